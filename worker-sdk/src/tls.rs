//! TLS settings for a kernel served over `https://` (rustls, ring provider).

use std::fmt;
use std::io;
use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// How to reach a kernel started with `--tls-cert` and `--tls-key`: the CA certificates that
/// signed the kernel's certificate, and optionally a client certificate to present and a domain
/// name to check the kernel's certificate against.
///
/// A kernel started with `--tls-client-ca` refuses worker sessions that present no client
/// certificate signed by that CA; agents need one only if the kernel's operator says so.
///
/// Give it to [`WorkerBuilder::tls`](crate::WorkerBuilder::tls) or
/// [`AgentClient::connect_tls`](crate::AgentClient::connect_tls). With TLS settings, an address
/// without a scheme means `https://`; an `https://` address without them is refused, and so is an
/// `http://` address with them.
///
/// ```no_run
/// # fn example() -> std::io::Result<()> {
/// use worker_sdk::Tls;
///
/// let tls = Tls::from_ca_file("ca.pem")?.identity_files("worker.pem", "worker.key")?;
/// # let _ = tls;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Tls {
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    domain_name: Option<String>,
}

impl Tls {
    /// Trusts the CA certificates in `ca_pem` (PEM text) to sign the kernel's certificate.
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> Self {
        Tls {
            ca_pem: ca_pem.into(),
            identity: None,
            domain_name: None,
        }
    }

    /// Reads the CA certificates from a PEM file; the error names the file.
    pub fn from_ca_file(path: impl AsRef<Path>) -> io::Result<Self> {
        Ok(Tls::new(read_pem(path.as_ref(), "CERTIFICATE")?))
    }

    /// Presents this client certificate chain and its private key (both PEM text).
    pub fn identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Presents the client certificate and private key read from two PEM files; the error names the
    /// file.
    pub fn identity_files(self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> io::Result<Self> {
        let cert = read_pem(cert.as_ref(), "CERTIFICATE")?;
        let key = read_pem(key.as_ref(), "PRIVATE KEY")?;
        Ok(self.identity(cert, key))
    }

    /// Checks the kernel's certificate against `name` instead of the address's host (for a kernel
    /// reached by IP address or through a tunnel).
    pub fn domain_name(mut self, name: impl Into<String>) -> Self {
        self.domain_name = Some(name.into());
        self
    }

    pub(crate) fn client_config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &self.domain_name {
            config = config.domain_name(name.clone());
        }
        config
    }
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("Tls")
            .field("client_identity", &self.identity.is_some())
            .field("domain_name", &self.domain_name)
            .finish_non_exhaustive()
    }
}

/// Reads a PEM file that must hold a `-----BEGIN ...<label>-----` block.
fn read_pem(path: &Path, label: &str) -> io::Result<Vec<u8>> {
    let named = |kind, reason: String| io::Error::new(kind, format!("TLS file '{}': {reason}", path.display()));
    let pem = std::fs::read(path).map_err(|e| named(e.kind(), e.to_string()))?;
    let text = String::from_utf8_lossy(&pem);
    let has_block = text
        .lines()
        .any(|line| line.starts_with("-----BEGIN ") && line.trim_end().ends_with(&format!("{label}-----")));
    if !has_block {
        let block = if label == "CERTIFICATE" {
            "CERTIFICATE"
        } else {
            "... PRIVATE KEY"
        };
        return Err(named(
            io::ErrorKind::InvalidData,
            format!("holds no '-----BEGIN {block}-----' block"),
        ));
    }
    Ok(pem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_named_in_errors() {
        let dir = std::env::temp_dir().join(format!("worker-sdk-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = Tls::from_ca_file(dir.join("missing.pem")).unwrap_err();
        assert!(missing.to_string().contains("missing.pem"), "{missing}");

        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "hello").unwrap();
        let error = Tls::from_ca_file(&junk).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(error.to_string().contains("junk.pem"), "{error}");

        let ca = dir.join("ca.pem");
        std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").unwrap();
        let tls = Tls::from_ca_file(&ca).unwrap();
        let error = tls.identity_files(&ca, &ca).unwrap_err();
        assert!(error.to_string().contains("PRIVATE KEY"), "{error}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn debug_shows_no_key() {
        let tls = Tls::new("ca").identity("cert", "secret key").domain_name("kernel");
        let text = format!("{tls:?}");
        assert!(!text.contains("secret"), "{text}");
        assert!(text.contains("kernel"), "{text}");
    }
}
