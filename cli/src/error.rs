//! Every way a `kernelctl` command can fail, and how each is worded on stderr.
//!
//! Usage errors never get here: clap reports them and exits 2 while parsing. Everything in
//! [`CliError`] exits 1, except a closed stdout (`kernelctl runs list | head`), which
//! [`CliError::is_broken_pipe`] lets `main` treat as success.

use std::io;

use tonic::Code;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The kernel could not be reached at all.
    #[error("cannot reach kernel at {addr}: {cause}")]
    Connect { addr: String, cause: String },

    /// The CA file given with `--tls-ca` cannot be read or holds no usable certificate.
    #[error("--tls-ca '{path}': {cause}")]
    TlsCa { path: String, cause: String },

    /// The key given with `--api-key` cannot travel as gRPC metadata.
    #[error("--api-key: {0}")]
    ApiKey(String),

    /// A call ended with a gRPC error status, from the kernel or from the channel under it.
    #[error("{}: {message}", code_words(*.code))]
    Rpc { code: Code, message: String },

    /// A unary call got no answer in time.
    #[error("deadline exceeded: no answer from the kernel within {}s", .0.as_secs())]
    Timeout(std::time::Duration),

    /// The kernel answered, but not with what the protocol promises.
    #[error("malformed response from kernel: {0}")]
    MalformedResponse(&'static str),

    /// Writing to stdout failed.
    #[error("cannot write output: {0}")]
    Output(#[from] io::Error),

    /// A followed run ended other than completed.
    #[error("run {id} {status}{reason}")]
    RunEnded { id: String, status: String, reason: String },
}

impl CliError {
    /// A reader that went away (`| head`) is not a failure of the command.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, CliError::Output(err) if err.kind() == io::ErrorKind::BrokenPipe)
    }
}

impl From<tonic::Status> for CliError {
    fn from(status: tonic::Status) -> Self {
        let mut message = status.message().to_owned();
        // A status made by the client from a transport failure says only "transport error"; the
        // cause is in its source chain.
        if let Some(source) = std::error::Error::source(&status) {
            let cause = error_chain(source);
            if !message.contains(&cause) {
                message = if message.is_empty() || message == "transport error" {
                    cause
                } else {
                    format!("{message}: {cause}")
                };
            }
        }
        CliError::Rpc {
            code: status.code(),
            message,
        }
    }
}

/// Every link of an error's `source()` chain, joined with `: `, skipping the outermost when it
/// says nothing by itself (tonic's "transport error").
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut links = Vec::new();
    let mut next = Some(err);
    while let Some(link) = next {
        let text = link.to_string();
        if !links.contains(&text) {
            links.push(text);
        }
        next = link.source();
    }
    if links.len() > 1 && links[0] == "transport error" {
        links.remove(0);
    }
    links.join(": ")
}

/// A gRPC status code in lowercase words, as in `error: not found: run r1 not found`.
pub fn code_words(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid argument",
        Code::DeadlineExceeded => "deadline exceeded",
        Code::NotFound => "not found",
        Code::AlreadyExists => "already exists",
        Code::PermissionDenied => "permission denied",
        Code::ResourceExhausted => "resource exhausted",
        Code::FailedPrecondition => "failed precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out of range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_errors_name_the_code_in_words() {
        let err = CliError::from(tonic::Status::not_found("run 0192 not found"));
        assert_eq!(err.to_string(), "not found: run 0192 not found");
        let err = CliError::from(tonic::Status::failed_precondition("run is completed"));
        assert_eq!(err.to_string(), "failed precondition: run is completed");
        assert_eq!(code_words(Code::InvalidArgument), "invalid argument");
    }

    #[test]
    fn transport_failures_inside_a_status_show_their_cause() {
        let mut status = tonic::Status::unknown("transport error");
        status.set_source(std::sync::Arc::new(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "connection reset by peer",
        )));
        assert_eq!(CliError::from(status).to_string(), "unknown: connection reset by peer");
    }

    #[test]
    fn connect_errors_name_the_address() {
        let err = CliError::Connect {
            addr: "http://127.0.0.1:1".into(),
            cause: "connection refused".into(),
        };
        assert_eq!(
            err.to_string(),
            "cannot reach kernel at http://127.0.0.1:1: connection refused"
        );
    }

    #[test]
    fn a_timeout_says_how_long_it_waited() {
        let err = CliError::Timeout(std::time::Duration::from_secs(30));
        assert_eq!(
            err.to_string(),
            "deadline exceeded: no answer from the kernel within 30s"
        );
    }

    #[test]
    fn only_a_broken_pipe_is_benign() {
        assert!(CliError::from(io::Error::from(io::ErrorKind::BrokenPipe)).is_broken_pipe());
        assert!(!CliError::from(io::Error::other("disk full")).is_broken_pipe());
        assert!(!CliError::MalformedResponse("x").is_broken_pipe());
    }

    #[test]
    fn error_chain_joins_sources() {
        #[derive(Debug, thiserror::Error)]
        #[error("transport error")]
        struct Outer(#[source] io::Error);
        let err = Outer(io::Error::new(io::ErrorKind::ConnectionRefused, "connection refused"));
        assert_eq!(error_chain(&err), "connection refused");
    }
}
