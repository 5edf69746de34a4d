//! The kernel's one error type and its single mapping to gRPC statuses.

use tonic::{Code, Status};

/// Everything a kernel operation can refuse or fail with.
#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum KernelError {
    /// A request field is missing or malformed; nothing was written.
    #[error("{field}: {message}")]
    InvalidArgument { field: String, message: String },
    /// The named thing does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request is valid but the current state does not allow it (e.g. a turn on a finished run).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A registration conflicts with what connected workers already offer.
    #[error("{0}")]
    AlreadyExists(String),
    /// The kernel is shutting down or a component stopped.
    #[error("{0}")]
    Unavailable(String),
    /// A configured limit was exceeded; the message names the field, the size and the limit.
    #[error("{field}: {message}")]
    LimitExceeded { field: String, message: String },
    /// No API key, or one the kernel does not know.
    #[error("{0}")]
    Unauthenticated(String),
    /// The API key lacks what the request needs (a scope, or a tool a worker may register).
    #[error("{0}")]
    PermissionDenied(String),
    /// The store failed; the message says which operation.
    #[error("store: {0}")]
    Store(String),
    /// The run's shard is not this replica's (any more): the write changed nothing, and is sent
    /// again to the shard's owner. A client sees it as `UNAVAILABLE` only when no owner answers.
    #[error("{0}")]
    Moved(String),
}

impl KernelError {
    /// One error of each kind: the errors reference maps each to its status through the one
    /// mapping below, so the page shows the code a client really gets.
    pub fn examples() -> [KernelError; 9] {
        let text = || String::from("...");
        [
            KernelError::invalid("field", "..."),
            KernelError::NotFound(text()),
            KernelError::FailedPrecondition(text()),
            KernelError::AlreadyExists(text()),
            KernelError::Unavailable(text()),
            KernelError::LimitExceeded {
                field: "field".into(),
                message: text(),
            },
            KernelError::Unauthenticated(text()),
            KernelError::PermissionDenied(text()),
            KernelError::Store(text()),
        ]
    }

    /// What an error of this kind tells a client, and whether the same request may succeed
    /// later: the errors reference is rendered from it, so a new kind cannot go undocumented.
    pub fn guidance(&self) -> (&'static str, &'static str) {
        match self {
            KernelError::InvalidArgument { .. } => (
                "A request field is missing or malformed. The message starts with the field's path. Nothing \
                 was written.",
                "No: fix the field the message names.",
            ),
            KernelError::NotFound(_) => (
                "The run, step, call, approval, tool, agent or key named does not exist, or was deleted.",
                "No.",
            ),
            KernelError::FailedPrecondition(_) => (
                "The request is valid but the state does not allow it now: a turn on a finished run, an \
                 answer to an approval already answered, a result from a dispatch that no longer holds its \
                 call. The message says which.",
                "Not as it is: read the state first (`kernelctl runs show`).",
            ),
            KernelError::AlreadyExists(_) => (
                "A worker's registration conflicts with what connected workers already offer: a tool or \
                 hosted agent of the same name with another fingerprint (description, schema or version).",
                "Once the other workers have left or run the same version.",
            ),
            KernelError::Unavailable(_) => (
                "The kernel is draining or stopping, its database is unreachable, or one of its parts \
                 stopped; the request was not done.",
                "Yes, after a backoff, or on another replica.",
            ),
            KernelError::LimitExceeded { .. } => (
                "A configured limit was exceeded; the message names the field, what it was, and the limit \
                 with its flag ([The kernel's flags](kernel-flags.md#limits)).",
                "Not as it is: send less, or raise the limit.",
            ),
            KernelError::Unauthenticated(_) => (
                "The kernel has API keys and the request carried none, or one it does not know \
                 ([Security](../guides/security.md)).",
                "With a key the kernel knows.",
            ),
            KernelError::PermissionDenied(_) => (
                "The request's key lacks a scope it needs, or a worker's key may not register the tool \
                 it offered.",
                "With a key that has the scope.",
            ),
            KernelError::Moved(_) => (
                "Among replicas: the run's shard moved to another replica while the request was on its way, \
                 and no owner answered in time. Nothing was written.",
                "Yes, after a backoff.",
            ),
            KernelError::Store(_) => (
                "The store failed the operation the message names (`store: ...`).",
                "Yes, after a backoff. A write sent again is recorded once where it is idempotent: a \
                 turn's calls, a run created with an idempotency key, a worker's result.",
            ),
        }
    }

    /// An invalid request field.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        KernelError::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The same error naming the request field that was `from` (or one within it) as `to`: for a
    /// request checked as another request's part.
    pub fn renamed(self, from: &str, to: &str) -> Self {
        let rename = |field: String| match field.strip_prefix(from) {
            Some(rest) => format!("{to}{rest}"),
            None => field,
        };
        match self {
            KernelError::InvalidArgument { field, message } => KernelError::InvalidArgument {
                field: rename(field),
                message,
            },
            KernelError::LimitExceeded { field, message } => KernelError::LimitExceeded {
                field: rename(field),
                message,
            },
            other => other,
        }
    }
}

impl From<KernelError> for Status {
    fn from(error: KernelError) -> Self {
        let code = match &error {
            KernelError::InvalidArgument { .. } => Code::InvalidArgument,
            KernelError::NotFound(_) => Code::NotFound,
            KernelError::FailedPrecondition(_) => Code::FailedPrecondition,
            KernelError::AlreadyExists(_) => Code::AlreadyExists,
            KernelError::Unavailable(_) | KernelError::Moved(_) => Code::Unavailable,
            KernelError::LimitExceeded { .. } => Code::ResourceExhausted,
            KernelError::Unauthenticated(_) => Code::Unauthenticated,
            KernelError::PermissionDenied(_) => Code::PermissionDenied,
            KernelError::Store(_) => Code::Internal,
        };
        Status::new(code, error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_an_example_with_its_own_status() {
        let codes: std::collections::BTreeSet<String> = KernelError::examples()
            .into_iter()
            .map(|error| format!("{:?}", Status::from(error).code()))
            .collect();
        assert_eq!(codes.len(), KernelError::examples().len(), "{codes:?}");
    }

    #[test]
    fn invalid_argument_names_the_field() {
        let status = Status::from(KernelError::invalid("calls[1].arguments_json", "not JSON"));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "calls[1].arguments_json: not JSON");
    }
}
