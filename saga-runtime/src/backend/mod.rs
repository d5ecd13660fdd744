//! Storage backends.
pub mod memory;

/// A backend failure.
#[derive(Debug, thiserror::Error)]
#[error("backend: {0}")]
pub struct BackendError(pub String);
