//! Which engines run what: each engine announces the process managers and
//! saga versions it runs, for a time, so that an engine handed a message
//! it cannot handle (a rolling deploy, a process manager only some engines
//! run) can tell whether another live engine can, and hand it back at once
//! rather than count it toward the poison cap. A backend shared by several
//! engines offers it ([`Backend::runners`](super::Backend::runners)); every
//! default here is the answer of one that does not know.

use std::time::Duration;

use async_trait::async_trait;

use super::BackendError;

/// Announcements of what each engine runs, each expiring with its TTL.
#[async_trait]
pub trait Runners: Send + Sync + 'static {
    /// Records that `member` runs the process managers `names` for the
    /// next `ttl` (`None`: it stops running them now, shutting down), so
    /// that an engine handed a message for a process manager it does not
    /// run can tell whether another engine does
    /// ([`process_runner_alive`](Self::process_runner_alive)).
    async fn announce_processes(
        &self,
        member: &str,
        names: &[&'static str],
        ttl: Option<Duration>,
    ) -> Result<(), BackendError> {
        let _ = (member, names, ttl);
        Ok(())
    }

    /// Whether an engine that runs process manager `name` announced it
    /// within its TTL. `false` when the backend does not know (the
    /// default): the message then waits for one with growing delays.
    async fn process_runner_alive(&self, name: &str) -> Result<bool, BackendError> {
        let _ = name;
        Ok(false)
    }

    /// Records that `member` runs the saga versions `runs` for the next
    /// `ttl` (`None`: it stops running them now, shutting down): each as
    /// the saga's name alone, `name@version` and
    /// `name@version#fingerprint`, so that an engine handed
    /// a task of a version it lacks (a rolling deploy) can tell whether
    /// another live engine runs it ([`saga_runner_alive`](Self::saga_runner_alive))
    /// and hand the message back at once, without counting the delivery
    /// toward the poison cap. A few entries per registered version, each
    /// expiring with its announcement: bounded however often engines
    /// restart.
    async fn announce_sagas(
        &self,
        member: &str,
        runs: &[String],
        ttl: Option<Duration>,
    ) -> Result<(), BackendError> {
        let _ = (member, runs, ttl);
        Ok(())
    }

    /// Whether an engine that runs `run` (one of the forms
    /// `announce_sagas` records) announced it within its TTL. `false` when
    /// the backend does not know (the default): the message then waits
    /// for one with growing delays, each counted toward the cap.
    async fn saga_runner_alive(&self, run: &str) -> Result<bool, BackendError> {
        let _ = run;
        Ok(false)
    }
}

/// What an engine that runs version `version` (with steps fingerprinted
/// `fingerprint`) of saga `name` announces: the name alone (for a message
/// of a saga an engine does not run at all), the version, and the version
/// with its steps (for a task started on a definition this engine's
/// version does not match). Saga names hold no `@` or `#`, so one form
/// cannot stand for another, nor for a process manager's name.
pub(crate) fn saga_runs(name: &str, version: u32, fingerprint: &str) -> [String; 3] {
    [
        name.to_owned(),
        saga_version_run(name, version),
        saga_steps_run(name, version, fingerprint),
    ]
}

/// The form [`saga_runs`] announces version `version` of saga `name`
/// with the steps fingerprinted `fingerprint` under.
pub(crate) fn saga_steps_run(name: &str, version: u32, fingerprint: &str) -> String {
    format!("{name}@{version}#{fingerprint}")
}

/// The form [`saga_runs`] announces version `version` of saga `name` under.
pub(crate) fn saga_version_run(name: &str, version: u32) -> String {
    format!("{name}@{version}")
}
