//! [`Breakers`](crate::backend::Breakers) (needs [`Backend::breakers`](crate::backend::Backend::breakers)).

use super::*;

/// A shared circuit breaker: closed until `threshold` consecutive failures,
/// then open for its duration, then one probe at a time; a failed probe
/// reopens it, a successful one closes it; a success resets the count.
pub async fn shared_breakers_open_probe_once_and_close(b: Arc<dyn Backend>) {
    let br = breaker_part(&b);
    const OPEN: Duration = Duration::from_millis(300);
    const PROBE: Duration = Duration::from_secs(5);
    let call = |probe, counting| BreakerDecision::Call { probe, counting };
    let acquire = |token: &'static str| br.breaker_acquire("s:step", PROBE, token);
    let report = |probe: Option<&'static str>, failed| {
        br.breaker_report("s:step", probe, Some(failed), 3, OPEN)
    };
    assert_eq!(acquire("t0").await.unwrap(), call(false, false));
    assert_eq!(report(None, true).await.unwrap(), None, "one failure");
    assert_eq!(
        acquire("t0").await.unwrap(),
        call(false, true),
        "a failure is being counted: a success must report"
    );
    assert_eq!(report(None, false).await.unwrap(), None, "still closed");
    assert_eq!(
        acquire("t0").await.unwrap(),
        call(false, false),
        "the success reset the count"
    );
    assert_eq!(report(None, true).await.unwrap(), None);
    assert_eq!(report(None, true).await.unwrap(), None);
    assert_eq!(
        report(None, true).await.unwrap(),
        Some(BreakerChange::Opened),
        "the third failure in a row says it opened the breaker"
    );
    match acquire("t0").await.unwrap() {
        BreakerDecision::Open { retry_after } => assert!(
            retry_after <= OPEN && retry_after > OPEN / 2,
            "open for about the break: {retry_after:?}"
        ),
        other => panic!("the third failure in a row opens the breaker: {other:?}"),
    }
    assert_eq!(
        br.breaker_acquire("other:step", PROBE, "t0").await.unwrap(),
        call(false, false),
        "breakers are per name"
    );

    tokio::time::sleep(OPEN + Duration::from_millis(50)).await;
    assert_eq!(acquire("p1").await.unwrap(), call(true, false));
    assert!(
        matches!(acquire("p2").await.unwrap(), BreakerDecision::Open { .. }),
        "one probe at a time"
    );
    assert_eq!(
        report(Some("p1"), true).await.unwrap(),
        Some(BreakerChange::Opened),
        "a failed probe reopens"
    );
    assert!(
        matches!(acquire("p2").await.unwrap(), BreakerDecision::Open { .. }),
        "a failed probe reopens"
    );

    tokio::time::sleep(OPEN + Duration::from_millis(50)).await;
    assert_eq!(acquire("p3").await.unwrap(), call(true, false));
    // A probe that did not happen frees its slot for the next caller.
    let dropped = br.breaker_report("s:step", Some("p3"), None, 3, OPEN);
    assert_eq!(dropped.await.unwrap(), None);
    assert_eq!(acquire("p4").await.unwrap(), call(true, false));
    // A stale probe's report (its slot went to p4) changes nothing.
    assert_eq!(report(Some("p3"), false).await.unwrap(), None);
    assert!(
        matches!(acquire("p5").await.unwrap(), BreakerDecision::Open { .. }),
        "p4 is still the probe: p3's late success did not close the breaker"
    );
    assert_eq!(
        report(Some("p4"), false).await.unwrap(),
        Some(BreakerChange::Closed),
        "a successful probe closes"
    );
    assert_eq!(
        acquire("t0").await.unwrap(),
        call(false, false),
        "a successful probe closes"
    );
}
