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
    secure_endpoint(addr, tls)?
        .connect()
        .await
        .map_err(|e| with_hint(addr, describe(&e)))
}

/// What to do about a failure to reach the kernel at `addr`, read from the failure's text: the
/// raw errors (`frame with invalid size`, `InvalidContentType`, `Connection refused`) do not say.
/// `None` when the text shows none of the usual mistakes.
pub fn connection_hint(addr: &str, error: &str) -> Option<String> {
    let (at, plain) = if addr.trim().is_empty() {
        (String::new(), !error.contains("https://"))
    } else {
        let addr = normalize(addr);
        (format!(" at {addr}"), !addr.starts_with("https://"))
    };
    if plain && (error.contains("frame with invalid size") || error.contains("h2 protocol error")) {
        Some(format!(
            "the kernel{at} serves TLS: use an https:// address and the kernel's CA (--tls-ca, or Tls in the SDK)"
        ))
    } else if !plain && (error.contains("InvalidContentType") || error.contains("corrupt message")) {
        Some(format!(
            "the kernel{at} serves plaintext: use an http:// address, without a CA"
        ))
    } else if error.contains("Connection refused") || error.contains("connection refused") {
        Some(format!(
            "is the kernel running{at}? start it with `cargo run -p kernel`, or give its address (--addr, --kernel \
             or KERNEL_ADDR)"
        ))
    } else {
        None
    }
}

/// What to do about a failure to reach the kernel at `addr`: [`connection_hint`], and for a
/// plaintext address whose connection broke without saying why, a look at whether the kernel
/// speaks TLS there (a plaintext client on a TLS kernel sees anything from `frame with invalid
/// size` to `broken pipe`). The look opens one short connection of its own.
pub async fn diagnose(addr: &str, error: &str) -> Option<String> {
    if let Some(hint) = connection_hint(addr, error) {
        return Some(hint);
    }
    let uri = normalize(addr);
    let broken = ["connection", "broken pipe", "reset", "h2", "transport error"]
        .iter()
        .any(|sign| error.contains(sign));
    if uri.starts_with("http://") && broken && speaks_tls(&uri).await {
        return Some(format!(
            "the kernel at {uri} serves TLS: use an https:// address and the kernel's CA (--tls-ca, or Tls in the SDK)"
        ));
    }
    None
}

/// Whether the server at `uri` answers an HTTP/2 preface with a TLS alert record.
async fn speaks_tls(uri: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
    let Ok(endpoint) = endpoint(uri) else {
        return false;
    };
    let (Some(host), Some(port)) = (endpoint.uri().host(), endpoint.uri().port_u16()) else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
    let probe = async move {
        let mut stream = tokio::net::TcpStream::connect((host.as_str(), port)).await.ok()?;
        stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.ok()?;
        let mut head = [0u8; 2];
        stream.read_exact(&mut head).await.ok()?;
        // A TLS record: content type 21 (alert), then major version 3.
        Some(head == [0x15, 0x03])
    };
    matches!(tokio::time::timeout(PROBE_TIMEOUT, probe).await, Ok(Some(true)))
}

/// `error`, followed by what to do about it when [`connection_hint`] knows.
pub(crate) fn with_hint(addr: &str, error: String) -> String {
    match connection_hint(addr, &error) {
        Some(hint) => format!("{error} ({hint})"),
        None => error,
    }
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
    fn the_usual_mistakes_get_a_hint() {
        let tls = connection_hint(
            "127.0.0.1:50051",
            "h2 protocol error: http2 error: frame with invalid size",
        );
        assert!(tls.unwrap().contains("serves TLS: use an https:// address"));
        let plain = connection_hint(
            "https://kernel:50051",
            "received corrupt message of type InvalidContentType",
        );
        assert!(plain.unwrap().contains("serves plaintext"));
        let refused = connection_hint("127.0.0.1:1", "tcp connect error: Connection refused (os error 111)").unwrap();
        assert!(
            refused.starts_with("is the kernel running at http://127.0.0.1:1?"),
            "{refused}"
        );
        assert_eq!(connection_hint("127.0.0.1:1", "deadline has elapsed"), None);
        assert!(
            connection_hint("", "h2 protocol error")
                .unwrap()
                .starts_with("the kernel serves TLS"),
            "without an address the hint names none"
        );
        assert_eq!(
            with_hint("127.0.0.1:1", "boom".into()),
            "boom",
            "no hint, nothing added"
        );
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
