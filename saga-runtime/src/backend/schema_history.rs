//! A store's schema as a history of migrations: what a deployment has
//! applied (version, name, checksum) against what this build ships, and
//! what to do about it. Pure, so that every store with a schema
//! (PostgreSQL today, SQLite next) decides the same way; the store reads
//! the applied rows and carries the plan out.
//!
//! Why checksums: a migration that is edited after it was applied leaves
//! deployments whose functions differ from the ones the engine's
//! statements expect, with the same version number on both. Every
//! migration this build ships carries the checksum it was released with
//! (a unit test fails when a file no longer matches), the database records
//! the checksum of what it applied, and a difference is refused at start
//! rather than found by a statement hours later.

use sha2::{Digest, Sha256};

/// One migration as the build ships it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Migration {
    /// 1, 2, 3, ... without gaps.
    pub version: i32,
    pub name: &'static str,
    /// The text, before a store fills in its placeholders (the schema's
    /// name): the checksum is the same for every deployment. Each store
    /// pins the checksum each migration was released with in a test, so
    /// that editing a file fails the build's tests rather than a
    /// deployment.
    pub sql: &'static str,
}

impl Migration {
    /// [`checksum`] of this migration's text.
    pub fn checksum(&self) -> String {
        checksum(self.sql)
    }
}

/// One migration as a deployment recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Applied {
    pub version: i32,
    pub name: String,
    /// `None`: recorded by a version of this library that kept no
    /// checksums.
    pub checksum: Option<String>,
}

/// What to do with a deployment's schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Every migration of this build is applied, as this build ships it.
    Current,
    /// Migrations are to be applied (those after `from`), or checksums to
    /// be recorded for migrations applied before checksums were kept
    /// (`adopt`), or both.
    Migrate {
        /// The newest version applied; 0 for none.
        from: i32,
        /// Versions whose recorded checksum is missing.
        adopt: Vec<i32>,
    },
    /// The deployment is of a newer build (it applied `newest`).
    Newer { newest: i32 },
    /// The deployment's history and this build's differ: the text says
    /// where and what to do.
    Diverged(String),
}

/// The SHA-256 of a migration's text, in hex. Line endings count as `\n`,
/// so a checkout that converts them does not read as an edit.
pub(crate) fn checksum(sql: &str) -> String {
    let mut hash = Sha256::new();
    for (n, line) in sql.split('\n').enumerate() {
        if n > 0 {
            hash.update(b"\n");
        }
        hash.update(line.strip_suffix('\r').unwrap_or(line).as_bytes());
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares what `store` (its name in messages: "schema `saga`") applied
/// with what this build ships.
pub(crate) fn plan(shipped: &[Migration], applied: &[Applied], store: &str) -> Plan {
    let known = shipped.last().map_or(0, |m| m.version);
    let newest = applied.iter().map(|a| a.version).max().unwrap_or(0);
    if newest > known {
        return Plan::Newer { newest };
    }
    let mut adopt = Vec::new();
    for (n, row) in applied.iter().enumerate() {
        let expected = n as i32 + 1;
        if row.version != expected {
            return Plan::Diverged(format!(
                "{store} records migration {} where {expected} was expected next: its history has \
                 a gap or a duplicate, so it was not written by this library's migrator (or a row \
                 was deleted by hand). Restore the schema from a backup, or migrate a new one and \
                 move the tasks to it",
                row.version
            ));
        }
        // `newest <= known` and no gap: every row has a shipped twin.
        let Some(ours) = shipped.get(n) else { break };
        if row.name != ours.name {
            return Plan::Diverged(diverged(store, row, ours, "name", &row.name, ours.name));
        }
        match &row.checksum {
            None => adopt.push(row.version),
            Some(theirs) if *theirs != ours.checksum() => {
                return Plan::Diverged(diverged(
                    store,
                    row,
                    ours,
                    "checksum",
                    theirs,
                    &ours.checksum(),
                ));
            }
            Some(_) => {}
        }
    }
    match (newest == known, adopt.is_empty()) {
        (true, true) => Plan::Current,
        _ => Plan::Migrate {
            from: newest,
            adopt,
        },
    }
}

/// The refusal of a migration applied otherwise than this build ships it.
fn diverged(
    store: &str,
    row: &Applied,
    ours: &Migration,
    what: &str,
    theirs: &str,
    mine: &str,
) -> String {
    format!(
        "{store} applied migration {} ({}) with {what} `{theirs}`, and this build ships it with \
         {what} `{mine}`: the deployment was migrated by a build whose migration {} differs from \
         this one's (an edited migration, or a fork), so its functions may not be the ones this \
         engine calls. Run the build that migrated it, restore the schema from a backup taken \
         before, or migrate a new schema and move the tasks to it. A migration is never edited \
         once applied: a change is a new migration",
        row.version, row.name, ours.version
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIPPED: &[Migration] = &[
        Migration {
            version: 1,
            name: "core",
            sql: "CREATE TABLE t ();\n",
        },
        Migration {
            version: 2,
            name: "more",
            sql: "CREATE TABLE u ();\n",
        },
    ];

    fn applied(rows: &[(i32, &str, Option<&str>)]) -> Vec<Applied> {
        rows.iter()
            .map(|(version, name, checksum)| Applied {
                version: *version,
                name: (*name).to_owned(),
                checksum: checksum.map(str::to_owned),
            })
            .collect()
    }

    #[test]
    fn line_endings_do_not_change_a_checksum_and_a_character_does() {
        assert_eq!(checksum("a;\nb;\n"), checksum("a;\r\nb;\r\n"));
        assert_ne!(checksum("a;\nb;\n"), checksum("a;\nb; \n"));
        assert_eq!(checksum("").len(), 64);
    }

    #[test]
    fn a_history_is_current_behind_newer_or_diverged() {
        let one = SHIPPED[0].checksum();
        let two = SHIPPED[1].checksum();
        let store = "schema `saga`";
        assert_eq!(
            plan(
                SHIPPED,
                &applied(&[(1, "core", Some(&one)), (2, "more", Some(&two))]),
                store
            ),
            Plan::Current
        );
        assert_eq!(
            plan(SHIPPED, &[], store),
            Plan::Migrate {
                from: 0,
                adopt: vec![]
            }
        );
        assert_eq!(
            plan(SHIPPED, &applied(&[(1, "core", Some(&one))]), store),
            Plan::Migrate {
                from: 1,
                adopt: vec![]
            }
        );
        // Recorded before checksums were kept: adopted, nothing applied.
        assert_eq!(
            plan(
                SHIPPED,
                &applied(&[(1, "core", None), (2, "more", Some(&two))]),
                store
            ),
            Plan::Migrate {
                from: 2,
                adopt: vec![1]
            }
        );
        assert_eq!(
            plan(
                SHIPPED,
                &applied(&[(1, "core", None), (3, "x", None)]),
                store
            ),
            Plan::Newer { newest: 3 }
        );
        let Plan::Diverged(text) = plan(
            SHIPPED,
            &applied(&[(1, "core", Some(&one)), (2, "more", Some("beef"))]),
            store,
        ) else {
            panic!("an edited migration was accepted")
        };
        assert!(
            text.contains("schema `saga` applied migration 2 (more) with checksum `beef`")
                && text.contains(&two)
                && text.contains("a change is a new migration"),
            "{text}"
        );
        let Plan::Diverged(text) = plan(SHIPPED, &applied(&[(1, "kore", None)]), store) else {
            panic!("a renamed migration was accepted")
        };
        assert!(text.contains("with name `kore`"), "{text}");
        let Plan::Diverged(text) = plan(SHIPPED, &applied(&[(2, "more", None)]), store) else {
            panic!("a gap was accepted")
        };
        assert!(text.contains("records migration 2 where 1"), "{text}");
    }
}
