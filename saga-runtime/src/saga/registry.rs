//! The sagas an engine runs, by name and version.
//!
//! Several versions of one saga run side by side while the tasks of the
//! old ones drain: a task runs to its end on the version it started with.
//! Registration is checked once, at build time, so that a worker never
//! meets an ambiguity at run time.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::{ErasedSaga, SagaDefinition};
use crate::error::Error;

#[derive(Default)]
pub(crate) struct SagaRegistry {
    by_name: HashMap<&'static str, BTreeMap<u32, Arc<dyn ErasedSaga>>>,
}

impl SagaRegistry {
    /// Refuses one name and version registered twice (the second would
    /// silently win), and two versions with the same fingerprint (a version
    /// bump without a change, or one type registered under two versions:
    /// either way old tasks could not be told from new ones).
    pub fn new(sagas: Vec<Arc<dyn ErasedSaga>>) -> Result<Self, Error> {
        let mut by_name: HashMap<&'static str, BTreeMap<u32, Arc<dyn ErasedSaga>>> = HashMap::new();
        for saga in sagas {
            let def = saga.definition();
            let versions = by_name.entry(def.name).or_default();
            if let Some(same) = versions
                .values()
                .map(|s| s.definition())
                .find(|other| other.fingerprint == def.fingerprint && other.version != def.version)
            {
                return Err(Error::SameSagaDefinition {
                    saga: def.name,
                    versions: (same.version, def.version),
                });
            }
            if versions.insert(def.version, saga).is_some() {
                return Err(Error::DuplicateSaga(def.name.to_owned()));
            }
        }
        Ok(SagaRegistry { by_name })
    }

    /// Every registered definition, every version.
    pub fn all(&self) -> impl Iterator<Item = &'static SagaDefinition> + '_ {
        self.by_name
            .values()
            .flat_map(|versions| versions.values().map(|s| s.definition()))
    }

    /// Version `version` of saga `name`.
    pub fn get(&self, name: &str, version: u32) -> Option<&Arc<dyn ErasedSaga>> {
        self.by_name.get(name)?.get(&version)
    }

    /// The registered versions of `name`, ascending; `None` if it has none.
    pub fn versions(&self, name: &str) -> Option<Vec<u32>> {
        self.by_name
            .get(name)
            .map(|versions| versions.keys().copied().collect())
    }

    pub fn any_cancellable(&self, name: &str) -> bool {
        self.by_name
            .get(name)
            .is_some_and(|versions| versions.values().any(|s| s.definition().cancellable))
    }

    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The newest version of each saga, sorted by name: what new tasks
    /// of that name are started on by callers that only know the name.
    pub fn latest(&self) -> Vec<&'static SagaDefinition> {
        let mut defs: Vec<_> = self
            .by_name
            .values()
            .filter_map(|versions| versions.values().next_back())
            .map(|saga| saga.definition())
            .collect();
        defs.sort_by_key(|d| d.name);
        defs
    }

    /// Every registered saga name with its versions, for messages.
    pub fn describe(&self) -> String {
        let mut names: Vec<String> = self
            .by_name
            .iter()
            .map(|(name, versions)| match versions.len() {
                1 if versions.contains_key(&1) => (*name).to_owned(),
                _ => format!(
                    "{name} v{}",
                    versions
                        .keys()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join("/")
                ),
            })
            .collect();
        names.sort();
        names.join(", ")
    }
}
