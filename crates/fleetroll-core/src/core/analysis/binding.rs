//! Analysis backends bound to namespaces. The operator's settings name backends (`--analysis-allow`) and
//! defaults (`--analysis-prometheus-address`); each entry may be bound to namespaces (`team-a=...`,
//! `team-*=...`), so that with one scoped backend per tenant (a prom-label-proxy per namespace, a Mimir
//! tenant) no tenant's rollout can name another's. An allow entry is always bound; `*=` binds it to every
//! namespace, for backends that are safe for everyone.

use std::{net::IpAddr, str::FromStr};

pub use crate::core::namespaces::Namespaces;
use crate::core::{http_check::Allowed, namespaces::split_bound};

/// A backend rollouts may name: a host (at any port, or at one), an address or a CIDR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    pub host: Allowed,
    pub port: Option<u16>,
}

impl FromStr for Place {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(host) = s.parse::<Allowed>() {
            return Ok(Place { host, port: None });
        }
        if let Ok(socket) = s.parse::<std::net::SocketAddr>() {
            return Ok(Place { host: Allowed::Net(socket.ip().into()), port: Some(socket.port()) });
        }
        let refused = || format!("{s:?} is neither a host, an address nor a CIDR, with an optional :port");
        let (host, port) = s.rsplit_once(':').ok_or_else(refused)?;
        let port = port.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(refused)?;
        let host = host.parse::<Allowed>().map_err(|_| refused())?;
        Ok(Place { host, port: Some(port) })
    }
}

impl Place {
    /// Whether a URL's host and port (its scheme's default when it gives none) are this place: a name
    /// only by itself (what it resolves to is judged when connecting), an address by the CIDR.
    pub fn holds(&self, url: &url::Url) -> bool {
        if self.port.is_some_and(|p| url.port_or_known_default() != Some(p)) {
            return false;
        }
        match (&self.host, url.host()) {
            (Allowed::Net(net), Some(url::Host::Ipv4(ip))) => net.contains(&IpAddr::from(ip)),
            (Allowed::Net(net), Some(url::Host::Ipv6(ip))) => net.contains(&IpAddr::from(ip)),
            (Allowed::Host(name), Some(url::Host::Domain(host))) => {
                *name == host.trim_end_matches('.').to_ascii_lowercase()
            }
            _ => false,
        }
    }
}

/// One `--analysis-allow` entry: a backend and the namespaces whose rollouts may name it. Every entry is
/// bound: `*=BACKEND` is the form for a backend every tenant may query, so that sharing one is written, not
/// what an entry means when its binding is forgotten.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowEntry {
    pub namespaces: Namespaces,
    pub place: Place,
}

impl FromStr for AllowEntry {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match split_bound(s)? {
            (Some(namespaces), place) => Ok(AllowEntry { namespaces, place: place.parse()? }),
            (None, place) => Err(format!(
                "{place:?} is bound to no namespace: write NAMESPACES={place} (team-a={place}, \
                 team-*={place}) for the rollouts that may name it, or *={place} if every tenant may query it"
            )),
        }
    }
}

/// One `--analysis-prometheus-address` entry: the backend rollouts of these namespaces query when they
/// name none (bound to none: of every namespace no bound entry matches).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DefaultBackend {
    pub namespaces: Option<Namespaces>,
    /// An http(s) base URL, without a trailing slash.
    pub address: String,
}

impl FromStr for DefaultBackend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (namespaces, address) = split_bound(s)?;
        base_url(address)?;
        Ok(DefaultBackend { namespaces, address: address.trim_end_matches('/').to_string() })
    }
}

/// The form two spellings of one backend share, for comparing them: the URL as the HTTP client parses it
/// (host lowercase, an address in dotted form, the root's trailing dot and a default port left out),
/// without a trailing slash.
pub fn normalized(url: &url::Url) -> String {
    let mut url = url.clone();
    if let Some(url::Host::Domain(host)) = url.host() {
        let host = host.strip_suffix('.').unwrap_or(host).to_string();
        let _ = url.set_host(Some(&host));
    }
    url.as_str().trim_end_matches('/').to_string()
}

/// Applies to `namespace`: bound to none, or to a pattern that matches it.
pub fn applies(namespaces: Option<&Namespaces>, namespace: &str) -> bool {
    namespaces.is_none_or(|n| n.matches(namespace))
}

/// An http(s) URL with a host and nothing else a surprise could hide in (user information, a query, a
/// fragment), parsed as the HTTP client parses it, so that the host judged is the host reached.
pub fn base_url(text: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    let fine = matches!(url.scheme(), "http" | "https")
        && url.host_str().is_some_and(|h| !h.is_empty())
        && url.username().is_empty()
        && url.password().is_none()
        && url.query().is_none()
        && url.fragment().is_none();
    match fine {
        true => Ok(url),
        false => Err(format!(
            "{text:?} is not an http(s) base URL (a host, no user information, query or fragment)"
        )),
    }
}
