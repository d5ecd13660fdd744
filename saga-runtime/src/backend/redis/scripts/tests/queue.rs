//! The work queue's and the endpoints' scripts, case by case.

use redis::Value;

use super::Fixture;
use crate::backend::redis::record::RawRecord;
use crate::backend::redis::scripts::{self as s, Claimed, EndpointTaken, Loaded, Released, Taken};
use crate::model::task::TaskId;

const GROUP: &str = "workers";

fn id() -> TaskId {
    "00000000-0000-0000-0000-0000000000bb".parse().unwrap()
}

/// A stream entry's fields as Redis answers them.
fn fields(pairs: &[&str]) -> Value {
    Value::Array(
        pairs
            .iter()
            .map(|p| Value::BulkString(p.as_bytes().to_vec()))
            .collect(),
    )
}

fn saga_message(task: TaskId) -> String {
    format!(r#"{{"task_id":"{task}"}}"#)
}

impl Fixture {
    fn take<'a>(&self, own: bool, token: &'a str, prefixes: &[String]) -> s::Take<'a> {
        s::Take {
            streams: prefixes
                .iter()
                .enumerate()
                .map(|(p, prefix)| s::TakeFrom {
                    queue: self.keys.queue(p as u16),
                    prefix: prefix.clone(),
                })
                .collect(),
            group: GROUP,
            consumer: "c1",
            first: 0,
            own,
            token,
            ttl_ms: 10_000,
            max: 10,
        }
    }
}

#[tokio::test]
async fn take_reads_messages_and_leases_their_tasks() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    let queue = k.queue(0);
    f.group(&queue).await;
    let _: () = f
        .cmd(&["HSET", &k.task(id()), "doc", "{}", "version", "4"])
        .await;
    let other: TaskId = "00000000-0000-0000-0000-0000000000cc".parse().unwrap();
    let payloads = [
        saga_message(id()),
        saga_message(id()),
        saga_message(other),
        "not json".to_owned(),
    ];
    let mut entries = Vec::new();
    for payload in &payloads {
        entries.push(f.add(&queue, payload).await);
    }
    let taken = f
        .call(&f.take(false, "tok", &[k.task_prefix(0)]))
        .await
        .unwrap();
    let loaded = [
        // The task's lease, taken.
        Loaded::Lease {
            fence: 1,
            task: id(),
            record: RawRecord {
                doc: Some("{}".to_owned()),
                version: Some("4".to_owned()),
                apart: false,
            },
            cancel: None,
        },
        // A second message of the task in the same read: the lease is
        // taken.
        Loaded::Busy { task: id() },
        // A task that does not exist here; a message that does not decode.
        Loaded::Nothing,
        Loaded::Nothing,
    ];
    let expected: Vec<Taken> = (0..4)
        .map(|i| Taken {
            stream: 0,
            id: entries[i].clone(),
            fields: fields(&["payload", &payloads[i]]),
            deliveries: 1,
            loaded: loaded[i].clone(),
        })
        .collect();
    assert_eq!(taken, expected);
    let holder: Option<String> = f.cmd(&["GET", &k.lock(id())]).await;
    assert_eq!(holder.as_deref(), Some("tok"));
    let exists: u64 = f.cmd(&["EXISTS", &k.fence(other), &k.lock(other)]).await;
    assert_eq!(exists, 0, "nothing written for a task that is not there");

    // Nothing new; this consumer's own messages again, counted.
    let none = f.call(&f.take(false, "t2", &[k.task_prefix(0)])).await;
    assert!(none.unwrap().is_empty());
    let mut own = f.take(true, "t2", &[k.task_prefix(0)]);
    own.max = 2;
    let again = f.call(&own).await.unwrap();
    let seen: Vec<(&str, u64, &Loaded)> = again
        .iter()
        .map(|t| (t.id.as_str(), t.deliveries, &t.loaded))
        .collect();
    let busy = Loaded::Busy { task: id() };
    assert_eq!(
        seen,
        [
            (entries[0].as_str(), 2, &busy),
            (entries[1].as_str(), 2, &busy)
        ]
    );
}

/// A saga message as the engine writes it is read without decoding it
/// (`saga_task` in take.lua); anything else that names a task still goes
/// through the decoder, which alone tells a process-manager message.
#[tokio::test]
async fn take_reads_a_written_saga_message_and_decodes_every_other_shape() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    let queue = k.queue(0);
    f.group(&queue).await;
    let tasks: Vec<TaskId> = (0..4)
        .map(|i| {
            format!("00000000-0000-0000-0000-00000000001{i}")
                .parse()
                .unwrap()
        })
        .collect();
    for task in &tasks {
        let _: () = f
            .cmd(&["HSET", &k.task(*task), "doc", "{}", "version", "1"])
            .await;
    }
    let payloads = [
        // As written (`WorkItem::encode`).
        format!(r#"{{"task_id":"{}","saga":"orders","seq":3}}"#, tasks[0]),
        // An escaped quote in the saga name, and spaces: decoded.
        format!(r#"{{"task_id":"{}","saga":"or\"ders","seq":3}}"#, tasks[1]),
        format!(
            r#"{{ "task_id": "{}", "saga": "orders", "seq": 3 }}"#,
            tasks[2]
        ),
        // The same start with a `process` key: not a saga message.
        format!(
            r#"{{"task_id":"{}","saga":"orders","seq":3,"process":"p"}}"#,
            tasks[3]
        ),
    ];
    for payload in &payloads {
        f.add(&queue, payload).await;
    }
    let taken = f
        .call(&f.take(false, "tok", &[k.task_prefix(0)]))
        .await
        .unwrap();
    let leased: Vec<Option<TaskId>> = taken
        .iter()
        .map(|t| match &t.loaded {
            Loaded::Lease { task, .. } => Some(*task),
            _ => None,
        })
        .collect();
    assert_eq!(
        leased,
        [Some(tasks[0]), Some(tasks[1]), Some(tasks[2]), None]
    );
}

#[tokio::test]
async fn take_loads_the_instance_of_a_process_manager_message() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    let stream = k.process_partition(3);
    let queue = k.queue(stream);
    f.group(&queue).await;
    let tag = k.process_prefix(stream);
    let _: () = f
        .cmd(&[
            "HSET",
            &format!("{tag}:inst:orders:i1"),
            "doc",
            "{}",
            "version",
            "2",
        ])
        .await;
    let _: () = f
        .cmd(&["SET", &format!("{tag}:idx:orders:order:42"), "i1"])
        .await;
    let payloads = [
        r#"{"process":"orders","instance_id":"i1"}"#,
        r#"{"process":"orders","key":"42","key_field":"order"}"#,
        r#"{"process":"orders","key":"43","key_field":"order"}"#,
    ];
    for payload in payloads {
        f.add(&queue, payload).await;
    }
    let mut take = f.take(false, "tok", &[format!("pm|{tag}")]);
    take.streams[0].queue = queue;
    let taken = f.call(&take).await.unwrap();
    let loaded: Vec<&Loaded> = taken.iter().map(|t| &t.loaded).collect();
    let instance = |key: &str, field: Option<&str>, found: bool| Loaded::Instance {
        key: key.to_owned(),
        key_field: field.map(str::to_owned),
        doc: found.then(|| "{}".to_owned()),
        version: found.then(|| "2".to_owned()),
    };
    assert_eq!(
        loaded,
        [
            &instance("i1", None, true),
            &instance("42", Some("order"), true),
            &instance("43", Some("order"), false),
        ]
    );
}

#[tokio::test]
async fn claim_takes_over_idle_messages() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    let queue = k.queue(0);
    f.group(&queue).await;
    let first = f.add(&queue, "a").await;
    let second = f.add(&queue, "b").await;
    f.read(&queue, "c1").await;
    let claim = |min_idle_ms| s::Claim {
        queues: vec![k.queue(5), queue.clone()],
        group: GROUP,
        consumer: "c2",
        min_idle_ms,
        count: 1,
    };
    // A queue without the group (a server restarted empty): `NOGROUP`,
    // on which the backend recreates the groups and calls again.
    let error = f.call(&claim(0)).await.unwrap_err();
    assert!(error.to_string().contains("NOGROUP"), "{error}");
    f.group(&k.queue(5)).await;
    // Not idle long enough.
    assert_eq!(f.call(&claim(60_000)).await.unwrap(), None);
    let claimed = Claimed {
        queue: 1,
        id: first.clone(),
        deliveries: 2,
        fields: fields(&["payload", "a"]),
    };
    assert_eq!(f.call(&claim(0)).await.unwrap(), Some(claimed));
    // An entry deleted while pending is dropped from the pending list.
    let _: u64 = f.cmd(&["XDEL", &queue, &first]).await;
    assert_eq!(f.call(&claim(0)).await.unwrap(), None);
    let pending: Vec<Value> = f.cmd(&["XPENDING", &queue, GROUP, "-", "+", "10"]).await;
    assert_eq!(pending.len(), 1, "only the second is pending");
    let claimed = Claimed {
        queue: 1,
        id: second,
        deliveries: 2,
        fields: fields(&["payload", "b"]),
    };
    assert_eq!(f.call(&claim(0)).await.unwrap(), Some(claimed));
}

#[tokio::test]
async fn release_hands_back_only_its_own_message() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    let queue = k.queue(0);
    f.group(&queue).await;
    let entry = f.add(&queue, "p").await;
    f.read(&queue, "c1").await;
    let release = |consumer, entry: &str, delay_ms, answered| s::Release {
        queue: k.queue(0),
        delayed: k.delayed(0),
        group: GROUP,
        consumer,
        entry: entry.to_owned(),
        delay_ms,
        answered,
    };
    // Another consumer's: not handed back, left alone.
    assert_eq!(
        f.call(&release("c2", &entry, 0, true)).await.unwrap(),
        Released::NotOurs
    );
    assert_eq!(f.entries(&queue).await.len(), 1);
    // Answered now: a copy with no unanswered delivery.
    assert_eq!(
        f.call(&release("c1", &entry, 0, true)).await.unwrap(),
        Released::HandedBack
    );
    let now = f.entries(&queue).await;
    assert_eq!(now.len(), 1);
    assert_ne!(now[0].0, entry);
    assert_eq!(now[0].1, ["payload", "p", "unanswered", "0"]);
    // Unanswered, after a delay: on the delayed set, the delivery counted.
    f.read(&queue, "c1").await;
    assert_eq!(
        f.call(&release("c1", &now[0].0, 5000, false))
            .await
            .unwrap(),
        Released::HandedBack
    );
    let delayed: Vec<String> = f.cmd(&["ZRANGE", &k.delayed(0), "0", "-1"]).await;
    assert_eq!(delayed, ["1:p"]);
    assert!(f.entries(&queue).await.is_empty());
    // Settled meanwhile: nothing to hand back.
    assert_eq!(
        f.call(&release("c1", &now[0].0, 0, true)).await.unwrap(),
        Released::NotOurs
    );
}

/// An entry with no `payload` field (its field name not UTF-8, say) has
/// nothing a copy could carry: it is left pending, untouched, for its
/// consumer to dead-letter. (It used to be acknowledged and deleted: lost.)
#[tokio::test]
async fn release_leaves_an_entry_without_a_payload_pending() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    let queue = k.queue(0);
    f.group(&queue).await;
    let entry: String = redis::cmd("XADD")
        .arg(&queue)
        .arg("*")
        .arg(&[0xffu8, 0xfe][..])
        .arg("x")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    f.read(&queue, "c1").await;
    for (delay_ms, answered) in [(0, true), (5000, false)] {
        let release = s::Release {
            queue: k.queue(0),
            delayed: k.delayed(0),
            group: GROUP,
            consumer: "c1",
            entry: entry.clone(),
            delay_ms,
            answered,
        };
        assert_eq!(f.call(&release).await.unwrap(), Released::NoPayload);
    }
    let pending: Vec<Value> = f.cmd(&["XPENDING", &queue, GROUP, "-", "+", "10"]).await;
    assert_eq!(pending.len(), 1);
    let entries: Vec<Value> = f.cmd(&["XRANGE", &queue, "-", "+"]).await;
    assert_eq!(entries.len(), 1);
    let delayed: Vec<String> = f.cmd(&["ZRANGE", &k.delayed(0), "0", "-1"]).await;
    assert!(delayed.is_empty(), "{delayed:?}");
}

#[tokio::test]
async fn dead_letter_parks_then_settles() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    let queue = k.queue(0);
    f.group(&queue).await;
    let entry = f.add(&queue, "poison").await;
    f.read(&queue, "c1").await;
    let dead_letter = |entry: &str| s::DeadLetter {
        queue: k.queue(0),
        dead: k.dead(0),
        group: GROUP,
        entry: entry.to_owned(),
        payload: "pois",
        reason: "bad",
        task: Some(id()),
        size: Some(6),
        dead_cap: 100,
    };
    let letter = f.call(&dead_letter(&entry)).await.unwrap();
    let letters = f.entries(&k.dead(0)).await;
    assert_eq!(letters[0].0, letter);
    let parked = &letters[0].1;
    assert_eq!(
        parked[..6],
        [
            "payload",
            "pois",
            "reason",
            "bad",
            "task",
            &id().to_string()
        ]
    );
    assert_eq!(parked[8..], ["size", "6"]);
    assert!(f.entries(&queue).await.is_empty(), "settled");
    // With the group gone (a server restarted empty): parked all the same.
    let other = f.add(&k.queue(1), "x").await;
    let mut lost = dead_letter(&other);
    lost.queue = k.queue(1);
    lost.task = None;
    lost.size = None;
    f.call(&lost).await.unwrap();
    let letters = f.entries(&k.dead(0)).await;
    assert_eq!(
        letters[1].1[..6],
        ["payload", "pois", "reason", "bad", "task", ""]
    );
    assert_eq!(letters[1].1.len(), 8, "no size: not cut");

    // Requeued: its payload back on the queue, the letter gone; once.
    let requeue = s::Requeue {
        dead: k.dead(0),
        queue: k.queue(0),
        entry: letter.clone(),
    };
    let requeued = f.call(&requeue).await.unwrap();
    let mut parked: Vec<&str> = ["payload", "pois", "reason", "bad", "task"].to_vec();
    let task = id().to_string();
    parked.push(&task);
    let at = letters[0].1[7].clone();
    parked.extend(["at", &at, "size", "6"]);
    assert_eq!(requeued, Some(fields(&parked)));
    let queued = f.entries(&queue).await;
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0].1, ["payload", "pois"]);
    assert_eq!(f.call(&requeue).await.unwrap(), None);
}

#[tokio::test]
async fn ack_share_and_delayed_moves() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    let queue = k.queue(0);
    f.group(&queue).await;
    let entry = f.add(&queue, "p").await;
    f.read(&queue, "c1").await;
    let ack = s::Ack {
        queue: queue.clone(),
        group: GROUP,
        entry: entry.clone(),
    };
    assert!(f.call(&ack).await.unwrap(), "pending");
    assert!(!f.call(&ack).await.unwrap(), "settled already");
    assert!(f.entries(&queue).await.is_empty());

    // Shared: moved with every field, if it is the consumer's.
    let entry: String = f
        .cmd(&["XADD", &queue, "*", "payload", "p", "unanswered", "2"])
        .await;
    f.read(&queue, "c1").await;
    let share = |consumer| s::Share {
        from: queue.clone(),
        to: k.queue(1),
        group: GROUP,
        entry: entry.clone(),
        consumer,
    };
    assert!(!f.call(&share("c2")).await.unwrap());
    assert!(f.call(&share("c1")).await.unwrap());
    let moved = f.entries(&k.queue(1)).await;
    assert_eq!(moved[0].1, ["payload", "p", "unanswered", "2"]);
    assert!(f.entries(&queue).await.is_empty());

    // Due delayed messages move, with their unanswered deliveries.
    let delayed = k.delayed(0);
    let _: () = f.cmd(&["ZADD", &delayed, "0", "2:due"]).await;
    let _: () = f.cmd(&["ZADD", &delayed, "1", "0:also"]).await;
    let _: () = f
        .cmd(&["ZADD", &delayed, "99999999999999", "0:later"])
        .await;
    let release = s::ReleaseDelayed {
        pairs: vec![(delayed.clone(), queue.clone()), (k.delayed(1), k.queue(1))],
        limit: 10,
    };
    assert_eq!(f.call(&release).await.unwrap(), 2);
    let moved: Vec<Vec<String>> = f.entries(&queue).await.into_iter().map(|e| e.1).collect();
    assert_eq!(
        moved,
        [
            vec!["payload", "due", "unanswered", "2"],
            vec!["payload", "also"]
        ]
    );
    let left: Vec<String> = f.cmd(&["ZRANGE", &delayed, "0", "-1"]).await;
    assert_eq!(left, ["0:later"]);
}

#[tokio::test]
async fn process_manager_messages_go_to_partitions_once_they_are_read() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    let part = k.queue(k.process_partition(3));
    let shared = k.queue(k.process_stream());
    let enqueue = |members: Option<String>| s::EnqueuePm {
        messages: vec![
            (part.clone(), "m1".to_owned()),
            (part.clone(), "m2".to_owned()),
        ],
        members,
    };
    // Nobody reads partitions yet: the shared stream.
    assert_eq!(
        f.call(&enqueue(Some(k.partition_members()))).await.unwrap(),
        2
    );
    assert_eq!(f.entries(&shared).await.len(), 2);
    // A live member: the partition.
    let _: () = f
        .cmd(&["ZADD", &k.partition_members(), "99999999999999", "e1"])
        .await;
    f.call(&enqueue(Some(k.partition_members()))).await.unwrap();
    assert_eq!(f.entries(&part).await.len(), 2);
    // No members key (spread layout): always the partition.
    let _: () = f.cmd(&["DEL", &k.partition_members()]).await;
    f.call(&enqueue(None)).await.unwrap();
    assert_eq!(f.entries(&part).await.len(), 4);
    assert_eq!(f.entries(&shared).await.len(), 2);
}

#[tokio::test]
async fn endpoint_take_creates_its_group_and_takes_over_idle_messages() {
    let mut f = Fixture::new().await;
    let k = f.keys.clone();
    let stream = k.endpoint("billing");
    let entry: String = f.cmd(&["XADD", &stream, "*", "envelope", "e"]).await;
    let take = |consumer, claim_idle_ms| s::EndpointTake {
        stream: stream.clone(),
        group: "g",
        consumer,
        claim_idle_ms,
    };
    let taken = EndpointTaken {
        id: entry.clone(),
        fields: fields(&["envelope", "e"]),
        deliveries: 1,
    };
    assert_eq!(f.call(&take("c1", 60_000)).await.unwrap(), Some(taken));
    assert_eq!(f.call(&take("c2", 60_000)).await.unwrap(), None);
    let taken = EndpointTaken {
        id: entry.clone(),
        fields: fields(&["envelope", "e"]),
        deliveries: 2,
    };
    assert_eq!(f.call(&take("c2", 0)).await.unwrap(), Some(taken));

    let settle = |park| s::EndpointSettle {
        stream: stream.clone(),
        dead: k.endpoint_dead("billing"),
        group: "g",
        entry: &entry,
        park,
        payload: "e",
        reason: "no",
        size: None,
        dead_cap: 100,
    };
    assert!(f.call(&settle(true)).await.unwrap());
    let letters = f.entries(&k.endpoint_dead("billing")).await;
    assert_eq!(letters[0].1[..4], ["payload", "e", "reason", "no"]);
    assert!(!f.call(&settle(false)).await.unwrap(), "settled already");
}
