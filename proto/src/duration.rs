//! Durations as people write them on command lines and in policy files (`250ms`, `30s`, `5m`,
//! `1h`, `30d`, or a bare number of seconds), read the same way by the kernel and `kernelctl`.

/// Milliseconds in `text`; zero is allowed (callers that need a positive duration check it).
pub fn parse_millis(text: &str) -> Result<u64, String> {
    let bad = || format!("bad duration '{text}': write 250ms, 30s, 5m, 1h, 30d or a whole number of seconds");
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    if digits.is_empty() {
        return Err(bad());
    }
    let count: u64 = digits.parse().map_err(|_| format!("bad duration '{text}': too long"))?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60 * 1000,
        "h" => 60 * 60 * 1000,
        "d" => 24 * 60 * 60 * 1000,
        _ => return Err(bad()),
    };
    count
        .checked_mul(unit_ms)
        .ok_or_else(|| format!("bad duration '{text}': too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_reads() {
        assert_eq!(parse_millis("250ms"), Ok(250));
        assert_eq!(parse_millis("30"), Ok(30_000));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis(" 5m "), Ok(300_000));
        assert_eq!(parse_millis("1h"), Ok(3_600_000));
        assert_eq!(parse_millis("30d"), Ok(2_592_000_000));
        assert_eq!(parse_millis("0s"), Ok(0));
        for bad in ["", "d", "1w", "1.5h", "-1s", "99999999999999999999d"] {
            assert!(parse_millis(bad).is_err(), "{bad:?}");
        }
    }
}
