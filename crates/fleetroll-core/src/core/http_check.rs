//! Where a health check may send the operator. Any creator of a FleetRollout chooses `health.http.url`, and
//! the operator fetches it from inside the cluster and writes the outcome into status: left open, that is a
//! port scanner and an oracle for loopback, the cloud metadata service, the API server and every internal
//! service, with the operator's network position. So:
//!
//! - the URL's host must be the target's own Service (`{name}.{namespace}.svc`, or with the cluster domain
//!   `{name}.{namespace}.svc.cluster.local`), or for node rollouts `{node}`, `{podIP}`, `{hostIP}`; or be
//!   allowed by the operator (`--http-check-allow`, empty by default);
//! - a Service name is resolved as the absolute name in the cluster domain (no search path, so it cannot
//!   fall through to public DNS), and not at all when the Service is an ExternalName (which points anywhere);
//! - whatever any name resolves to (allowed ones included) must not be loopback, link-local, unspecified,
//!   multicast or the API server, unless an allowed CIDR covers it;
//! - redirects are not followed, no proxy is used, and responses are judged by their status code only.
//!
//! Analysis queries (`edge::prometheus`) are held to the same address rules, under their own flag.
//!
//! Pure decisions; the resolver that applies them to every connection is in `edge::probe`.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::{
    api::TargetKind,
    core::namespaces::{Namespaces, split_bound},
};

/// One entry of `--http-check-allow`: a CIDR (or a single address), or a host name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Allowed {
    /// URLs may name, and reach, addresses in it (loopback or link-local ones too).
    Net(IpNet),
    /// URLs may name this host, and reach whatever it resolves to.
    Host(String),
}

impl std::str::FromStr for Allowed {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if let Ok(net) = s.parse::<IpNet>() {
            return Ok(Allowed::Net(net));
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(Allowed::Net(IpNet::from(ip)));
        }
        // A host as URLs name it once parsed: lowercase, without the root's trailing dot; and not all
        // digits and dots, which a URL parser reads as an address (`2130706433`, `127.1`).
        let host = s.strip_suffix('.').unwrap_or(s);
        let valid_host = !host.is_empty()
            && host.len() <= 253
            && host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            && !host.bytes().all(|b| b.is_ascii_digit() || b == b'.');
        if valid_host {
            Ok(Allowed::Host(host.to_ascii_lowercase()))
        } else {
            Err(format!("{s:?} is neither a CIDR, an IP address nor a host name"))
        }
    }
}

/// One `--notify-allow` entry: an allowance and the namespaces whose Secrets may use it. Every entry is
/// bound (`*=` for every namespace), so that what the platform allows its own sinks is not what a tenant's
/// sink may reach when the binding is forgotten.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundAllowed {
    pub namespaces: Namespaces,
    pub allowed: Allowed,
}

impl std::str::FromStr for BoundAllowed {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match split_bound(s)? {
            (Some(namespaces), allowed) => Ok(BoundAllowed { namespaces, allowed: allowed.parse()? }),
            (None, allowed) => Err(format!(
                "{allowed:?} is bound to no namespace: write NAMESPACES={allowed} (fleetroll-system={allowed}, \
                 team-*={allowed}) for the namespaces whose sink Secrets may reach it, or *={allowed} if every \
                 tenant's may"
            )),
        }
    }
}

/// A policy whose allowances are bound to namespaces: a request on behalf of a namespace is judged by
/// `base` and the entries bound to that namespace only.
#[derive(Clone, Debug, Default)]
pub struct BoundPolicy {
    pub base: Policy,
    pub allow: Vec<BoundAllowed>,
}

impl BoundPolicy {
    /// The policy for requests on behalf of `namespace`.
    pub fn for_namespace(&self, namespace: &str) -> Policy {
        let bound = self.allow.iter().filter(|e| e.namespaces.matches(namespace));
        let mut allowed = self.base.allowed.clone();
        allowed.extend(bound.map(|e| e.allowed.clone()));
        Policy { allowed, ..self.base.clone() }
    }
}

/// Whose requests a policy judges, for its refusals: health checks and analysis queries go by the same
/// rules, but each is widened by its own flag, and a refusal should name the one that applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Purpose {
    /// What is refused, plural ("health checks").
    pub what: &'static str,
    /// The operator flag that allows more.
    pub flag: &'static str,
}

impl Purpose {
    pub const HEALTH_CHECKS: Purpose = Purpose { what: "health checks", flag: "--http-check-allow" };
    pub const ANALYSIS: Purpose = Purpose { what: "analysis queries", flag: "--analysis-allow" };
    pub const NOTIFICATIONS: Purpose = Purpose { what: "notifications", flag: "--notify-allow" };
}

/// The cluster DNS domain when none is configured.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// The operator's rules for health-check URLs.
#[derive(Clone, Debug)]
pub struct Policy {
    pub allowed: Vec<Allowed>,
    /// The API server's addresses, never probed unless allowed.
    pub api_server: Vec<IpAddr>,
    /// The cluster's DNS domain (`--cluster-domain`).
    pub cluster_domain: String,
}

impl Default for Policy {
    fn default() -> Self {
        Self { allowed: Vec::new(), api_server: Vec::new(), cluster_domain: CLUSTER_DOMAIN.into() }
    }
}

/// A target's Service, named by a health-check host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceName {
    pub namespace: String,
    pub name: String,
}

impl Policy {
    /// Whether the operator allows URLs to name this host (what it resolves to is still checked).
    pub fn allows_host(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.allowed.iter().any(|a| matches!(a, Allowed::Host(h) if *h == host))
    }

    /// The Service a resolved host name stands for (`<name>.<namespace>.svc[.<cluster domain>][.]`), and
    /// the absolute name to resolve it by, so that the resolver's search path never sends it elsewhere.
    pub fn service(&self, host: &str) -> Option<(ServiceName, String)> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let domain = format!(".svc.{}", self.cluster_domain);
        let stem = host.strip_suffix(&domain).or_else(|| host.strip_suffix(".svc"))?;
        // A Service name is one DNS label; a namespace too.
        let (name, namespace) = stem.rsplit_once('.')?;
        let label = |l: &str| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        (label(name) && label(namespace)).then(|| {
            let absolute = format!("{name}.{namespace}.svc.{}.", self.cluster_domain);
            (ServiceName { namespace: namespace.into(), name: name.into() }, absolute)
        })
    }

    fn allows_address(&self, ip: IpAddr) -> bool {
        self.allowed.iter().any(|a| matches!(a, Allowed::Net(n) if n.contains(&ip)))
    }

    /// Whether a request made for `purpose` may connect to `ip`, or why not (naming the flag that allows it).
    pub fn check_address(&self, ip: IpAddr, purpose: Purpose) -> Result<(), String> {
        if self.allows_address(ip) {
            return Ok(());
        }
        let ip = canonical(ip);
        let kind = if ip.is_loopback() {
            Some("loopback")
        } else if is_link_local(ip) {
            Some("link-local (cloud metadata services live there)")
        } else if METADATA_SERVICES.contains(&ip) {
            Some("a cloud metadata service")
        } else if ip.is_unspecified() {
            Some("unspecified")
        } else if ip.is_multicast() || ip == IpAddr::from([255, 255, 255, 255]) {
            Some("multicast or broadcast")
        } else if self.api_server.iter().any(|a| canonical(*a) == ip) {
            Some("the Kubernetes API server")
        } else {
            None
        };
        match kind {
            Some(kind) => {
                Err(format!("{ip} is {kind}; {} may not reach it ({})", purpose.what, purpose.flag))
            }
            None => Ok(()),
        }
    }

    /// Whether a rollout's URL template names only its targets (or allowed hosts), or why not. Checked
    /// before anything changes and again at every step (the check may change mid-rollout).
    pub fn check_template(&self, url: &str, kind: TargetKind) -> Result<(), String> {
        let host = host(url)?;
        if self.names_target(host, kind) || self.allows_host(host) {
            return Ok(());
        }
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = literal.parse::<IpAddr>() {
            return match self.allows_address(ip) {
                true => Ok(()),
                false => Err(format!(
                    "health.http.url names the address {ip}, which the operator does not allow (--http-check-allow)"
                )),
            };
        }
        let forms = match kind {
            TargetKind::Node => "{node}, {podIP} or {hostIP}".to_string(),
            _ => format!("{{name}}.{{namespace}}.svc or {{name}}.{{namespace}}.svc.{}", self.cluster_domain),
        };
        Err(format!(
            "health.http.url must name its target ({forms}) or a host the operator allows (--http-check-allow); \
             {host:?} is neither"
        ))
    }
}

/// The host of a URL (brackets kept on IPv6 literals). User information is refused: `http://{name}@evil/`
/// would name another host than it seems to.
pub fn host(url: &str) -> Result<&str, String> {
    let rest = url.split_once("://").map(|(_, r)| r).ok_or_else(|| format!("{url:?} is not a URL"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err("health.http.url must not carry user information (user@host)".into());
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map(|(h, _)| &authority[..h.len() + 2]).unwrap_or(authority),
        None => authority.split(':').next().unwrap_or_default(),
    };
    if host.is_empty() {
        return Err(format!("{url:?} has no host"));
    }
    Ok(host)
}

impl Policy {
    /// Whether a template's host is one of the forms that name the target itself: its Service in the
    /// cluster domain (never another domain, which could resolve anywhere), or a node rollout's node or pod.
    fn names_target(&self, host: &str, kind: TargetKind) -> bool {
        if kind == TargetKind::Node {
            return matches!(host, "{node}" | "{name}" | "{podIP}" | "{hostIP}");
        }
        let host = host.trim_end_matches('.');
        host == "{name}.{namespace}.svc"
            || host == format!("{{name}}.{{namespace}}.svc.{}", self.cluster_domain)
    }
}

/// IPv4-mapped IPv6 addresses judged as the IPv4 address they carry.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Cloud metadata services outside link-local space: AWS's and GCP's IPv6 endpoints, Alibaba Cloud's.
const METADATA_SERVICES: [IpAddr; 3] = [
    IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
    IpAddr::V6(std::net::Ipv6Addr::new(0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254)),
    IpAddr::V4(std::net::Ipv4Addr::new(100, 100, 100, 200)),
];

fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEALTH: Purpose = Purpose::HEALTH_CHECKS;

    fn policy(allowed: &[&str]) -> Policy {
        Policy {
            allowed: allowed.iter().map(|a| a.parse().unwrap()).collect(),
            api_server: vec!["10.96.0.1".parse().unwrap(), "192.168.5.10".parse().unwrap()],
            cluster_domain: CLUSTER_DOMAIN.into(),
        }
    }

    #[test]
    fn a_template_must_name_its_target() {
        let p = policy(&[]);
        let deployment = TargetKind::Deployment;
        for ok in [
            "http://{name}.{namespace}.svc:8080/healthz",
            "https://{name}.{namespace}.svc.cluster.local/ready?x={name}",
            "http://{name}.{namespace}.svc.cluster.local.:8080/",
        ] {
            assert_eq!(p.check_template(ok, deployment), Ok(()), "{ok}");
        }
        for bad in [
            "http://127.0.0.1:8080/{namespace}/{name}",
            "http://localhost/",
            "http://169.254.169.254/latest/meta-data/",
            "http://[::1]:80/",
            "http://kubernetes.default.svc/api",
            "http://metadata.google.internal/",
            "http://{name}.evil.example.com/",
            "http://{name}/",
            "http://{name}.{namespace}.svc.{name}.evil/",
            // Another domain after .svc resolves wherever its owner wants; so may a name without .svc,
            // which the search path can send to public DNS (a namespace called like a top-level domain).
            "http://{name}.{namespace}.svc.attacker.example:6443/",
            "http://{name}.{namespace}.svc.corp-cluster.internal/",
            "http://{name}.{namespace}:8080/",
            "http://{name}.{namespace}@evil.example.com/",
            "http://evil.example.com/{name}.{namespace}.svc",
            "http://{podIP}:8080/",
        ] {
            assert!(p.check_template(bad, deployment).is_err(), "{bad} was accepted");
        }
        let node = TargetKind::Node;
        for ok in ["http://{podIP}:8080/healthz", "http://{hostIP}:9100/", "http://{node}:10250/"] {
            assert_eq!(p.check_template(ok, node), Ok(()), "{ok}");
        }
        assert!(p.check_template("http://{name}.{namespace}.svc/", node).is_err());
    }

    #[test]
    fn the_operator_may_allow_hosts_and_networks() {
        let p = policy(&["127.0.0.1", "10.20.0.0/16", "Checks.Example.COM"]);
        assert_eq!(
            p.check_template("http://127.0.0.1:8080/{namespace}/{name}", TargetKind::Deployment),
            Ok(())
        );
        assert_eq!(p.check_template("http://10.20.3.4/", TargetKind::Deployment), Ok(()));
        assert_eq!(p.check_template("http://checks.example.com/{name}", TargetKind::Deployment), Ok(()));
        assert!(p.check_template("http://10.21.0.1/", TargetKind::Deployment).is_err());
        assert!(p.allows_host("checks.example.com."));
        assert!("not a host!".parse::<Allowed>().is_err());
    }

    #[test]
    fn a_bound_allowance_serves_its_own_namespaces_only() {
        let entry = |s: &str| s.parse::<BoundAllowed>();
        let bound = BoundPolicy {
            base: policy(&[]),
            allow: vec![
                entry("fleetroll-system=127.0.0.0/8").unwrap(),
                entry("team-*=hooks.internal").unwrap(),
            ],
        };
        let loopback = "127.0.0.1".parse().unwrap();
        let (platform, tenant) = (bound.for_namespace("fleetroll-system"), bound.for_namespace("team-a"));
        assert_eq!(platform.check_address(loopback, Purpose::NOTIFICATIONS), Ok(()));
        assert!(tenant.check_address(loopback, Purpose::NOTIFICATIONS).is_err());
        assert!(tenant.allows_host("hooks.internal.") && !platform.allows_host("hooks.internal"));
        // Every spelling of loopback is one address to the check.
        assert!(tenant.check_address("::ffff:127.0.0.1".parse().unwrap(), Purpose::NOTIFICATIONS).is_err());
        assert_eq!(entry("*=::1").unwrap().allowed, "::1".parse::<Allowed>().unwrap());
        let unbound = entry("127.0.0.0/8").unwrap_err();
        assert!(unbound.contains("bound to no namespace") && unbound.contains("*=127.0.0.0/8"), "{unbound}");
        assert!(entry("Team=10.0.0.0/8").is_err() && entry("*=not a host!").is_err());
    }
    #[test]
    fn loopback_link_local_and_the_api_server_are_never_reached_unless_allowed() {
        let p = policy(&[]);
        for bad in [
            "127.0.0.1",
            "127.8.9.10",
            "::1",
            "169.254.169.254",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "0.0.0.0",
            "::",
            "224.0.0.1",
            "255.255.255.255",
            "10.96.0.1",
            "192.168.5.10",
            "fd00:ec2::254",
            "fd20:ce::254",
            "100.100.100.200",
            "::ffff:100.100.100.200",
        ] {
            let refusal = p.check_address(bad.parse().unwrap(), HEALTH);
            assert!(refusal.is_err(), "{bad} was allowed");
        }
        for ok in ["10.244.1.7", "192.168.5.11", "fd00::7", "8.8.8.8"] {
            assert_eq!(p.check_address(ok.parse().unwrap(), HEALTH), Ok(()), "{ok}");
        }
        let allowed = policy(&["127.0.0.0/8"]);
        assert_eq!(allowed.check_address("127.0.0.1".parse().unwrap(), HEALTH), Ok(()));
        assert!(
            allowed
                .check_address("169.254.169.254".parse().unwrap(), HEALTH)
                .unwrap_err()
                .contains("link-local")
        );
        let refusal = p.check_address("127.0.0.1".parse().unwrap(), Purpose::ANALYSIS).unwrap_err();
        assert!(refusal.contains("analysis queries may not reach it (--analysis-allow)"), "{refusal}");
        assert!(p.check_address("::1".parse().unwrap(), HEALTH).unwrap_err().contains("--http-check-allow"));
    }

    #[test]
    fn a_service_host_is_resolved_by_its_absolute_name_in_the_cluster_domain() {
        let p = policy(&[]);
        let web = ServiceName { namespace: "team".into(), name: "web".into() };
        let absolute = "web.team.svc.cluster.local.".to_string();
        assert_eq!(p.service("web.team.svc"), Some((web.clone(), absolute.clone())));
        assert_eq!(p.service("web.team.svc.cluster.local"), Some((web.clone(), absolute.clone())));
        assert_eq!(p.service("Web.Team.svc.cluster.local."), Some((web, absolute)));
        // Not a Service of the cluster: a dotted name (no Service has one), another domain, no .svc.
        for other in ["a.b.team.svc", "web.team.svc.evil.example", "web.team", "localhost", "team.svc"] {
            assert_eq!(p.service(other), None, "{other}");
        }
        let custom = Policy { cluster_domain: "corp.internal".into(), ..policy(&[]) };
        assert_eq!(
            custom.service("web.team.svc.corp.internal").map(|(_, a)| a),
            Some("web.team.svc.corp.internal.".into())
        );
        assert_eq!(
            custom.check_template("http://{name}.{namespace}.svc.corp.internal/", TargetKind::Deployment),
            Ok(())
        );
        assert!(
            custom
                .check_template("http://{name}.{namespace}.svc.cluster.local/", TargetKind::Deployment)
                .is_err()
        );
    }

    #[test]
    fn hosts_are_read_the_way_a_client_reads_them() {
        assert_eq!(host("http://web.ns.svc:8080/x"), Ok("web.ns.svc"));
        assert_eq!(host("http://[::1]:8080/x"), Ok("[::1]"));
        assert_eq!(host("https://web?x=@evil"), Ok("web"));
        assert!(host("http://user@evil/").is_err());
        assert!(host("http:///path").is_err());
        assert!(host("web/path").is_err());
    }
}
