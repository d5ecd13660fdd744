//! Waking idle readers on a cluster.
//!
//! On a single server an idle worker blocks in one `XREADGROUP` over every
//! stream it reads. On a cluster it cannot: a command's keys must share a
//! slot, and each partition is a slot of its own. A worker there reads the
//! partitions one script call each without blocking, and when none has
//! anything it waits for a wake-up.
//!
//! Wake-ups come from watchers: one per stream and backend, each blocked in
//! a plain `XREAD` (no group: it takes nothing, so a watcher that is
//! abandoned half-way strands no message) on a connection of its own,
//! reading from the last id its consumer group was handed. When the stream
//! grows past it, the watcher bumps a counter that the idle workers of this
//! backend wait on, and they read again.
//!
//! Not every backend watches every stream: the engines reading sagas split
//! the saga partitions between them (their *homes*), by rank in a
//! membership set each renews, so that a new message wakes the workers of
//! one engine rather than of all, and a deployment holds one watcher
//! connection per partition rather than one per partition and engine. A
//! stream nobody watches for a moment (an engine joined or left) is still
//! read by every idle worker's round of reads, at least once a blocking
//! period.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::Value;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::entry;
use super::server::{Conn, Server};
use crate::util::Unpoisoned;

/// A watcher nobody waited on for this long stops (its stream is no
/// longer a home of this backend, or its workers stopped).
const IDLE_WATCHER: Duration = Duration::from_secs(30);

/// How often a backend renews its place among the saga readers, and how
/// long the place lasts without renewal.
pub(super) const MEMBERSHIP_RENEW: Duration = Duration::from_secs(1);
pub(super) const MEMBERSHIP_TTL: Duration = Duration::from_secs(5);

/// The watchers of one backend, and its place among the saga readers.
pub(super) struct Watch {
    /// This backend's name in the membership set.
    pub member: String,
    streams: Mutex<HashMap<String, Arc<Stream>>>,
    place: Mutex<Place>,
    /// The consumers of this backend that read sagas: when the last one
    /// leaves, so does the backend's place (its partitions go to the
    /// others at once, not after the membership's TTL).
    readers: Mutex<std::collections::HashSet<String>>,
}

/// This backend's rank among the saga readers, as last renewed.
#[derive(Clone, Copy)]
pub(super) struct Place {
    pub rank: u16,
    pub size: u16,
    renewed: Option<Instant>,
}

impl Default for Watch {
    fn default() -> Self {
        Watch {
            member: uuid::Uuid::new_v4().simple().to_string(),
            streams: Mutex::new(HashMap::new()),
            place: Mutex::new(Place {
                rank: 0,
                size: 1,
                renewed: None,
            }),
            readers: Mutex::new(std::collections::HashSet::new()),
        }
    }
}

/// One watched stream: the wake-up counter, and when a worker last
/// waited on it.
struct Stream {
    woken: watch::Sender<u64>,
    wanted: Mutex<Instant>,
    /// Whether its watcher runs (it stops once idle; the next wait on the
    /// stream starts another).
    running: AtomicBool,
    /// Workers waiting on it now. Its watcher blocks only while some do:
    /// under load nobody waits, and a watcher woken by every new message
    /// would cost a command per message.
    waiting: AtomicUsize,
    /// Rings when a worker starts waiting.
    resume: Notify,
}

/// Where each stream's counter stood before a round of reads: a wait
/// returns as soon as one moved past it.
pub(super) struct Marks(Vec<(String, watch::Receiver<u64>, Arc<Stream>)>);

/// Counts a worker as waiting on some streams while it lives.
struct Waiting<'a>(&'a [Arc<Stream>]);

impl<'a> Waiting<'a> {
    fn new(streams: &'a [Arc<Stream>]) -> Self {
        for stream in streams {
            stream.waiting.fetch_add(1, Ordering::AcqRel);
            stream.resume.notify_one();
        }
        Waiting(streams)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        for stream in self.0 {
            stream.waiting.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Watch {
    /// This backend's place, and whether it is due for renewal.
    pub fn place(&self) -> (Place, bool) {
        let place = *self.place.locked();
        let due = place
            .renewed
            .is_none_or(|at| at.elapsed() >= MEMBERSHIP_RENEW);
        (place, due)
    }

    /// Records `consumer` as one of this backend's saga readers.
    pub fn joined(&self, consumer: &str) {
        let mut readers = self.readers.locked();
        if !readers.contains(consumer) {
            readers.insert(consumer.to_owned());
        }
    }

    /// Forgets `consumer`; `true` if it was the last saga reader (the
    /// backend's place is then given up).
    pub fn left(&self, consumer: &str) -> bool {
        let mut readers = self.readers.locked();
        let last = readers.remove(consumer) && readers.is_empty();
        if last {
            self.place.locked().renewed = None;
        }
        last
    }

    pub fn set_place(&self, rank: u16, size: u16) {
        *self.place.locked() = Place {
            rank,
            size: size.max(1),
            renewed: Some(Instant::now()),
        };
    }

    /// The counters of `queues` as they stand, watchers started where none
    /// runs. Taken before a round of reads, so that a message that arrives
    /// during the round is not missed by the wait after it.
    pub fn marks(&self, server: &Server, group: &str, block: Duration, queues: &[String]) -> Marks {
        let mut streams = self.streams.locked();
        Marks(
            queues
                .iter()
                .map(|queue| {
                    let stream = streams
                        .entry(queue.clone())
                        .or_insert_with(|| {
                            Arc::new(Stream {
                                woken: watch::channel(0).0,
                                wanted: Mutex::new(Instant::now()),
                                running: AtomicBool::new(false),
                                waiting: AtomicUsize::new(0),
                                resume: Notify::new(),
                            })
                        })
                        .clone();
                    *stream.wanted.locked() = Instant::now();
                    if !stream.running.swap(true, Ordering::AcqRel) {
                        tokio::spawn(run(
                            Arc::downgrade(&stream),
                            server.clone(),
                            queue.clone(),
                            group.to_owned(),
                            block,
                        ));
                    }
                    (queue.clone(), stream.woken.subscribe(), stream)
                })
                .collect(),
        )
    }
}

impl Marks {
    /// Waits until a watched stream grew since the marks were taken, or
    /// `timeout` passes; the stream that grew, if one did.
    pub async fn wait(self, timeout: Duration) -> Option<String> {
        if self.0.is_empty() {
            tokio::time::sleep(timeout).await;
            return None;
        }
        let (mut receivers, streams): (Vec<_>, Vec<_>) = self
            .0
            .into_iter()
            .map(|(queue, rx, stream)| ((queue, rx), stream))
            .unzip();
        let _waiting = Waiting::new(&streams);
        let changed = futures::future::select_all(receivers.iter_mut().map(|(queue, rx)| {
            Box::pin(async move { rx.changed().await.map(|()| queue.clone()) })
        }));
        let outcome = tokio::time::timeout(timeout, changed).await;
        match outcome {
            Ok((Ok(queue), _, _)) => Some(queue),
            // A watcher stopped: read again (the next round starts another).
            Ok((Err(_), _, _)) => None,
            Err(_) => None,
        }
    }
}

/// One watcher: blocks on `queue` past the last entry its group was
/// handed, and bumps the counter each time the stream grows.
async fn run(stream: Weak<Stream>, server: Server, queue: String, group: String, block: Duration) {
    let mut conn: Option<Conn> = None;
    let mut from: Option<String> = None;
    // After an error the stream's slot may have moved: look it up again.
    let mut failed = false;
    loop {
        {
            let Some(stream) = stream.upgrade() else {
                return;
            };
            let idle = stream.wanted.locked().elapsed();
            if idle > IDLE_WATCHER {
                stream.running.store(false, Ordering::Release);
                return;
            }
            // Nobody waiting: block again only once somebody does (reading
            // on from the last entry it saw, so that what arrived meanwhile
            // wakes that worker at once).
            if stream.waiting.load(Ordering::Acquire) == 0 {
                let _ = tokio::time::timeout(block, stream.resume.notified()).await;
                continue;
            }
        }
        let c = match &mut conn {
            Some(c) => c,
            None => match server.blocking_for(&queue, block, failed).await {
                Ok(c) => conn.insert(c),
                Err(error) => {
                    tracing::debug!(%error, queue, "a stream watcher could not connect; retrying");
                    failed = true;
                    wake(&stream);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            },
        };
        let start = match &from {
            Some(id) => id.clone(),
            None => match delivered(c, &queue, &group).await {
                Ok(id) => id,
                Err(error) => {
                    tracing::debug!(%error, queue, "a stream watcher could not read its group; retrying");
                    conn = None;
                    failed = true;
                    wake(&stream);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            },
        };
        let read: redis::RedisResult<Value> = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(super::ms(block))
            .arg("STREAMS")
            .arg(&queue)
            .arg(&start)
            .query_async(c)
            .await;
        match read {
            Ok(Value::Nil) => {
                failed = false;
                from = Some(start);
            }
            Ok(reply) => {
                failed = false;
                let last = entry::items(&reply)
                    .first()
                    .and_then(|s| entry::items(s).get(1).copied())
                    .map(entry::entries)
                    .and_then(|e| e.last().map(|(id, _)| id.clone()));
                from = Some(last.unwrap_or(start));
                wake(&stream);
            }
            Err(error) => {
                tracing::debug!(%error, queue, "a stream watcher's read failed; reconnecting");
                conn = None;
                failed = true;
                from = None;
                wake(&stream);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

fn wake(stream: &Weak<Stream>) {
    if let Some(stream) = stream.upgrade() {
        stream.woken.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// The last entry id `group` was handed on `queue` (`0-0` when the stream
/// or the group does not exist yet: then any entry is news).
async fn delivered(conn: &mut Conn, queue: &str, group: &str) -> redis::RedisResult<String> {
    let groups: redis::RedisResult<Value> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(queue)
        .query_async(conn)
        .await;
    let groups = match groups {
        Ok(groups) => groups,
        Err(e) if e.code() == Some("ERR") => return Ok("0-0".to_owned()),
        Err(e) => return Err(e),
    };
    for info in entry::items(&groups) {
        let fields = entry::fields(info);
        let field = |name: &[u8]| {
            fields
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| entry::text(v))
        };
        if field(b"name").as_deref() == Some(group) {
            return Ok(field(b"last-delivered-id").unwrap_or_else(|| "0-0".to_owned()));
        }
    }
    Ok("0-0".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_is_due_for_renewal_until_renewed() {
        let watch = Watch::default();
        assert!(watch.place().1, "never renewed");
        watch.set_place(2, 3);
        let (place, due) = watch.place();
        assert_eq!((place.rank, place.size, due), (2, 3, false));
    }
}
