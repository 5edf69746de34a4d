//! What a worker's answer to a dispatch records as its outcome: an output over the kernel's
//! result limit, one that is not JSON, or no answer at all fails the attempt as fatal (the same
//! call would answer the same again), and is reported as the answer of whoever owed it (a tool's
//! result, a hosted handler's output); an error message over the limit is cut.

use crate::model::{ErrorKind, StepKind, cut};

/// How much of an oversized error message is kept.
pub const KEPT_ERROR_CHARS: usize = 1024;

/// A worker's answer for one dispatch, as it sent it.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// JSON text, not yet checked.
    Output(String),
    Error {
        kind: ErrorKind,
        message: String,
    },
    /// Neither an output nor an error.
    Nothing,
}

/// Who owed an answer: a tool (its name), or a hosted run's handler (its agent).
#[derive(Clone, Copy, Debug)]
pub struct Owed<'a> {
    pub kind: StepKind,
    pub name: &'a str,
}

impl Owed<'_> {
    fn what(&self) -> &'static str {
        match self.kind {
            StepKind::Agent => "an output",
            _ => "a result",
        }
    }
}

impl std::fmt::Display for Owed<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            StepKind::Agent => write!(f, "agent '{}'", self.name),
            _ => write!(f, "tool '{}'", self.name),
        }
    }
}

/// The outcome `answer` records for the dispatch `owed` held, with results limited to `max`
/// bytes: canonical JSON text, or the attempt's error.
pub fn outcome(answer: Answer, owed: Owed<'_>, max: usize) -> Result<String, (ErrorKind, String)> {
    let what = owed.what();
    match answer {
        Answer::Output(text) if text.len() > max => Err((
            ErrorKind::Fatal,
            format!(
                "{owed} returned {what} of {} bytes; the limit is {max} bytes (--max-result-bytes)",
                text.len()
            ),
        )),
        Answer::Output(text) => kernel_proto::canonical::canonicalize(&text).map_err(|e| {
            (
                ErrorKind::Fatal,
                format!("{owed} returned {what} that is not valid JSON: {e}"),
            )
        }),
        Answer::Error { kind, message } if message.len() > max => Err((
            kind,
            format!(
                "{}… ({owed} returned an error message of {} bytes, cut; the limit is {max} bytes \
                 (--max-result-bytes))",
                cut(&message, KEPT_ERROR_CHARS),
                message.len()
            ),
        )),
        Answer::Error { kind, message } => Err((kind, message)),
        Answer::Nothing => Err((ErrorKind::Fatal, format!("{owed} returned neither {what} nor an error"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOOL: Owed<'static> = Owed {
        kind: StepKind::Tool,
        name: "fetch",
    };
    const AGENT: Owed<'static> = Owed {
        kind: StepKind::Agent,
        name: "triage",
    };

    #[test]
    fn json_within_the_limit_is_recorded_canonical() {
        assert_eq!(
            outcome(Answer::Output(r#"{"b":1, "a":2}"#.into()), TOOL, 64),
            Ok(r#"{"a":2,"b":1}"#.into())
        );
    }

    #[test]
    fn an_output_over_the_limit_or_not_json_or_missing_fails_as_fatal_naming_who_owed_it() {
        let (kind, message) = outcome(Answer::Output("x".repeat(65)), TOOL, 64).unwrap_err();
        assert_eq!(kind, ErrorKind::Fatal);
        assert!(
            message.starts_with("tool 'fetch' returned a result of 65 bytes"),
            "{message}"
        );
        let (kind, message) = outcome(Answer::Output("{oops".into()), AGENT, 64).unwrap_err();
        assert_eq!(kind, ErrorKind::Fatal);
        assert!(
            message.starts_with("agent 'triage' returned an output that is not valid JSON"),
            "{message}"
        );
        let (_, message) = outcome(Answer::Nothing, AGENT, 64).unwrap_err();
        assert_eq!(message, "agent 'triage' returned neither an output nor an error");
    }

    #[test]
    fn an_error_keeps_its_kind_and_an_oversized_message_is_cut() {
        let error = |message: String| Answer::Error {
            kind: ErrorKind::Retryable,
            message,
        };
        assert_eq!(
            outcome(error("busy".into()), TOOL, 64),
            Err((ErrorKind::Retryable, "busy".into()))
        );
        let (kind, message) = outcome(error("é".repeat(2000)), TOOL, 64).unwrap_err();
        assert_eq!(kind, ErrorKind::Retryable);
        assert!(message.starts_with(&"é".repeat(KEPT_ERROR_CHARS)), "cut at a character");
        assert!(
            message.ends_with("the limit is 64 bytes (--max-result-bytes))"),
            "{message}"
        );
    }
}
