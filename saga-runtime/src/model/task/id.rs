//! [`TaskId`], and what a string that is not one is told.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Identifies one task (one execution of a saga).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TaskId(pub Uuid);

impl TaskId {
    /// A new random id.
    pub fn new() -> Self {
        TaskId(Uuid::new_v4())
    }
}

impl Default for TaskId {
    fn default() -> Self {
        TaskId::new()
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Parses the full id as [`Display`](fmt::Display) prints it (a UUID;
/// the simple, braced and URN forms are accepted too). What an operator
/// pastes from a console, a log line or a shell comes here, so the error
/// says what a task id is rather than how the UUID parser failed.
impl FromStr for TaskId {
    type Err = TaskIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s.trim())
            .map(TaskId)
            .map_err(|_| TaskIdError::new(s))
    }
}

/// How much of a string that is not a task id its error repeats: enough
/// to recognise it, not enough to echo a 10 kB path back into a response
/// or a log line.
const SHOWN: usize = 40;

/// A string that is not a [`TaskId`]. Its message says what a task id is,
/// and, for the 8 characters a console shows, where to find the whole id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskIdError {
    /// The start of the input (at most 40 characters) and whether it was cut.
    shown: String,
    cut: bool,
    /// Its length in characters.
    len: usize,
}

impl TaskIdError {
    fn new(input: &str) -> Self {
        let input = input.trim();
        let len = input.chars().count();
        // Escaped, so that what is shown is one printable line.
        let shown: String = input
            .chars()
            .take(SHOWN)
            .flat_map(char::escape_debug)
            .collect();
        TaskIdError {
            shown,
            cut: len > SHOWN,
            len,
        }
    }
}

impl fmt::Display for TaskIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ellipsis = if self.cut { "…" } else { "" };
        write!(f, "`{}{ellipsis}` is not a task id: ", self.shown)?;
        f.write_str(
            "a task id is a full UUID, 36 characters like \
             `4b6c1f0e-2d7a-4c3b-9e8f-1a2b3c4d5e6f`",
        )?;
        if self.len == 8 && self.shown.chars().all(|c| c.is_ascii_hexdigit()) {
            // The console's tables show an id's first 8 characters.
            f.write_str(
                "; the console shows only the first 8 characters: copy the full id \
                 from the task's page",
            )?;
        } else if self.len > SHOWN {
            write!(f, " (this one has {} characters)", self.len)?;
        }
        Ok(())
    }
}

impl std::error::Error for TaskIdError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_ids_parse_and_round_trip() {
        let id = TaskId::new();
        assert_eq!(id.to_string().parse::<TaskId>().unwrap(), id);
        // Pasted with a trailing newline from a shell.
        assert_eq!(format!("{id}\n").parse::<TaskId>().unwrap(), id);
    }

    #[test]
    fn a_console_short_id_is_told_where_the_full_one_is() {
        let error = "4b6c1f0e".parse::<TaskId>().unwrap_err().to_string();
        assert!(error.contains("full UUID, 36 characters"), "{error}");
        assert!(error.contains("first 8 characters"), "{error}");
        assert!(error.contains("task's page"), "{error}");
        assert!(!error.contains("invalid length"), "{error}");
    }

    #[test]
    fn a_long_input_is_not_echoed_whole() {
        let long = "a".repeat(10_000);
        let error = long.parse::<TaskId>().unwrap_err().to_string();
        assert!(error.len() < 300, "{} bytes", error.len());
        assert!(error.contains("10000 characters"), "{error}");
        assert!(!error.contains("8 characters"), "{error}");
        let other = "not-an-id".parse::<TaskId>().unwrap_err().to_string();
        assert!(other.starts_with("`not-an-id` is not a task id"), "{other}");
    }
}
