//! In-memory backend.
