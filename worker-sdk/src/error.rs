//! The error a tool returns, and the kind that tells the kernel whether to try again.

use std::fmt;
use std::io;

/// Whether a failed call may succeed if the kernel tries it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ErrorKind {
    /// May succeed on another attempt; retried by the tool's retry policy (the default).
    #[default]
    Retryable,
    /// Will fail the same way again; never retried.
    Fatal,
    /// The input itself is harmful; never retried.
    Poison,
}

impl ErrorKind {
    /// The lowercase name used in logs and messages: `retryable`, `fatal` or `poison`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Retryable => "retryable",
            ErrorKind::Fatal => "fatal",
            ErrorKind::Poison => "poison",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed tool call: a message the model reads and a kind the kernel's retry policy reads.
///
/// Use `?` on a `String`, `&str`, [`std::io::Error`] or [`serde_json::Error`], or map any other
/// error with one of the constructors, which take anything that implements `Display`:
///
/// ```
/// use worker_sdk::{ErrorKind, ToolError};
///
/// let parsed: Result<u32, ToolError> = "x".parse::<u32>().map_err(ToolError::fatal);
/// assert_eq!(parsed.unwrap_err().kind(), ErrorKind::Fatal);
/// assert_eq!(ToolError::new("try later").kind(), ErrorKind::Retryable);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    kind: ErrorKind,
    message: String,
}

impl ToolError {
    /// A retryable error, the same as [`ToolError::retryable`].
    pub fn new(message: impl fmt::Display) -> Self {
        Self::retryable(message)
    }

    /// An error that may go away on another attempt (a timeout, a busy backend).
    pub fn retryable(message: impl fmt::Display) -> Self {
        Self::with_kind(ErrorKind::Retryable, message)
    }

    /// An error that will happen again with the same input; the kernel never retries it.
    pub fn fatal(message: impl fmt::Display) -> Self {
        Self::with_kind(ErrorKind::Fatal, message)
    }

    /// An error caused by harmful input; the kernel never retries it.
    pub fn poison(message: impl fmt::Display) -> Self {
        Self::with_kind(ErrorKind::Poison, message)
    }

    /// An error of the given kind.
    pub fn with_kind(kind: ErrorKind, message: impl fmt::Display) -> Self {
        Self {
            kind,
            message: message.to_string(),
        }
    }

    /// Whether the kernel may retry the call.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The text the model reads.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the kernel may try the call again.
    pub fn is_retryable(&self) -> bool {
        self.kind == ErrorKind::Retryable
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ToolError {}

impl From<String> for ToolError {
    fn from(message: String) -> Self {
        Self::retryable(message)
    }
}

impl From<&str> for ToolError {
    fn from(message: &str) -> Self {
        Self::retryable(message)
    }
}

/// Transient I/O failures (timeouts, interrupted or refused connections) are retryable; the
/// rest (not found, permission denied, bad data) would fail the same way again, so they are fatal.
impl From<io::Error> for ToolError {
    fn from(error: io::Error) -> Self {
        use io::ErrorKind as Io;
        let kind = match error.kind() {
            Io::TimedOut
            | Io::Interrupted
            | Io::WouldBlock
            | Io::ConnectionRefused
            | Io::ConnectionReset
            | Io::ConnectionAborted
            | Io::NotConnected
            | Io::BrokenPipe
            | Io::UnexpectedEof
            | Io::ResourceBusy => ErrorKind::Retryable,
            _ => ErrorKind::Fatal,
        };
        Self::with_kind(kind, error)
    }
}

/// A JSON error means the data is malformed, which another attempt will not change.
impl From<serde_json::Error> for ToolError {
    fn from(error: serde_json::Error) -> Self {
        Self::fatal(error)
    }
}

pub(crate) fn error_kind_to_pb(kind: ErrorKind) -> kernel_proto::v1::ErrorKind {
    use kernel_proto::v1 as pb;
    match kind {
        ErrorKind::Retryable => pb::ErrorKind::Retryable,
        ErrorKind::Fatal => pb::ErrorKind::Fatal,
        ErrorKind::Poison => pb::ErrorKind::Poison,
    }
}

pub(crate) fn error_kind_from_pb(kind: i32) -> Option<ErrorKind> {
    use kernel_proto::v1 as pb;
    match pb::ErrorKind::try_from(kind).ok()? {
        pb::ErrorKind::Unspecified => None,
        pb::ErrorKind::Retryable => Some(ErrorKind::Retryable),
        pb::ErrorKind::Fatal => Some(ErrorKind::Fatal),
        pb::ErrorKind::Poison => Some(ErrorKind::Poison),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_retryable_by_default() {
        assert_eq!(ToolError::from("busy").kind(), ErrorKind::Retryable);
        assert_eq!(ToolError::from(String::from("busy")).kind(), ErrorKind::Retryable);
        assert_eq!(ToolError::new("busy").kind(), ErrorKind::Retryable);
        assert_eq!(ErrorKind::default(), ErrorKind::Retryable);
    }

    #[test]
    fn io_errors_split_into_transient_and_permanent() {
        let timeout = io::Error::new(io::ErrorKind::TimedOut, "slow");
        let missing = io::Error::new(io::ErrorKind::NotFound, "no such file");
        assert_eq!(ToolError::from(timeout).kind(), ErrorKind::Retryable);
        let missing = ToolError::from(missing);
        assert_eq!(missing.kind(), ErrorKind::Fatal);
        assert_eq!(missing.to_string(), "no such file");
    }

    #[test]
    fn json_errors_are_fatal() {
        let error = serde_json::from_str::<u32>("nope").unwrap_err();
        assert_eq!(ToolError::from(error).kind(), ErrorKind::Fatal);
    }

    #[test]
    fn constructors_set_kind_and_message() {
        let poison = ToolError::poison("drop table");
        assert_eq!(poison.kind(), ErrorKind::Poison);
        assert_eq!(poison.message(), "drop table");
        assert!(!poison.is_retryable());
        assert_eq!(ErrorKind::Fatal.to_string(), "fatal");
    }
}
