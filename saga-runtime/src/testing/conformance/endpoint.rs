//! [`Endpoints`](crate::backend::Endpoints) (needs [`Backend::processes`](crate::backend::Backend::processes)).

use super::*;

/// Endpoints: each group gets every message once (a new group from the
/// oldest kept); a message its consumer leaves untouched goes to another,
/// counted; a touch keeps it; settling acknowledges or dead-letters it;
/// trimming removes what every group has settled, and nothing before.
pub async fn endpoints_deliver_to_groups_claim_settle_and_trim(b: Arc<dyn Backend>) {
    let p = process_part(&b);
    const IDLE: Duration = Duration::from_millis(150);
    const NO_WAIT: Duration = Duration::from_millis(20);
    let i = instance("e");
    let mut c = write(&i, &[]);
    c.endpoints = vec![
        ("billing".into(), "env-1".into()),
        ("billing".into(), "env-2".into()),
    ];
    p.process_commit("pm", c).await.unwrap().unwrap();
    let take = |group: &'static str, consumer: &'static str| {
        let p = p.clone();
        async move {
            p.endpoint_receive("billing", group, consumer, IDLE, NO_WAIT)
                .await
                .unwrap()
        }
    };
    let first = take("g1", "c1").await.unwrap();
    assert_eq!((first.raw.as_str(), first.deliveries), ("env-1", 1));
    let second = take("g1", "c1").await.unwrap();
    assert_eq!((second.raw.as_str(), second.deliveries), ("env-2", 1));
    assert_eq!(take("g1", "c1").await, None);
    let other = take("g2", "c9").await.unwrap();
    assert_eq!(
        other.raw, "env-1",
        "a new group starts at the oldest message"
    );

    p.endpoint_settle("billing", "g1", &first, None)
        .await
        .unwrap();
    assert_eq!(
        p.endpoint_trim("billing", TTL).await.unwrap(),
        0,
        "g2 still holds env-1"
    );

    // c1 stops touching env-2: after the idle time another consumer takes it.
    tokio::time::sleep(IDLE + Duration::from_millis(50)).await;
    let claimed = take("g1", "c2").await.unwrap();
    assert_eq!((claimed.raw.as_str(), claimed.deliveries), ("env-2", 2));
    tokio::time::sleep(IDLE / 2).await;
    p.endpoint_touch("billing", "g1", "c2", &claimed.id)
        .await
        .unwrap();
    tokio::time::sleep(IDLE / 2 + Duration::from_millis(30)).await;
    assert_eq!(take("g1", "c3").await, None, "a touched message stays");
    p.endpoint_settle("billing", "g1", &claimed, Some("boom"))
        .await
        .unwrap();
    let dead = p.endpoint_dead_letters("billing").await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].payload.as_str(), dead[0].reason.as_str()),
        ("env-2", "boom")
    );
    assert_eq!(
        take("g1", "c1").await,
        None,
        "settled messages are not delivered again"
    );

    p.endpoint_settle("billing", "g2", &other, None)
        .await
        .unwrap();
    let rest = take("g2", "c9").await.unwrap();
    p.endpoint_settle("billing", "g2", &rest, None)
        .await
        .unwrap();
    assert_eq!(p.endpoint_trim("billing", TTL).await.unwrap(), 2);
    assert!(p.endpoint_messages("billing").await.unwrap().is_empty());
    assert_eq!(p.endpoint_trim("billing", TTL).await.unwrap(), 0);
    assert_eq!(p.endpoint_trim("nobody-reads-this", TTL).await.unwrap(), 0);

    let mut c = write(&i, &[]);
    c.instance = None;
    c.endpoints = vec![("billing".into(), "env-3".into())];
    p.process_commit("pm", c).await.unwrap().unwrap();
    assert_eq!(take("g1", "c1").await.unwrap().raw, "env-3");
    let third = take("g2", "c9").await.unwrap();
    p.endpoint_settle("billing", "g2", &third, None)
        .await
        .unwrap();
    // A read that waits is woken by the write it waits for.
    let waiting = {
        let p = p.clone();
        tokio::spawn(async move {
            p.endpoint_receive("billing", "g2", "c9", IDLE, Duration::from_secs(5))
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut c = write(&i, &[]);
    c.instance = None;
    c.endpoints = vec![("billing".into(), "env-4".into())];
    let started = tokio::time::Instant::now();
    p.process_commit("pm", c).await.unwrap().unwrap();
    assert_eq!(waiting.await.unwrap().unwrap().raw, "env-4");
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// An idle message is taken over wherever it stands in the group's
/// pending list, even behind many that live consumers keep touching.
pub async fn endpoints_claim_an_idle_message_behind_busy_ones(b: Arc<dyn Backend>) {
    let p = process_part(&b);
    const IDLE: Duration = Duration::from_millis(200);
    let i = instance("e");
    let mut c = write(&i, &[]);
    c.endpoints = (0..16)
        .map(|n| ("jobs".to_owned(), format!("m-{n}")))
        .collect();
    p.process_commit("pm", c).await.unwrap().unwrap();
    let mut held = Vec::new();
    for _ in 0..15 {
        let d = p.endpoint_receive("jobs", "g", "busy", IDLE, Duration::ZERO);
        held.push(d.await.unwrap().unwrap());
    }
    let left = p
        .endpoint_receive("jobs", "g", "died", IDLE, Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(left.raw, "m-15");
    tokio::time::sleep(IDLE + Duration::from_millis(50)).await;
    for d in &held {
        p.endpoint_touch("jobs", "g", "busy", &d.id).await.unwrap();
    }
    let taken = p
        .endpoint_receive("jobs", "g", "new", IDLE, Duration::ZERO)
        .await
        .unwrap()
        .expect("the idle message is taken over");
    assert_eq!((taken.raw.as_str(), taken.deliveries), ("m-15", 2));
}
