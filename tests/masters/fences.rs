//! Whether a token is current (`GET …/fences/{fencing_token}`), asked of one replica about
//! leases granted through the other, for every kind that has fencing tokens: a lock, a
//! permit, an election's term, a lease on several names and a shared lease.

use crate::common;

use common::masters;
use serde_json::json;

#[tokio::test]
async fn lock_permit_shared_and_election_tokens_are_current_on_the_other_replica() {
    let masters = masters(3);
    let (a, b) = common::two_replicas(&masters).await;
    let (_, lock) = a.grant("fenced", json!({})).await;
    let (_, permit) = a
        .send("POST", "/semaphores/fenced", Some(json!({"limit": 2})))
        .await;
    let (_, term) = a.send("POST", "/elections/fenced", None).await;
    let (_, pair) = a
        .send(
            "POST",
            "/locks",
            Some(json!({"names": ["fenced:1", "fenced:2"]})),
        )
        .await;
    let (_, reader) = a.grant("fenced:r", json!({"mode": "shared"})).await;
    let cases = [
        (
            "/locks/fenced",
            lock["fencing_token"].as_u64().unwrap(),
            format!(
                "/locks/fenced/leases/{}",
                lock["lease_id"].as_str().unwrap()
            ),
        ),
        (
            "/semaphores/fenced",
            permit["fencing_token"].as_u64().unwrap(),
            format!(
                "/semaphores/fenced/leases/{}",
                permit["lease_id"].as_str().unwrap()
            ),
        ),
        (
            "/elections/fenced",
            term["term"].as_u64().unwrap(),
            format!(
                "/elections/fenced/leases/{}",
                term["lease_id"].as_str().unwrap()
            ),
        ),
        (
            "/locks/fenced:2",
            pair["fencing_token"].as_u64().unwrap(),
            format!(
                "/locks/fenced:1/leases/{}",
                pair["lease_id"].as_str().unwrap()
            ),
        ),
        (
            "/locks/fenced:r",
            reader["fencing_token"].as_u64().unwrap(),
            format!(
                "/locks/fenced:r/leases/{}",
                reader["lease_id"].as_str().unwrap()
            ),
        ),
    ];
    for (route, token, lease) in cases {
        let fence = format!("{route}/fences/{token}");
        let (status, seen) = b.send("GET", &fence, None).await;
        assert_eq!(
            (status, &seen["current"]),
            (200, &json!(true)),
            "{fence}: {seen}"
        );
        let other = format!("{route}/fences/{}", token + 1);
        assert_eq!(
            b.send("GET", &other, None).await.1["current"],
            false,
            "{other}"
        );
        assert_eq!(a.send("DELETE", &lease, None).await.0, 204, "{lease}");
        let (_, seen) = b.send("GET", &fence, None).await;
        assert_eq!(seen["current"], false, "{fence} after its lease ended");
    }
}
