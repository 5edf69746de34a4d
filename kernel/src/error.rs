//! The kernel's one error type and its single mapping to gRPC statuses.

use tonic::{Code, Status};

/// Everything a kernel operation can refuse or fail with.
#[derive(Debug, thiserror::Error)]
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
}

impl KernelError {
    /// An invalid request field.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        KernelError::InvalidArgument {
            field: field.into(),
            message: message.into(),
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
            KernelError::Unavailable(_) => Code::Unavailable,
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
    fn invalid_argument_names_the_field() {
        let status = Status::from(KernelError::invalid("calls[1].arguments_json", "not JSON"));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "calls[1].arguments_json: not JSON");
    }
}
