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
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(pair.cert_pem.as_bytes()).unwrap())
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
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(plain.is_err() || plain.unwrap().status() != 200);

    // The health check of the container image speaks TLS when it is configured.
    // (Asynchronously: the server runs on this test's one thread.)
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_redlockd"))
        .arg("healthcheck")
        .env_clear()
        .env("REDLOCKD_LISTEN", format!("127.0.0.1:{port}"))
        .env("REDLOCKD_TLS_CERT", &cert)
        .env("REDLOCKD_TLS_KEY", &key)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

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
