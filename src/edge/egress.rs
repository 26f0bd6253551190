//! Where the operator's own HTTP requests may go (health checks, analysis queries, and whatever comes
//! next), judged on every address a name resolves to by the rules of [`crate::core::http_check`]: one
//! resolver, one client setup, one way of telling why a request failed.

use std::{sync::Arc, time::Duration};

use kube::{Api, Client};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::core::http_check::{Policy, Purpose, ServiceName};

/// A client builder that resolves names with `resolver` only, follows no redirect (it would lead past the
/// rules) and uses no proxy (a proxy would resolve the name itself, past every rule here).
pub(crate) fn guarded(resolver: Arc<GuardedResolver>) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(resolver)
        .user_agent(concat!("fleetroll/", env!("CARGO_PKG_VERSION")))
}

/// Why a URL may not be fetched for `purpose`: not a URL, user information, or a literal address the
/// policy refuses (names are judged by the resolver, on every address they resolve to).
pub(crate) fn refusal(policy: &Policy, purpose: Purpose, url: &str) -> Option<String> {
    let parsed = match reqwest::Url::parse(url) {
        Ok(u) => u,
        Err(e) => return Some(format!("not a URL: {e}")),
    };
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Some("user information in the URL".into());
    }
    match parsed.host() {
        Some(url::Host::Ipv4(ip)) => policy.check_address(ip.into(), purpose).err(),
        Some(url::Host::Ipv6(ip)) => policy.check_address(ip.into(), purpose).err(),
        Some(url::Host::Domain(_)) => None,
        None => Some("no host".into()),
    }
}

/// Resolves names for the prober and the analysis querier: a Service by its absolute name in the cluster
/// domain (never an ExternalName Service, which points wherever its author likes), and drops every address
/// the policy refuses, so that no name is ever connected to loopback, the metadata service or the API
/// server. Cheap to clone: clones share what they learnt of Services.
#[derive(Clone)]
pub(crate) struct GuardedResolver {
    policy: Arc<Policy>,
    services: Option<ServiceKinds>,
    purpose: Purpose,
}

impl GuardedResolver {
    /// A resolver under `policy`; `services` reads Services (to refuse ExternalName ones), and refusals
    /// speak of `purpose`.
    pub(crate) fn new(policy: Arc<Policy>, services: Option<Client>, purpose: Purpose) -> Self {
        Self { policy, services: services.map(ServiceKinds::new), purpose }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        let services = self.services.clone();
        let purpose = self.purpose;
        let host = name.as_str().to_string();
        Box::pin(async move {
            let lookup = match policy.service(&host).or_else(|| service_in_a_namespace(&policy, &host)) {
                Some((service, absolute)) => {
                    if let Some(services) = &services
                        && services.is_external_name(&service).await?
                    {
                        return Err(format!(
                            "Service {}/{} is an ExternalName Service: {} do not follow it",
                            service.namespace, service.name, purpose.what
                        )
                        .into());
                    }
                    absolute
                }
                None => absolute(&host),
            };
            let resolved: Vec<std::net::SocketAddr> =
                tokio::net::lookup_host((lookup.as_str(), 0)).await?.collect();
            let mut refusals = Vec::new();
            let allowed: Vec<std::net::SocketAddr> = resolved
                .into_iter()
                .filter(|a| match policy.check_address(a.ip(), purpose) {
                    Ok(()) => true,
                    Err(why) => {
                        refusals.push(why);
                        false
                    }
                })
                .collect();
            if allowed.is_empty() {
                let why = refusals.first().cloned().unwrap_or_else(|| "no address".into());
                return Err(format!("{host} resolves to no address {} may reach: {why}", purpose.what).into());
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// `name.namespace`, which a pod's resolver reads as a Service (the first place its search path finds
/// it): judged as one, so that an ExternalName Service is not followed that way either. A public domain of
/// two labels is written absolute (`acme.dev.`).
fn service_in_a_namespace(policy: &Policy, host: &str) -> Option<(ServiceName, String)> {
    let (name, namespace) = host.split_once('.')?;
    if namespace.contains('.') || namespace.is_empty() {
        return None;
    }
    policy.service(&format!("{name}.{namespace}.svc"))
}

/// The name to look up for `host`, which is not a Service's: a name with a dot as absolute, so that the
/// resolver's search path never tries it inside the cluster first (`audit.acme.dev` would be tried as
/// `audit.acme.dev.svc.cluster.local`: a pod `audit` under Service `acme` in a namespace called `dev`,
/// which its tenant controls). A single label (`localhost`) stays as it is: only the hosts file and the
/// operator's own namespace answer for it first.
fn absolute(host: &str) -> String {
    if host.contains('.') && !host.ends_with('.') { format!("{host}.") } else { host.to_string() }
}

/// Whether Services are ExternalName ones, read from the API server and remembered for a short while.
#[derive(Clone)]
struct ServiceKinds {
    client: Client,
    /// (namespace, name) -> (is an ExternalName, when it was read).
    seen: Arc<std::sync::Mutex<KindsSeen>>,
}

type KindsSeen = lru::LruCache<(String, String), (bool, std::time::Instant)>;

/// How long a Service's kind is remembered, and how many are.
const SERVICE_KIND_TTL: Duration = Duration::from_secs(30);
const SERVICE_KINDS_KEPT: std::num::NonZeroUsize = match std::num::NonZeroUsize::new(1024) {
    Some(n) => n,
    None => std::num::NonZeroUsize::MIN,
};

impl ServiceKinds {
    fn new(client: Client) -> Self {
        Self { client, seen: Arc::new(std::sync::Mutex::new(lru::LruCache::new(SERVICE_KINDS_KEPT))) }
    }

    async fn is_external_name(&self, service: &ServiceName) -> Result<bool, kube::Error> {
        let key = (service.namespace.clone(), service.name.clone());
        let cached = self.seen.lock().ok().and_then(|mut seen| seen.get(&key).copied());
        if let Some((external, at)) = cached
            && at.elapsed() < SERVICE_KIND_TTL
        {
            return Ok(external);
        }
        let api: Api<k8s_openapi::api::core::v1::Service> =
            Api::namespaced(self.client.clone(), &service.namespace);
        let external = api
            .get_opt(&service.name)
            .await?
            .and_then(|s| s.spec)
            .and_then(|s| s.type_)
            .is_some_and(|t| t == "ExternalName");
        if let Ok(mut seen) = self.seen.lock() {
            seen.put(key, (external, std::time::Instant::now()));
        }
        Ok(external)
    }
}

/// An error with its causes, for people: reqwest's own message leaves out why a connection failed.
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let next = cause.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_never_connected_to() {
        // The system resolver, for real: "localhost" is loopback on every machine.
        let guarded = |p: Policy| GuardedResolver::new(Arc::new(p), None, Purpose::HEALTH_CHECKS);
        let resolver = guarded(Policy::default());
        let refused = resolver.resolve("localhost".parse::<Name>().unwrap()).await.err().unwrap();
        assert!(refused.to_string().contains("loopback"), "{refused}");
        // Analysis queries are refused alike, naming their own flag.
        let analysis = GuardedResolver::new(Arc::new(Policy::default()), None, Purpose::ANALYSIS);
        let refused = analysis.resolve("localhost".parse::<Name>().unwrap()).await.err().unwrap().to_string();
        assert!(refused.contains("analysis queries") && refused.contains("--analysis-allow"), "{refused}");
        // Allowing a name lets URLs name it; where it leads is still checked.
        let named = Policy { allowed: vec!["localhost".parse().unwrap()], ..Default::default() };
        let resolver = guarded(named);
        assert!(resolver.resolve("localhost".parse::<Name>().unwrap()).await.is_err());
        let reachable = Policy {
            allowed: vec!["localhost".parse().unwrap(), "127.0.0.0/8".parse().unwrap()],
            ..Default::default()
        };
        let resolver = guarded(reachable);
        assert!(resolver.resolve("localhost".parse::<Name>().unwrap()).await.is_ok());
    }

    #[test]
    fn a_dotted_name_is_a_service_in_a_namespace_or_looked_up_outside_the_search_path() {
        assert_eq!(absolute("audit.acme.dev"), "audit.acme.dev.");
        assert_eq!(absolute("acme.dev."), "acme.dev.");
        assert_eq!(absolute("localhost"), "localhost");
        let policy = Policy::default();
        let (service, lookup) = service_in_a_namespace(&policy, "prometheus.monitoring").unwrap();
        assert_eq!((service.name.as_str(), service.namespace.as_str()), ("prometheus", "monitoring"));
        assert_eq!(lookup, "prometheus.monitoring.svc.cluster.local.");
        for not_a_service in ["acme.dev.", "audit.acme.dev", "localhost", "a..b", ".dev"] {
            assert!(service_in_a_namespace(&policy, not_a_service).is_none(), "{not_a_service}");
        }
    }
}
