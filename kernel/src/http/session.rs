//! Who is asking over HTTP. With an auth file, the console's visitor enters an API key once; it is
//! kept in a session cookie (HttpOnly, SameSite=Strict, gone when the browser closes) and checked
//! on every request exactly as gRPC checks `authorization: Bearer`, for the scope of the
//! `kernel.v1` method the page stands for. A scraper sends the header itself.

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

use super::Http;
use crate::auth::Caller;

/// The method whose scope reading pages and `/metrics` need (`runs:read`).
pub const READ: &str = "/kernel.v1.RunService/ListRuns";
/// The method whose scope answering an approval needs (`approvals:write`).
pub const ANSWER: &str = "/kernel.v1.ApprovalService/ApproveCall";
/// The method whose scope the limits page needs (`admin`, as `kernelctl limits`).
pub const ADMIN: &str = "/kernel.v1.AdminService/GetStatus";

const COOKIE: &str = "kernel_key";

/// Why a request was not let through.
pub enum Refusal {
    /// No key came with it: the console asks for one.
    NoKey,
    /// The key is unknown or lacks the scope.
    Refused(tonic::Status),
}

impl Refusal {
    /// The answer to a client that is not a page: a status and the reason.
    pub fn plain(self) -> Response {
        match self {
            Refusal::Refused(status) => super::plain(&status),
            Refusal::NoKey => {
                let (status, message) = self.status_and_message();
                (status, format!("{message}\n")).into_response()
            }
        }
    }

    /// The HTTP status and the reason.
    pub fn status_and_message(&self) -> (StatusCode, String) {
        match self {
            Refusal::NoKey => (
                StatusCode::UNAUTHORIZED,
                "this kernel requires an API key: send 'authorization: Bearer <key>'".to_owned(),
            ),
            Refusal::Refused(status) => (super::http_status(status), status.message().to_owned()),
        }
    }

    /// Whether the visitor should be sent to the key form.
    pub fn wants_key(&self) -> bool {
        match self {
            Refusal::NoKey => true,
            Refusal::Refused(status) => status.code() == tonic::Code::Unauthenticated,
        }
    }

    /// A redirect to the key form, which then comes back to `back`.
    pub fn to_login(back: &str) -> Response {
        Redirect::to(&format!("/login?next={}", urlencode(back))).into_response()
    }
}

/// The caller behind `headers` if it may call `path`; `None` when the kernel has no keys.
pub fn authorize(http: &Http, headers: &HeaderMap, path: &str) -> Result<Option<Caller>, Refusal> {
    let Some(keys) = &http.kernel.keys else {
        return Ok(None);
    };
    let header = match secret_from_cookie(headers) {
        Some(secret) => format!("Bearer {secret}"),
        None => match headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
            Some(value) => value.to_owned(),
            None => return Err(Refusal::NoKey),
        },
    };
    keys.current()
        .authorize(path, Some(header.as_bytes()))
        .map(Some)
        .map_err(|error| Refusal::Refused(error.into()))
}

/// The key a visitor entered, if the kernel knows it.
pub fn check_key(http: &Http, secret: &str) -> Option<Caller> {
    http.kernel.keys.as_ref()?.current().authenticate(secret.trim())
}

/// Whether the console asks for a key at all.
pub fn required(http: &Http) -> bool {
    http.kernel.keys.is_some()
}

/// The `Set-Cookie` that keeps `secret` for the browser session. Hex, so no secret's characters
/// can break the header.
pub fn keep(secret: &str) -> String {
    format!(
        "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict",
        hex::encode(secret.trim().as_bytes())
    )
}

/// The `Set-Cookie` that forgets it.
pub fn forget() -> String {
    format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
}

fn secret_from_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .and_then(|(_, value)| hex::decode(value).ok())
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .filter(|secret| !secret.is_empty())
}

/// Percent-encodes everything but unreserved characters and `/`, for a path in a query.
pub fn urlencode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => out.push(byte as char),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_key_reads_back_whatever_its_characters() {
        let secret = "s3cr;et = \"x\"";
        let cookie = keep(secret);
        let value = cookie.split(';').next().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, format!("other=1; {value}").parse().unwrap());
        assert_eq!(secret_from_cookie(&headers).as_deref(), Some(secret));
    }

    #[test]
    fn a_forgotten_key_is_no_key() {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, "kernel_key=".parse().unwrap());
        assert_eq!(secret_from_cookie(&headers), None);
    }
}
