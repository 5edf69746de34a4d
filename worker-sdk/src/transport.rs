//! Connecting to the kernel: address normalisation and the channel settings both clients share.

use std::error::Error as _;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::tls::Tls;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts `host:port` as well as a full URI, defaulting the scheme to `http`.
pub(crate) fn normalize(addr: &str) -> String {
    let addr = addr.trim();
    if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    }
}

pub(crate) fn endpoint(addr: &str) -> Result<Endpoint, tonic::transport::Error> {
    Ok(Endpoint::from_shared(normalize(addr))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .keep_alive_while_idle(true))
}

/// The endpoint for `addr` with optional TLS settings: with them a bare `host:port` means
/// `https`; `https` needs them and `http` takes none. The error says what to change.
pub(crate) fn secure_endpoint(addr: &str, tls: Option<&Tls>) -> Result<Endpoint, String> {
    let addr = addr.trim();
    let uri = match (addr.contains("://"), tls) {
        (false, Some(_)) => format!("https://{addr}"),
        _ => normalize(addr),
    };
    let https = uri.starts_with("https://");
    let endpoint = endpoint(&uri).map_err(|e| describe(&e))?;
    match tls {
        Some(tls) if https => endpoint.tls_config(tls.client_config()).map_err(|e| describe(&e)),
        Some(_) => Err(format!(
            "'{addr}' is plaintext but TLS settings were given; use https://"
        )),
        None if https => Err(format!("'{addr}' uses TLS: give TLS settings with the kernel's CA")),
        None => Ok(endpoint),
    }
}

/// Connects to `addr`, over TLS when `tls` is given (see [`secure_endpoint`]).
pub(crate) async fn connect_secure(addr: &str, tls: Option<&Tls>) -> Result<Channel, String> {
    secure_endpoint(addr, tls)?.connect().await.map_err(|e| describe(&e))
}

/// A status with its code and the causes under it: a broken connection or a failed TLS handshake
/// says only "transport error" in its message.
pub(crate) fn describe_status(status: &tonic::Status) -> String {
    with_causes(
        format!("{:?}: {}", status.code(), status.message()),
        status.message(),
        status.source(),
    )
}

/// A transport error with its causes: tonic's own message is just "transport error".
pub(crate) fn describe(error: &tonic::transport::Error) -> String {
    let text = error.to_string();
    let last = text.clone();
    with_causes(text, &last, error.source())
}

/// `text`, then each cause under it after `: `; `last` is the message `text` ends with.
fn with_causes(mut text: String, last: &str, mut source: Option<&(dyn std::error::Error + 'static)>) -> String {
    let mut last = last.to_owned();
    while let Some(cause) = source {
        // Layers often repeat their inner error's message; keep each once.
        let message = cause.to_string();
        if message != last {
            text.push_str(": ");
            text.push_str(&message);
            last = message;
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_addresses_get_http() {
        assert_eq!(normalize("127.0.0.1:50051"), "http://127.0.0.1:50051");
        assert_eq!(normalize("http://[::1]:1"), "http://[::1]:1");
        assert_eq!(normalize(" https://kernel:443 "), "https://kernel:443");
        assert!(endpoint("localhost:50051").is_ok());
        assert!(endpoint("http://bad host").is_err());
    }

    #[test]
    fn tls_settings_decide_the_scheme() {
        let ca = rcgen::generate_simple_self_signed(vec!["kernel".into()]).unwrap();
        let tls = Tls::new(ca.cert.pem());
        let bare = secure_endpoint("kernel:443", Some(&tls)).unwrap();
        assert_eq!(bare.uri().scheme_str(), Some("https"));
        assert!(secure_endpoint("https://kernel:443", Some(&tls)).is_ok());
        assert!(
            secure_endpoint("http://kernel:80", Some(&tls))
                .unwrap_err()
                .contains("plaintext")
        );
        let junk = Tls::new("-----BEGIN CERTIFICATE-----\nnot base64\n");
        assert!(secure_endpoint("https://kernel:443", Some(&junk)).is_err());
        assert!(secure_endpoint("https://kernel:443", None).unwrap_err().contains("CA"));
        assert_eq!(
            secure_endpoint("kernel:80", None).unwrap().uri().scheme_str(),
            Some("http")
        );
    }
}
