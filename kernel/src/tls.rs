//! TLS for the gRPC server (rustls through tonic, with the ring provider).
//!
//! `--tls-cert` and `--tls-key` give the kernel its identity; `--tls-client-ca` adds client
//! certificates for workers. Every file is read and parsed at start, so a missing or malformed one
//! stops the kernel with an error naming the flag and the file, before the store is opened.
//!
//! With a client CA, a client that presents a certificate is verified during the handshake (one
//! not signed by the CA is refused there). Presenting one stays optional for agents and kernelctl,
//! which authenticate otherwise; a worker session without one is refused by [`WorkerGate`] with
//! `UNAUTHENTICATED`, so an unknown process cannot offer tools.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Status};
use tracing::info;

use crate::config::Config;
use crate::error::KernelError;

/// A client that has not finished its TLS handshake by then is disconnected.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A server builder serving TLS when the configuration asks for it, plaintext otherwise.
pub fn server_builder(config: &Config) -> Result<Server, KernelError> {
    let Some(tls) = server_config(config)? else {
        return Ok(Server::builder());
    };
    let server = Server::builder().tls_config(tls).map_err(|e| {
        KernelError::invalid(
            format!("--tls-key '{}'", path_text(&config.tls_key)),
            format!("unusable with --tls-cert: {}", error_chain(&e)),
        )
    })?;
    info!(
        cert = %path_text(&config.tls_cert),
        client_ca = %path_text(&config.tls_client_ca),
        "serving over tls"
    );
    Ok(server)
}

fn path_text(path: &Option<PathBuf>) -> String {
    path.as_deref()
        .map_or_else(|| "none".into(), |p| p.display().to_string())
}

/// An error and its causes: tonic's own message says only "transport error".
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The server's TLS settings from the configuration, or `None` to serve plaintext.
pub fn server_config(config: &Config) -> Result<Option<ServerTlsConfig>, KernelError> {
    let (cert_path, key_path) = match (&config.tls_cert, &config.tls_key) {
        (None, None) => {
            if config.tls_client_ca.is_some() {
                return Err(KernelError::invalid(
                    "--tls-client-ca",
                    "needs --tls-cert and --tls-key: client certificates are checked over TLS only",
                ));
            }
            return Ok(None);
        }
        (Some(cert), Some(key)) => (cert, key),
        (Some(_), None) => return Err(KernelError::invalid("--tls-key", "missing: --tls-cert needs it")),
        (None, Some(_)) => return Err(KernelError::invalid("--tls-cert", "missing: --tls-key needs it")),
    };
    let cert = read_certificates("--tls-cert", cert_path)?;
    let key = read_private_key("--tls-key", key_path)?;
    let mut tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(cert, key))
        .timeout(HANDSHAKE_TIMEOUT);
    if let Some(ca_path) = &config.tls_client_ca {
        let ca = read_certificates("--tls-client-ca", ca_path)?;
        tls = tls.client_ca_root(Certificate::from_pem(ca)).client_auth_optional(true);
    }
    Ok(Some(tls))
}

/// Reads a PEM file that must hold at least one certificate, each well formed.
fn read_certificates(flag: &str, path: &Path) -> Result<Vec<u8>, KernelError> {
    let pem = read(flag, path)?;
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        cert.map_err(|e| bad_file(flag, path, format!("not a PEM certificate: {e}")))?;
        count += 1;
    }
    if count == 0 {
        return Err(bad_file(flag, path, "holds no PEM certificate".into()));
    }
    Ok(pem)
}

/// Reads a PEM file that must hold a private key (PKCS#8, PKCS#1 or SEC1).
fn read_private_key(flag: &str, path: &Path) -> Result<Vec<u8>, KernelError> {
    let pem = read(flag, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| bad_file(flag, path, format!("no PEM private key: {e}")))?;
    Ok(pem)
}

fn read(flag: &str, path: &Path) -> Result<Vec<u8>, KernelError> {
    std::fs::read(path).map_err(|e| bad_file(flag, path, format!("cannot read: {e}")))
}

fn bad_file(flag: &str, path: &Path, reason: String) -> KernelError {
    KernelError::invalid(format!("{flag} '{}'", path.display()), reason)
}

/// An interceptor for the worker service: with a client CA configured, a session must come over a
/// connection whose client presented a certificate (the handshake has already verified it against
/// the CA). Without one it lets everything through.
#[derive(Clone, Copy, Debug)]
pub struct WorkerGate {
    require_client_cert: bool,
}

impl WorkerGate {
    /// A gate for the configuration: closed to workers without a certificate when a client CA is set.
    pub fn new(config: &Config) -> Self {
        WorkerGate {
            require_client_cert: config.tls_client_ca.is_some(),
        }
    }
}

impl tonic::service::Interceptor for WorkerGate {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        if !self.require_client_cert || request.peer_certs().is_some_and(|certs| !certs.is_empty()) {
            return Ok(request);
        }
        Err(Status::unauthenticated(
            "worker sessions need a client certificate signed by the kernel's --tls-client-ca",
        ))
    }
}

#[cfg(test)]
mod tests {
    use tonic::service::Interceptor;

    use super::*;

    fn config(dir: &Path, flags: &[(&str, &str)]) -> Config {
        let mut config = Config::for_tests(dir.join("kernel.db"));
        for (flag, file) in flags {
            let path = Some(dir.join(file));
            match *flag {
                "cert" => config.tls_cert = path,
                "key" => config.tls_key = path,
                "ca" => config.tls_client_ca = path,
                _ => unreachable!(),
            }
        }
        config
    }

    fn message(error: KernelError) -> String {
        error.to_string()
    }

    #[test]
    fn no_files_means_plaintext() {
        let dir = tempfile::tempdir().unwrap();
        assert!(server_config(&config(dir.path(), &[])).unwrap().is_none());
    }

    #[test]
    fn cert_and_key_go_together() {
        let dir = tempfile::tempdir().unwrap();
        let error = message(server_config(&config(dir.path(), &[("cert", "c.pem")])).unwrap_err());
        assert!(error.starts_with("--tls-key: missing"), "{error}");
        let error = message(server_config(&config(dir.path(), &[("ca", "ca.pem")])).unwrap_err());
        assert!(error.starts_with("--tls-client-ca: needs --tls-cert"), "{error}");
    }

    #[test]
    fn a_missing_or_malformed_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing =
            message(server_config(&config(dir.path(), &[("cert", "nope.pem"), ("key", "k.pem")])).unwrap_err());
        let nope: PathBuf = dir.path().join("nope.pem");
        assert!(
            missing.starts_with("--tls-cert '") && missing.contains(&nope.display().to_string()),
            "{missing}"
        );
        assert!(missing.contains("cannot read"), "{missing}");

        std::fs::write(dir.path().join("junk.pem"), "not a certificate").unwrap();
        let junk =
            message(server_config(&config(dir.path(), &[("cert", "junk.pem"), ("key", "junk.pem")])).unwrap_err());
        assert!(
            junk.starts_with("--tls-cert '") && junk.contains("no PEM certificate"),
            "{junk}"
        );
    }

    #[test]
    fn the_gate_is_open_without_a_client_ca() {
        let dir = tempfile::tempdir().unwrap();
        let mut open = WorkerGate::new(&config(dir.path(), &[]));
        assert!(open.call(Request::new(())).is_ok());
        let mut closed = WorkerGate::new(&config(dir.path(), &[("ca", "ca.pem")]));
        let status = closed.call(Request::new(())).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(status.message().contains("client certificate"));
    }
}
