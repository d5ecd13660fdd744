//! What a step waiting for a flow-control limit (`#[limit]`) records: on
//! the step, so that a long wait is audited once, its length measured,
//! and its place in line given up if the task is cancelled meanwhile.

use serde::{Deserialize, Serialize};

use super::Timestamp;

/// A step's wait for a flow-control limit, kept in its [`StepRecord`](super::StepRecord) while it lasts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitingForLimit {
    /// The limit's name.
    pub limit: String,
    /// The key's value, for a keyed limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// When the wait began.
    pub since: Timestamp,
}

#[cfg(test)]
mod tests {
    use crate::model::task::AuditAction;

    #[test]
    fn audit_entries_of_a_newer_kind_are_read_not_refused() {
        let wait = AuditAction::LimitWait {
            limit: "psp".into(),
            key: Some("42".into()),
        };
        let json = serde_json::to_value(&wait).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"kind": "LimitWait", "limit": "psp", "key": "42"})
        );
        let newer: AuditAction =
            serde_json::from_value(serde_json::json!({"kind": "Teleported", "to": "mars"}))
                .unwrap();
        assert_eq!(newer, AuditAction::Unrecognised);
    }
}
