//! Which servers redlockd's own HTTP clients trust: the client verbs (`lock`, `inspect`,
//! `list`) calling a replica over `https://`, and the trace exporter calling a collector.
//!
//! Both verify certificates with the operating system's store (reqwest's platform
//! verifier: on Linux the distribution's bundle, or the `SSL_CERT_FILE` / `SSL_CERT_DIR`
//! the process is given), plus the certificates of `REDLOCKD_CA_FILE` when set: a
//! company's internal CA (cert-manager, Vault PKI) trusted by one setting, without
//! touching the machine's store. Nothing here turns verification off.

use std::path::Path;

/// Make rustls' process-wide crypto provider ring's, the one the rest of the binary
/// (rediss:// masters, the HTTPS listener) uses. Installing it twice is refused
/// harmlessly: the provider is the same.
pub(crate) fn use_ring() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The certificates of the PEM file at `path` (one or more), to trust beside the system's.
/// A file that cannot be read or holds no certificate is an error that names it: a CA
/// file set by mistake must not leave the client quietly trusting less than was meant.
pub(crate) fn extra_roots(path: Option<&Path>) -> anyhow::Result<Vec<reqwest::Certificate>> {
    use anyhow::Context as _;
    let Some(path) = path else {
        return Ok(Vec::new());
    };
    let pem = std::fs::read(path).with_context(|| format!("{}", path.display()))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .with_context(|| format!("{}: not PEM certificates", path.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        path.display()
    );
    Ok(certs)
}

/// An async client builder that trusts the system's store and `roots`.
pub(crate) fn client(roots: &[reqwest::Certificate]) -> reqwest::ClientBuilder {
    use_ring();
    roots
        .iter()
        .cloned()
        .fold(reqwest::Client::builder(), |b, cert| {
            b.add_root_certificate(cert)
        })
}

/// A blocking client builder (the trace exporter's) that trusts the system's store and
/// `roots`. Build it outside any async runtime: reqwest's blocking client runs one of its
/// own.
pub(crate) fn blocking_client(roots: &[reqwest::Certificate]) -> reqwest::blocking::ClientBuilder {
    use_ring();
    roots
        .iter()
        .cloned()
        .fold(reqwest::blocking::Client::builder(), |b, cert| {
            b.add_root_certificate(cert)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_that_is_missing_or_not_pem_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("redlockd-trust-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.pem");
        let err = extra_roots(Some(&missing)).unwrap_err();
        assert!(format!("{err:#}").contains("missing.pem"), "{err:#}");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = extra_roots(Some(&empty)).unwrap_err();
        assert!(format!("{err:#}").contains("empty.pem"), "{err:#}");
        assert!(extra_roots(None).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
