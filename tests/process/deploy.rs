//! What ships beside the binary stays true to it: the Grafana dashboard draws every metric
//! redlockd exports and queries only those, and every panel's query, run by a real
//! Prometheus scraping a replica under a contended workload, is accepted and returns data;
//! the alerting rules pass `promtool check rules` and their unit tests (`promtool test
//! rules`, tests/alerts/); `promtool check metrics` has nothing to say about `/metrics`;
//! compose and the Helm chart use the same dashboard and rules files. The rest of the
//! deployment files are validated by scripts/validate-deploy (hadolint, the compose schema,
//! helm lint, Kubernetes schemas, the chart's PrometheusRule).

use crate::common;

use common::SendJson as _;

use std::collections::BTreeSet;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{RedisMaster, TestApp, config, masters, wait_for};
use redlockd::auth::{Role, new_token};
use serde_json::{Value, json};

const DASHBOARD: &str = include_str!("../../helm/redlockd/dashboards/redlockd.json");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

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

/// Every panel's queries, with the panel's title (rows have none).
fn panel_queries() -> Vec<(String, String)> {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().expect("a title").to_owned();
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} queries nothing");
        for target in targets {
            queries.push((
                title.clone(),
                target["expr"].as_str().expect("expr").to_owned(),
            ));
        }
    }
    queries
}

/// A replica on three real masters with a token file (so that the reload metric exists)
/// and a cap of one waiting grant per name (so that 429s happen), and its client token.
struct Bed {
    _masters: Vec<RedisMaster>,
    _tokens: tempfile::NamedTempFile,
    app: TestApp,
    token: String,
}

impl Bed {
    async fn start() -> Self {
        let masters = masters(3);
        let (token, entry) = new_token("workload", Role::Admin, vec![]);
        let mut tokens = tempfile::NamedTempFile::new().unwrap();
        write!(tokens, "{}", json!({ "tokens": [entry] })).unwrap();
        let mut cfg = config(&masters);
        cfg.auth_file = Some(tokens.path().to_str().unwrap().to_owned());
        cfg.max_waiters_per_name = 1;
        let app = TestApp::spawn(cfg).await;
        Self {
            _masters: masters,
            _tokens: tokens,
            app,
            token,
        }
    }

    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.request(reqwest::Method::POST, path)
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.app
            .http
            .request(method, self.app.url(path))
            .bearer_auth(&self.token)
    }

    /// The status of a `method` on `path`, sent with the workload's token.
    async fn status(&self, method: reqwest::Method, path: &str) -> u16 {
        self.request(method, path)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    /// What an operator's dashboard should show a moment of: grants, contention, waits
    /// granted and given up, a 429 past the waiter cap, a held stream, a campaign and its
    /// observer, renews, revokes, a leader read, a semaphore's permits, sessions. The streams stay open while the caller
    /// keeps what this returns.
    async fn contended_workload(&self) -> Workload {
        let lease: Value = self.post("/locks/dash:1").value().await;
        let id = lease["lease_id"].as_str().expect("granted").to_owned();
        // One waiter is admitted (the cap is one per name); the next is refused with 429.
        let waiter = self.post("/locks/dash:1?wait_ms=5000").send();
        let waiting = tokio::spawn(waiter);
        self.app.wait_for_contention("dash", 1).await;
        let refused = self
            .post("/locks/dash:1?wait_ms=5000")
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 429);
        // Renew, then revoke: the waiter is granted.
        let renew = format!("/locks/dash:1/leases/{id}");
        let http = &self.app.http;
        assert_eq!(self.status(reqwest::Method::PUT, &renew).await, 200);
        assert_eq!(self.status(reqwest::Method::DELETE, &renew).await, 204);
        let granted = waiting.await.unwrap().unwrap();
        assert_eq!(granted.status(), 201);
        // A wait that gives up.
        let gave_up = self.post("/locks/dash:1?wait_ms=200").send().await.unwrap();
        assert_eq!(gave_up.status(), 409);
        // A semaphore's permit taken and released, and one refused: all (one) taken.
        let permit: Value = self.post("/semaphores/dash:pool?limit=1").value().await;
        assert_eq!(
            self.status(reqwest::Method::POST, "/semaphores/dash:pool?limit=1")
                .await,
            409
        );
        let release = format!(
            "/semaphores/dash:pool/leases/{}",
            permit["lease_id"].as_str().expect("a permit")
        );
        assert_eq!(self.status(reqwest::Method::DELETE, &release).await, 204);
        // A kept hold, granted and revoked.
        let kept: Value = self.post("/locks/dash:kept?kept=true").value().await;
        let revoke = format!(
            "/locks/dash:kept/leases/{}",
            kept["lease_id"].as_str().expect("a kept hold")
        );
        assert_eq!(self.status(reqwest::Method::DELETE, &revoke).await, 204);
        // A held stream, a campaign and an observer, open while Prometheus scrapes.
        let hold = common::EventStream::open(
            self.post("/locks/dash:stream")
                .header("accept", "text/event-stream"),
        );
        let campaign = common::EventStream::open(
            self.post("/elections/dash:lead?value=a")
                .header("accept", "text/event-stream"),
        );
        let observe = common::EventStream::open(
            self.request(reqwest::Method::GET, "/elections/dash:lead/observe"),
        );
        let (mut hold, mut campaign, mut observe) = (hold.await, campaign.await, observe.await);
        hold.expect("granted").await;
        campaign.expect("elected").await;
        observe.next().await.expect("the observer's first event");
        assert_eq!(
            self.status(reqwest::Method::GET, "/elections/dash:lead")
                .await,
            200
        );
        // And traffic that goes on while Prometheus scrapes (bounded: a minute at most, or
        // until the test drops it), so that rates and quantiles have something to show.
        let (http, base, token) = (http.clone(), self.app.base.clone(), self.token.clone());
        let traffic = tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            // About twenty cycles a second: a steady rate for Prometheus to see.
            let mut pace = tokio::time::interval(Duration::from_millis(50));
            while started.elapsed() < Duration::from_secs(60) {
                pace.tick().await;
                let call = |method: reqwest::Method, path: &str| {
                    http.request(method, format!("{base}{path}"))
                        .bearer_auth(&token)
                        .send()
                };
                let Ok(granted) = call(reqwest::Method::POST, "/locks/dash:bg").await else {
                    continue;
                };
                let lease: Value = granted.json().await.unwrap_or_default();
                let id = lease["lease_id"].as_str().unwrap_or("none").to_owned();
                let lease = format!("/locks/dash:bg/leases/{id}");
                let _ = call(reqwest::Method::POST, "/locks/dash:bg?wait_ms=20").await;
                let _ = call(reqwest::Method::PUT, &lease).await;
                let _ = call(reqwest::Method::GET, &lease).await;
                let _ = call(reqwest::Method::GET, "/locks/dash:bg").await;
                let _ = call(reqwest::Method::GET, "/locks?prefix=dash").await;
                let _ = call(reqwest::Method::GET, "/elections/dash:lead").await;
                let _ = call(reqwest::Method::DELETE, &lease).await;
                // A kept hold, granted and revoked.
                if let Ok(kept) = call(reqwest::Method::POST, "/locks/dash:kept?kept=true").await {
                    let kept: Value = kept.json().await.unwrap_or_default();
                    let id = kept["lease_id"].as_str().unwrap_or("none");
                    let _ = call(
                        reqwest::Method::DELETE,
                        &format!("/locks/dash:kept/leases/{id}"),
                    )
                    .await;
                }
                // A session with a lock held through it: opened, renewed, read, ended.
                let Ok(opened) = call(reqwest::Method::POST, "/sessions?ttl_ms=5000").await else {
                    continue;
                };
                let session: Value = opened.json().await.unwrap_or_default();
                let id = session["session_id"].as_str().unwrap_or("none").to_owned();
                let path = format!("/sessions/{id}");
                let _ = call(
                    reqwest::Method::POST,
                    &format!("/locks/dash:s?session={id}"),
                )
                .await;
                let _ = call(reqwest::Method::PUT, &path).await;
                let _ = call(reqwest::Method::GET, &path).await;
                let _ = call(reqwest::Method::DELETE, &path).await;
            }
        });
        Workload {
            _streams: vec![hold, campaign, observe],
            traffic,
        }
    }
}

/// A workload running: its streams open and its traffic going, until dropped.
struct Workload {
    _streams: Vec<common::EventStream>,
    traffic: tokio::task::JoinHandle<()>,
}

impl Drop for Workload {
    fn drop(&mut self) {
        self.traffic.abort();
    }
}

/// The metric families `/metrics` describes.
fn exported(metrics: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn the_dashboard_draws_every_exported_metric_and_only_those() {
    let mut used = BTreeSet::new();
    for (_, expr) in panel_queries() {
        used.extend(metric_names(&expr).iter().map(|n| family(n).to_owned()));
    }
    let bed = Bed::start().await;
    let _workload = bed.contended_workload().await;
    let exported = exported(&bed.app.text("/metrics").await);
    for name in &used {
        assert!(
            exported.contains(name),
            "the dashboard queries {name}, which redlockd does not export; exported: {exported:?}"
        );
    }
    let ours: Vec<&String> = exported
        .iter()
        .filter(|n| n.starts_with("redlockd_"))
        .collect();
    assert!(ours.len() >= 17, "{ours:?}");
    for name in ours {
        assert!(
            used.contains(name),
            "{name} is exported but on no panel of the dashboard"
        );
    }
}

/// `promtool` from Debian's `prometheus` package (scripts/test installs it).
fn promtool() -> Command {
    assert!(
        which("promtool"),
        "promtool is not installed: run scripts/test (it installs it), or apt-get install prometheus"
    );
    Command::new("promtool")
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

fn succeeds(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?}:\n{text}");
    text
}

#[test]
fn the_alerting_rules_pass_promtool_and_each_alerts_unit_tests() {
    let rules = format!("{ROOT}/helm/redlockd/alerts/redlockd.rules.yml");
    let checked = succeeds(promtool().args(["check", "rules", &rules]));
    assert!(checked.contains("SUCCESS: 14 rules found"), "{checked}");
    let tested = succeeds(
        promtool()
            .current_dir(format!("{ROOT}/tests/alerts"))
            .args(["test", "rules", "redlockd.rules.test.yml"]),
    );
    assert!(tested.contains("SUCCESS"), "{tested}");
    // Every alert has a unit test that fires it and one where it stays silent, and a
    // runbook page of its own on the docs site, which its runbook_url names.
    let rules_text = std::fs::read_to_string(&rules).unwrap();
    let tests_text =
        std::fs::read_to_string(format!("{ROOT}/tests/alerts/redlockd.rules.test.yml")).unwrap();
    let alerts: Vec<&str> = rules_text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert_eq!(alerts.len(), 14, "{alerts:?}");
    for alert in alerts {
        let fired = format!("alertname: {alert}\n    exp_alerts:\n    - exp_labels:");
        let silent = format!("alertname: {alert}\n    exp_alerts: []");
        assert!(tests_text.contains(&fired), "no test fires {alert}");
        assert!(tests_text.contains(&silent), "no test keeps {alert} silent");
        let page = format!("runbooks/{}.md", alert.to_lowercase());
        let runbook = std::fs::read_to_string(format!("{ROOT}/docs/{page}"))
            .unwrap_or_else(|e| panic!("no runbook page for {alert}: {e}"));
        assert!(runbook.starts_with(&format!("# {alert}\n")), "{page}");
        let summary = std::fs::read_to_string(format!("{ROOT}/docs/SUMMARY.md")).unwrap();
        assert!(
            summary.contains(&format!("]({page})")),
            "SUMMARY.md lacks {page}"
        );
        assert!(rules_text.contains(&format!(
            "runbook_url: \"http://localhost:8080/book/{}\"",
            page.replace(".md", ".html")
        )));
    }
    // compose's Prometheus and the chart load this very file.
    let compose = std::fs::read_to_string(format!("{ROOT}/docker-compose.yml")).unwrap();
    assert!(compose.contains("./helm/redlockd/alerts/redlockd.rules.yml:"));
    let chart = std::fs::read_to_string(format!(
        "{ROOT}/helm/redlockd/templates/prometheusrule.yaml"
    ))
    .unwrap();
    assert!(chart.contains(r#".Files.Get "alerts/redlockd.rules.yml""#));
}

#[tokio::test]
async fn promtool_finds_nothing_to_say_about_metrics() {
    let bed = Bed::start().await;
    let _workload = bed.contended_workload().await;
    let metrics = bed.app.text("/metrics").await;
    let mut check = promtool()
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check
        .stdin
        .take()
        .unwrap()
        .write_all(metrics.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics:\n{said}"
    );
}

/// A Prometheus of our own, scraping `target` every second, stopped on drop.
struct Prometheus {
    child: std::process::Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: &str) -> Self {
        assert!(
            which("prometheus"),
            "prometheus is not installed: run scripts/test (it installs it), or apt-get install prometheus"
        );
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: redlockd\n    static_configs:\n      - targets: [\"{target}\"]\n"
            ),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus");
        Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        }
    }

    /// The instant query's answer: `Err` with Prometheus's error when it refuses it.
    async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let answer: Value = common::http()
            .get(format!("{}/api/v1/query", self.base))
            .query(&[("query", expr)])
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        if answer["status"] != "success" {
            return Err(answer.to_string());
        }
        Ok(answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// The one value of a query that answers a single number.
    async fn number(&self, expr: &str) -> Option<f64> {
        let result = self.query(expr).await.ok()?;
        result.first()?["value"][1].as_str()?.parse().ok()
    }

    /// Wait (30 s at most) until the query `expr` answers a number of at least `least`.
    async fn wait_for_at_least(&self, what: &str, expr: &str, least: f64) {
        wait_for(what, Duration::from_secs(30), async || {
            (self.number(expr).await? >= least).then_some(())
        })
        .await;
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn every_panels_query_is_accepted_by_prometheus_and_returns_data() {
    let bed = Bed::start().await;
    let prometheus = Prometheus::start(bed.app.base.trim_start_matches("http://"));
    // Scraped before the workload, so that every counter's rate has a sample to start from.
    let up = r#"up{job="redlockd"}"#;
    prometheus
        .wait_for_at_least("Prometheus to scrape the replica", up, 1.0)
        .await;
    let _workload = bed.contended_workload().await;
    let metrics = bed.app.text("/metrics").await;
    let requests: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("redlockd_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let seen = r#"sum(redlockd_requests_total{job="redlockd"})"#;
    prometheus
        .wait_for_at_least("Prometheus to scrape the workload", seen, requests)
        .await;
    // Series the workload made (a 429's, a lock class's) need two samples for a rate.
    let scrapes = r#"min(count_over_time(redlockd_requests_total{job="redlockd"}[1m]))"#;
    prometheus
        .wait_for_at_least("two scrapes of the workload's new series", scrapes, 2.0)
        .await;
    for (title, expr) in panel_queries() {
        // Grafana's variables, as Grafana would fill them in.
        let query = expr
            .replace("$job", "redlockd")
            .replace("$__rate_interval", "1m");
        let result = prometheus
            .query(&query)
            .await
            .unwrap_or_else(|e| panic!("{title}: Prometheus refused {query}: {e}"));
        let values: Vec<&str> = result
            .iter()
            .filter_map(|series| series["value"][1].as_str())
            .collect();
        assert!(
            values.iter().any(|v| *v != "NaN"),
            "{title}: {query} returned no data under a contended workload: {result:?}"
        );
    }
}

#[test]
fn compose_and_the_chart_share_the_dashboard_file() {
    let compose = std::fs::read_to_string(format!("{ROOT}/docker-compose.yml")).unwrap();
    assert!(compose.contains("./helm/redlockd/dashboards/redlockd.json:"));
    let chart = std::fs::read_to_string(format!(
        "{ROOT}/helm/redlockd/templates/dashboard-configmap.yaml"
    ))
    .unwrap();
    assert!(chart.contains(r#".Files.Get "dashboards/redlockd.json""#));
}
