//! The task protocol's scripts, case by case: the normal path, a stale
//! fence, a stale version, a missing task, a recorded cancellation, an
//! idempotent repeat. Each refusal is checked to leave the data as it was.

use redis::Value;

use super::Fixture;
use crate::backend::redis::keys::TaskKeys;
use crate::backend::redis::record::RawRecord;
use crate::backend::redis::scripts::{
    self as s, Beat, Call, Invocation, Locking, Op, RefusalCode, Refused, SettleArgv, Written,
};
use crate::backend::BackendError;
use crate::model::task::{TaskId, TaskStatus};

const DOC: &str = r#"{"n":1}"#;
const GROUP: &str = "workers";

fn id() -> TaskId {
    "00000000-0000-0000-0000-0000000000aa".parse().unwrap()
}

fn refused(refusal: RefusalCode, detail: Option<&str>) -> Refused {
    Refused {
        refusal,
        detail: detail.map(str::to_owned),
    }
}

fn written(version: u64, claimed: bool) -> Written {
    Written { version, claimed }
}

/// The three task writes as they were called before they became one
/// script (`apply.lua`), field by field, so that each case below reads as
/// the write it makes; each lowers into the effects the engine's writes
/// lower into (`backend/write.rs`), in the same order.
struct RecordAttempt {
    tk: TaskKeys,
    index_from: String,
    index_to: String,
    lease_fence: u64,
    version: u64,
    doc: String,
    claim: &'static str,
    status: TaskStatus,
    created_ms: u64,
    audit_cap: usize,
    fields: Vec<String>,
    apart: bool,
    audit_entries: Vec<String>,
}

struct RecordNext {
    attempt: RecordAttempt,
    queue: String,
    token: &'static str,
    renew: Option<(u64, String)>,
    group: &'static str,
    consumer: &'static str,
    unless_cancelled: bool,
}

struct Commit {
    tk: TaskKeys,
    queue: String,
    dead: String,
    delayed: String,
    index_from: String,
    index_to: String,
    expiring: String,
    lease_fence: u64,
    version: u64,
    doc: String,
    next: Option<(String, u64)>,
    settle: SettleArgv<'static>,
    unless_cancelled: bool,
    status: TaskStatus,
    expire_after_ms: Option<u64>,
    created_ms: u64,
    stored_member: Option<String>,
    new_member: String,
    dead_cap: u64,
    publish: Option<String>,
    audit_cap: usize,
    fields: Vec<String>,
    apart: bool,
    audit_entries: Vec<String>,
}

impl RecordAttempt {
    fn put(&self) -> Op<'static> {
        Op::Put {
            index_from: self.index_from.clone(),
            index_to: self.index_to.clone(),
            doc: self.doc.clone(),
            status: self.status,
            created_ms: self.created_ms,
            audit_cap: self.audit_cap,
            fields: self.fields.clone(),
            audit_entries: self.audit_entries.clone(),
        }
    }

    fn apply(&self, unless_cancelled: bool, mut more: Vec<Op<'static>>) -> s::Apply<'static> {
        let mut effects = vec![self.put(), Op::Claim(self.claim)];
        effects.append(&mut more);
        s::Apply {
            tk: self.tk.clone(),
            lease_fence: self.lease_fence,
            version: self.version,
            apart: self.apart,
            unless_cancelled,
            effects,
        }
    }
}

impl Commit {
    fn apply(&self) -> s::Apply<'static> {
        let mut effects = vec![Op::Put {
            index_from: self.index_from.clone(),
            index_to: self.index_to.clone(),
            doc: self.doc.clone(),
            status: self.status,
            created_ms: self.created_ms,
            audit_cap: self.audit_cap,
            fields: self.fields.clone(),
            audit_entries: self.audit_entries.clone(),
        }];
        if let Some((payload, delay_ms)) = &self.next {
            effects.push(Op::Enqueue {
                queue: self.queue.clone(),
                delayed: self.delayed.clone(),
                payload: payload.clone(),
                delay_ms: *delay_ms,
            });
        }
        if self.settle != SettleArgv::Keep {
            effects.push(Op::Settle {
                queue: self.queue.clone(),
                dead: self.dead.clone(),
                settle: self.settle.clone(),
                group: GROUP,
                dead_cap: self.dead_cap,
            });
        }
        effects.push(Op::Retain {
            expiring: self.expiring.clone(),
            expire_after_ms: self.expire_after_ms,
            stored_member: self.stored_member.clone(),
            new_member: self.new_member.clone(),
        });
        effects.push(Op::Unlock);
        if let Some(channel) = &self.publish {
            effects.push(Op::Announce {
                channel: channel.clone(),
            });
        }
        s::Apply {
            tk: self.tk.clone(),
            lease_fence: self.lease_fence,
            version: self.version,
            apart: self.apart,
            unless_cancelled: self.unless_cancelled,
            effects,
        }
    }
}

/// Each shape is called as the one write it lowers into.
macro_rules! called_as_apply {
    ($($shape:ty => |$it:ident| $apply:expr;)*) => {$(
        impl Call for $shape {
            type Reply = Result<Written, Refused>;
            fn script() -> &'static redis::Script {
                <s::Apply<'static> as Call>::script()
            }
            fn fill(&self, call: &mut Invocation) {
                let $it = self;
                $apply.fill(call)
            }
            fn decode(reply: Value) -> Result<Self::Reply, BackendError> {
                <s::Apply<'static> as Call>::decode(reply)
            }
        }
    )*};
}

called_as_apply! {
    RecordAttempt => |it| it.apply(false, Vec::new());
    RecordNext => |it| it.attempt.apply(
        it.unless_cancelled,
        it.renew
            .iter()
            .map(|(ttl_ms, entry)| Op::Renew {
                queue: it.queue.clone(),
                token: it.token,
                ttl_ms: *ttl_ms,
                group: it.group,
                consumer: it.consumer,
                entry: entry.clone(),
            })
            .collect(),
    );
    Commit => |it| it.apply();
}

impl Fixture {
    pub(super) fn create(&self, doc: &str) -> s::Create {
        let k = &self.keys;
        s::Create {
            task: k.task(id()),
            index_all: k.index(0, "orders", None),
            index_pending: k.index(0, "orders", Some(TaskStatus::Pending)),
            queue: k.queue(0),
            audit: k.audit(id()),
            doc: doc.to_owned(),
            id: id().to_string(),
            payload: "first".to_owned(),
            created_ms: 1000,
            audit_cap: 3,
            fields: Vec::new(),
            audit_entries: vec!["created".to_owned()],
        }
    }

    fn lock<'a>(&self, token: &'a str) -> s::Lock<'a> {
        let k = &self.keys;
        s::Lock {
            lock: k.lock(id()),
            fence: k.fence(id()),
            task: k.task(id()),
            cancel: k.cancel(id()),
            token,
            ttl_ms: 10_000,
        }
    }

    fn record(&self, fence: u64, version: u64, claim: &'static str) -> RecordAttempt {
        let k = &self.keys;
        RecordAttempt {
            tk: k.of_task(id()),
            index_from: k.index(0, "orders", Some(TaskStatus::Pending)),
            index_to: k.index(0, "orders", Some(TaskStatus::Running)),
            lease_fence: fence,
            version,
            doc: format!(r#"{{"v":{version}}}"#),
            claim,
            status: TaskStatus::Running,
            created_ms: 1000,
            audit_cap: 3,
            fields: Vec::new(),
            apart: false,
            audit_entries: vec![format!("attempt {claim}")],
        }
    }

    fn next(&self, fence: u64, version: u64, unless_cancelled: bool) -> RecordNext {
        let k = &self.keys;
        RecordNext {
            attempt: RecordAttempt {
                tk: k.of_task(id()),
                index_from: k.index(0, "orders", Some(TaskStatus::Running)),
                index_to: k.index(0, "orders", Some(TaskStatus::Running)),
                lease_fence: fence,
                version,
                doc: format!(r#"{{"v":{version}}}"#),
                claim: "next",
                status: TaskStatus::Running,
                created_ms: 1000,
                audit_cap: 3,
                fields: Vec::new(),
                apart: false,
                audit_entries: vec!["next".to_owned()],
            },
            queue: k.queue(0),
            token: "t1",
            renew: None,
            group: GROUP,
            consumer: "c1",
            unless_cancelled,
        }
    }

    fn commit(&self, fence: u64, version: u64) -> Commit {
        let k = &self.keys;
        Commit {
            tk: k.of_task(id()),
            queue: k.queue(0),
            dead: k.dead(0),
            delayed: k.delayed(0),
            index_from: k.index(0, "orders", Some(TaskStatus::Pending)),
            index_to: k.index(0, "orders", Some(TaskStatus::Running)),
            expiring: k.expiring(0),
            lease_fence: fence,
            version,
            doc: format!(r#"{{"v":{version}}}"#),
            next: None,
            settle: SettleArgv::Keep,
            unless_cancelled: false,
            status: TaskStatus::Running,
            expire_after_ms: None,
            created_ms: 1000,
            stored_member: None,
            new_member: format!("{}|Running|orders", id()),
            dead_cap: 100,
            publish: None,
            audit_cap: 3,
            fields: Vec::new(),
            apart: false,
            audit_entries: vec!["step".to_owned()],
        }
    }

    /// A created task, locked by `t1` (fence 1).
    async fn locked_task(&mut self) {
        assert_eq!(self.call(&self.create(DOC)).await.unwrap(), None);
        let taken = self.call(&self.lock("t1")).await.unwrap();
        assert!(
            matches!(taken, Locking::Taken { fence: 1, .. }),
            "{taken:?}"
        );
    }

    /// The task's record and audit log: what a refused write must leave.
    async fn task_state(&mut self) -> (Vec<String>, Vec<String>) {
        let task = self.keys.task(id());
        let audit = self.keys.audit(id());
        (
            self.cmd(&["HGETALL", &task]).await,
            self.cmd(&["LRANGE", &audit, "0", "-1"]).await,
        )
    }

    /// A message on partition 0's queue, delivered to consumer `c1` (with
    /// any other new message there).
    async fn delivered(&mut self, payload: &str) -> String {
        let queue = self.keys.queue(0);
        let _: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg(&["CREATE", &queue, GROUP, "0", "MKSTREAM"][..])
            .query_async(&mut self.conn)
            .await;
        let entry: String = self.cmd(&["XADD", &queue, "*", "payload", payload]).await;
        let _: Value = self
            .cmd(&["XREADGROUP", "GROUP", GROUP, "c1", "STREAMS", &queue, ">"])
            .await;
        entry
    }
}

#[tokio::test]
async fn create_writes_a_task_once() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    assert_eq!(f.call(&f.create(DOC)).await.unwrap(), None);
    let record: Vec<String> = f.cmd(&["HGETALL", &k.task(id())]).await;
    // The status `create.lua` writes is the one Rust stores for Pending.
    let pending = TaskStatus::Pending.as_str();
    assert_eq!(record, ["doc", DOC, "version", "1", "status", pending]);
    for index in [
        k.index(0, "orders", None),
        k.index(0, "orders", Some(TaskStatus::Pending)),
    ] {
        let score: Option<u64> = f.cmd(&["ZSCORE", &index, &id().to_string()]).await;
        assert_eq!(score, Some(1000), "{index}");
    }
    let audit: Vec<String> = f.cmd(&["LRANGE", &k.audit(id()), "0", "-1"]).await;
    assert_eq!(audit, ["created"]);

    // The same create again: the stored record, nothing written.
    assert_eq!(
        f.call(&f.create(r#"{"n":2}"#)).await.unwrap(),
        Some(RawRecord {
            doc: Some(DOC.to_owned()),
            version: Some("1".to_owned()),
            apart: false,
        })
    );
    let len: u64 = f.cmd(&["XLEN", &k.queue(0)]).await;
    assert_eq!(len, 1, "one first message");
    let audit: Vec<String> = f.cmd(&["LRANGE", &k.audit(id()), "0", "-1"]).await;
    assert_eq!(audit, ["created"]);
}

#[tokio::test]
async fn lock_takes_a_fenced_lease_of_a_task_that_exists() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    // No task: nothing written, not even a fence.
    assert_eq!(f.call(&f.lock("t1")).await.unwrap(), Locking::Missing);
    let exists: u64 = f.cmd(&["EXISTS", &k.fence(id()), &k.lock(id())]).await;
    assert_eq!(exists, 0);

    f.call(&f.create(DOC)).await.unwrap();
    let taken = Locking::Taken {
        fence: 1,
        record: RawRecord {
            doc: Some(DOC.to_owned()),
            version: Some("1".to_owned()),
            apart: false,
        },
        cancel: None,
    };
    assert_eq!(f.call(&f.lock("t1")).await.unwrap(), taken);
    assert_eq!(f.call(&f.lock("t2")).await.unwrap(), Locking::Busy);

    // Released by its token only, once.
    let unlock = |token| s::Unlock {
        lock: k.lock(id()),
        token,
    };
    assert!(!f.call(&unlock("t2")).await.unwrap());
    assert!(f.call(&unlock("t1")).await.unwrap());
    assert!(!f.call(&unlock("t1")).await.unwrap());

    // A new fence each time; the cancellation flag comes along.
    let _: () = f.cmd(&["SET", &k.cancel(id()), "5|c"]).await;
    let taken = Locking::Taken {
        fence: 2,
        record: RawRecord {
            doc: Some(DOC.to_owned()),
            version: Some("1".to_owned()),
            apart: false,
        },
        cancel: Some("5|c".to_owned()),
    };
    assert_eq!(f.call(&f.lock("t2")).await.unwrap(), taken);
}

#[tokio::test]
async fn record_attempt_checks_fence_and_version_first() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    f.locked_task().await;
    let before = f.task_state().await;
    let cases = [
        (
            "stale fence",
            0,
            1,
            refused(RefusalCode::LockLost, Some("1")),
        ),
        (
            "stale version",
            1,
            7,
            refused(RefusalCode::Conflict, Some("1")),
        ),
    ];
    for (case, fence, version, expected) in cases {
        let reply = f.call(&f.record(fence, version, "a1")).await.unwrap();
        assert_eq!(reply, Err(expected), "{case}");
        assert_eq!(f.task_state().await, before, "{case}: nothing written");
    }

    // The normal path: the record, the index entry moved, the claim.
    let reply = f.call(&f.record(1, 1, "a1")).await.unwrap();
    assert_eq!(reply, Ok(written(2, true)));
    let status: String = f.cmd(&["HGET", &k.task(id()), "status"]).await;
    assert_eq!(status, "Running");
    let running: Vec<String> = f
        .cmd(&[
            "ZRANGE",
            &k.index(0, "orders", Some(TaskStatus::Running)),
            "0",
            "-1",
        ])
        .await;
    let pending: u64 = f
        .cmd(&["ZCARD", &k.index(0, "orders", Some(TaskStatus::Pending))])
        .await;
    assert_eq!((running, pending), (vec![id().to_string()], 0));

    // The same claim again (a repeat): written, the claim not new.
    let reply = f.call(&f.record(1, 2, "a1")).await.unwrap();
    assert_eq!(reply, Ok(written(3, false)));
    // The log keeps its last three entries.
    let audit: Vec<String> = f.cmd(&["LRANGE", &k.audit(id()), "0", "-1"]).await;
    assert_eq!(audit, ["created", "attempt a1", "attempt a1"]);
    let reply = f.call(&f.record(1, 3, "a2")).await.unwrap();
    assert_eq!(reply, Ok(written(4, true)));
    let audit: Vec<String> = f.cmd(&["LRANGE", &k.audit(id()), "0", "-1"]).await;
    assert_eq!(audit, ["attempt a1", "attempt a1", "attempt a2"]);

    // The record gone (expired), the fence left: missing.
    let _: () = f.cmd(&["DEL", &k.task(id())]).await;
    let reply = f.call(&f.record(1, 4, "a3")).await.unwrap();
    assert_eq!(reply, Err(refused(RefusalCode::Missing, None)));
}

#[tokio::test]
async fn record_next_refuses_a_recorded_cancellation_when_asked() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    f.locked_task().await;
    let _: () = f.cmd(&["SET", &k.cancel(id()), "9|x"]).await;
    let before = f.task_state().await;
    let cases = [
        (
            "stale fence",
            2,
            1,
            refused(RefusalCode::LockLost, Some("1")),
        ),
        (
            "stale version",
            1,
            2,
            refused(RefusalCode::Conflict, Some("1")),
        ),
        (
            "cancelled",
            1,
            1,
            refused(RefusalCode::CancelRequested, Some("9|x")),
        ),
    ];
    for (case, fence, version, expected) in cases {
        let reply = f.call(&f.next(fence, version, true)).await.unwrap();
        assert_eq!(reply, Err(expected), "{case}");
        assert_eq!(f.task_state().await, before, "{case}: nothing written");
    }
    // Not asked to: written.
    let reply = f.call(&f.next(1, 1, false)).await.unwrap();
    assert_eq!(reply, Ok(written(2, true)));

    // A renewal sets the lease again (it expired, nobody noticed: the
    // fence is still the latest) and keeps the message.
    let entry = f.delivered("m").await;
    let _: () = f.cmd(&["DEL", &k.lock(id())]).await;
    let mut renewing = f.next(1, 2, false);
    renewing.renew = Some((60_000, entry.clone()));
    assert_eq!(f.call(&renewing).await.unwrap(), Ok(written(3, false)));
    let holder: Option<String> = f.cmd(&["GET", &k.lock(id())]).await;
    let ttl: i64 = f.cmd(&["PTTL", &k.lock(id())]).await;
    assert_eq!(holder.as_deref(), Some("t1"));
    assert!(ttl > 10_000, "renewed for 60 s: {ttl}");
    let pending: Vec<(String, String, u64, u64)> = f
        .cmd(&["XPENDING", &k.queue(0), GROUP, "-", "+", "10"])
        .await;
    let kept = pending
        .iter()
        .find(|p| p.0 == entry)
        .expect("still pending");
    assert_eq!(kept.1, "c1");
}

#[tokio::test]
async fn commit_refuses_before_writing() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    f.locked_task().await;
    let entry = f.delivered("m").await;
    let _: () = f.cmd(&["SET", &k.cancel(id()), "9|x"]).await;
    let queue_before: u64 = f.cmd(&["XLEN", &k.queue(0)]).await;
    let before = f.task_state().await;
    let cases = [
        (
            "stale fence",
            3,
            1,
            false,
            refused(RefusalCode::LockLost, Some("1")),
        ),
        (
            "stale version",
            1,
            9,
            false,
            refused(RefusalCode::Conflict, Some("1")),
        ),
        (
            "cancelled",
            1,
            1,
            true,
            refused(RefusalCode::CancelRequested, Some("9|x")),
        ),
    ];
    for (case, fence, version, unless_cancelled, expected) in cases {
        let mut commit = f.commit(fence, version);
        commit.unless_cancelled = unless_cancelled;
        commit.next = Some(("next".to_owned(), 0));
        commit.settle = SettleArgv::Ack {
            entry: entry.clone(),
        };
        assert_eq!(f.call(&commit).await.unwrap(), Err(expected), "{case}");
        assert_eq!(f.task_state().await, before, "{case}: nothing written");
        let len: u64 = f.cmd(&["XLEN", &k.queue(0)]).await;
        let holder: Option<String> = f.cmd(&["GET", &k.lock(id())]).await;
        assert_eq!(
            (len, holder.as_deref()),
            (queue_before, Some("t1")),
            "{case}"
        );
    }
    let _: () = f.cmd(&["DEL", &k.task(id())]).await;
    let reply = f.call(&f.commit(1, 1)).await.unwrap();
    assert_eq!(reply, Err(refused(RefusalCode::Missing, None)));
    // An argument out of range is an error, before any write.
    f.call(&f.create(DOC)).await.unwrap();
    let mut commit = f.commit(1, 1);
    commit.next = Some(("next".to_owned(), 100_000_000_000_000));
    let error = f.call(&commit).await.unwrap_err();
    assert!(matches!(error, BackendError::Rejected(_)), "{error:?}");
    assert!(
        error.to_string().contains("out of range: 100000000000000"),
        "{error}"
    );
}

#[tokio::test]
async fn commit_writes_settles_and_releases() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    f.locked_task().await;
    let entry = f.delivered("m").await;
    let mut commit = f.commit(1, 1);
    commit.next = Some(("next".to_owned(), 0));
    commit.settle = SettleArgv::Ack { entry };
    assert_eq!(f.call(&commit).await.unwrap(), Ok(written(2, false)));
    let holder: Option<String> = f.cmd(&["GET", &k.lock(id())]).await;
    assert_eq!(holder, None, "the lease released");
    let queue: Vec<(String, Vec<String>)> = f.cmd(&["XRANGE", &k.queue(0), "-", "+"]).await;
    let payloads: Vec<&str> = queue.iter().map(|(_, f)| f[1].as_str()).collect();
    assert_eq!(
        payloads,
        ["first", "next"],
        "the message settled, the next one sent"
    );

    // Delayed as the writer says, cancellation requested or not: whether
    // a cancellation cuts a wait short is the engine's decision, made by
    // asking to be refused.
    let mut commit = f.commit(1, 2);
    commit.next = Some(("later".to_owned(), 60_000));
    f.call(&commit).await.unwrap().unwrap();
    let _: () = f.cmd(&["SET", &k.cancel(id()), "9|x"]).await;
    let mut commit = f.commit(1, 3);
    commit.next = Some(("wake".to_owned(), 60_000));
    f.call(&commit).await.unwrap().unwrap();
    let delayed: Vec<String> = f.cmd(&["ZRANGE", &k.delayed(0), "0", "-1"]).await;
    assert_eq!(delayed, ["0:later", "0:wake"], "both wait");
    let len: u64 = f.cmd(&["XLEN", &k.queue(0)]).await;
    assert_eq!(len, 2, "nothing enqueued now");

    // The end: parked as a dead letter, kept for a while, announced.
    let entry = f.delivered("poison").await;
    let mut commit = f.commit(1, 4);
    commit.status = TaskStatus::DeadLettered;
    commit.index_to = k.index(0, "orders", Some(TaskStatus::DeadLettered));
    commit.new_member = format!("{}|DeadLettered|orders", id());
    commit.expire_after_ms = Some(60_000);
    commit.publish = Some(k.finished_channel());
    commit.settle = SettleArgv::Dead {
        entry,
        payload: "pois",
        reason: "bad",
        size: Some(6),
    };
    assert_eq!(f.call(&commit).await.unwrap(), Ok(written(5, false)));
    let letters: Vec<(String, Vec<String>)> = f.cmd(&["XRANGE", &k.dead(0), "-", "+"]).await;
    let fields = &letters[0].1;
    assert_eq!(
        fields[..6],
        [
            "payload",
            "pois",
            "reason",
            "bad",
            "task",
            &id().to_string()
        ]
    );
    assert_eq!(fields[8..], ["size", "6"]);
    let ttl: i64 = f.cmd(&["PTTL", &k.task(id())]).await;
    assert!(ttl > 0 && ttl <= 60_000, "{ttl}");
    let member: Vec<String> = f.cmd(&["ZRANGE", &k.expiring(0), "0", "-1"]).await;
    assert_eq!(member, [format!("{}|DeadLettered|orders", id())]);
}

#[tokio::test]
async fn heartbeat_extends_only_its_own_lease() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    f.locked_task().await;
    let entry = f.delivered("m").await;
    let beat = |token| s::Heartbeat {
        lock: k.lock(id()),
        queue: k.queue(0),
        cancel: k.cancel(id()),
        task: k.task(id()),
        token,
        ttl_ms: 60_000,
        group: GROUP,
        consumer: "c1",
        entry: entry.clone(),
    };
    let not_held = Beat {
        held: false,
        cancel: None,
    };
    assert_eq!(f.call(&beat("t2")).await.unwrap(), not_held);
    let ttl: i64 = f.cmd(&["PTTL", &k.lock(id())]).await;
    assert!(ttl <= 10_000, "not extended: {ttl}");
    let held = Beat {
        held: true,
        cancel: None,
    };
    assert_eq!(f.call(&beat("t1")).await.unwrap(), held);
    let ttl: i64 = f.cmd(&["PTTL", &k.lock(id())]).await;
    assert!(ttl > 10_000, "extended: {ttl}");
    let _: () = f.cmd(&["SET", &k.cancel(id()), "9|x"]).await;
    let cancelled = Beat {
        held: true,
        cancel: Some("9|x".to_owned()),
    };
    assert_eq!(f.call(&beat("t1")).await.unwrap(), cancelled);
}

#[tokio::test]
async fn cancel_records_a_request_once() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    let cancel = |at_ms, token| s::Cancel {
        cancel: k.cancel(id()),
        task: k.task(id()),
        queue: k.queue(0),
        at_ms,
        token,
        channel: k.cancel_channel(),
        id: id().to_string(),
        wake: "wake".to_owned(),
        audit: k.audit(id()),
        audit_cap: 1000,
        audit_entries: vec![format!("{{\"token\":\"{token}\"}}")],
    };
    // No task: nothing recorded.
    assert_eq!(f.call(&cancel(100, "a")).await.unwrap(), None);
    let exists: u64 = f.cmd(&["EXISTS", &k.cancel(id()), &k.queue(0)]).await;
    assert_eq!(exists, 0);

    f.call(&f.create(DOC)).await.unwrap();
    let cases = [
        ("new", 100, "a", None),
        ("the same request again", 200, "a", None),
        ("another request", 300, "b", Some("100")),
    ];
    for (case, at, token, expected) in cases {
        let reply = f.call(&cancel(at, token)).await.unwrap();
        assert_eq!(reply.as_deref(), expected, "{case}");
    }
    let flag: Option<String> = f.cmd(&["GET", &k.cancel(id())]).await;
    assert_eq!(flag.as_deref(), Some("100|a"));
    let len: u64 = f.cmd(&["XLEN", &k.queue(0)]).await;
    assert_eq!(len, 2, "the first message and one wake-up");
    // Who asked is appended once, with the request that was recorded.
    let audit: Vec<String> = f.cmd(&["LRANGE", &k.audit(id()), "0", "-1"]).await;
    let asked: Vec<&String> = audit.iter().filter(|e| e.contains("token")).collect();
    assert_eq!(asked, [&"{\"token\":\"a\"}".to_owned()], "{audit:?}");
}

/// Record layout 2: the fixed fields in `h`, the changing ones in `doc`,
/// `n` and one field per step; a write sets the fields it is given and
/// leaves the others as stored; `lock` and `create` read the record back
/// whole, as one JSON object; more fields than Lua unpacks at once are
/// written in chunks.
#[tokio::test]
async fn records_with_their_steps_apart_are_written_by_field_and_read_whole() {
    let mut f = Fixture::new().await;
    let pairs = |p: &[(&str, &str)]| -> Vec<String> {
        p.iter()
            .flat_map(|(k, v)| [k.to_string(), v.to_string()])
            .collect()
    };
    let mut create = f.create(r#"{"status":1}"#);
    create.fields = pairs(&[
        ("n", "2"),
        ("h", r#"{"id":7}"#),
        ("s:0", "10"),
        ("s:1", "20"),
    ]);
    assert_eq!(f.call(&create).await.unwrap(), None);
    let record = |doc: &str, version: &str| RawRecord {
        doc: Some(doc.to_owned()),
        version: Some(version.to_owned()),
        apart: true,
    };
    // Created again: the stored record, whole.
    let whole = r#"{"id":7,"status":1,"steps":[10,20]}"#;
    assert_eq!(f.call(&create).await.unwrap(), Some(record(whole, "1")));
    let taken = f.call(&f.lock("t1")).await.unwrap();
    let Locking::Taken { record: got, .. } = taken else {
        panic!("{taken:?}")
    };
    assert_eq!(got, record(whole, "1"));

    // One step changed: only its field is sent, the other is kept.
    // The control state is in the record: the fence the lock took, the
    // claim the write makes.
    let mut write = f.record(1, 1, "one");
    write.apart = true;
    write.doc = r#"{"status":2}"#.to_owned();
    write.fields = pairs(&[("n", "2"), ("s:1", "21")]);
    assert_eq!(f.call(&write).await.unwrap(), Ok(written(2, true)));
    let (fields, _) = f.task_state().await;
    let stored: std::collections::HashMap<_, _> = fields
        .chunks(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect();
    assert_eq!(stored["s:0"], "10");
    assert_eq!(stored["s:1"], "21");
    assert_eq!(stored["h"], r#"{"id":7}"#);
    assert_eq!(stored["version"], "2");
    assert_eq!(stored["fence"], "1");
    assert_eq!(stored["c:one"], "1");
    let apart_keys: u64 = f
        .cmd(&["EXISTS", &f.keys.fence(id()), &f.keys.claims(id())])
        .await;
    assert_eq!(apart_keys, 0, "no fence or claims key of its own");
    // A stale fence is refused; the same claim again is not new.
    let mut stale = f.record(0, 2, "one");
    stale.apart = true;
    assert_eq!(
        f.call(&stale).await.unwrap(),
        Err(refused(RefusalCode::LockLost, Some("1")))
    );
    let mut again = f.record(1, 2, "one");
    again.apart = true;
    again.fields = pairs(&[("n", "2")]);
    assert_eq!(f.call(&again).await.unwrap(), Ok(written(3, false)));

    // 700 steps: 1,400 values, past what one unpack takes.
    let mut many = vec![("n".to_owned(), "700".to_owned())];
    many.extend((0..700).map(|i| (format!("s:{i}"), i.to_string())));
    let mut big = f.record(1, 3, "two");
    big.apart = true;
    big.doc = r#"{"status":3}"#.to_owned();
    big.fields = many.into_iter().flat_map(|(k, v)| [k, v]).collect();
    assert_eq!(f.call(&big).await.unwrap(), Ok(written(4, true)));
    let unlock = s::Unlock {
        lock: f.keys.lock(id()),
        token: "t1",
    };
    assert!(f.call(&unlock).await.unwrap());
    let Locking::Taken {
        record: got, fence, ..
    } = f.call(&f.lock("t2")).await.unwrap()
    else {
        panic!("not taken")
    };
    assert_eq!(fence, 2, "the next fence, from the record");
    let doc: serde_json::Value = serde_json::from_str(&got.doc.unwrap()).unwrap();
    // In order, across the first read's 8 and the rest.
    let steps: Vec<u64> = (0..700).collect();
    assert_eq!(doc["steps"], serde_json::json!(steps));
    assert_eq!(doc["status"], 3);

    // A step missing in either read is read as null, in its place.
    let _: u64 = f.cmd(&["HDEL", &f.keys.task(id()), "s:3", "s:500"]).await;
    assert!(f
        .call(&s::Unlock {
            lock: f.keys.lock(id()),
            token: "t2"
        })
        .await
        .unwrap());
    let Locking::Taken { record: got, .. } = f.call(&f.lock("t3")).await.unwrap() else {
        panic!("not taken")
    };
    let doc: serde_json::Value = serde_json::from_str(&got.doc.unwrap()).unwrap();
    let steps = doc["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 700);

    // A damaged step count (beyond the hash's fields, or no count) is
    // answered at once as a record that does not parse.
    for n in ["4000000000", "-3", "2.5"] {
        let _: u64 = f.cmd(&["HSET", &f.keys.task(id()), "n", n]).await;
        let unlock = s::Unlock {
            lock: f.keys.lock(id()),
            token: "t3",
        };
        let _ = f.call(&unlock).await.unwrap();
        let Locking::Taken { record: got, .. } = f.call(&f.lock("t3")).await.unwrap() else {
            panic!("not taken")
        };
        let doc = got.doc.unwrap();
        assert!(doc.contains("unreadable"), "n = {n}: {doc}");
        assert!(RawRecord {
            doc: Some(doc),
            ..Default::default()
        }
        .parse()
        .is_err());
    }
    assert_eq!(
        (steps[2].clone(), steps[3].clone(), steps[4].clone()),
        (2.into(), serde_json::Value::Null, 4.into())
    );
    assert_eq!(
        (steps[499].clone(), steps[500].clone(), steps[501].clone()),
        (499.into(), serde_json::Value::Null, 501.into())
    );
}
