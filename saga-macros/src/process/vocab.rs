//! The words of `#[process_manager(..)]`'s settings, shared by what parses
//! them and the IR that carries them.

/// `on_complete = keep | delete`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnComplete {
    #[default]
    Keep,
    Delete,
}

/// `concurrency = optimistic | pessimistic`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Concurrency {
    #[default]
    Optimistic,
    Pessimistic,
}
