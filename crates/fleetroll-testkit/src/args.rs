//! The command line of the test binaries that bring their own harness (security, chaos), read as libtest
//! reads it, so that `cargo test -- NAME --skip OTHER` means the same to every test binary it reaches.

/// Which entries a run selects: those containing one of the named filters (all, when none is named), less
/// those containing a `--skip` pattern.
#[derive(Debug, Default)]
pub struct Selection {
    filters: Vec<String>,
    skips: Vec<String>,
    exact: bool,
}

impl Selection {
    /// The selection this process was started with.
    pub fn from_env() -> Self {
        Self::parse(std::env::args().skip(1))
    }

    /// Positional words are filters; `--skip P` (or `--skip=P`) skips; `--exact` compares whole names;
    /// every other flag (`--full`, `--nocapture`, …) is left to whoever reads it.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Self {
        let mut selection = Self::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "--skip" {
                selection.skips.extend(args.next());
            } else if let Some(pattern) = arg.strip_prefix("--skip=") {
                selection.skips.push(pattern.to_owned());
            } else if arg == "--exact" {
                selection.exact = true;
            } else if !arg.starts_with('-') {
                selection.filters.push(arg);
            }
        }
        selection
    }

    /// Names must match a pattern whole, as with `--exact`.
    pub fn exact(mut self) -> Self {
        self.exact = true;
        self
    }

    pub fn selects(&self, name: &str) -> bool {
        let matches =
            |pattern: &String| if self.exact { name == pattern } else { name.contains(pattern.as_str()) };
        (self.filters.is_empty() || self.filters.iter().any(matches)) && !self.skips.iter().any(matches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Selection {
        Selection::parse(args.iter().map(|a| a.to_string()))
    }

    #[test]
    fn no_words_selects_everything_and_a_skip_is_not_a_filter() {
        assert!(parse(&[]).selects("node status"));
        let skipping = parse(&["--skip", "helm_install::"]);
        assert!(skipping.selects("node status"));
        assert!(!skipping.selects("helm_install::running"));
        assert!(!parse(&["--skip=node"]).selects("node status"));
    }

    #[test]
    fn filters_select_by_substring_or_whole_name_with_exact() {
        let filtered = parse(&["node", "--nocapture", "--full"]);
        assert!(filtered.selects("node status") && !filtered.selects("mcp flood"));
        let exact = parse(&["--exact", "plane"]);
        assert!(exact.selects("plane") && !exact.selects("plane fuzz"));
        assert!(!parse(&["node", "--skip", "status"]).selects("node status"));
    }
}
