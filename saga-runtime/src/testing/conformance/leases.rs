//! [`Leases`](crate::backend::Leases) (needs [`Backend::leases`](crate::backend::Backend::leases)).

use super::*;

/// Named leases: one holder at a time, renewable by it, released by it
/// only, free once expired.
pub async fn named_leases_have_one_holder_at_a_time(b: Arc<dyn Backend>) {
    let b = lease_part(&b);
    assert!(b.named_lease("poller", "p1", TTL).await.unwrap());
    assert!(!b.named_lease("poller", "p2", TTL).await.unwrap());
    assert!(b.named_lease("poller", "p1", TTL).await.unwrap(), "renewal");
    assert!(!b.release_named_lease("poller", "p2").await.unwrap());
    assert!(b.release_named_lease("poller", "p1").await.unwrap());
    assert!(b
        .named_lease("poller", "p2", Duration::from_millis(100))
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(
        b.named_lease("poller", "p1", TTL).await.unwrap(),
        "an expired lease is free"
    );
}
