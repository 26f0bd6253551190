//! Which backend a rollout's analysis may query. A rollout's creator names the address, and the operator
//! sends queries (and the credentials of a Secret) there from inside the cluster: left open, that is a
//! way to reach any internal service with the operator's network position, and, where tenants each have a
//! backend scoped to them, a way to read another tenant's series. So the address must be the default of
//! the rollout's namespace (`--analysis-prometheus-address`, the same URL however spelled) or a backend the
//! operator allows for that namespace (`--analysis-allow`, every entry bound to namespaces: [`binding`]),
//! judged on the URL as the HTTP client parses it (a decimal or dotted address, a trailing dot or slash
//! name the same backend); and whatever
//! a name resolves to is judged by the same rules as health checks (no loopback, link-local or API server
//! unless allowed). Not a Service of the rollout's own namespace: a Service without a selector sends its
//! traffic to whatever endpoints its author writes.
//!
//! The namespace is the rollout's own, for every query it sends: a rollout of the fleet namespace that
//! spans namespaces uses the fleet namespace's backends, its per-target queries too (a query is text its
//! author writes, `{{namespace}}` a convenience and not a scope).

use std::time::Duration;

use super::binding::{self, AllowEntry, DefaultBackend};
use crate::{
    api::{Analysis, PrometheusProvider},
    core::{Blocked, analysis::check_query, duration, http_check::Policy, reason},
};

/// The operator's settings for analysis backends.
#[derive(Clone, Debug, Default)]
pub struct Backends {
    /// The backends used when a rollout names none, by namespace (the first bound entry that matches,
    /// else the one bound to none); a rollout may name its own, however spelled.
    pub defaults: Vec<DefaultBackend>,
    /// The backends rollouts may name besides their default (`--analysis-allow`).
    pub allow: Vec<AllowEntry>,
    /// Where names may resolve to: the allowed CIDRs, and the defaults' own addresses.
    pub policy: Policy,
    /// A header every query carries, set to the rollout's namespace (`--analysis-namespace-header`), for
    /// a shared backend that scopes queries by it.
    pub namespace_header: Option<String>,
}

/// The backend one rollout's analysis queries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    /// The base URL, without a trailing slash.
    pub address: String,
    /// The credentials Secret, in the rollout's namespace.
    pub secret: Option<String>,
    pub timeout: Duration,
    /// A header to send with every query, and its value: the rollout's namespace.
    pub namespace_header: Option<(String, String)>,
}

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

impl Backends {
    /// The default backend of rollouts in `namespace`: the first default bound to it, else the default
    /// bound to none.
    pub fn default_for(&self, namespace: &str) -> Option<&str> {
        let bound =
            self.defaults.iter().find(|d| d.namespaces.as_ref().is_some_and(|n| n.matches(namespace)));
        let any = || self.defaults.iter().find(|d| d.namespaces.is_none());
        bound.or_else(any).map(|d| d.address.as_str())
    }

    /// The backend the analysis of a rollout in `namespace` queries, or why it cannot have one.
    pub fn resolve(&self, analysis: &Analysis, namespace: &str) -> Result<Backend, Blocked> {
        let prometheus = analysis.provider.as_ref().and_then(|p| p.prometheus.as_ref());
        let named = prometheus.and_then(|p| p.address.as_deref());
        let Some(address) = named.or(self.default_for(namespace)) else {
            return Err(Blocked {
                reason: reason::ANALYSIS_PROVIDER_MISSING,
                message: format!(
                    "spec.analysis names no backend (provider.prometheus.address) and the operator has no \
                     default for namespace {namespace} (--analysis-prometheus-address, Helm value \
                     analysis.prometheus.address); nothing was changed"
                ),
            });
        };
        let address = address.trim_end_matches('/').to_string();
        if named.is_some() {
            self.check_address(&address, namespace)?;
        }
        let secret = prometheus.and_then(|p| p.secret_ref.as_ref()).map(|s| s.name.clone());
        if let Some(name) = secret.as_deref().filter(|n| !is_dns_subdomain(n)) {
            return Err(Blocked {
                reason: reason::INVALID_ANALYSIS,
                message: format!("secretRef.name {name:?} is not a Secret name; nothing was changed"),
            });
        }
        Ok(Backend {
            address,
            secret,
            timeout: prometheus.map_or(DEFAULT_TIMEOUT, timeout),
            namespace_header: self.namespace_header.clone().map(|h| (h, namespace.to_string())),
        })
    }

    /// Whether a rollout in `namespace` may name this address: its namespace's default, or a backend
    /// allowed for its namespace (`*=` for every one). The refusal names the rule, never the
    /// backends of other namespaces.
    fn check_address(&self, address: &str, namespace: &str) -> Result<(), Blocked> {
        let refused = |why: String| Blocked { reason: reason::ANALYSIS_ADDRESS_REFUSED, message: why };
        let url = binding::base_url(address).map_err(|e| refused(format!("analysis address: {e}")))?;
        let default = self.default_for(namespace).and_then(|d| binding::base_url(d).ok());
        if default.is_some_and(|d| binding::normalized(&d) == binding::normalized(&url)) {
            return Ok(());
        }
        let allowed = self.allow.iter().any(|a| a.namespaces.matches(namespace) && a.place.holds(&url));
        if allowed {
            return Ok(());
        }
        Err(refused(format!(
            "analysis address {address} is not a backend rollouts in namespace {namespace} may query: leave \
             it out for the namespace's default, or name a backend the operator allows for this namespace \
             (--analysis-allow, Helm value analysis.allow; a backend bound to other namespaces is not); \
             nothing was changed"
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
pub fn check(backends: &Backends, analysis: &Analysis, namespace: &str) -> Result<(), Blocked> {
    backends.resolve(analysis, namespace)?;
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
