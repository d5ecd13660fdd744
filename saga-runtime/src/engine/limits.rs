//! The flow-control limits an engine applies (`#[limit]` on its sagas'
//! steps and its process managers' handlers), by name, with their use now.
//!
//! A limit's name is shared by everything that declares it, across sagas,
//! process managers and engines: they spend one budget. The engine refuses
//! to build when two declarations of one name disagree on what the limit
//! allows, since each engine would enforce its own reading of it.

use serde::Serialize;

use super::Engine;
use crate::backend::LimitUsage;
use crate::error::Error;
use crate::worker::limits::declared;

/// One limit as this engine declares it, and its use now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LimitInfo {
    /// The limit's name.
    pub name: &'static str,
    /// At most this many attempts at once, if limited.
    pub concurrency: Option<u32>,
    /// At most `count` starts per `per_ms`, `burst` at once, if limited.
    pub rate: Option<RateInfo>,
    /// Whether a use of it is keyed (each key has its own budget: see
    /// [`Engine::limit_usage`]).
    pub keyed: bool,
    /// What declares it: `saga.step` or `process.handler`, sorted.
    pub used_by: Vec<String>,
    /// The unkeyed budget's use now; `None` when every use is keyed.
    pub usage: Option<LimitUsage>,
}

/// A start rate, as [`LimitInfo`] shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RateInfo {
    /// Starts per period.
    pub count: u32,
    /// The period, in milliseconds.
    pub per_ms: u64,
    /// How many may start at once.
    pub burst: u32,
}

impl Engine {
    /// The limits this engine's sagas and process managers declare, by
    /// name, with the use of each unkeyed budget now (one backend call
    /// each).
    pub async fn limits(&self) -> Result<Vec<LimitInfo>, Error> {
        let declared = declared(
            self.rt.sagas.all(),
            self.rt.processes.values().map(|p| p.definition()),
        )?;
        let mut all = Vec::new();
        for (name, d) in declared {
            let usage = match d.unkeyed {
                true => Some(
                    self.retrying("limits", || {
                        self.rt.limits().limit_usage(name, None, d.config)
                    })
                    .await?,
                ),
                false => None,
            };
            all.push(LimitInfo {
                name,
                concurrency: d.config.concurrency,
                rate: d.config.rate.map(|r| RateInfo {
                    count: r.count,
                    per_ms: r.per.as_millis() as u64,
                    burst: r.burst,
                }),
                keyed: d.keyed,
                used_by: d.used_by,
                usage,
            });
        }
        Ok(all)
    }

    /// The use now of limit `name` for `key` (`None`: its unkeyed budget).
    /// An error for a name this engine does not declare.
    pub async fn limit_usage(&self, name: &str, key: Option<&str>) -> Result<LimitUsage, Error> {
        let declared = declared(
            self.rt.sagas.all(),
            self.rt.processes.values().map(|p| p.definition()),
        )?;
        let Some(d) = declared.get(name) else {
            let known: Vec<&str> = declared.keys().copied().collect();
            return Err(Error::Config(format!(
                "no limit `{name}` is declared by this engine's sagas or process managers (it declares [{}])",
                known.join(", ")
            )));
        };
        let config = d.config;
        self.retrying("limit_usage", || {
            self.rt.limits().limit_usage(name, key, config)
        })
        .await
    }
}
