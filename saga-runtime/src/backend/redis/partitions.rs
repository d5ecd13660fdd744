//! Process-manager partitions: which engine reads which partition stream.
//!
//! Every process-manager message goes to one of
//! [`PROCESS_PARTITIONS`](super::keys::PROCESS_PARTITIONS) streams, chosen
//! from its instance id or correlation value, so that the messages of one
//! instance meet in one stream. Each partition is read by one engine at a
//! time, the holder of its owner lease: `BALANCE` spreads the partitions
//! over the engines that renewed their membership within its TTL. One
//! writer per instance is thus the normal case across processes, not
//! only within one; versioning still settles the rare overlap (an owner
//! that stalls past its lease, a hand-over while the old owner finishes a
//! message).

use std::time::Duration;

use super::{ms, scripts as s, RedisBackend};
use crate::backend::BackendError;

impl RedisBackend {
    /// Runs `BALANCE` for `member`; the partitions it owns after it.
    pub(super) async fn balance(
        &self,
        member: &str,
        ttl: Duration,
        leaving: bool,
    ) -> Result<u64, BackendError> {
        let k = self.keys();
        let owned = self
            .call(&s::Balance {
                members: k.partition_members(),
                owner_prefix: k.partition_owner_prefix(),
                member,
                ttl_ms: ms(ttl).max(1),
                partitions: k.pm_count(),
                leaving,
                pm_prefix: (!k.spread()).then(|| k.process_prefix(k.process_stream())),
            })
            .await?;
        Ok(owned
            .into_iter()
            .filter(|k| *k < 64)
            .fold(0, |mask, k| mask | 1 << k))
    }
}
