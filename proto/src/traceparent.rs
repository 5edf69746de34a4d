//! The W3C `traceparent` (Trace Context level 1): the trace a span belongs to and its parent span,
//! as an agent sends it to the kernel and the kernel hands it to a tool. Both ends parse it here,
//! so they accept and refuse the same texts.

use std::fmt;
use std::str::FromStr;

/// The `sampled` bit of a traceparent's flags.
pub const SAMPLED: u8 = 0x01;

/// A W3C `traceparent`: the trace a span belongs to and the span that is its parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    /// Whether the trace's caller records it.
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            hex::encode(self.trace_id),
            hex::encode(self.span_id),
            self.flags
        )
    }
}

impl FromStr for TraceParent {
    type Err = String;

    /// Parses as the W3C rules read it: version `00` is exactly four fields; a later version may
    /// add fields after the fourth, which are ignored; `ff`, upper-case hex and all-zero ids are
    /// invalid.
    fn from_str(text: &str) -> Result<TraceParent, String> {
        let invalid = || format!("{text:?} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)");
        let version = text.get(..2).ok_or_else(invalid)?;
        let head = match version {
            "00" if text.len() == 55 => text,
            "00" | "ff" => return Err(invalid()),
            _ if text.len() == 55 || text.as_bytes().get(55) == Some(&b'-') => &text[..55],
            _ => return Err(invalid()),
        };
        let fields: Vec<&str> = head.split('-').collect();
        let [version, trace, span, flags] = fields[..] else {
            return Err(invalid());
        };
        if ![version, trace, span, flags]
            .iter()
            .all(|field| field.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        {
            return Err(invalid());
        }
        let mut parent = TraceParent {
            trace_id: [0; 16],
            span_id: [0; 8],
            flags: 0,
        };
        let mut flag = [0u8; 1];
        hex::decode_to_slice(trace, &mut parent.trace_id).map_err(|_| invalid())?;
        hex::decode_to_slice(span, &mut parent.span_id).map_err(|_| invalid())?;
        hex::decode_to_slice(flags, &mut flag).map_err(|_| invalid())?;
        parent.flags = flag[0];
        if parent.trace_id == [0; 16] || parent.span_id == [0; 8] {
            return Err(invalid());
        }
        Ok(parent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_reads_and_writes_the_same_text() {
        let parent: TraceParent = EXAMPLE.parse().unwrap();
        assert_eq!(hex::encode(parent.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex::encode(parent.span_id), "00f067aa0ba902b7");
        assert!(parent.sampled());
        assert_eq!(parent.to_string(), EXAMPLE);
    }

    #[test]
    fn what_the_w3c_rules_reject_is_rejected() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        ] {
            assert!(bad.parse::<TraceParent>().is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn a_later_version_is_read_for_its_first_four_fields() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what-comes-next";
        let parent: TraceParent = later.parse().unwrap();
        assert!(!parent.sampled());
        assert_eq!(hex::encode(parent.span_id), "00f067aa0ba902b7");
    }
}
