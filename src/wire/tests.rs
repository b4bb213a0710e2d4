use super::*;
use serde::de::DeserializeOwned;

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(value: T) {
    let text = serde_json::to_string(&value).unwrap();
    assert_eq!(serde_json::from_str::<T>(&text).unwrap(), value, "{text}");
}

#[test]
fn every_body_reads_back_what_it_writes() {
    round_trip(GrantRequest {
        ttl_ms: Some(Whole(5000)),
        wait_ms: None,
        owner: Some("me".into()),
        mode: Some(LockMode::Shared),
        lock_delay_ms: Some(Whole(2000)),
        session: Some("k2VdY1Qm0sJx9a7bTf4r3w".into()),
        grace_ms: Some(Whole(3000)),
        kept: Some(Flag(false)),
    });
    round_trip(GrantRequest::default());
    round_trip(ResumeRequest {
        grace_ms: Some(Whole(0)),
    });
    round_trip(RenewRequest {
        ttl_ms: Some(Whole(100)),
    });
    round_trip(ListQuery {
        prefix: Some("a:".into()),
        after: None,
        limit: Some(Whole(10)),
    });
    round_trip(LeaseBody {
        name: "a".into(),
        lease_id: "q3JtZ0kPq6Nw2b1xVf8u4A".into(),
        fencing_token: FencingToken::new(42),
        ttl_ms: 30000,
        validity_ms: 29697,
        expires_at: "2026-11-22T03:00:30.000Z".into(),
        owner: None,
        ttl_remaining_ms: Some(1),
        mode: LockMode::Exclusive,
        names: Some(vec!["a".into(), "b".into()]),
    });
    round_trip(LockList {
        locks: vec![LockEntry {
            name: "a".into(),
            fencing_token: FencingToken::new(7),
            ttl_remaining_ms: 2900,
            owner: Some("w".into()),
            kept_until: Some("2026-11-22T05:00:30.000Z".into()),
        }],
        next: Some("a".into()),
    });
    round_trip(Readiness {
        ready: false,
        backend: "redis".into(),
        problem: Some("why".into()),
        masters: vec![MasterReport {
            address: "redis://h:1".into(),
            up: true,
            latency_ms: Some(0.21),
            voting: false,
            quarantined_until: Some("2026-11-22T03:00:30.000Z".into()),
            shards: Some(vec![ShardReport {
                address: "10.0.0.7:7000".into(),
                up: true,
                voting: false,
                slots: 5461,
                latency_ms: None,
                quarantined_until: Some("2026-11-22T03:00:30.000Z".into()),
                problem: Some("why".into()),
                clock_offset_ms: Some(-1.5),
            }]),
            problem: None,
            clock_offset_ms: None,
            subscribed: Some(true),
        }],
    });
    round_trip(ErrorBody {
        error: "quorum_unavailable".into(),
        message: "m".into(),
        retry_after_ms: None,
        masters: vec![MasterError {
            address: "redis://h:1".into(),
            error: "timeout".into(),
        }],
    });
}

#[test]
fn a_request_sends_only_the_fields_it_sets() {
    let text = serde_json::to_string(&GrantRequest {
        ttl_ms: Some(Whole(5000)),
        ..GrantRequest::default()
    })
    .unwrap();
    assert_eq!(text, r#"{"ttl_ms":5000}"#);
}
