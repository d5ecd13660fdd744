//! Which sagas have tasks stored under the prefix: for an operator who
//! named one with none (`sagactl list --saga <misspelt>`).

use std::time::Duration;

use super::{unavailable, RedisBackend};
use crate::backend::BackendError;
use crate::model::task::TaskStatus;

impl RedisBackend {
    /// Every partition's per-saga indexes (`<tag>:idx:<saga>`), found by
    /// a `SCAN` on the server that holds the partition: a whole pass over
    /// its keys, for an operator's error path only.
    pub(super) async fn scan_saga_names(&self) -> Result<Vec<String>, BackendError> {
        let k = self.keys();
        let server = &self.shared.server;
        let mut found = std::collections::BTreeSet::new();
        for p in 0..k.partitions() {
            let head = k.index(p, "", None);
            let escaped: String = head
                .chars()
                .flat_map(|c| match c {
                    '*' | '?' | '[' | ']' | '\\' => vec!['\\', c],
                    c => vec![c],
                })
                .collect();
            let mut conn = match server.is_cluster() {
                true => server
                    .blocking_for(&head, Duration::ZERO, false)
                    .await
                    .map_err(unavailable)?,
                false => self.conn(),
            };
            let mut cursor = "0".to_owned();
            loop {
                let (next, keys): (String, Vec<String>) = redis::cmd("SCAN")
                    .arg(&cursor)
                    .arg("MATCH")
                    .arg(format!("{escaped}*"))
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn)
                    .await
                    .map_err(unavailable)?;
                found.extend(
                    keys.iter()
                        .filter_map(|key| key.strip_prefix(&head))
                        .map(str::to_owned),
                );
                if next == "0" {
                    break;
                }
                cursor = next;
            }
        }
        // `<saga>:<status>` is a per-status index of `<saga>`, whose
        // all-status index is there too.
        let per_status = |name: &str| {
            TaskStatus::ALL.iter().any(|s| {
                name.strip_suffix(s.as_str())
                    .and_then(|n| n.strip_suffix(':'))
                    .is_some_and(|saga| found.contains(saga))
            })
        };
        Ok(found.iter().filter(|n| !per_status(n)).cloned().collect())
    }
}
