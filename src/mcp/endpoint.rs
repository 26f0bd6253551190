//! The MCP endpoint's URL (the audience) and the origins and hosts it implies, all read with the `url`
//! crate: the WHATWG URL standard, which is how browsers (and so `Origin` headers) read them.

use url::Url;

/// An origin: scheme, host and port, lowercased, with the scheme's default port filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub scheme: String,
    /// As the URL standard serializes it: IPv6 literals in brackets, domains in ASCII.
    pub host: String,
    /// None: any port (`:*`, allowed only in configured origins).
    pub port: Option<u16>,
}

impl Origin {
    /// The origin of a URL; None when it has no host, or no port and a scheme without a default one.
    pub fn of(url: &Url) -> Option<Origin> {
        Some(Origin {
            scheme: url.scheme().to_string(),
            host: url.host_str()?.to_string(),
            port: Some(url.port_or_known_default()?),
        })
    }

    /// An origin as an `Origin` header or `--mcp-allowed-origin` gives it: `scheme://host[:port]` and
    /// nothing more, or `scheme://host:*` for any port.
    pub fn parse(value: &str) -> Option<Origin> {
        let value = value.trim();
        let (value, any_port) = match value.strip_suffix(":*") {
            Some(rest) => (rest, true),
            None => (value, false),
        };
        let url = Url::parse(value).ok()?;
        // A path, query, fragment or user information would make it something other than an origin (and
        // `https://localhost@evil.com` is evil.com's).
        let bare = matches!(url.path(), "" | "/")
            && url.query().is_none()
            && url.fragment().is_none()
            && url.username().is_empty()
            && url.password().is_none();
        if !bare || (any_port && url.port().is_some()) {
            return None;
        }
        let origin = Origin::of(&url)?;
        Some(if any_port { Origin { port: None, ..origin } } else { origin })
    }
}

/// `scheme://host[:port]` of the endpoint's URL, under which its Protected Resource Metadata is served.
pub fn origin_of(resource: &str) -> String {
    match Url::parse(resource) {
        Ok(url) if url.origin().is_tuple() => url.origin().ascii_serialization(),
        _ => resource.trim_end_matches('/').to_string(),
    }
}

/// The `Host` header values `/mcp` accepts: localhost, the endpoint's own host, and `extra`.
pub fn allowed_hosts(resource: &str, extra: &[String]) -> Vec<String> {
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    hosts.extend(Url::parse(resource).ok().and_then(|u| u.host_str().map(String::from)));
    hosts.extend(extra.iter().cloned());
    hosts.dedup();
    hosts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_origin_of_a_url() {
        assert_eq!(origin_of("http://127.0.0.1:8080/mcp"), "http://127.0.0.1:8080");
        assert_eq!(origin_of("https://fleet.example.com/mcp"), "https://fleet.example.com");
        assert_eq!(origin_of("https://fleet.example.com"), "https://fleet.example.com");
    }

    #[test]
    fn origins_are_scheme_host_and_port_and_nothing_more() {
        let origin =
            |scheme: &str, host: &str, port| Origin { scheme: scheme.into(), host: host.into(), port };
        assert_eq!(
            Origin::parse("HTTPS://Fleet.Example.com"),
            Some(origin("https", "fleet.example.com", Some(443)))
        );
        assert_eq!(Origin::parse("http://[::1]:8080/"), Some(origin("http", "[::1]", Some(8080))));
        assert_eq!(Origin::parse("http://dev.example.com:*"), Some(origin("http", "dev.example.com", None)));
        for bad in [
            "",
            "null",
            "bogus",
            "https://a.example.com/path",
            "https://a@b.example.com",
            "http://[::1",
            "http://localhost:99999",
            "http://a.example.com?x",
            "custom://host",
        ] {
            assert_eq!(Origin::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_endpoint_host_is_allowed_besides_localhost() {
        let hosts = allowed_hosts("https://fleet.example.com:8443/mcp", &["ingress.example.com".into()]);
        assert_eq!(hosts, ["localhost", "127.0.0.1", "::1", "fleet.example.com", "ingress.example.com"]);
        assert_eq!(allowed_hosts("http://[::1]:8080/mcp", &[])[3], "[::1]");
        assert_eq!(allowed_hosts("not a url", &[]).len(), 3);
    }
}
