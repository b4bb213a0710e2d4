//! What ships beside the binary stays true to it: every metric the Grafana dashboard
//! queries is one redlockd exports (checked against a live `/metrics`), and compose and the
//! Helm chart use the same dashboard file. The rest of the deployment files are validated by
//! scripts/validate-deploy (hadolint, the compose schema, helm lint, Kubernetes schemas).

mod common;

use std::collections::BTreeSet;

use common::{TestApp, config, masters};
use serde_json::json;

const DASHBOARD: &str = include_str!("../helm/redlockd/dashboards/redlockd.json");

/// Metric names in PromQL expressions: our own and the process collector's.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    for prefix in ["redlockd_", "process_"] {
        let mut rest = expr;
        while let Some(at) = rest.find(prefix) {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.push(tail[..end].to_owned());
            rest = &tail[end..];
        }
    }
    names
}

/// A histogram is exported as `<family>_bucket`, `_sum` and `_count`.
fn family(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name)
}

#[tokio::test]
async fn every_metric_on_the_dashboard_is_exported() {
    let dashboard: serde_json::Value =
        serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut used = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            used.extend(metric_names(target["expr"].as_str().expect("expr")));
        }
    }
    assert!(used.len() >= 10, "{used:?}");

    // Four masters, one of which is stopped once the deployment is initialised, so that
    // every family has a sample, master errors included.
    let mut ms = masters(4);
    let app = TestApp::spawn(config(&ms.iter().collect::<Vec<_>>())).await;
    ms[3].stop();
    app.must_grant("dash:1", json!({})).await;
    assert_eq!(app.grant("dash:1", json!({"wait_ms": 100})).await.0, 409);
    let exported: BTreeSet<String> = app
        .text("/metrics")
        .await
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    for name in &used {
        assert!(
            exported.contains(family(name)),
            "the dashboard queries {name}, which redlockd does not export; exported: {exported:?}"
        );
    }
}

#[test]
fn compose_and_the_chart_share_the_dashboard_file() {
    let compose =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docker-compose.yml"))
            .unwrap();
    assert!(compose.contains("./helm/redlockd/dashboards/redlockd.json:"));
    let chart = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/helm/redlockd/templates/dashboard-configmap.yaml"
    ))
    .unwrap();
    assert!(chart.contains(r#".Files.Get "dashboards/redlockd.json""#));
}
