//! The targets, as the controller sees and changes them: cached facts from the reflector stores, the
//! idempotent image patches of a batch and of a rollback, and the optional HTTP checks.

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::{StreamExt, stream};
use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment, StatefulSet},
    core::v1::Namespace,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
    runtime::reflector::{ObjectRef, Store},
};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use tracing::{debug, info};

use crate::{
    api::{FIELD_MANAGER, PlannedTarget, TargetKind},
    core::http_check::Policy,
    core::rollout::TargetState,
    core::workload::{self, Cached, WorkloadFacts},
    error::{Error, Result, denial, is_not_found},
    runtime::failpoint,
    runtime::metrics::Metrics,
};

/// How many target patches of one batch are in flight at once.
const PATCH_CONCURRENCY: usize = 16;
const HTTP_CONCURRENCY: usize = 16;
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest one step's probes take together (a reconcile has 60 s in all).
const PROBE_BUDGET: Duration = Duration::from_secs(15);

/// The reflector caches the controller reads targets from.
#[derive(Clone)]
pub struct Stores {
    pub deployments: Store<Cached<Deployment>>,
    pub statefulsets: Store<Cached<StatefulSet>>,
    pub daemonsets: Store<Cached<DaemonSet>>,
    pub namespaces: Store<Namespace>,
    ready: tokio::sync::watch::Receiver<bool>,
}

impl Stores {
    /// Wraps the stores; they count as ready once each has been filled by its first list.
    pub fn new(
        deployments: Store<Cached<Deployment>>,
        statefulsets: Store<Cached<StatefulSet>>,
        daemonsets: Store<Cached<DaemonSet>>,
        namespaces: Store<Namespace>,
    ) -> Self {
        let (tx, ready) = tokio::sync::watch::channel(false);
        let (d, s, ds, n) =
            (deployments.clone(), statefulsets.clone(), daemonsets.clone(), namespaces.clone());
        // One waiter only: Store::wait_until_ready wakes just the last of several concurrent waiters, so
        // reconciles wait on this watch channel instead.
        tokio::spawn(async move {
            let _ = futures::future::join4(
                d.wait_until_ready(),
                s.wait_until_ready(),
                ds.wait_until_ready(),
                n.wait_until_ready(),
            )
            .await;
            let _ = tx.send(true);
        });
        Self { deployments, statefulsets, daemonsets, namespaces, ready }
    }

    /// Resolves once every cache has been filled by its first list.
    pub async fn wait_until_ready(&self) {
        let mut ready = self.ready.clone();
        let _ = ready.wait_for(|r| *r).await;
    }

    /// A target's facts from the cache.
    pub fn facts(&self, kind: TargetKind, namespace: &str, name: &str) -> Option<WorkloadFacts> {
        fn get<K>(store: &Store<Cached<K>>, namespace: &str, name: &str) -> Option<WorkloadFacts>
        where
            K: kube::Resource<DynamicType = ()> + Clone,
        {
            store.get(&ObjectRef::new(name).within(namespace)).map(|c| c.facts.clone())
        }
        match kind {
            TargetKind::Deployment => get(&self.deployments, namespace, name),
            TargetKind::StatefulSet => get(&self.statefulsets, namespace, name),
            TargetKind::DaemonSet => get(&self.daemonsets, namespace, name),
            // Node targets are not workloads; controller::nodes reads them.
            TargetKind::Node => None,
        }
    }

    /// The keys (`namespace/name`) of the cached workloads of a kind that `keep` accepts.
    pub fn keys_where(&self, kind: TargetKind, keep: impl Fn(&WorkloadFacts) -> bool) -> Vec<String> {
        fn keys<K>(store: &Store<Cached<K>>, keep: impl Fn(&WorkloadFacts) -> bool) -> Vec<String>
        where
            K: kube::Resource<DynamicType = ()> + Clone,
        {
            store.state().iter().filter(|c| keep(&c.facts)).map(|c| c.facts.key()).collect()
        }
        match kind {
            TargetKind::Deployment => keys(&self.deployments, keep),
            TargetKind::StatefulSet => keys(&self.statefulsets, keep),
            TargetKind::DaemonSet => keys(&self.daemonsets, keep),
            TargetKind::Node => Vec::new(),
        }
    }

    /// What the state machine needs of a target.
    pub fn state(&self, kind: TargetKind, container: Option<&str>, t: &PlannedTarget) -> Option<TargetState> {
        let facts = self.facts(kind, &t.namespace, &t.name)?;
        Some(TargetState {
            image: facts.container_image(container).map(|(_, i)| i.to_string()).map_err(|e| e.to_string()),
            applied: facts.applied.clone(),
            readiness: facts.readiness(),
            http: None,
        })
    }
}

/// What happened to the targets of one patch round.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub changed: u32,
    /// Already carried the key: not changed again.
    pub unchanged: u32,
    /// Gone, or without the container.
    pub skipped: u32,
    /// Refused by the API server, with its message.
    pub denied: Vec<(PlannedTarget, String)>,
}

/// One image change to make.
pub struct Change<'a> {
    pub kind: TargetKind,
    pub container: Option<&'a str>,
    pub key: &'a str,
    pub rollout: &'a str,
    pub between: &'static str,
}

/// Applies `image_of(target)` to each target that does not carry `change.key` yet, with server-side apply.
/// Safe to repeat: a target that already has the key is skipped, and re-sending the same apply is a no-op.
pub async fn patch_all(
    client: &Client,
    stores: &Stores,
    metrics: &Metrics,
    change: &Change<'_>,
    targets: &[PlannedTarget],
    image_of: impl Fn(&PlannedTarget) -> String,
) -> Result<Outcome> {
    // Owned items: a stream of borrowed ones trips the compiler's higher-ranked lifetime checks.
    let work: Vec<(usize, PlannedTarget, String)> =
        targets.iter().enumerate().map(|(i, t)| (i, t.clone(), image_of(t))).collect();
    let results: Vec<(PlannedTarget, Result<PatchResult>)> = stream::iter(work)
        .map(|(i, t, image)| async move {
            if i > 0 {
                failpoint::hit(change.between).await;
            }
            let result = patch_one(client, stores, metrics, change, &t, &image).await;
            (t, result)
        })
        .buffered(PATCH_CONCURRENCY)
        .collect()
        .await;
    let mut outcome = Outcome::default();
    for (t, r) in results {
        match r? {
            PatchResult::Changed => outcome.changed += 1,
            PatchResult::Unchanged => outcome.unchanged += 1,
            PatchResult::Skipped => outcome.skipped += 1,
            PatchResult::Denied(message) => outcome.denied.push((t, message)),
        }
    }
    Ok(outcome)
}

enum PatchResult {
    Changed,
    Unchanged,
    Skipped,
    Denied(String),
}

async fn patch_one(
    client: &Client,
    stores: &Stores,
    metrics: &Metrics,
    change: &Change<'_>,
    t: &PlannedTarget,
    image: &str,
) -> Result<PatchResult> {
    let facts = match stores.facts(change.kind, &t.namespace, &t.name) {
        Some(f) => Some(f),
        // Not in the cache (yet): ask the API server, so a fresh target is not mistaken for a gone one.
        None => live_facts(client, change.kind, t).await?,
    };
    let Some(facts) = facts else {
        info!(target = %format!("{}/{}", t.namespace, t.name), "target is gone; skipped");
        return Ok(PatchResult::Skipped);
    };
    let container = match facts.container_image(change.container) {
        Ok((name, current)) => {
            if facts.applied.as_deref() == Some(change.key) && current == image {
                return Ok(PatchResult::Unchanged);
            }
            name.to_string()
        }
        Err(e) => {
            info!(error = %e, "target has no such container; skipped");
            return Ok(PatchResult::Skipped);
        }
    };
    let body = workload::image_patch(
        change.kind,
        &t.namespace,
        &t.name,
        &container,
        image,
        change.key,
        change.rollout,
    );
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let patch = Patch::Apply(&body);
    let result = match change.kind {
        TargetKind::Deployment => Api::<Deployment>::namespaced(client.clone(), &t.namespace)
            .patch(&t.name, &params, &patch)
            .await
            .map(|_| ()),
        TargetKind::StatefulSet => Api::<StatefulSet>::namespaced(client.clone(), &t.namespace)
            .patch(&t.name, &params, &patch)
            .await
            .map(|_| ()),
        TargetKind::DaemonSet => Api::<DaemonSet>::namespaced(client.clone(), &t.namespace)
            .patch(&t.name, &params, &patch)
            .await
            .map(|_| ()),
        TargetKind::Node => return Ok(PatchResult::Skipped),
    };
    metrics.target_patches.inc();
    match result {
        Ok(()) => {
            debug!(target = %format!("{}/{}", t.namespace, t.name), %image, key = change.key, "patched");
            Ok(PatchResult::Changed)
        }
        Err(e) if is_not_found(&e) => Ok(PatchResult::Skipped),
        Err(e) => match denial(&e) {
            Some(message) => {
                info!(target = %format!("{}/{}", t.namespace, t.name), %message, "change denied");
                Ok(PatchResult::Denied(message))
            }
            None => Err(Error::Kube(e)),
        },
    }
}

/// A target's facts read from the API server.
pub async fn live_facts(
    client: &Client,
    kind: TargetKind,
    t: &PlannedTarget,
) -> Result<Option<WorkloadFacts>> {
    let facts = match kind {
        TargetKind::Deployment => Api::<Deployment>::namespaced(client.clone(), &t.namespace)
            .get_opt(&t.name)
            .await?
            .map(|d| workload::deployment_facts(&d)),
        TargetKind::StatefulSet => Api::<StatefulSet>::namespaced(client.clone(), &t.namespace)
            .get_opt(&t.name)
            .await?
            .map(|s| workload::statefulset_facts(&s)),
        TargetKind::DaemonSet => Api::<DaemonSet>::namespaced(client.clone(), &t.namespace)
            .get_opt(&t.name)
            .await?
            .map(|d| workload::daemonset_facts(&d)),
        TargetKind::Node => None,
    };
    Ok(facts)
}

/// Runs the HTTP check against each target, like a kubelet probe (TLS certificates are not verified: the
/// host is the target's own), within the operator's rules for where checks may go (see
/// [`crate::core::http_check`]): every address a name resolves to is checked, literal addresses too, and
/// redirects are not followed.
#[derive(Clone)]
pub struct Prober {
    http: reqwest::Client,
    policy: Arc<Policy>,
}

impl Prober {
    /// A prober under `policy`; `services` reads the targets' Services (to refuse ExternalName ones). Err:
    /// the HTTP client cannot be built, and no check may run without these rules.
    pub fn new(policy: Policy, services: Option<Client>) -> Result<Self, String> {
        let policy = Arc::new(policy);
        let resolver = GuardedResolver { policy: policy.clone(), services: services.map(ServiceKinds::new) };
        let http = reqwest::Client::builder()
            .timeout(HTTP_TIMEOUT)
            .danger_accept_invalid_certs(true)
            .redirect(reqwest::redirect::Policy::none())
            // A proxy would resolve the name itself, past every rule here.
            .no_proxy()
            .dns_resolver(Arc::new(resolver))
            .build()
            .map_err(|e| format!("cannot build the health-check client: {e}"))?;
        Ok(Self { http, policy })
    }

    /// The rules it probes by.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// GETs each target's URL; the answer is keyed like the input. Only the status code is read: a
    /// failure never echoes what the endpoint answered.
    pub async fn check_all(
        &self,
        expect: u16,
        checks: Vec<((String, String), String)>,
    ) -> HashMap<(String, String), Result<(), String>> {
        // However slow the endpoints (a tarpit), one step's probes end within this time: targets not
        // answered by then count as not probed yet, and fail at the health timeout.
        let budget = tokio::time::sleep(PROBE_BUDGET);
        stream::iter(checks)
            .map(|(key, url)| async move {
                let result = match self.refusal(&url) {
                    Some(why) => Err(format!("GET {url} refused: {why}")),
                    None => match self.http.get(&url).send().await {
                        Ok(r) if r.status().as_u16() == expect => Ok(()),
                        Ok(r) => {
                            Err(format!("GET {url} returned {}, expected {expect}", r.status().as_u16()))
                        }
                        Err(e) => Err(format!("GET {url} failed: {}", chain(&e))),
                    },
                };
                (key, result)
            })
            .buffer_unordered(HTTP_CONCURRENCY)
            .take_until(budget)
            .collect()
            .await
    }

    /// Why a URL (placeholders substituted) may not be fetched: user information, or a literal address
    /// the policy refuses (names are judged by the resolver, on every address they resolve to).
    fn refusal(&self, url: &str) -> Option<String> {
        let parsed = match reqwest::Url::parse(url) {
            Ok(u) => u,
            Err(e) => return Some(format!("not a URL: {e}")),
        };
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Some("user information in the URL".into());
        }
        match parsed.host() {
            Some(url::Host::Ipv4(ip)) => self.policy.check_address(ip.into()).err(),
            Some(url::Host::Ipv6(ip)) => self.policy.check_address(ip.into()).err(),
            Some(url::Host::Domain(_)) => None,
            None => Some("no host".into()),
        }
    }
}

/// Resolves names for the prober: a target's Service by its absolute name in the cluster domain (never
/// an ExternalName Service, which points wherever its author likes), and drops every address the policy
/// refuses, so that no name is ever connected to loopback, the metadata service or the API server.
struct GuardedResolver {
    policy: Arc<Policy>,
    services: Option<ServiceKinds>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        let services = self.services.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let lookup = match policy.service(&host) {
                Some((service, absolute)) => {
                    if let Some(services) = &services
                        && services.is_external_name(&service).await?
                    {
                        return Err(format!(
                            "Service {}/{} is an ExternalName Service: health checks do not follow it",
                            service.namespace, service.name
                        )
                        .into());
                    }
                    absolute
                }
                None => host.clone(),
            };
            let resolved: Vec<std::net::SocketAddr> =
                tokio::net::lookup_host((lookup.as_str(), 0)).await?.collect();
            let mut refusals = Vec::new();
            let allowed: Vec<std::net::SocketAddr> = resolved
                .into_iter()
                .filter(|a| match policy.check_address(a.ip()) {
                    Ok(()) => true,
                    Err(why) => {
                        refusals.push(why);
                        false
                    }
                })
                .collect();
            if allowed.is_empty() {
                let why = refusals.first().cloned().unwrap_or_else(|| "no address".into());
                return Err(format!("{host} resolves to no address a health check may reach: {why}").into());
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
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

    async fn is_external_name(
        &self,
        service: &crate::core::http_check::ServiceName,
    ) -> Result<bool, kube::Error> {
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
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
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
        let resolver = GuardedResolver { policy: Arc::new(Policy::default()), services: None };
        let refused = resolver.resolve("localhost".parse::<Name>().unwrap()).await.err().unwrap();
        assert!(refused.to_string().contains("loopback"), "{refused}");
        // Allowing a name lets URLs name it; where it leads is still checked.
        let named = Policy { allowed: vec!["localhost".parse().unwrap()], ..Default::default() };
        let resolver = GuardedResolver { policy: Arc::new(named), services: None };
        assert!(resolver.resolve("localhost".parse::<Name>().unwrap()).await.is_err());
        let reachable = Policy {
            allowed: vec!["localhost".parse().unwrap(), "127.0.0.0/8".parse().unwrap()],
            ..Default::default()
        };
        let resolver = GuardedResolver { policy: Arc::new(reachable), services: None };
        assert!(resolver.resolve("localhost".parse::<Name>().unwrap()).await.is_ok());
    }

    #[tokio::test]
    async fn literal_addresses_and_user_information_are_refused_before_any_request() {
        let prober = Prober::new(Policy::default(), None).unwrap();
        let key = ("ns".to_string(), "web".to_string());
        for url in ["http://127.0.0.1:1/x", "http://[::ffff:169.254.169.254]/", "http://user:pw@10.1.2.3/"] {
            let result = prober.check_all(200, vec![(key.clone(), url.to_string())]).await;
            let message = result[&key].clone().unwrap_err();
            assert!(message.contains("refused"), "{url}: {message}");
        }
    }
}
