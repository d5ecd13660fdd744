//! How a script says no: one table of refusal codes for Lua and Rust.
//!
//! A refused write answers `{code, detail}` (a negative code) and has
//! written nothing. The Lua side names the codes in
//! `lua/lib/refusals.lua`; a test checks that file against
//! [`RefusalCode::TABLE`], so a code cannot change on one side only (the codes
//! are on the wire: a script and the Rust reading it must agree, and an
//! upgrade in place runs old and new side by side).

/// Why a script refused a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefusalCode {
    /// The write's fence is not the task's latest: its lease was lost.
    LockLost,
    /// The stored version (or generation) is not the one the writer read.
    Conflict,
    /// The task does not exist.
    Missing,
    /// A correlation entry is held by another instance.
    Taken,
    /// The task's cancellation was requested (and the write asked to be
    /// refused then).
    CancelRequested,
    /// A tombstone remembers a message being handled: a late duplicate for
    /// an instance that was deleted.
    Tombstoned,
    /// A tally the commit opens exists already.
    TallyExists,
    /// As many messages are held for the value as the cap allows.
    HoldFull,
    /// An endpoint a group reads holds as many messages as its cap.
    EndpointFull,
}

impl RefusalCode {
    /// Every refusal, with its name in `lua/lib/refusals.lua` and its code
    /// on the wire. Codes repeat across families (a task write's `-5` is a
    /// cancellation, a process-manager write's a tombstone), never within
    /// the set one script answers (see [`from_code`](Self::from_code)).
    pub const TABLE: [(RefusalCode, &'static str, i64); 9] = [
        (RefusalCode::LockLost, "LOCK_LOST", -1),
        (RefusalCode::Conflict, "CONFLICT", -2),
        (RefusalCode::Missing, "MISSING", -3),
        (RefusalCode::Taken, "TAKEN", -4),
        (RefusalCode::CancelRequested, "CANCEL_REQUESTED", -5),
        (RefusalCode::Tombstoned, "TOMBSTONED", -5),
        (RefusalCode::TallyExists, "TALLY_EXISTS", -6),
        (RefusalCode::HoldFull, "HOLD_FULL", -7),
        (RefusalCode::EndpointFull, "ENDPOINT_FULL", -8),
    ];

    /// What a task write answers (`apply.lua`).
    pub const TASK_WRITE: &'static [RefusalCode] = &[
        RefusalCode::LockLost,
        RefusalCode::Conflict,
        RefusalCode::Missing,
        RefusalCode::CancelRequested,
    ];

    /// What `process_commit.lua` answers.
    pub const PROCESS_COMMIT: &'static [RefusalCode] = &[
        RefusalCode::Conflict,
        RefusalCode::Taken,
        RefusalCode::Tombstoned,
        RefusalCode::TallyExists,
        RefusalCode::EndpointFull,
    ];

    /// What `endpoint_append.lua` answers.
    pub const ENDPOINT_APPEND: &'static [RefusalCode] = &[RefusalCode::EndpointFull];

    /// What `process_hold.lua` answers.
    pub const PROCESS_HOLD: &'static [RefusalCode] = &[
        RefusalCode::Conflict,
        RefusalCode::Taken,
        RefusalCode::Tombstoned,
        RefusalCode::HoldFull,
    ];

    /// What `claim_entry.lua` answers.
    pub const CLAIM_ENTRY: &'static [RefusalCode] = &[RefusalCode::Taken, RefusalCode::Tombstoned];

    /// Its code on the wire.
    pub fn code(self) -> i64 {
        Self::TABLE
            .iter()
            .find(|(r, _, _)| *r == self)
            .map_or(0, |(_, _, code)| *code)
    }

    /// The refusal of `among` (what one script answers) that `code` names.
    pub fn from_code(code: i64, among: &[RefusalCode]) -> Option<RefusalCode> {
        among.iter().copied().find(|r| r.code() == code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `local NAME = CODE` lines of `lua/lib/refusals.lua`, in order.
    fn lua_table() -> Vec<(String, i64)> {
        include_str!("../lua/lib/refusals.lua")
            .lines()
            .filter_map(|line| line.strip_prefix("local "))
            .map(|rest| {
                let (name, code) = rest.split_once(" = ").expect("`local NAME = CODE`");
                (
                    name.to_owned(),
                    code.trim().parse().expect("an integer code"),
                )
            })
            .collect()
    }

    #[test]
    fn the_lua_constants_are_the_rust_table() {
        let rust: Vec<(String, i64)> = RefusalCode::TABLE
            .iter()
            .map(|(_, name, code)| ((*name).to_owned(), *code))
            .collect();
        assert_eq!(lua_table(), rust);
    }

    #[test]
    fn every_refusal_is_in_the_table_once_with_todays_code() {
        // A new variant must be added here, and so to the table.
        let code = |r: RefusalCode| match r {
            RefusalCode::LockLost => -1,
            RefusalCode::Conflict => -2,
            RefusalCode::Missing => -3,
            RefusalCode::Taken => -4,
            RefusalCode::CancelRequested | RefusalCode::Tombstoned => -5,
            RefusalCode::TallyExists => -6,
            RefusalCode::HoldFull => -7,
            RefusalCode::EndpointFull => -8,
        };
        for (refusal, _, wire) in RefusalCode::TABLE {
            assert_eq!(code(refusal), wire, "{refusal:?}");
            assert_eq!(refusal.code(), wire, "{refusal:?}");
            let listed = RefusalCode::TABLE.iter().filter(|(r, _, _)| *r == refusal);
            assert_eq!(listed.count(), 1, "{refusal:?}");
        }
    }

    #[test]
    fn no_code_repeats_among_what_one_script_answers() {
        for among in [
            RefusalCode::TASK_WRITE,
            RefusalCode::PROCESS_COMMIT,
            RefusalCode::PROCESS_HOLD,
            RefusalCode::CLAIM_ENTRY,
            RefusalCode::ENDPOINT_APPEND,
        ] {
            for refusal in among {
                assert_eq!(
                    RefusalCode::from_code(refusal.code(), among),
                    Some(*refusal),
                    "{among:?}"
                );
            }
            assert_eq!(RefusalCode::from_code(0, among), None);
            assert_eq!(RefusalCode::from_code(7, among), None);
        }
    }
}
