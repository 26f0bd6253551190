//! Durations as the spec writes them: Go-style `30s`, `5m`, `1h30m`, `250ms`, units in that order, each at
//! most once, up to [`MAX`]. The CRD admits exactly the same strings ([`SCHEMA_RULE`]), so nothing the API
//! server accepts can overflow the operator's time arithmetic.

use std::time::Duration;

/// The longest duration any field takes: 30 days.
pub const MAX: Duration = Duration::from_secs(30 * 24 * 3600);
/// [`MAX`] as the spec writes it (the schema rule and its messages spell it out).
#[cfg(test)]
pub const MAX_TEXT: &str = "720h";

/// The CEL rule on every duration field. Six digits per unit keep CEL's own `duration()` (int64
/// nanoseconds) from overflowing before the comparison with the maximum.
pub const SCHEMA_RULE: &str = "self != '' && self.matches('^([0-9]{1,6}h)?([0-9]{1,6}m)?([0-9]{1,6}s)?([0-9]{1,6}ms)?$') && duration(self) <= duration('720h')";

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not a duration of at most 720h (30 days) such as 30s, 5m or 1h30m")]
pub struct InvalidDuration(pub String);

/// The units, in the order the grammar allows them.
const UNITS: [(&str, Duration); 4] = [
    ("h", Duration::from_secs(3600)),
    ("m", Duration::from_secs(60)),
    ("s", Duration::from_secs(1)),
    ("ms", Duration::from_millis(1)),
];
const MAX_DIGITS: usize = 6;

pub fn parse(text: &str) -> Result<Duration, InvalidDuration> {
    let invalid = || InvalidDuration(text.to_string());
    if text.is_empty() {
        return Err(invalid());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    // Each unit may appear once, after the units before it.
    let mut next_unit = 0;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(invalid)?;
        if digits == 0 || digits > MAX_DIGITS {
            return Err(invalid());
        }
        let value: u32 = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        // "ms" before "m": the longer suffix wins.
        let (index, (suffix, unit)) = UNITS
            .iter()
            .enumerate()
            .filter(|(_, (suffix, _))| rest.starts_with(suffix))
            .max_by_key(|(_, (suffix, _))| suffix.len())
            .ok_or_else(invalid)?;
        if index < next_unit {
            return Err(invalid());
        }
        next_unit = index + 1;
        rest = &rest[suffix.len()..];
        total = total.checked_add(unit.checked_mul(value).ok_or_else(invalid)?).ok_or_else(invalid)?;
    }
    if total > MAX {
        return Err(invalid());
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_style_durations() {
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("1m30s500ms"), Ok(Duration::from_millis(90_500)));
        assert_eq!(parse("720h"), Ok(MAX));
        assert_eq!(parse(MAX_TEXT), Ok(MAX));
    }

    #[test]
    fn rejects_what_the_schema_rejects() {
        for bad in [
            "",
            "5",
            "s",
            "5 minutes",
            "1.5h",
            "-1s",
            "5d",
            "1h30",
            "99999999999999999999s",
            "99999999h",
            "1234567s",
            "721h",
            "720h1ms",
            "30m1h",
            "1s1s",
            "10ms5s",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn the_largest_strings_the_grammar_allows_are_refused_not_overflowed() {
        // Every unit at its six-digit maximum: far beyond MAX, and no panic on the way.
        assert!(parse("999999h999999m999999s999999ms").is_err());
        assert_eq!(parse("0h719m"), Ok(Duration::from_secs(719 * 60)));
    }
}
