//! HTTPS on the listener: served with the configured certificate, renewed certificates
//! served once the files change, plain HTTP refused, and the container health check speaks
//! TLS too.

use crate::common;

use std::time::Duration;

use common::{TestApp, config, wait_for};

struct Pair {
    cert_pem: String,
    key_pem: String,
}

fn pair() -> Pair {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    Pair {
        cert_pem: cert.cert.pem(),
        key_pem: cert.key_pair.serialize_pem(),
    }
}

fn trusting(pair: &Pair) -> reqwest::Client {
    common::http_builder()
        .tls_certs_only([reqwest::Certificate::from_pem(pair.cert_pem.as_bytes()).unwrap()])
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

#[tokio::test]
async fn https_is_served_with_the_certificate_and_a_renewed_one_is_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let first = pair();
    std::fs::write(&cert, &first.cert_pem).unwrap();
    std::fs::write(&key, &first.key_pem).unwrap();
    let mut cfg = config(&[]);
    cfg.tls_cert = Some(cert.to_str().unwrap().to_owned());
    cfg.tls_key = Some(key.to_str().unwrap().to_owned());
    let app = TestApp::spawn(cfg).await;
    let port = app.base.rsplit(':').next().unwrap().to_owned();
    let https = format!("https://localhost:{port}");

    let resp = trusting(&first)
        .post(format!("{https}/locks/over-tls"))
        .send()
        .await
        .expect("an HTTPS request");
    assert_eq!(resp.status(), 201);
    // Plain HTTP on the TLS port gets no answer.
    let plain = common::http()
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(plain.is_err() || plain.unwrap().status() != 200);

    // The health check of the container image speaks TLS when it is configured.
    // (Asynchronously: the server runs on this test's one thread.)
    common::succeeds(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_redlockd"))
            .arg("healthcheck")
            .env_clear()
            .env("REDLOCKD_LISTEN", format!("127.0.0.1:{port}"))
            .env("REDLOCKD_TLS_CERT", &cert)
            .env("REDLOCKD_TLS_KEY", &key),
    )
    .await;

    // A renewed certificate is served from the next handshake, no restart.
    let second = pair();
    std::fs::write(&key, &second.key_pem).unwrap();
    std::fs::write(&cert, &second.cert_pem).unwrap();
    let renewed = trusting(&second);
    wait_for(
        "the renewed certificate",
        Duration::from_secs(10),
        async || {
            renewed
                .get(format!("{https}/healthz"))
                .send()
                .await
                .ok()
                .filter(|r| r.status() == 200)
                .map(drop)
        },
    )
    .await;
    assert!(
        trusting(&first)
            .get(format!("{https}/healthz"))
            .send()
            .await
            .is_err(),
        "the old certificate is no longer served"
    );
}

#[test]
fn a_missing_key_stops_the_process_and_names_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("tls.crt");
    std::fs::write(&cert, pair().cert_pem).unwrap();
    for (envs, variable) in [
        (
            vec![("REDLOCKD_TLS_CERT", cert.to_str().unwrap())],
            "REDLOCKD_TLS_CERT",
        ),
        (
            vec![
                ("REDLOCKD_TLS_CERT", cert.to_str().unwrap()),
                ("REDLOCKD_TLS_KEY", "/no/such/key"),
            ],
            "REDLOCKD_TLS_KEY",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_redlockd"))
            .env_clear()
            .env("REDLOCKD_LISTEN", "127.0.0.1:0")
            .envs(envs)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(variable), "{stderr}");
    }
}

/// A certificate authority of the test's own, as a company's internal CA would be, and a
/// server certificate for `localhost` it signed.
struct Authority {
    ca_pem: String,
    server: Pair,
}

fn authority() -> Authority {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "redlockd test CA");
    let ca = params.self_signed(&ca_key).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&server_key, &ca, &ca_key)
        .unwrap();
    Authority {
        ca_pem: ca.pem(),
        server: Pair {
            cert_pem: server.pem(),
            key_pem: server_key.serialize_pem(),
        },
    }
}

/// `redlockd lock --server https://…` against a server whose certificate an internal CA
/// signed: refused until the CA is trusted, then trusted through `--ca-file`
/// (`REDLOCKD_CA_FILE`) or the standard `SSL_CERT_FILE`, never by changing the machine's
/// store and never by turning verification off.
#[tokio::test]
async fn the_cli_trusts_an_internal_ca_through_ca_file_or_ssl_cert_file() {
    let dir = tempfile::tempdir().unwrap();
    let ca = authority();
    let (cert, key, ca_file) = (
        dir.path().join("tls.crt"),
        dir.path().join("tls.key"),
        dir.path().join("company-ca.pem"),
    );
    std::fs::write(&cert, &ca.server.cert_pem).unwrap();
    std::fs::write(&key, &ca.server.key_pem).unwrap();
    std::fs::write(&ca_file, &ca.ca_pem).unwrap();
    let mut cfg = config(&[]);
    cfg.tls_cert = Some(cert.to_str().unwrap().to_owned());
    cfg.tls_key = Some(key.to_str().unwrap().to_owned());
    let app = TestApp::spawn(cfg).await;
    let port = app.base.rsplit(':').next().unwrap().to_owned();
    let server = format!("https://localhost:{port}");
    let ran = dir.path().join("ran");

    let lock = |envs: &[(&str, &std::path::Path)], args: &[&str]| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_redlockd"));
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .args(["lock", "--server", &server])
            .args(args)
            .args(["ca-test", "--", "touch"])
            .arg(&ran);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd.output()
    };
    // Not trusted: no answer is accepted from the server, and the command never runs.
    let out = lock(&[], &[]).await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(!ran.exists(), "the command ran without the lock");
    assert!(stderr.contains("certificate"), "says why: {stderr}");

    // Trusted through --ca-file.
    let ca_path = ca_file.to_str().unwrap();
    let out = lock(&[], &["--ca-file", ca_path]).await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(ran.exists(), "the command ran under the lock");
    std::fs::remove_file(&ran).unwrap();

    // Trusted through REDLOCKD_CA_FILE, and through the standard SSL_CERT_FILE.
    for variable in ["REDLOCKD_CA_FILE", "SSL_CERT_FILE"] {
        let out = lock(&[(variable, &ca_file)], &[]).await.unwrap();
        assert!(
            out.status.success(),
            "{variable}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(ran.exists(), "{variable}: the command ran under the lock");
        std::fs::remove_file(&ran).unwrap();
    }

    // A CA file that is not one is refused as bad usage, naming it, before any call.
    let out = lock(
        &[],
        &[
            "--ca-file",
            cert.with_extension("missing").to_str().unwrap(),
        ],
    )
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("tls.missing"), "{stderr}");
}

/// A TLS listener for a receiver of the test's own, served by axum.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    tls: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.tls.accept(stream).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// An OTLP/HTTP collector over HTTPS with `pair`'s certificate: each POST to `/v1/traces`
/// kept as its content type.
async fn https_collector(pair: &Pair) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(pair.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
    let key = PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let posts = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = posts.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let kept = kept.clone();
            async move {
                let kind = headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                kept.lock().unwrap().push(kind);
                "{}"
            }
        }),
    );
    let listener = TlsListener {
        tcp: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        tls: tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)),
    };
    let port = listener.tcp.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("https://localhost:{port}"), posts)
}

/// Traces to an `https://` collector named only by the standard OpenTelemetry variables,
/// its certificate signed by an internal CA trusted through `REDLOCKD_CA_FILE`; the
/// protocol the standard variable asks for is the one spoken.
#[tokio::test]
async fn traces_go_to_an_https_collector_named_by_the_standard_variables() {
    let dir = tempfile::tempdir().unwrap();
    let ca = authority();
    let ca_file = dir.path().join("company-ca.pem");
    std::fs::write(&ca_file, &ca.ca_pem).unwrap();
    let (endpoint, posts) = https_collector(&ca.server).await;
    let server = common::Server::start(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("REDLOCKD_CA_FILE", ca_file.to_str().unwrap()),
    ])
    .await;
    server.wait_ready("the server to be ready").await;
    let granted = common::http()
        .post(format!("{}/locks/traced:https", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(granted.status(), 201);
    // Stopping sends what is still batched.
    common::signal(server.child.id(), "-TERM");
    wait_for(
        "the spans to reach the collector",
        Duration::from_secs(10),
        async || (!posts.lock().unwrap().is_empty()).then_some(()),
    )
    .await;
    assert!(
        posts
            .lock()
            .unwrap()
            .iter()
            .all(|kind| kind == "application/x-protobuf"),
        "{:?}",
        posts.lock().unwrap()
    );

    // An untrusted collector's certificate gets no span: without the CA, nothing arrives,
    // and the server serves all the same.
    let untrusted = pair();
    let (endpoint, posts) = https_collector(&untrusted).await;
    let mut server = common::Server::start(&[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)]).await;
    server.wait_ready("the server to be ready").await;
    let granted = common::http()
        .post(format!("{}/locks/traced:untrusted", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(granted.status(), 201);
    common::signal(server.child.id(), "-TERM");
    // Its exit comes after the exporter's last attempt to send.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while server.child.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the server did not stop"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        posts.lock().unwrap().is_empty(),
        "a span was sent to an untrusted collector"
    );
}
