//! `Origin` values `/mcp` accepts. Browsers send `Origin`; a page on another site reaching a server on
//! localhost or an intranet (DNS rebinding) must be refused, so any request with a foreign `Origin` is,
//! whatever else it carries. Requests without one (agents, CLIs) pass.

use tracing::warn;
use url::Url;

use crate::mcp::endpoint::Origin;

#[derive(Clone, Debug, Default)]
pub struct Origins {
    allowed: Vec<Origin>,
}

impl Origins {
    /// The configured origins, the origin of the MCP endpoint itself, and localhost on any port.
    pub fn new(configured: &[String], resource: &str) -> Self {
        let mut allowed = Vec::new();
        for host in ["localhost", "127.0.0.1", "[::1]"] {
            for scheme in ["http", "https"] {
                allowed.push(Origin { scheme: scheme.into(), host: host.into(), port: None });
            }
        }
        allowed.extend(Url::parse(resource).ok().as_ref().and_then(Origin::of));
        for value in configured {
            match Origin::parse(value) {
                Some(origin) => allowed.push(origin),
                None => {
                    warn!(origin = %value, "ignoring an allowed origin that is not scheme://host[:port|:*]")
                }
            }
        }
        Self { allowed }
    }

    pub fn allows(&self, origin: &str) -> bool {
        // A request names one port: `:*` is for the allow-list only.
        let Some(o) = Origin::parse(origin).filter(|o| o.port.is_some()) else { return false };
        self.allowed
            .iter()
            .any(|a| a.scheme == o.scheme && a.host == o.host && (a.port.is_none() || a.port == o.port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn localhost_the_endpoint_and_configured_origins_are_allowed_and_nothing_else() {
        let configured =
            ["https://app.example.com".into(), "http://dev.example.com:*".into(), "bogus".into()];
        let origins = Origins::new(&configured, "https://fleet.example.com/mcp");
        for ok in [
            "http://localhost:3000",
            "https://127.0.0.1",
            "http://[::1]:8080",
            "HTTP://LocalHost:1",
            "https://fleet.example.com",
            "https://fleet.example.com:443",
            "https://app.example.com",
            "http://dev.example.com:9999",
            "http://dev.example.com",
        ] {
            assert!(origins.allows(ok), "{ok} should be allowed");
        }
        for bad in [
            "https://evil.example.com",
            "null",
            "",
            "https://fleet.example.com:8443",
            "http://fleet.example.com",
            "https://app.example.com:444",
            "http://localhost.evil.com",
            "https://localhost@evil.com",
            "http://127.0.0.1.evil.com:80",
            "https://app.example.com/path",
            "http://[::1",
            "http://localhost:*",
            "http://localhost:99999",
        ] {
            assert!(!origins.allows(bad), "{bad} should be refused");
        }
        let audience_on_a_port = Origins::new(&[], "http://127.0.0.1:8080/mcp");
        assert!(!audience_on_a_port.allows("https://evil.example.com"));
    }
}
