//! Which backend a rollout's analysis may query. A rollout's creator names the address, and the operator
//! sends queries (and the credentials of a Secret) there from inside the cluster: left open, that is a
//! way to reach any internal service with the operator's network position. So the address must be the
//! operator's default (`--analysis-prometheus-address`, exactly) or a host or CIDR the operator allows
//! (`--analysis-allow`); and whatever a name resolves to is judged by the same rules as health checks (no
//! loopback, link-local or API server unless allowed). Not a Service of the rollout's own namespace: a
//! Service without a selector sends its traffic to whatever endpoints its author writes.

use std::time::Duration;

use crate::{
    api::{Analysis, PrometheusProvider},
    core::{
        Blocked,
        analysis::check_query,
        duration,
        http_check::{self, Allowed, Policy},
        reason,
    },
};

/// The operator's settings for analysis backends.
#[derive(Clone, Debug, Default)]
pub struct Backends {
    /// The address used when a rollout names none; rollouts may name it too, exactly.
    pub default_address: Option<String>,
    /// The hosts and CIDRs rollouts may name besides the default (`--analysis-allow`).
    pub allow: Vec<Allowed>,
    /// Where names may resolve to: the allowed CIDRs, and the default's own address.
    pub policy: Policy,
}

/// The backend one rollout's analysis queries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    /// The base URL, without a trailing slash.
    pub address: String,
    /// The credentials Secret, in the rollout's namespace.
    pub secret: Option<String>,
    pub timeout: Duration,
}

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

impl Backends {
    /// The backend a rollout's analysis queries, or why it cannot have one.
    pub fn resolve(&self, analysis: &Analysis) -> Result<Backend, Blocked> {
        let prometheus = analysis.provider.as_ref().and_then(|p| p.prometheus.as_ref());
        let named = prometheus.and_then(|p| p.address.as_deref());
        let Some(address) = named.or(self.default_address.as_deref()) else {
            return Err(Blocked {
                reason: reason::ANALYSIS_PROVIDER_MISSING,
                message:
                    "spec.analysis names no backend (provider.prometheus.address) and the operator has no \
                          default (--analysis-prometheus-address, Helm value analysis.prometheus.address); \
                          nothing was changed"
                        .into(),
            });
        };
        let address = address.trim_end_matches('/').to_string();
        if named.is_some() {
            self.check_address(&address)?;
        }
        let secret = prometheus.and_then(|p| p.secret_ref.as_ref()).map(|s| s.name.clone());
        if let Some(name) = secret.as_deref().filter(|n| !is_dns_subdomain(n)) {
            return Err(Blocked {
                reason: reason::INVALID_ANALYSIS,
                message: format!("secretRef.name {name:?} is not a Secret name; nothing was changed"),
            });
        }
        Ok(Backend { address, secret, timeout: prometheus.map_or(DEFAULT_TIMEOUT, timeout) })
    }

    /// Whether a rollout may name this address: the default exactly, or an allowed host or CIDR.
    fn check_address(&self, address: &str) -> Result<(), Blocked> {
        let refused = |why: String| Blocked { reason: reason::ANALYSIS_ADDRESS_REFUSED, message: why };
        if self.default_address.as_deref().is_some_and(|d| d.trim_end_matches('/') == address) {
            return Ok(());
        }
        let host = http_check::host(address).map_err(|e| refused(format!("analysis address: {e}")))?;
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        let name = host.trim_end_matches('.').to_ascii_lowercase();
        let allowed = match literal.parse::<std::net::IpAddr>() {
            Ok(ip) => self.allow.iter().any(|a| matches!(a, Allowed::Net(n) if n.contains(&ip))),
            Err(_) => self.allow.iter().any(|a| matches!(a, Allowed::Host(h) if *h == name)),
        };
        if allowed {
            return Ok(());
        }
        Err(refused(format!(
            "analysis address {address} is not one this installation lets rollouts query: leave it out for the \
             operator's default, or name a host the operator allows (--analysis-allow, Helm value \
             analysis.allow); nothing was changed"
        )))
    }
}

/// Whether `name` is an object name (an RFC 1123 subdomain): it goes into a URL path.
fn is_dns_subdomain(name: &str) -> bool {
    let label = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    name.len() <= 253 && name.split('.').all(label)
}

fn timeout(p: &PrometheusProvider) -> Duration {
    duration::parse(&p.timeout).unwrap_or(DEFAULT_TIMEOUT).min(Duration::from_secs(30))
}

/// Every check an analysis passes before its rollout may change anything: a backend it may query, and
/// queries that use only their scope's placeholders (the schema checks these too; a spec stored before
/// the rule existed is judged here).
pub fn check(backends: &Backends, analysis: &Analysis) -> Result<(), Blocked> {
    backends.resolve(analysis)?;
    for metric in &analysis.metrics {
        check_query(metric).map_err(|message| Blocked { reason: reason::INVALID_ANALYSIS, message })?;
    }
    if analysis.metrics.iter().all(|m| m.dry_run) {
        return Err(Blocked {
            reason: reason::INVALID_ANALYSIS,
            message: "spec.analysis has only dryRun metrics, which never decide: add a metric without dryRun"
                .into(),
        });
    }
    Ok(())
}
