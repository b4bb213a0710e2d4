//! The client side of the contract, for the binary's client verbs (`redlockd lock`,
//! `inspect`, `list`): calls to one or more redlockd replicas, failing over between them,
//! with the answers turned into typed outcomes.
//!
//! Failing over is safe only for calls that are safe to repeat. Renew, revoke, check,
//! inspect and list are; a grant is when it carries an Idempotency-Key (sent again, it is
//! answered with the lease its first attempt won), and only then.

pub(crate) mod lock;
pub(crate) mod show;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::wire::ErrorBody;

/// How long connecting to one replica may take before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a call other than a waiting grant may take at one replica.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How many times a call goes round the replicas before it gives up, as every client does.
const ROUNDS: usize = 2;

/// Why a call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Failure {
    /// Another lease holds the lock; it lapses in about `retry_after` unless renewed.
    #[error("{message}")]
    Held {
        retry_after: Duration,
        message: String,
    },
    /// The lease (or the route) does not exist: the masters no longer hold it.
    #[error("{0}")]
    NotFound(String),
    /// The server refused the request as malformed.
    #[error("{0}")]
    Invalid(String),
    /// The server refused the token (401), or its role or prefixes do not allow this (403).
    #[error("{0}")]
    Denied(String),
    /// No replica answered, or the one that did cannot reach a majority of masters.
    #[error("{0}")]
    Unavailable(String),
}

/// Whether a call may be sent again to another replica: on any failure to get an answer,
/// or a 503, the next replica is tried (clients/cases/failover.json).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Repeat<'a> {
    /// Safe to repeat as it is (it names its lease, or only reads).
    Safe,
    /// A grant, made safe to repeat by this Idempotency-Key, sent with every attempt.
    Keyed(&'a str),
}

/// A new Idempotency-Key for one grant: 128 random bits.
pub(crate) fn idempotency_key() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The replicas to ask, in order; the one that answered last is asked first next time.
pub(crate) struct Servers {
    urls: Vec<String>,
    http: reqwest::Client,
    preferred: AtomicUsize,
    token: Option<String>,
}

impl Servers {
    /// The replicas `args` names, called with its bearer token when given, trusting its CA
    /// file beside the system's store.
    pub(crate) fn of(args: &crate::cli::ServerArgs) -> Result<Self, Failure> {
        Self::new(
            &args.servers,
            args.token.as_deref(),
            args.ca_file.as_deref(),
        )
    }

    /// The replicas at `urls`, called with `token` as the bearer token when given.
    pub(crate) fn new(
        urls: &[String],
        token: Option<&str>,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Self, Failure> {
        let urls: Vec<String> = urls
            .iter()
            .map(|u| u.trim().trim_end_matches('/').to_owned())
            .filter(|u| !u.is_empty())
            .collect();
        if urls.is_empty() {
            return Err(Failure::Invalid("no --server given".into()));
        }
        for url in &urls {
            let parsed = url::Url::parse(url)
                .map_err(|e| Failure::Invalid(format!("--server {url}: {e}")))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(Failure::Invalid(format!(
                    "--server {url}: must be an http:// or https:// URL"
                )));
            }
        }
        let roots = crate::trust::extra_roots(ca_file)
            .map_err(|e| Failure::Invalid(format!("--ca-file {e:#}")))?;
        let http = crate::trust::client(&roots)
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| Failure::Unavailable(format!("cannot start an HTTP client: {e}")))?;
        Ok(Self {
            urls,
            http,
            preferred: AtomicUsize::new(0),
            token: token.filter(|t| !t.is_empty()).map(str::to_owned),
        })
    }

    /// Read `path`: a GET, safe to ask each replica in turn.
    pub(crate) async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, Failure> {
        self.call::<(), T>(Method::GET, path, None, Duration::ZERO, Repeat::Safe)
            .await
    }

    /// Send one call, to each replica in turn as `repeat` allows, and read its answer.
    /// `wait` is added to the time one replica may take (a waiting grant). A replica that
    /// gives no answer, or has no majority (503), is passed over, twice round at most; any
    /// other answer is final, and its replica is asked first next time.
    pub(crate) async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        wait: Duration,
        repeat: Repeat<'_>,
    ) -> Result<T, Failure> {
        let first = self.preferred.load(Ordering::Relaxed);
        let mut last = Failure::Unavailable("no server was asked".into());
        let tries = self.urls.len() * ROUNDS;
        for i in 0..tries {
            let at = (first + i) % self.urls.len();
            let base = &self.urls[at];
            let mut request = self
                .http
                .request(method.clone(), format!("{base}{path}"))
                .timeout(CALL_TIMEOUT + wait);
            if let Some(body) = body {
                request = request.json(body);
            }
            if let Some(token) = &self.token {
                request = request.bearer_auth(token);
            }
            if let Repeat::Keyed(key) = repeat {
                request = request.header("Idempotency-Key", key);
            }
            let response = match request.send().await {
                Ok(response) => response,
                Err(e) => {
                    last = Failure::Unavailable(format!("{base}: {}", describe(&e)));
                    continue;
                }
            };
            let status = response.status();
            let bytes = match response.bytes().await {
                Ok(bytes) => bytes,
                Err(e) => {
                    last = Failure::Unavailable(format!("{base}: {}", describe(&e)));
                    continue;
                }
            };
            if status.is_success() {
                self.preferred.store(at, Ordering::Relaxed);
                let bytes: &[u8] = if bytes.is_empty() { b"null" } else { &bytes };
                return serde_json::from_slice(bytes)
                    .map_err(|e| Failure::Unavailable(format!("{base}: unexpected answer ({e})")));
            }
            let failure = failure(status, &bytes, base);
            if status == StatusCode::SERVICE_UNAVAILABLE {
                last = failure;
                continue;
            }
            self.preferred.store(at, Ordering::Relaxed);
            return Err(failure);
        }
        Err(last)
    }
}

/// The failure an error status and body stand for.
fn failure(status: StatusCode, body: &[u8], base: &str) -> Failure {
    let parsed: Option<ErrorBody> = serde_json::from_slice(body).ok();
    let message = parsed.as_ref().map_or_else(
        || format!("{base} answered {status}"),
        |b| b.message.clone(),
    );
    match status {
        StatusCode::CONFLICT => Failure::Held {
            retry_after: Duration::from_millis(
                parsed.and_then(|b| b.retry_after_ms).unwrap_or(1000),
            ),
            message,
        },
        StatusCode::NOT_FOUND
            if parsed
                .is_some_and(|b| matches!(&*b.error, "lease_not_found" | "session_not_found")) =>
        {
            Failure::NotFound(message)
        }
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Failure::Denied(message),
        // Past a cap or the token's rate, or a body that did not arrive in time: try later.
        StatusCode::TOO_MANY_REQUESTS | StatusCode::REQUEST_TIMEOUT => {
            Failure::Unavailable(format!("{base}: {message}"))
        }
        s if s.is_client_error() => Failure::Invalid(message),
        _ => Failure::Unavailable(format!("{base}: {message}")),
    }
}

/// A transport error in a few words (reqwest's own text repeats the URL).
fn describe(e: &reqwest::Error) -> String {
    let what = if e.is_connect() {
        "cannot connect"
    } else if e.is_timeout() {
        "no answer in time"
    } else {
        "connection failed"
    };
    let mut cause = std::error::Error::source(e);
    let mut deepest = None;
    while let Some(c) = cause {
        deepest = Some(c.to_string());
        cause = c.source();
    }
    match deepest {
        Some(d) => format!("{what} ({d})"),
        None => what.to_owned(),
    }
}

/// Escape nothing: lock names are URL-safe by the contract's alphabet, and a name outside
/// it is refused by the server with a clear 400. Lease ids are URL-safe by construction.
pub(crate) fn lock_path(name: &str) -> String {
    format!("/locks/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_statuses_become_typed_failures() {
        let held = br#"{"error":"lock_held","message":"held","retry_after_ms":1500}"#;
        assert_eq!(
            failure(StatusCode::CONFLICT, held, "s"),
            Failure::Held {
                retry_after: Duration::from_millis(1500),
                message: "held".into()
            }
        );
        let gone = br#"{"error":"lease_not_found","message":"gone"}"#;
        assert_eq!(
            failure(StatusCode::NOT_FOUND, gone, "s"),
            Failure::NotFound("gone".into())
        );
        assert!(matches!(
            failure(StatusCode::BAD_REQUEST, b"{}", "s"),
            Failure::Invalid(_)
        ));
        assert!(matches!(
            failure(StatusCode::SERVICE_UNAVAILABLE, b"not json", "s"),
            Failure::Unavailable(m) if m.contains("503")
        ));
        assert!(matches!(
            failure(StatusCode::REQUEST_TIMEOUT, b"", "s"),
            Failure::Unavailable(_)
        ));
    }

    /// The table every client runs (clients/cases/errors.json). The command line tells
    /// 401 from 403 by the message only, and a 429 is "try later", as unavailability is.
    #[test]
    fn each_answer_is_classified_as_the_shared_table_says() {
        let table: serde_json::Value =
            serde_json::from_str(include_str!("../../clients/cases/errors.json")).unwrap();
        for case in table["cases"].as_array().unwrap() {
            let status = StatusCode::from_u16(case["status"].as_u64().unwrap() as u16).unwrap();
            let body = match &case["body"] {
                serde_json::Value::String(text) => text.clone().into_bytes(),
                body => body.to_string().into_bytes(),
            };
            let got = failure(status, &body, "s");
            let class = case["class"].as_str().unwrap();
            let expected = match (class, &got) {
                ("held", Failure::Held { retry_after, .. }) => {
                    let ms = case["retry_after_ms"].as_u64().unwrap();
                    *retry_after == Duration::from_millis(ms)
                }
                ("lease_lost", Failure::NotFound(_)) => true,
                ("bad_request", Failure::Invalid(_)) => true,
                ("unauthorized" | "forbidden", Failure::Denied(_)) => true,
                ("too_many_requests" | "unavailable", Failure::Unavailable(_)) => true,
                _ => false,
            };
            assert!(expected, "{case}: {got:?}");
        }
    }

    /// One replica of a case of clients/cases/failover.json: it answers each connection
    /// with its next answer (its last repeats), or closes it unanswered (`refused`: no
    /// answer, as a replica that cannot be reached gives none), and records the attempt.
    async fn replica(
        i: usize,
        mut answers: Vec<serde_json::Value>,
        ok_body: serde_json::Value,
        tried: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    ) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut request = [0u8; 4096];
                let _ = conn.read(&mut request).await;
                tried.lock().unwrap().push(i);
                let answer = if answers.len() > 1 {
                    answers.remove(0)
                } else {
                    answers[0].clone()
                };
                let (status, body) = match &answer {
                    serde_json::Value::String(word) if word == "refused" => continue,
                    serde_json::Value::String(_) => (200, ok_body.clone()),
                    given => (given["status"].as_u64().unwrap(), given["body"].clone()),
                };
                let body = body.to_string();
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
            }
        });
        url
    }

    /// The table every client runs (clients/cases/failover.json): the replicas asked, in
    /// order, and what the caller gets. (The command line's failures carry no code.)
    #[tokio::test]
    async fn each_call_goes_round_the_replicas_as_the_shared_table_says() {
        let table: serde_json::Value =
            serde_json::from_str(include_str!("../../clients/cases/failover.json")).unwrap();
        for case in table["cases"].as_array().unwrap() {
            let tried = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let mut urls = Vec::new();
            for (i, answers) in case["replicas"].as_array().unwrap().iter().enumerate() {
                let answers = answers.as_array().unwrap().clone();
                urls.push(replica(i, answers, table["ok_body"].clone(), tried.clone()).await);
            }
            let servers = Servers::new(&urls, None, None).unwrap();
            for call in case["calls"].as_array().unwrap() {
                tried.lock().unwrap().clear();
                let got = servers.get::<serde_json::Value>("/locks/job").await;
                let expected = match (call["result"].as_str().unwrap(), &got) {
                    ("ok", Ok(body)) => body["fencing_token"] == 7,
                    ("unavailable", Err(Failure::Unavailable(_))) => true,
                    ("forbidden", Err(Failure::Denied(_))) => true,
                    _ => false,
                };
                assert!(expected, "{}: {call}: {got:?}", case["name"]);
                let want: Vec<usize> = serde_json::from_value(call["tried"].clone()).unwrap();
                assert_eq!(*tried.lock().unwrap(), want, "{}", case["name"]);
            }
        }
    }

    #[test]
    fn only_http_servers_are_accepted() {
        assert!(Servers::new(&["http://127.0.0.1:1/".into()], None, None).is_ok());
        assert!(Servers::new(&["redis://127.0.0.1:1".into()], None, None).is_err());
        assert!(Servers::new(&[], None, None).is_err());
    }
}
