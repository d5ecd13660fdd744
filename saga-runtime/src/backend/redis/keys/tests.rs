//! The key layout, pinned: hash slots, tags, partitions and names.

use super::*;

#[test]
fn slots_are_redis_clusters() {
    // `CLUSTER KEYSLOT` on a real cluster.
    assert_eq!(slot("foo"), 12182);
    assert_eq!(slot("bar"), 5061);
    assert_eq!(slot("hello"), 866);
    assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
    assert_eq!(
        slot("foo{}{bar}"),
        slot("foo{}{bar}"),
        "an empty tag hashes the key"
    );
    assert_ne!(slot("foo{}{bar}"), slot("bar"));
    assert_eq!(crc16(b"123456789"), 0x31C3);
}

#[test]
fn spread_tags_put_each_partition_in_its_own_band_of_slots() {
    for n in [1u16, 3, 16, 64] {
        let keys = Keys::new("saga", n, PROCESS_PARTITIONS, true);
        let band = u32::from(SLOTS) / u32::from(n);
        for p in 0..n {
            let s = u32::from(keys.stream_slot(p));
            assert_eq!(s / band, u32::from(p), "partition {p} of {n}: slot {s}");
        }
    }
    // Three primaries with equal ranges hold 5 or 6 of 16 each.
    let keys = Keys::new("saga", 16, PROCESS_PARTITIONS, true);
    let mut per_shard = [0; 3];
    for p in 0..16 {
        per_shard[usize::from(keys.stream_slot(p) / 5462)] += 1;
    }
    assert!(
        per_shard.iter().all(|n| (5..=6).contains(n)),
        "{per_shard:?}"
    );
    let pm: Vec<u16> = (0..PROCESS_PARTITIONS)
        .map(|k| slot(&keys.queue(keys.process_partition(k))))
        .collect();
    let mut distinct = pm.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        16,
        "each process-manager partition its own slot: {pm:?}"
    );
}

#[test]
fn spread_keys_of_an_instance_share_its_partitions_slot() {
    let keys = Keys::new("saga", 16, PROCESS_PARTITIONS, true);
    for i in 0..200 {
        let id = format!("order-{i}");
        let k = keys.pm_k("fulfillment", &id);
        let here = slot(&keys.queue(keys.process_partition(k)));
        for key in [
            keys.instance("fulfillment", &id),
            keys.instances("fulfillment", k),
            keys.tombstone("fulfillment", &id),
            keys.scheduled(k),
            keys.open_tallies(k),
            keys.dead(keys.process_partition(k)),
            keys.queue(keys.shared_stream(keys.process_partition(k))),
            keys.correlation("fulfillment", "order_id", &id),
            keys.correlation_claim("fulfillment", "order_id", &id),
            keys.tally(
                &TallyRef {
                    process: "fulfillment".into(),
                    instance: id.clone(),
                    generation: "g".into(),
                    name: "items".into(),
                },
                ":pending",
            ),
        ] {
            assert_eq!(slot(&key), here, "{key}");
        }
        assert_eq!(
            keys.envelope_stream(&Envelope {
                message_id: "m".into(),
                process: "fulfillment".into(),
                message_type: "t".into(),
                payload: serde_json::Value::Null,
                kind: crate::model::envelope::EnvelopeKind::Timeout,
                instance_id: Some(id.clone()),
                generation: None,
                failures: 0,
                key: None,
                key_field: None,
                traceparent: None,
                due_ms: None,
                hops: 0,
                hold_until: None,
            }),
            keys.process_partition(k)
        );
    }
    let shared = keys.shared_streams();
    assert_eq!(shared.len(), 16);
    assert!(shared
        .iter()
        .all(|s| keys.is_process(*s) && keys.shared_stream(*s) == *s));
    assert_eq!(
        keys.split_id(&format!("{}/1-0", shared[15])),
        Some((shared[15], "1-0"))
    );
    assert_eq!(keys.streams(), 16 + 1 + 32);
}

fn tag(key: &str) -> &str {
    let start = key.find('{').unwrap() + 1;
    let end = key[start..].find('}').unwrap() + start;
    &key[start..end]
}

#[test]
fn every_key_of_a_task_and_its_queue_share_one_hash_tag() {
    let keys = Keys::new("saga", 8, PROCESS_PARTITIONS, false);
    for _ in 0..50 {
        let id = TaskId::new();
        let p = keys.partition_of(id);
        let expected = tag(&keys.queue(p)).to_owned();
        for key in [
            keys.task(id),
            keys.lock(id),
            keys.fence(id),
            keys.cancel(id),
            keys.claims(id),
            keys.audit(id),
            keys.dead(p),
            keys.delayed(p),
            keys.expiring(p),
            keys.index(p, "create-zip", None),
            keys.index(p, "create-zip", Some(TaskStatus::Running)),
        ] {
            assert_eq!(tag(&key), expected, "{key}");
        }
    }
    let id = TaskId::new();
    let prefix = keys.task_prefix(keys.partition_of(id));
    for (kind, key) in [
        ("task", keys.task(id)),
        ("lock", keys.lock(id)),
        ("fence", keys.fence(id)),
        ("cancel", keys.cancel(id)),
    ] {
        assert_eq!(format!("{prefix}:{kind}:{id}"), key, "TAKE builds it so");
    }
    let pm = keys.process_prefix(keys.process_stream());
    assert_eq!(format!("{pm}:inst:p:i-1"), keys.instance("p", "i-1"));
    assert_eq!(format!("{pm}:idx:p:f:v"), keys.correlation("p", "f", "v"));
    assert_eq!(keys.split_id("3/1-0"), Some((3, "1-0")));
    assert_eq!(keys.split_id("3:1-0"), Some((3, "1-0")));
    for bad in ["3:abc", "3:1-2-3", "3:17", "3:-1", "3:1-"] {
        assert_eq!(keys.split_id(bad), None, "{bad}");
    }
    assert_eq!(
        keys.split_id("8/1-0"),
        Some((8, "1-0")),
        "the process-manager stream"
    );
    assert_eq!(
        keys.split_id("24/1-0"),
        Some((24, "1-0")),
        "the last partition"
    );
    assert_eq!(keys.split_id("25/1-0"), None);
    assert_eq!(keys.queue(keys.process_stream()), format!("{pm}:queue"));
    assert_eq!(
        keys.queue(keys.process_partition(3)),
        format!("{pm}:queue:3")
    );
    assert_eq!(
        keys.dead(keys.process_partition(15)),
        format!("{pm}:dead:15")
    );
    assert!(keys.is_process(8) && keys.is_process(24) && !keys.is_process(7));
    let pm = tag(&keys.queue(keys.process_stream())).to_owned();
    for key in [
        keys.instance("fulfillment", "o-1"),
        keys.correlation("fulfillment", "order_number", "42"),
        keys.scheduled(0),
        keys.endpoint("billing"),
        keys.dead(keys.process_stream()),
        keys.tally(
            &TallyRef {
                process: "batch".into(),
                instance: "b:1".into(),
                generation: "g".into(),
                name: "items".into(),
            },
            ":pending",
        ),
    ] {
        assert_eq!(tag(&key), pm, "{key}");
    }
}

/// Index keys and expiring members carry a status's stored name: a
/// running deployment's keys must read the same after an upgrade.
#[test]
fn status_keys_are_the_stored_names() {
    let keys = Keys::new("saga", 1, PROCESS_PARTITIONS, false);
    let id: TaskId = "00000000-0000-0000-0000-000000000007".parse().unwrap();
    assert_eq!(
        keys.index(0, "orders", Some(TaskStatus::CompensationFailed)),
        "saga:{saga:0}:idx:orders:CompensationFailed"
    );
    assert_eq!(keys.index(0, "orders", None), "saga:{saga:0}:idx:orders");
    assert_eq!(
        Keys::expiring_member(id, TaskStatus::DeadLettered, "orders"),
        "00000000-0000-0000-0000-000000000007|DeadLettered|orders"
    );
}
