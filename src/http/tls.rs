//! TLS on the listener (`REDLOCKD_TLS_CERT`, `REDLOCKD_TLS_KEY`), with rustls, so that
//! bearer tokens need not cross a network in clear. The certificate and key are read again
//! when either file changes (checked every few seconds), without dropping a connection: a
//! renewed certificate (cert-manager, certbot) is served from the next handshake on. A
//! pair that does not load keeps the one in force and says why in the log.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

/// How often the certificate files are looked at for changes.
const RELOAD_EVERY: Duration = Duration::from_secs(2);

/// The certificate in force, for every handshake.
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// Where the certificate and key are, and the acceptor that serves them.
pub(crate) struct Tls {
    cert: PathBuf,
    key: PathBuf,
    current: Arc<Current>,
    pub acceptor: tokio_rustls::TlsAcceptor,
}

fn load(cert: &PathBuf, key: &PathBuf) -> Result<CertifiedKey, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("REDLOCKD_TLS_CERT {}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("REDLOCKD_TLS_CERT {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "REDLOCKD_TLS_CERT {}: no certificate in it",
            cert.display()
        ));
    }
    // The error names the file, never its content.
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|_| format!("REDLOCKD_TLS_KEY {}: no private key in it", key.display()))?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, private, &provider).map_err(|e| {
        format!(
            "REDLOCKD_TLS_KEY {}: does not match the certificate ({e})",
            key.display()
        )
    })
}

fn modified(path: &PathBuf) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl Tls {
    /// Load the pair; an error names the variable and the file.
    pub(crate) fn load(cert: &str, key: &str) -> Result<Self, String> {
        let (cert, key) = (PathBuf::from(cert), PathBuf::from(key));
        let current = Arc::new(Current(RwLock::new(Arc::new(load(&cert, &key)?))));
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(current.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            cert,
            key,
            current,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// Watch the files until `shutdown`, loading the pair again when either changes;
    /// `reloaded` is told whether each attempt succeeded.
    pub(crate) async fn reload_on_change(
        self: Arc<Self>,
        reloaded: impl Fn(bool) + Send + 'static,
        shutdown: CancellationToken,
    ) {
        let mut seen = (modified(&self.cert), modified(&self.key));
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(RELOAD_EVERY) => {}
            }
            let now = (modified(&self.cert), modified(&self.key));
            if now == seen {
                continue;
            }
            match load(&self.cert, &self.key) {
                Ok(fresh) => {
                    *self.current.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(fresh);
                    seen = now;
                    reloaded(true);
                    tracing::info!("TLS certificate reloaded");
                }
                // Half-written (one file renewed before the other): tried again next time.
                Err(e) => {
                    reloaded(false);
                    tracing::warn!(error = %e, "TLS certificate not reloaded; the one in force stays")
                }
            }
        }
    }
}
