//! Whether a token is current (`GET …/fences/{fencing_token}`), asked of one replica about
//! leases granted through the other, for every kind that has fencing tokens: a lock, a
//! permit, an election's term, a lease on several names and a shared lease.

use crate::common;

use serde_json::json;

#[tokio::test]
async fn lock_permit_shared_and_election_tokens_are_current_on_the_other_replica() {
    let (_masters, a, b) = common::two_replicas_over_three().await;
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
    // (the route asked about the token, the token, the lease's route for its revoke)
    let case = |route: &str, body: &serde_json::Value, token: &str, leases: &str| {
        let token = body[token].as_u64().unwrap();
        let lease = format!("{leases}/leases/{}", body["lease_id"].as_str().unwrap());
        (route.to_owned(), token, lease)
    };
    let cases = [
        case("/locks/fenced", &lock, "fencing_token", "/locks/fenced"),
        case(
            "/semaphores/fenced",
            &permit,
            "fencing_token",
            "/semaphores/fenced",
        ),
        case("/elections/fenced", &term, "term", "/elections/fenced"),
        case("/locks/fenced:2", &pair, "fencing_token", "/locks/fenced:1"),
        case(
            "/locks/fenced:r",
            &reader,
            "fencing_token",
            "/locks/fenced:r",
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
