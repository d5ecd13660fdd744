//! Checking tally items off, from anywhere: [`Engine::tally`].

use super::Engine;
use crate::error::Error;
use crate::process::tally::{status_of, MISSING_LISTED};
use crate::process::{TallyCheck, TallyRef, TallyStatus};

/// What checking an item did ([`Tally::check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// Counted; `remaining` items are still unchecked.
    Counted {
        /// Items still unchecked.
        remaining: u64,
        /// After the tally's deadline: counted all the same (the instance
        /// learns of it from the completion, `late: true`).
        late: bool,
    },
    /// Every item is checked, and this check sent the instance
    /// [`TallyCompleted`](crate::process::TallyCompleted): exactly one
    /// check of a tally answers this (usually the one of the last item;
    /// with checks racing at the end, possibly another that saw none left,
    /// the last one then answering `Counted` with none remaining).
    Completed {
        /// After the deadline.
        late: bool,
    },
    /// Checked before: a duplicate, which changes nothing.
    AlreadyChecked,
}

/// One tally, as seen by whoever does its items: [`Engine::tally`].
/// Cheap to clone; holds a handle to the engine, so it can move into
/// spawned tasks.
#[derive(Clone)]
pub struct Tally {
    engine: Engine,
    tally: TallyRef,
}

impl std::fmt::Debug for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Tally").field(&self.tally).finish()
    }
}

impl Engine {
    /// The tally `tally` (a reference its process manager handed out with
    /// the work; see [`ProcessContext::open_tally`](crate::process::ProcessContext::open_tally)).
    /// Checking its items is one atomic step each and never touches the
    /// instance, so any number of workers in any number of processes check
    /// items concurrently.
    pub fn tally(&self, tally: &TallyRef) -> Tally {
        Tally {
            engine: self.clone(),
            tally: tally.clone(),
        }
    }
}

impl Tally {
    /// Checks `item` off; idempotent (a retry or a redelivered work item
    /// answers [`Checked::AlreadyChecked`]). The check of the last item
    /// sends the instance its completion, exactly once, in the same step.
    /// An item the tally does not have is [`Error::UnknownTallyItem`]; a
    /// tally that does not exist (or expired) [`Error::TallyNotFound`].
    pub async fn check(&self, item: impl AsRef<str>) -> Result<Checked, Error> {
        let item = item.as_ref();
        let checked = self
            .engine
            .retrying("tally check", || async move {
                self.engine
                    .rt
                    .processes()?
                    .tally_check(&self.tally, item)
                    .await
            })
            .await?;
        match checked {
            TallyCheck::Counted { remaining, late } => Ok(Checked::Counted { remaining, late }),
            TallyCheck::Completed { late } => Ok(Checked::Completed { late }),
            TallyCheck::AlreadyChecked => Ok(Checked::AlreadyChecked),
            TallyCheck::UnknownItem => Err(Error::UnknownTallyItem {
                tally: self.tally.clone(),
                item: item.to_owned(),
            }),
            TallyCheck::NoTally => Err(Error::TallyNotFound(self.tally.clone())),
        }
    }

    /// Its progress, with up to [`MISSING_LISTED`] unchecked items.
    pub async fn status(&self) -> Result<TallyStatus, Error> {
        let progress = self
            .engine
            .retrying("tally status", || async move {
                let processes = self.engine.rt.processes()?;
                processes
                    .tally_progress(&self.tally, MISSING_LISTED, false)
                    .await
            })
            .await?
            .ok_or_else(|| Error::TallyNotFound(self.tally.clone()))?;
        Ok(status_of(&self.tally, progress, false))
    }

    /// Which tally.
    pub fn reference(&self) -> &TallyRef {
        &self.tally
    }
}
