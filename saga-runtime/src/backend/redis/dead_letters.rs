//! The dead-letter stream as an operator works it: paged, read, requeued
//! (atomically, onto the letter's own partition) and discarded.

use async_trait::async_trait;
use redis::Value;

use super::entry::{self, entries};
use super::queue::entry_order;
use super::{scripts as s, unavailable, RedisBackend};
use crate::backend::{BackendError, DeadLetter, DeadLetterQuery, DeadLetters, Page};
use crate::model::task::Timestamp;

/// A dead-letter stream entry.
fn dead_letter(stream: u16, id: &str, raw_fields: &Value) -> DeadLetter {
    let fields = entry::fields(raw_fields);
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| *k == name.as_bytes())
            .map(|(_, v)| entry::text(v))
            .unwrap_or_default()
    };
    DeadLetter {
        id: format!("{stream}:{id}"),
        payload: field("payload"),
        reason: field("reason"),
        task_id: field("task").parse().ok(),
        at: Timestamp(field("at").parse().unwrap_or(0)),
        truncated: field("size").parse().ok(),
    }
}

#[async_trait]
impl DeadLetters for RedisBackend {
    async fn dead_letters(
        &self,
        query: &DeadLetterQuery,
    ) -> Result<Page<DeadLetter>, BackendError> {
        // Newest first across streams, by entry id then stream; a cursor is
        // the last letter's id.
        let after = match &query.after {
            Some(id) => match self.keys().split_id(id) {
                Some((p, entry)) => Some((entry_order(entry), p)),
                None => return Err(BackendError::InvalidCursor(id.clone())),
            },
            None => None,
        };
        let mut conn = self.conn();
        let mut letters: Vec<((u64, u64), u16, DeadLetter)> = Vec::new();
        for p in 0..self.keys().streams() {
            let end = match after {
                None => "+".to_owned(),
                // Entries of later streams with the cursor's id come after
                // it in the order; of earlier streams, before.
                Some(((ms, seq), cp)) if p < cp => format!("{ms}-{seq}"),
                // Nothing is older than the first possible id.
                Some(((0, 0), _)) => continue,
                Some(((ms, seq), _)) => format!("({ms}-{seq}"),
            };
            let reply: Value = redis::cmd("XREVRANGE")
                .arg(self.keys().dead(p))
                .arg(&end)
                .arg("-")
                .arg("COUNT")
                .arg(query.limit + 1)
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
            for (id, fields) in entries(&reply) {
                letters.push((entry_order(&id), p, dead_letter(p, &id, fields)));
            }
        }
        letters.sort_by_key(|l| std::cmp::Reverse((l.0, l.1)));
        let more = letters.len() > query.limit;
        letters.truncate(query.limit);
        let items: Vec<DeadLetter> = letters.into_iter().map(|(_, _, l)| l).collect();
        let next = more.then(|| items.last().map(|l| l.id.clone())).flatten();
        Ok(Page { items, next })
    }

    async fn dead_letter_by_id(&self, id: &str) -> Result<Option<DeadLetter>, BackendError> {
        let Some((p, entry)) = self.keys().split_id(id) else {
            return Ok(None);
        };
        let reply: Value = redis::cmd("XRANGE")
            .arg(self.keys().dead(p))
            .arg(entry)
            .arg(entry)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(entries(&reply)
            .first()
            .map(|(id, fields)| dead_letter(p, id, fields)))
    }

    async fn requeue_dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, BackendError> {
        let Some((p, entry)) = self.keys().split_id(id) else {
            return Ok(None);
        };
        let fields = self
            .call(&s::Requeue {
                dead: self.keys().dead(p),
                queue: self.keys().queue(p),
                entry: entry.to_owned(),
            })
            .await?;
        Ok(fields.map(|fields| dead_letter(p, entry, &fields)))
    }

    /// The dead streams' lengths, in one pipelined round trip.
    async fn dead_letter_count(&self) -> Result<usize, BackendError> {
        let lengths = self
            .query_each(
                (0..self.keys().streams())
                    .map(|p| redis::cmd("XLEN").arg(self.keys().dead(p)).clone())
                    .collect(),
            )
            .await?;
        lengths.iter().try_fold(0usize, |sum, len| {
            redis::from_redis_value_ref::<usize>(len)
                .map(|len| sum + len)
                .map_err(|_| super::corrupt("XLEN answered something else than a length"))
        })
    }

    async fn discard_dead_letter(&self, id: &str) -> Result<bool, BackendError> {
        let Some((p, entry)) = self.keys().split_id(id) else {
            return Ok(false);
        };
        let removed: usize = redis::cmd("XDEL")
            .arg(self.keys().dead(p))
            .arg(entry)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(removed > 0)
    }
}
