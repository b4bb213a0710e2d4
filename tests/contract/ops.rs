//! The operations surface in process: the OpenAPI document (committed, served, current,
//! in step with the contract page), the offline docs, request ids, compression. Metrics of
//! real masters' health and traces stay in `masters::ops`.

use crate::common;

use common::TestApp;
use serde_json::json;

const REGENERATE: &str = "cargo run --quiet -- openapi > openapi/openapi.json";

fn committed() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json"))
        .unwrap_or_else(|e| {
            panic!("openapi/openapi.json is missing ({e}); generate it with: {REGENERATE}")
        })
}

/// The backticked words of `text` (`` `lock_held` `` → `lock_held`).
fn backticked(text: &str) -> std::collections::BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Every `src`/`href` in a page.
fn references(html: &str) -> Vec<String> {
    let mut refs = Vec::new();
    for attr in ["src=\"", "href=\""] {
        let mut rest = html;
        while let Some(at) = rest.find(attr) {
            rest = &rest[at + attr.len()..];
            if let Some(end) = rest.find('"') {
                refs.push(rest[..end].to_owned());
            }
        }
    }
    refs
}

#[test]
fn the_committed_openapi_document_is_current() {
    assert!(
        committed() == redlockd::http::openapi_json(),
        "openapi/openapi.json differs from what the code generates; regenerate it with:\n  {REGENERATE}"
    );
}
#[test]
fn the_repositorys_contract_page_is_in_step_with_the_openapi_document() {
    use std::collections::BTreeSet;
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/API.md"))
        .expect("docs/API.md: the contract page users read");
    let doc: serde_json::Value = serde_json::from_str(&committed()).unwrap();
    let verbs = ["GET", "POST", "PUT", "DELETE", "PATCH"];
    // Every route of the document is on the page, as `METHOD /path`, and the page names
    // no route the document lacks (but the two it serves outside it).
    let documented: BTreeSet<String> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .map(move |m| format!("{} {path}", m.to_uppercase()))
        })
        .collect();
    let on_page: BTreeSet<String> = backticked(&page)
        .into_iter()
        .filter(|w| verbs.iter().any(|v| w.starts_with(&format!("{v} /"))))
        .map(|w| w.split('?').next().unwrap().to_owned())
        .collect();
    let outside = BTreeSet::from(["GET /openapi.json".to_owned(), "GET /docs".to_owned()]);
    let missing: Vec<_> = documented.difference(&on_page).collect();
    assert!(missing.is_empty(), "docs/API.md lacks {missing:?}");
    let extra: Vec<_> = on_page
        .difference(&documented)
        .filter(|r| !outside.contains(*r))
        .collect();
    assert!(
        extra.is_empty(),
        "docs/API.md names routes the service does not have: {extra:?}"
    );
    // Every error code and every `lost` reason the document names, and the name rule the
    // service enforces.
    let schemas = &doc["components"]["schemas"];
    let codes = backticked(
        schemas["ErrorBody"]["properties"]["error"]["description"]
            .as_str()
            .unwrap(),
    );
    let reasons = backticked(
        schemas["LostEvent"]["properties"]["reason"]["description"]
            .as_str()
            .unwrap(),
    );
    assert!(
        codes.len() >= 13 && reasons.len() >= 5,
        "{codes:?} {reasons:?}"
    );
    for word in codes.iter().chain(&reasons) {
        assert!(
            page.contains(&format!("`{word}`")),
            "docs/API.md does not explain `{word}`"
        );
    }
    let pattern = doc["paths"]["/locks/{name}"]["post"]["parameters"][0]["schema"]["pattern"]
        .as_str()
        .unwrap();
    assert!(
        page.contains(pattern),
        "docs/API.md lacks the name rule {pattern}"
    );
    // Every setting of the server.
    let cli = <redlockd::cli::Cli as clap::CommandFactory>::command();
    let serve = cli.find_subcommand("serve").unwrap();
    for arg in serve.get_arguments().filter(|a| !a.is_hide_set()) {
        if let Some(env) = arg.get_env() {
            let env = env.to_string_lossy();
            assert!(page.contains(&*env), "docs/API.md lacks {env}");
        }
    }
}

#[tokio::test]
async fn the_served_document_is_the_committed_one_and_describes_the_contract() {
    let app = TestApp::embedded().await;
    let served = app.text("/openapi.json").await;
    assert_eq!(served, committed());
    let doc: serde_json::Value = serde_json::from_str(&served).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let ops = [
        (
            "/locks/{name}",
            "post",
            ["201", "400", "409", "503"].as_slice(),
        ),
        ("/locks/{name}", "get", &["200", "400", "503"]),
        (
            "/locks/{name}/leases/{lease_id}",
            "put",
            &["200", "400", "404", "503"],
        ),
        (
            "/locks/{name}/leases/{lease_id}",
            "delete",
            &["204", "404", "503"],
        ),
        (
            "/locks/{name}/leases/{lease_id}",
            "get",
            &["200", "404", "503"],
        ),
        ("/locks", "get", &["200", "400", "503"]),
        ("/healthz", "get", &["200"]),
        ("/readyz", "get", &["200", "503"]),
        ("/metrics", "get", &["200"]),
    ];
    for (path, method, statuses) in ops {
        let op = &doc["paths"][path][method];
        assert!(op.is_object(), "{method} {path} is not documented");
        for status in statuses {
            assert!(
                op["responses"][status].is_object(),
                "{method} {path} lacks {status}"
            );
        }
    }
    for schema in [
        "LeaseBody",
        "ErrorBody",
        "GrantRequest",
        "LockStatus",
        "LockList",
        "Readiness",
    ] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "{schema} missing"
        );
    }
}

#[tokio::test]
async fn the_docs_are_served_from_the_binary_with_no_external_reference() {
    let app = TestApp::embedded().await;
    let page = app.text("/docs/").await;
    assert!(page.contains("swagger-ui"), "{page}");
    // `curl localhost:8080/docs` shows the page too, whose assets resolve under /docs/.
    let bare = app.call("GET", "/docs").send().await;
    assert_eq!(bare.status, 200);
    assert_eq!(bare.text.clone(), page);
    assert!(page.contains(r#"<base href="/docs/">"#), "{page}");
    let refs = references(&page);
    assert!(refs.len() >= 5, "{refs:?}");
    // The `<base>` names the folder itself; every other reference is an asset in it.
    for r in refs.iter().filter(|r| *r != "/docs/") {
        assert!(
            !r.contains("://") && !r.starts_with("//"),
            "external reference {r}"
        );
        let asset = format!("/docs/{}", r.trim_start_matches("./"));
        let resp = app.call("GET", &asset).send().await;
        assert_eq!(resp.status, 200, "{asset}");
        assert!(!resp.text.is_empty(), "{asset} is empty");
    }
    let init = app.text("/docs/swagger-initializer.js").await;
    assert!(init.contains(r#""url": "/openapi.json""#), "{init}");
    assert!(
        init.contains(r#""validatorUrl": "none""#),
        "the validator badge would fetch from the web: {init}"
    );
    assert!(
        !init.contains("http://") && !init.contains("https://"),
        "{init}"
    );
}

#[tokio::test]
async fn every_response_carries_a_request_id() {
    let app = TestApp::embedded().await;
    let resp = app
        .call("GET", "/healthz")
        .header("x-request-id", "trace-me-42")
        .send()
        .await;
    assert_eq!(resp.header("x-request-id"), Some("trace-me-42"));
    let resp = app.call("POST", "/locks/r").send().await;
    let id = resp.header("x-request-id").unwrap();
    assert_eq!(id.len(), 36, "a UUID: {id}");
}

#[tokio::test]
async fn large_responses_are_compressed_and_small_ones_are_not() {
    let app = TestApp::embedded().await;
    for (path, compressed) in [
        ("/metrics", true),
        ("/openapi.json", true),
        ("/docs/swagger-ui.css", true),
        ("/healthz", false),
    ] {
        let resp = app
            .call("GET", path)
            .header("accept-encoding", "gzip")
            .send()
            .await;
        assert_eq!(resp.status, 200, "{path}");
        let encoding = resp.header("content-encoding").map(str::to_owned);
        assert_eq!(
            encoding.as_deref() == Some("gzip"),
            compressed,
            "{path}: {encoding:?}"
        );
    }
}

#[tokio::test]
async fn requests_contention_and_cpu_are_counted_and_no_name_becomes_a_label() {
    let app = TestApp::embedded().await;
    app.must_grant("invoice:1", json!({})).await;
    assert_eq!(app.grant("invoice:1", json!({})).await.0, 409);
    app.grant("bad%20name", json!({})).await;
    let metrics = app.text("/metrics").await;
    for line in [
        r#"redlockd_requests_total{kind="lock",op="grant",outcome="ok"} 1"#,
        r#"redlockd_requests_total{kind="lock",op="grant",outcome="lock_held"} 1"#,
        r#"redlockd_requests_total{kind="lock",op="grant",outcome="invalid_request"} 1"#,
        r#"redlockd_contention_total{lock_class="invoice"} 1"#,
        r#"redlockd_leases_active 1"#,
        r#"redlockd_request_duration_seconds_bucket{op="grant",le="0.0001"}"#,
        "redlockd_wait_duration_seconds_bucket",
        "redlockd_master_request_duration_seconds_bucket",
        "process_resident_memory_bytes",
    ] {
        assert!(metrics.contains(line), "missing {line} in\n{metrics}");
    }
    assert!(
        !metrics.contains("invoice:1"),
        "a raw lock name became a label"
    );
    // CPU time in fractions of a second (the app runs in this process: compare with what
    // the kernel says of it), not whole seconds that read 0 for a second of work.
    let cpu = |text: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with("process_cpu_seconds_total "))
            .expect("process_cpu_seconds_total");
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<u64> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|f| f.parse().unwrap())
        .collect();
    let before = (fields[0] + fields[1]) as f64 / 100.0;
    let reported = cpu(&app.text("/metrics").await);
    assert!(
        reported >= before && reported - before < 0.5,
        "process_cpu_seconds_total {reported}, the kernel said {before} just before"
    );
}
