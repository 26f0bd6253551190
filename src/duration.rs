//! Durations as the spec writes them: Go-style `30s`, `5m`, `1h30m`, `250ms` (the CRD admits exactly
//! `^([0-9]+(ms|s|m|h))+$`).

use std::time::Duration;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not a duration such as 30s, 5m or 1h30m")]
pub struct InvalidDuration(pub String);

pub fn parse(text: &str) -> Result<Duration, InvalidDuration> {
    let invalid = || InvalidDuration(text.to_string());
    if text.is_empty() {
        return Err(invalid());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(invalid)?;
        if digits == 0 {
            return Err(invalid());
        }
        let value: u64 = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else if rest.starts_with('s') {
            (Duration::from_secs(1), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(60), 1)
        } else if rest.starts_with('h') {
            (Duration::from_secs(3600), 1)
        } else {
            return Err(invalid());
        };
        rest = &rest[len..];
        let part = unit.checked_mul(u32::try_from(value).map_err(|_| invalid())?).ok_or_else(invalid)?;
        total = total.checked_add(part).ok_or_else(invalid)?;
    }
    Ok(total)
}

/// Formats a duration the way the spec writes them (`1h30m`, `45s`, `250ms`).
pub fn format(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let secs = ms / 1000;
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 {
        out.push_str(&format!("{s}s"));
    }
    out
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
    }

    #[test]
    fn rejects_what_the_schema_rejects() {
        for bad in ["", "5", "s", "5 minutes", "1.5h", "-1s", "5d", "1h30", "99999999999999999999s"] {
            assert!(parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn formats_round_trip() {
        for text in ["0s", "45s", "5m", "1h30m", "250ms", "2h5s"] {
            assert_eq!(format(parse(text).unwrap()), text);
        }
    }
}
