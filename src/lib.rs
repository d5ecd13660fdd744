//! The examples of `saga-runtime` (in `examples/`): run one with
//! `cargo run --example create_zip`. An example that needs a store or a
//! broker names its feature (`cargo run --features redis --example
//! bench_redis`). The library is `saga-runtime`; the tests are in
//! `testsuite/`.

mod noop;
pub mod peer;
pub use noop::NoOp;
