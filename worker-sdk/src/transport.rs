//! Connecting to the kernel: address normalisation and the channel settings both clients share.

use std::error::Error as _;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

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

pub(crate) async fn connect(addr: &str) -> Result<Channel, tonic::transport::Error> {
    endpoint(addr)?.connect().await
}

/// A transport error with its causes: tonic's own message is just "transport error".
pub(crate) fn describe(error: &tonic::transport::Error) -> String {
    let mut text = error.to_string();
    let mut last = text.clone();
    let mut source = error.source();
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
}
