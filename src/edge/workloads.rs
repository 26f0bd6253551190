//! Workload targets, as the controller sees and changes them: cached facts from the reflector stores, and
//! the idempotent image patches of a batch and of a rollback.

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
use tracing::{debug, info};

use crate::{
    api::{FIELD_MANAGER, PlannedTarget, TargetKind},
    core::{
        count,
        rollout::{Carrier, HeldBy, TargetState},
        workload::{self, WorkloadFacts},
    },
    edge::cached::Cached,
    error::{Error, Result, denial, is_conflict, is_not_found},
    failpoint,
    metrics::Metrics,
};

/// How many target patches of one batch are in flight at once.
const PATCH_CONCURRENCY: usize = 16;

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
            // Node targets are not workloads; edge::nodes reads them.
            TargetKind::Node => None,
        }
    }

    /// What `pick` makes of each cached workload of a kind, where it makes anything.
    fn filter_map<T>(&self, kind: TargetKind, pick: impl Fn(&WorkloadFacts) -> Option<T>) -> Vec<T> {
        fn scan<K, T>(store: &Store<Cached<K>>, pick: impl Fn(&WorkloadFacts) -> Option<T>) -> Vec<T>
        where
            K: kube::Resource<DynamicType = ()> + Clone,
        {
            store.state().iter().filter_map(|c| pick(&c.facts)).collect()
        }
        match kind {
            TargetKind::Deployment => scan(&self.deployments, pick),
            TargetKind::StatefulSet => scan(&self.statefulsets, pick),
            TargetKind::DaemonSet => scan(&self.daemonsets, pick),
            TargetKind::Node => Vec::new(),
        }
    }

    /// The keys (`namespace/name`) of the cached workloads of a kind that `keep` accepts.
    pub fn keys_where(&self, kind: TargetKind, keep: impl Fn(&WorkloadFacts) -> bool) -> Vec<String> {
        self.filter_map(kind, |f| keep(f).then(|| f.key()))
    }

    /// The cached workloads of a kind whose `fleetroll.dev/applied` key starts with `prefix`, with the image
    /// of the rolled container.
    pub fn carrying(&self, kind: TargetKind, container: Option<&str>, prefix: &str) -> Vec<Carrier> {
        self.filter_map(kind, |f| {
            f.applied.as_deref().is_some_and(|k| k.starts_with(prefix)).then(|| Carrier {
                namespace: f.namespace.clone(),
                name: f.name.clone(),
                image: rolled_image(f, container),
            })
        })
    }

    /// What the state machine needs of a target.
    pub fn state(&self, kind: TargetKind, container: Option<&str>, t: &PlannedTarget) -> Option<TargetState> {
        Some(state_of(&self.facts(kind, &t.namespace, &t.name)?, container))
    }
}

/// What the state machine needs of a workload.
pub fn state_of(facts: &WorkloadFacts, container: Option<&str>) -> TargetState {
    TargetState {
        image: rolled_image(facts, container),
        applied: facts.applied.clone(),
        readiness: facts.readiness(),
        http: None,
    }
}

/// The image of a workload's rolled container, or why it cannot be told.
fn rolled_image(facts: &WorkloadFacts, container: Option<&str>) -> Result<String, String> {
    facts.container_image(container).map(|(_, i)| i.to_string()).map_err(|e| e.to_string())
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
    /// Not changed: another rollout had changed it first (still running, or since this plan was frozen).
    pub held: Vec<(PlannedTarget, HeldBy)>,
    /// Member clusters that could not be reached (their targets were not all changed), with why.
    pub unreached: std::collections::BTreeMap<String, String>,
}

impl Outcome {
    /// Every target skipped (their workload is gone).
    pub fn skipped(targets: &[PlannedTarget]) -> Self {
        Self { skipped: count(targets.len()), ..Default::default() }
    }

    /// Every target refused, for one reason.
    pub fn denied(targets: &[PlannedTarget], message: &str) -> Self {
        Self {
            denied: targets.iter().map(|t| (t.clone(), message.to_string())).collect(),
            ..Default::default()
        }
    }

    /// Adds what another round (in another cluster or namespace) did.
    pub fn add(&mut self, other: Outcome) {
        self.changed += other.changed;
        self.unchanged += other.unchanged;
        self.skipped += other.skipped;
        self.denied.extend(other.denied);
        self.held.extend(other.held);
        self.unreached.extend(other.unreached);
    }
}

/// A target's facts as a watch cache holds them; None when it holds none (yet).
pub type CachedFacts<'a> = &'a (dyn Fn(&PlannedTarget) -> Option<WorkloadFacts> + Sync);

/// The other rollout that owns a `fleetroll.dev/applied` key (`running`: whether it still runs); None when
/// the key is this rollout's own.
pub type Holder<'a> = &'a (dyn Fn(&str) -> Option<HeldBy> + Sync);

/// One image change to make.
pub struct Change<'a> {
    pub kind: TargetKind,
    pub container: Option<&'a str>,
    pub key: &'a str,
    pub rollout: &'a str,
    pub between: &'static str,
    /// Which other rollout changed a target that carries another key: while that one runs, or when it
    /// changed the target after this plan was frozen, the target is not changed, whatever the plan says.
    pub holder: Holder<'a>,
}

/// How often a change is tried again against a target that changed underneath it (each try reads it anew).
const CONFLICTS_RETRIED: usize = 3;

/// Applies `image_of(target)` to each target that does not carry `change.key` yet, with server-side apply.
/// Safe to repeat: a target that already has the key is skipped, and re-sending the same apply is a no-op.
/// `cached`: a target's facts from the watch cache of the cluster `client` talks to; a target it does not
/// hold is read live, so a fresh target is not mistaken for a gone one. Changes are sent with `writer`
/// (in the rollout's own cluster, its creator impersonated; in a member, the member's credentials).
pub async fn patch_all(
    client: &Client,
    writer: &Client,
    cached: CachedFacts<'_>,
    metrics: &Metrics,
    change: &Change<'_>,
    targets: &[PlannedTarget],
    image_of: impl Fn(&PlannedTarget) -> String,
) -> Result<Outcome> {
    // Owned items: a stream of borrowed ones trips the compiler's higher-ranked lifetime checks.
    let work: Vec<(usize, PlannedTarget, String)> =
        targets.iter().enumerate().map(|(i, t)| (i, t.clone(), image_of(t))).collect();
    // Unordered, so that one slow patch does not hold the slots of those finished after it; the results
    // are put back in the batch's order, so that the first error and the denials read the same every time.
    let mut results: Vec<(usize, PlannedTarget, Result<PatchResult>)> = stream::iter(work)
        .map(|(i, t, image)| async move {
            if i > 0 {
                failpoint::hit(change.between).await;
            }
            let result = patch_one((client, writer), cached, metrics, change, &t, &image).await;
            (i, t, result)
        })
        .buffer_unordered(PATCH_CONCURRENCY)
        .collect()
        .await;
    results.sort_by_key(|(i, ..)| *i);
    let mut outcome = Outcome::default();
    for (_, t, r) in results {
        match r? {
            PatchResult::Changed => outcome.changed += 1,
            PatchResult::Unchanged => outcome.unchanged += 1,
            PatchResult::Skipped => outcome.skipped += 1,
            PatchResult::Denied(message) => outcome.denied.push((t, message)),
            PatchResult::Held(other) => outcome.held.push((t, other)),
        }
    }
    Ok(outcome)
}

enum PatchResult {
    Changed,
    Unchanged,
    Skipped,
    Denied(String),
    Held(HeldBy),
}

/// Changes one target, judged as it is: from the cache first, then, after a conflict, as read anew. The
/// change is sent against the resourceVersion it was judged at, so that a target another rollout changed
/// meanwhile is judged again (held by it, now) rather than changed by both.
async fn patch_one(
    (client, writer): (&Client, &Client),
    cached: CachedFacts<'_>,
    metrics: &Metrics,
    change: &Change<'_>,
    t: &PlannedTarget,
    image: &str,
) -> Result<PatchResult> {
    let mut facts = cached(t);
    for _ in 0..CONFLICTS_RETRIED {
        let seen = match facts.take() {
            Some(f) => Some(f),
            None => live_facts(client, change.kind, t).await?,
        };
        let Some(seen) = seen else {
            info!(target = %t.key(), "target is gone; skipped");
            return Ok(PatchResult::Skipped);
        };
        let body = match judge(change, &seen, image, &t.previous_image) {
            Judged::Done(result) => return Ok(result),
            Judged::Send(body) => body,
        };
        let Some(result) = apply_patch(writer, change.kind, t, &body).await else {
            return Ok(PatchResult::Skipped);
        };
        metrics.target_patches.inc();
        return match result {
            Ok(()) => {
                debug!(target = %t.key(), %image, key = change.key, "patched");
                Ok(PatchResult::Changed)
            }
            Err(e) if is_conflict(&e) => {
                debug!(target = %t.key(), "changed since it was judged; judging it again");
                continue;
            }
            Err(e) if is_not_found(&e) => Ok(PatchResult::Skipped),
            Err(e) => match denial(&e) {
                Some(message) => {
                    info!(target = %t.key(), %message, "change denied");
                    Ok(PatchResult::Denied(message))
                }
                None => Err(Error::Kube(e)),
            },
        };
    }
    Err(Error::Conflict)
}

/// What to do with a target as seen: nothing (it is done, held or cannot be changed), or send this body.
enum Judged {
    Done(PatchResult),
    Send(serde_json::Value),
}

/// `planned`: the image the plan found on the target. Another rollout's change since then means the two
/// rollouts' plans overlapped: the target is that one's, even once it has ended (changing it again would
/// undo a rollout that reported it done).
fn judge(change: &Change<'_>, seen: &WorkloadFacts, image: &str, planned: &str) -> Judged {
    let owner = seen.applied.as_deref().filter(|k| *k != change.key).and_then(change.holder);
    let current = seen.container_image(change.container).ok().map(|(_, i)| i);
    if let Some(owner) = owner.filter(|o| o.running || current.is_some_and(|c| c != planned && c != image)) {
        info!(target = %seen.key(), holder = %owner.rollout, "another rollout changed it first; not changed");
        return Judged::Done(PatchResult::Held(owner));
    }
    match seen.container_image(change.container) {
        Ok((_, current)) if seen.applied.as_deref() == Some(change.key) && current == image => {
            Judged::Done(PatchResult::Unchanged)
        }
        Ok((container, _)) => Judged::Send(workload::image_patch(
            change.kind,
            seen,
            container,
            image,
            change.key,
            change.rollout,
        )),
        Err(e) => {
            info!(error = %e, "target has no such container; skipped");
            Judged::Done(PatchResult::Skipped)
        }
    }
}

/// Sends one server-side apply of `body` to a workload; None for a kind that is not a workload.
async fn apply_patch(
    client: &Client,
    kind: TargetKind,
    t: &PlannedTarget,
    body: &serde_json::Value,
) -> Option<Result<(), kube::Error>> {
    // The answer, the whole object, is read without being decoded into the API's types: nothing of it is
    // needed, and a member could make it cost kilobytes a `{}`.
    async fn apply<K>(client: &Client, t: &PlannedTarget, body: &serde_json::Value) -> Result<(), kube::Error>
    where
        K: kube::Resource<DynamicType = ()>,
    {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let request = kube::core::Request::new(K::url_path(&(), Some(&t.namespace)))
            .patch(&t.name, &params, &Patch::Apply(body))
            .map_err(kube::Error::BuildRequest)?;
        client.request::<serde::de::IgnoredAny>(request).await.map(drop)
    }
    Some(match kind {
        TargetKind::Deployment => apply::<Deployment>(client, t, body).await,
        TargetKind::StatefulSet => apply::<StatefulSet>(client, t, body).await,
        TargetKind::DaemonSet => apply::<DaemonSet>(client, t, body).await,
        TargetKind::Node => return None,
    })
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

#[cfg(test)]
mod tests;
