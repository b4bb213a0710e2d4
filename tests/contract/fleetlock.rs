//! FleetLock, in process: the protocol as coreos/zincati's `protocol.md` states it (the
//! header, the body with `id` or `node_uuid`, the `default` group, any 200 a success, other
//! answers `{"kind","value"}`), recursive pre-reboots, steady-state when nothing is held, a
//! full group, slots kept by the server until their maximum, an administrator's release of
//! one node, HTTP Basic and a token's prefixes, and quorum loss.

use crate::common;

use std::time::Duration;

use base64::Engine as _;
use common::{Answer, TestApp, config};
use redlockd::auth::{Role, new_token};
use redlockd::store::memory::Fault;
use serde_json::{Value, json};

fn params(id: &str, group: Option<&str>) -> Value {
    match group {
        Some(group) => json!({"client_params": {"id": id, "group": group}}),
        None => json!({"client_params": {"id": id}}),
    }
}

/// `op` (`pre-reboot` or `steady-state`) as Zincati sends it.
async fn fleet(app: &TestApp, op: &str, body: Value) -> Answer {
    app.call("POST", &format!("/fleetlock/v1/{op}"))
        .header("fleet-lock-protocol", "true")
        .json(&body)
        .send()
        .await
}

fn failed(answer: &Answer, status: u16, kind: &str) {
    let body = answer.json();
    assert_eq!(
        (answer.status, body["kind"].as_str()),
        (status, Some(kind)),
        "{body}"
    );
    assert!(
        body["value"].as_str().is_some_and(|v| !v.is_empty()),
        "{body}"
    );
}

async fn app(groups: &str) -> TestApp {
    let mut cfg = config(&[]);
    cfg.fleetlock_groups = Some(groups.to_owned());
    TestApp::in_process(cfg).await
}

#[tokio::test]
async fn a_node_takes_its_groups_slot_again_and_others_wait_until_its_steady_state() {
    let app = app("default=1").await;
    let first = fleet(&app, "pre-reboot", params("node-a", None)).await;
    assert_eq!(
        (first.status, &first.json()["slot"]),
        (200, &json!(0)),
        "{}",
        first.text
    );
    // Recursive: the same node again is the same slot, not a second one.
    let again = fleet(&app, "pre-reboot", params("node-a", Some("default"))).await;
    assert_eq!((again.status, &again.json()["slot"]), (200, &json!(0)));
    failed(
        &fleet(&app, "pre-reboot", params("node-b", None)).await,
        423,
        "failed_lock_semaphore_full",
    );
    // Another node's steady-state releases nothing of node-a's, and succeeds.
    assert_eq!(
        fleet(&app, "steady-state", params("node-b", None))
            .await
            .status,
        200
    );
    failed(
        &fleet(&app, "pre-reboot", params("node-b", None)).await,
        423,
        "failed_lock_semaphore_full",
    );
    // Inspect shows which node holds the slot, kept by the server.
    let (_, seen) = app.get("/semaphores/fleetlock:default").await;
    assert_eq!(seen["holders"][0]["owner"], "node-a", "{seen}");
    assert!(seen["holders"][0]["kept_until"].is_string(), "{seen}");
    assert_eq!(
        fleet(&app, "steady-state", params("node-a", None))
            .await
            .status,
        200
    );
    assert_eq!(
        fleet(&app, "steady-state", params("node-a", None))
            .await
            .status,
        200,
        "unbalanced: still 200"
    );
    assert_eq!(
        fleet(&app, "pre-reboot", params("node-b", None))
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn a_group_has_the_slots_its_configuration_gives_and_other_groups_are_refused() {
    let app = app("default=1, workers=2").await;
    for node in ["w1", "w2"] {
        assert_eq!(
            fleet(&app, "pre-reboot", params(node, Some("workers")))
                .await
                .status,
            200
        );
    }
    failed(
        &fleet(&app, "pre-reboot", params("w3", Some("workers"))).await,
        423,
        "failed_lock_semaphore_full",
    );
    // The groups are apart: the default group's slot is free.
    assert_eq!(
        fleet(&app, "pre-reboot", params("w3", None)).await.status,
        200
    );
    failed(
        &fleet(&app, "pre-reboot", params("x", Some("etcd"))).await,
        404,
        "failed_unknown_group",
    );
    failed(
        &fleet(&app, "steady-state", params("x", Some("etcd"))).await,
        404,
        "failed_unknown_group",
    );
}

#[tokio::test]
async fn calls_the_protocol_does_not_allow_are_400s_with_a_kind() {
    let app = app("default=1").await;
    let without_header = app
        .call("POST", "/fleetlock/v1/pre-reboot")
        .json(&params("n", None))
        .send()
        .await;
    failed(&without_header, 400, "bad_request");
    let wrong_header = app
        .call("POST", "/fleetlock/v1/pre-reboot")
        .header("fleet-lock-protocol", "false")
        .json(&params("n", None))
        .send()
        .await;
    failed(&wrong_header, 400, "bad_request");
    for body in [
        json!({}),
        json!({"client_params": {}}),
        json!({"client_params": {"id": ""}}),
        json!({"client_params": {"id": "n", "group": "no/slash"}}),
        json!({"client_params": {"id": "x".repeat(300)}}),
        json!([1]),
    ] {
        let answer = fleet(&app, "pre-reboot", body.clone()).await;
        assert_eq!(answer.status, 400, "{body}: {}", answer.text);
    }
    // Older Zincati named the node `node_uuid`.
    let old = fleet(
        &app,
        "pre-reboot",
        json!({"client_params": {"node_uuid": "n", "group": "default"}}),
    )
    .await;
    assert_eq!(old.status, 200, "{}", old.text);
    assert_eq!(
        fleet(&app, "steady-state", params("n", None)).await.status,
        200
    );
    assert_eq!(
        app.get("/semaphores/fleetlock:default").await.1["holders"],
        json!([])
    );
}

#[tokio::test(start_paused = true)]
async fn a_slot_is_kept_without_renews_until_its_maximum() {
    let mut cfg = config(&[]);
    cfg.default_ttl_ms = 500;
    cfg.max_ttl_ms = 1_000;
    cfg.max_kept_hold_ms = Some(5_000);
    let app = TestApp::in_process(cfg).await;
    assert_eq!(
        fleet(&app, "pre-reboot", params("rebooting", None))
            .await
            .status,
        200
    );
    tokio::time::sleep(Duration::from_millis(4_900)).await;
    failed(
        &fleet(&app, "pre-reboot", params("next", None)).await,
        423,
        "failed_lock_semaphore_full",
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        fleet(&app, "pre-reboot", params("next", None)).await.status,
        200
    );
    // A second pre-reboot keeps the slot for the whole maximum again, from its answer.
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    let again = fleet(&app, "pre-reboot", params("next", None)).await;
    assert_eq!(again.status, 200);
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    let third = fleet(&app, "pre-reboot", params("third", None)).await;
    failed(&third, 423, "failed_lock_semaphore_full");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let third = fleet(&app, "pre-reboot", params("third", None)).await;
    assert_eq!(third.status, 200);
}

#[tokio::test]
async fn under_authentication_basic_and_bearer_tokens_hold_and_an_administrator_releases_one_node()
{
    let (client, c) = new_token("node-agent", Role::Client, vec!["fleetlock:default".into()]);
    let (admin, a) = new_token("oncall", Role::Admin, vec![]);
    let file = tempfile::NamedTempFile::new().unwrap();
    common::write_tokens(file.path(), &[c, a]);
    let mut cfg = config(&[]);
    cfg.fleetlock_groups = Some("default=1,workers=1".into());
    cfg.auth_file = Some(file.path().to_str().unwrap().to_owned());
    let app = TestApp::in_process(cfg).await;
    let basic = |user: &str, token: &str| {
        let pair = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{token}"));
        format!("Basic {pair}")
    };
    let call = |op: &str, id: &str, group: &str, authorization: Option<String>| {
        let mut call = app
            .call("POST", &format!("/fleetlock/v1/{op}"))
            .header("fleet-lock-protocol", "true")
            .json(&params(id, Some(group)));
        if let Some(authorization) = authorization {
            call = call.header("authorization", &authorization);
        }
        call.send()
    };
    // Flatcar's client sends Basic: the token's name and the token.
    let held = call(
        "pre-reboot",
        "node-a",
        "default",
        Some(basic("node-agent", &client)),
    )
    .await;
    assert_eq!(held.status, 200, "{}", held.text);
    assert_eq!(
        call(
            "pre-reboot",
            "node-a",
            "default",
            Some(format!("Bearer {client}"))
        )
        .await
        .status,
        200
    );
    assert_eq!(
        call(
            "pre-reboot",
            "node-a",
            "default",
            Some(basic("someone-else", &client))
        )
        .await
        .status,
        401
    );
    assert_eq!(
        call("pre-reboot", "node-a", "default", None).await.status,
        401
    );
    // Its prefixes name the group's semaphore: `workers` is not this token's.
    let out = call(
        "pre-reboot",
        "node-a",
        "workers",
        Some(basic("node-agent", &client)),
    )
    .await;
    common::assert_error(out.status, &out.json(), 403, "forbidden");
    // A node that will not come back: an administrator releases its slot by its id.
    let release = |token: &str| {
        app.call("DELETE", "/fleetlock/v1/groups/default/nodes/node-a")
            .bearer(token)
            .send()
    };
    assert_eq!(release(&client).await.status, 403, "a client token may not");
    let released = release(&admin).await;
    assert_eq!(
        (released.status, &released.json()["released"]),
        (200, &json!(true)),
        "{}",
        released.text
    );
    assert_eq!(release(&admin).await.json()["released"], false);
    let next = call(
        "pre-reboot",
        "node-b",
        "default",
        Some(basic("node-agent", &client)),
    )
    .await;
    assert_eq!(next.status, 200, "{}", next.text);
}

#[tokio::test(start_paused = true)]
async fn without_a_majority_a_pre_reboot_is_a_503_and_takes_nothing() {
    let (app, nodes) = TestApp::over_three_nodes(config(&[])).await;
    for node in &nodes[1..] {
        node.set_fault(Fault::Down);
    }
    failed(
        &fleet(&app, "pre-reboot", params("n", None)).await,
        503,
        "quorum_unavailable",
    );
    failed(
        &fleet(&app, "steady-state", params("n", None)).await,
        503,
        "quorum_unavailable",
    );
    for node in &nodes {
        node.set_fault(Fault::None);
    }
    app.until_ready().await;
    assert_eq!(
        app.get("/semaphores/fleetlock:default").await.1["holders"],
        json!([])
    );
}

/// Kept holds off: REDLOCKD_MAX_KEPT_HOLD_MS at 0, or not above the largest TTL.
fn kept_off(cfg: &mut redlockd::config::Config) {
    cfg.max_kept_hold_ms = Some(0);
}

#[tokio::test]
async fn with_kept_holds_off_and_the_groups_left_unset_fleetlock_is_off_and_says_so() {
    let mut cfg = config(&[]);
    kept_off(&mut cfg);
    let app = TestApp::in_process(cfg).await;
    for op in ["pre-reboot", "steady-state"] {
        let answer = fleet(&app, op, params("node-a", None)).await;
        failed(&answer, 503, "fleetlock_off");
        let why = answer.json()["value"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            why.contains("REDLOCKD_MAX_KEPT_HOLD_MS") && why.contains("REDLOCKD_FLEETLOCK_GROUPS"),
            "{why}"
        );
    }
}

#[tokio::test]
async fn groups_named_with_kept_holds_off_refuse_to_start_naming_both_settings() {
    let mut cfg = config(&[]);
    kept_off(&mut cfg);
    cfg.fleetlock_groups = Some("default=1".into());
    let Err(e) = redlockd::app::App::new(cfg).await else {
        panic!("started with FleetLock groups and no kept holds");
    };
    let said = format!("{e:#}");
    assert!(
        said.contains("REDLOCKD_FLEETLOCK_GROUPS") && said.contains("REDLOCKD_MAX_KEPT_HOLD_MS"),
        "{said}"
    );
}

#[tokio::test]
async fn an_empty_group_list_turns_fleetlock_off() {
    let app = app("").await;
    let answer = fleet(&app, "pre-reboot", params("node-a", None)).await;
    failed(&answer, 503, "fleetlock_off");
}
