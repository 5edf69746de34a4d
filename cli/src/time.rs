//! Wall-clock instants as the kernel sends them, and their RFC 3339 spelling.
//!
//! [`UtcTime`] is what [`crate::view`] keeps of a `google.protobuf.Timestamp`: normalised, so
//! nanoseconds are always in `0..1e9`. JSON output spells it like the proto3 JSON mapping does
//! (fraction only when non-zero, in groups of 3 digits); tables use second or millisecond
//! precision. The calendar conversion is Howard Hinnant's `civil_from_days`, so no date crate is
//! needed.

use std::time::Duration;

use serde::{Serialize, Serializer};

const NANOS_PER_SECOND: i64 = 1_000_000_000;
const SECONDS_PER_DAY: i64 = 86_400;

/// An instant in UTC with nanosecond resolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct UtcTime {
    seconds: i64,
    nanos: u32,
}

/// How many fractional digits of a second to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    Seconds,
    Millis,
    /// As many groups of three digits as the value needs (none when the fraction is zero).
    Auto,
}

impl UtcTime {
    /// An instant from seconds and nanoseconds since the Unix epoch, in any (even denormal) form.
    pub fn new(seconds: i64, nanos: i64) -> Self {
        let seconds = seconds.saturating_add(nanos.div_euclid(NANOS_PER_SECOND));
        let nanos = nanos.rem_euclid(NANOS_PER_SECOND) as u32;
        Self { seconds, nanos }
    }

    /// The time from `earlier` to `self`, or `None` when `earlier` is later.
    pub fn since(self, earlier: UtcTime) -> Option<Duration> {
        let total = |t: UtcTime| i128::from(t.seconds) * 1_000_000_000 + i128::from(t.nanos);
        let nanos = total(self) - total(earlier);
        u64::try_from(nanos).ok().map(Duration::from_nanos)
    }

    /// RFC 3339 in UTC with a `Z` suffix, e.g. `2025-03-01T12:04:05Z`.
    pub fn rfc3339(self, precision: Precision) -> String {
        let days = self.seconds.div_euclid(SECONDS_PER_DAY);
        let second_of_day = self.seconds.rem_euclid(SECONDS_PER_DAY);
        let (year, month, day) = civil_from_days(days);
        let (hour, minute, second) = (second_of_day / 3600, second_of_day % 3600 / 60, second_of_day % 60);
        let fraction = match precision {
            Precision::Seconds => String::new(),
            Precision::Millis => format!(".{:03}", self.nanos / 1_000_000),
            Precision::Auto if self.nanos == 0 => String::new(),
            Precision::Auto if self.nanos.is_multiple_of(1_000_000) => {
                format!(".{:03}", self.nanos / 1_000_000)
            }
            Precision::Auto if self.nanos.is_multiple_of(1_000) => {
                format!(".{:06}", self.nanos / 1_000)
            }
            Precision::Auto => format!(".{:09}", self.nanos),
        };
        format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}{fraction}Z")
    }
}

impl From<prost_types::Timestamp> for UtcTime {
    fn from(ts: prost_types::Timestamp) -> Self {
        Self::new(ts.seconds, i64::from(ts.nanos))
    }
}

impl Serialize for UtcTime {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.rfc3339(Precision::Auto))
    }
}

/// Year, month (1–12) and day (1–31) of the proleptic Gregorian calendar for a count of days
/// since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month as u32, day as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_around_known_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(59), (1970, 3, 1));
        // 2000 is a leap year (divisible by 400), 1900 and 2100 are not.
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(11_017), (2000, 3, 1));
        assert_eq!(civil_from_days(47_540), (2100, 2, 28));
        assert_eq!(civil_from_days(47_541), (2100, 3, 1));
        assert_eq!(civil_from_days(-25_509), (1900, 2, 28));
        assert_eq!(civil_from_days(-25_508), (1900, 3, 1));
        assert_eq!(civil_from_days(-719_162), (1, 1, 1));
        assert_eq!(civil_from_days(2_932_896), (9999, 12, 31));
    }

    #[test]
    fn civil_dates_advance_one_day_at_a_time() {
        let mut previous = civil_from_days(-800_000);
        for days in -799_999..800_000 {
            let next = civil_from_days(days);
            let (y, m, d) = previous;
            let expected_same_month = (y, m, d + 1);
            let expected_next_month = if m == 12 { (y + 1, 1, 1) } else { (y, m + 1, 1) };
            assert!(
                next == expected_same_month || next == expected_next_month,
                "{previous:?} -> {next:?}"
            );
            previous = next;
        }
    }

    #[test]
    fn rfc3339_at_each_precision() {
        let t = UtcTime::new(1_700_000_000, 123_456_789);
        assert_eq!(t.rfc3339(Precision::Seconds), "2023-11-14T22:13:20Z");
        assert_eq!(t.rfc3339(Precision::Millis), "2023-11-14T22:13:20.123Z");
        assert_eq!(t.rfc3339(Precision::Auto), "2023-11-14T22:13:20.123456789Z");
        assert_eq!(UtcTime::new(0, 0).rfc3339(Precision::Auto), "1970-01-01T00:00:00Z");
        assert_eq!(
            UtcTime::new(0, 5_000_000).rfc3339(Precision::Auto),
            "1970-01-01T00:00:00.005Z"
        );
        assert_eq!(
            UtcTime::new(0, 5_000).rfc3339(Precision::Auto),
            "1970-01-01T00:00:00.000005Z"
        );
        assert_eq!(UtcTime::new(-1, 0).rfc3339(Precision::Seconds), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn denormal_timestamps_are_normalised() {
        assert_eq!(UtcTime::new(10, -1), UtcTime::new(9, 999_999_999));
        assert_eq!(UtcTime::new(10, 2_500_000_000), UtcTime::new(12, 500_000_000));
        let ts = prost_types::Timestamp {
            seconds: 1,
            nanos: -500_000_000,
        };
        assert_eq!(UtcTime::from(ts), UtcTime::new(0, 500_000_000));
    }

    #[test]
    fn serializes_as_an_rfc3339_string() {
        let json = serde_json::to_string(&UtcTime::new(1_700_000_000, 0)).unwrap();
        assert_eq!(json, r#""2023-11-14T22:13:20Z""#);
    }

    #[test]
    fn since_is_none_when_backwards() {
        let start = UtcTime::new(100, 900_000_000);
        let end = UtcTime::new(102, 100_000_000);
        assert_eq!(end.since(start), Some(Duration::from_millis(1_200)));
        assert_eq!(start.since(end), None);
    }
}
