//! Compile-time behaviour of `#[saga]`: `ui-tests/fail/*.rs` must fail with
//! exactly the diagnostics in the `.stderr` next to them, and
//! `ui-tests/pass/*.rs` must compile (and run).
//!
//! Diagnostics change between compiler releases, so the expected output is
//! tied to the version in `ui-tests/RUSTC_VERSION`; on any other version the
//! test explains how to regenerate instead of failing.

use std::process::Command;

#[test]
fn ui() {
    let expected = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/ui-tests/RUSTC_VERSION"
    ))
    .expect("ui-tests/RUSTC_VERSION is readable");
    let expected = expected.trim();
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let version = Command::new(&rustc)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    // `rustc 1.95.0 (59807616e 2026-04-14)` -> `1.95.0`
    let actual = version.split_whitespace().nth(1).unwrap_or("unknown");
    if actual != expected {
        eprintln!(
            "skipping UI tests: their expected output was generated with rustc {expected}, \
             this is rustc {actual}. To regenerate it for this compiler, run \
             `TRYBUILD=overwrite cargo test --test ui`, review every changed .stderr, and \
             write {actual} into ui-tests/RUSTC_VERSION."
        );
        return;
    }

    let t = trybuild::TestCases::new();
    t.compile_fail("ui-tests/fail/*.rs");
    t.pass("ui-tests/pass/*.rs");
}
