//! The data layout a master keeps (`<marker>:layout`, none = layout 1): a master that a
//! later release marked with a layout this one does not know is refused by every step,
//! never misread, and the 503, the metrics and `/readyz` say why.

use crate::common;

use std::time::Duration;

use common::{TestApp, config, masters, wait_for};
use serde_json::json;

#[tokio::test]
async fn a_master_keeping_a_layout_this_release_does_not_know_is_refused_not_misread() {
    let ms = masters(3);
    let app = TestApp::spawn(config(&ms)).await;
    let (held, _) = app.must_grant("inv:held", json!({"ttl_ms": 30000})).await;
    let mark = async |m: &common::RedisMaster, layout: Option<&str>| {
        let args: Vec<&str> = match layout {
            Some(layout) => vec!["SET", "redlockd:marker:layout", layout],
            None => vec!["DEL", "redlockd:marker:layout"],
        };
        m.cmd::<redis::Value>(&args).await.expect("mark the layout");
    };

    // Layout 1, named or not, is this release's.
    mark(&ms[0], Some("1")).await;
    app.must_grant("inv:1", json!({})).await;

    // One master of three in a later layout: the other two still make a majority.
    mark(&ms[0], Some("2")).await;
    app.must_grant("inv:2", json!({})).await;
    let errors = |m: &common::RedisMaster| {
        format!(
            r#"redlockd_master_errors_total{{kind="layout",master="redis://127.0.0.1:{}"}} "#,
            m.port
        )
    };
    // Counted when its answer comes, which the grant (decided by the other two) may not
    // have waited for.
    wait_for(
        "the refusal to be counted",
        Duration::from_secs(5),
        async || {
            let metrics = app.text("/metrics").await;
            let counted = metrics
                .lines()
                .find_map(|l| l.strip_prefix(&errors(&ms[0])))
                .and_then(|n| n.parse::<u64>().ok());
            counted.is_some_and(|n| n > 0).then_some(())
        },
    )
    .await;
    let metrics = app.text("/metrics").await;
    assert!(
        metrics.contains(&format!("{}0", errors(&ms[1]))),
        "{metrics}"
    );

    // Two of three: no step may act on them, so nothing is granted, renewed or released
    // on this release's reading of them; the 503 names them and the reason.
    mark(&ms[1], Some("2")).await;
    let (status, body) = app.grant("inv:3", json!({})).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "quorum_unavailable", "{body}");
    for m in &ms[..2] {
        let address = format!("redis://127.0.0.1:{}", m.port);
        assert!(
            body["masters"].as_array().is_some_and(|failed| failed
                .iter()
                .any(|f| f["address"] == address && f["error"] == "layout")),
            "{address} not refused for its layout: {body}"
        );
    }
    // Listing reads what the masters keep outside a batch (list.lua): refused the same way.
    let (status, listed) = app.get("/locks").await;
    assert_eq!(status, 503, "{listed}");
    assert!(
        listed["masters"]
            .as_array()
            .is_some_and(|failed| failed.iter().any(|f| f["error"] == "layout")),
        "{listed}"
    );
    assert_eq!(app.renew("inv:held", &held, json!({})).await.0, 503);
    assert_eq!(app.revoke("inv:held", &held).await.0, 503);
    // The master still holds what the grant put there: refused, not rewritten.
    let kept: bool = ms[1]
        .cmd(&["EXISTS", "redlockd:lock:inv:held"])
        .await
        .expect("exists");
    assert!(kept, "the hold on the refused master was touched");

    // Within a probe (about a second), /readyz says which masters and why, and that the
    // replica is not ready.
    let master =
        |ready: &serde_json::Value, m: &common::RedisMaster| common::master_in(ready, m).clone();
    let ready = wait_for(
        "readyz to name the layout",
        Duration::from_secs(5),
        async || {
            let (status, ready) = app.get("/readyz").await;
            (status == 503 && master(&ready, &ms[1])["voting"] == false).then_some(ready)
        },
    )
    .await;
    for m in &ms[..2] {
        let shown = master(&ready, m);
        assert!(
            shown["problem"]
                .as_str()
                .is_some_and(|p| p.contains("data layout 2")),
            "{ready}"
        );
    }
    assert_eq!(master(&ready, &ms[2])["voting"], true, "{ready}");

    // Back to layout 1 (the later release rolled back): served again.
    mark(&ms[0], None).await;
    mark(&ms[1], None).await;
    assert_eq!(app.revoke("inv:held", &held).await.0, 204);
    app.must_grant("inv:3", json!({})).await;
    wait_for(
        "readyz to be ready again",
        Duration::from_secs(5),
        async || (app.get("/readyz").await.0 == 200).then_some(()),
    )
    .await;
}

#[tokio::test]
async fn a_master_in_a_layout_this_release_does_not_know_is_never_restored_by_it() {
    let ms = masters(3);
    let app = TestApp::over(&ms, |cfg| {
        // A quarantine of the largest TTL alone, two seconds.
        common::short_quarantine(cfg);
        cfg.max_lock_delay_ms = 0;
    })
    .await;
    app.must_grant("res:before", json!({})).await;
    // The third master without its marker, in a layout a later release wrote: this
    // release would restore a master it finds unmarked once its quarantine is over, by
    // writing its counter and its marker; here it must write nothing.
    // In one step: a write of this release's between a flush and the layout's mark would
    // land in what is still layout 1 (CI caught the watermarks so).
    let _: redis::Value = ms[2]
        .cmd(&[
            "EVAL",
            "redis.call('FLUSHALL') redis.call('SET', KEYS[1], ARGV[1]) return 1",
            "1",
            "redlockd:marker:layout",
            "2",
        ])
        .await
        .expect("flush and mark the layout");
    let shown = wait_for(
        "readyz to name the layout",
        Duration::from_secs(5),
        async || {
            let (_, ready) = app.get("/readyz").await;
            common::problem_says(common::master_in(&ready, &ms[2]).clone(), "data layout 2")
        },
    )
    .await;
    assert_eq!(shown["voting"], false, "{shown}");
    // Well past the quarantine (two seconds, probed every second): no marker, counter or
    // lock written. (The replicas' clock records, `redlockd:clocks`, are no lock data: each
    // replica writes its own and prunes what is a minute old, whatever the layout.)
    let past = tokio::time::Instant::now() + Duration::from_secs(4);
    while tokio::time::Instant::now() < past {
        let mut keys: Vec<String> = ms[2].cmd(&["KEYS", "*"]).await.expect("keys");
        keys.retain(|k| k != "redlockd:clocks");
        assert_eq!(
            keys,
            vec!["redlockd:marker:layout".to_owned()],
            "this release wrote into a master in a layout it does not know"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, ready) = app.get("/readyz").await;
    assert_eq!(
        common::master_in(&ready, &ms[2])["voting"],
        false,
        "{ready}"
    );
    // Grants go on with the other two.
    app.must_grant("res:after", json!({})).await;
}
