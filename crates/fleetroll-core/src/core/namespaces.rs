//! Settings bound to namespaces: an operator flag's entry written `NAMESPACES=VALUE` applies to the
//! rollouts (and Secrets) of the namespaces a name or pattern gives, so that what one tenant is allowed is
//! not what every tenant is allowed. Analysis backends (`--analysis-allow`) and notification sinks
//! (`--notify-allow`) are bound this way.

use std::str::FromStr;

/// The namespaces an entry applies to: a name, or a pattern in which `*` stands for any run of characters
/// (`team-*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespaces(String);

impl Namespaces {
    pub fn matches(&self, namespace: &str) -> bool {
        glob(self.0.as_bytes(), namespace.as_bytes())
    }
}

impl FromStr for Namespaces {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let fine = !s.is_empty()
            && s.len() <= 63
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'*');
        match fine {
            true => Ok(Self(s.to_string())),
            false => {
                Err(format!("{s:?} is not a namespace or a pattern of them (lowercase, digits, '-', '*')"))
            }
        }
    }
}

impl std::fmt::Display for Namespaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether `text` matches `pattern`, where `*` matches any run of bytes: one backtracking point, so at
/// most |pattern| × |text| steps (63 × 63 here).
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if pattern.get(p) == Some(&b'*') {
            star = Some((p, t));
            p += 1;
        } else if pattern.get(p) == Some(&text[t]) {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            star = Some((sp, st + 1));
            (p, t) = (sp + 1, st + 1);
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

/// `NAMESPACES=VALUE` (bound) or `VALUE` (for every namespace). What stands before the first `=` is a
/// pattern only when it has no `:` or `/`, so that a URL's own `=` is never taken for one.
pub fn split_bound(s: &str) -> Result<(Option<Namespaces>, &str), String> {
    match s.split_once('=') {
        Some((namespaces, value)) if !namespaces.contains([':', '/']) => {
            Ok((Some(namespaces.trim().parse()?), value.trim()))
        }
        _ => Ok((None, s.trim())),
    }
}
