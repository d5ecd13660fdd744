//! Examples and integration tests live in this package; the library is `saga-runtime`.
