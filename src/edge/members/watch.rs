//! Watch caches of member clusters' workloads, so that a rollout across members is woken by its targets'
//! changes (as it is in its own cluster) instead of polling them. One watch per member and kind, started
//! the first time a rollout looks at that member, holding only each workload's facts (a few hundred bytes
//! each). A watch that fails (the member is down, or refuses a rotated credential) starts again with a
//! client built from the member's Secret read anew; until its first list is complete, its cache is not
//! used and targets are read live.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ListParams, WatchEvent, WatchParams},
    runtime::reflector::{ObjectRef, Store},
};
use serde::de::DeserializeOwned;
use tracing::{debug, info};

use super::{self as members, MemberError, Members};

use crate::{
    api::{FleetRollout, ROLLOUT_ANNOTATION, TargetKind, target_key},
    core::{
        clusters,
        workload::{self, WorkloadFacts},
    },
    edge::lists,
    error::{Error, Result},
};

/// How long a failed watch waits before it starts again (a member that is down is not hammered), doubled
/// after each failure in a row up to [`RESTART_AT_MOST_AFTER`].
const RESTART_AFTER: Duration = Duration::from_secs(2);
const RESTART_AT_MOST_AFTER: Duration = Duration::from_secs(60);
/// The least time between two watches of one member and kind, however soon the member ends them.
const RENEW_AT_MOST_EVERY: Duration = Duration::from_secs(1);

/// The facts of one member's workloads of one kind, by `namespace/name`, weighing at most
/// [`lists::MAX_FACTS_BYTES`].
#[derive(Default)]
pub struct Cache {
    facts: RwLock<Facts>,
    ready: AtomicBool,
}

#[derive(Default)]
struct Facts {
    all: HashMap<String, WorkloadFacts>,
    weight: usize,
}

impl Cache {
    /// A workload's facts; None when it does not exist (only meaningful once [`Cache::ready`]).
    pub fn get(&self, namespace: &str, name: &str) -> Option<WorkloadFacts> {
        self.facts.read().ok()?.all.get(&target_key(namespace, name)).cloned()
    }

    /// Whether the first list is complete, so that a workload missing here does not exist.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    fn replace(&self, all: HashMap<String, WorkloadFacts>, weight: usize) {
        if let Ok(mut facts) = self.facts.write() {
            *facts = Facts { all, weight };
        }
        self.ready.store(true, Ordering::Release);
    }

    /// Not to be trusted until the next complete list: the watch failed, or lists again.
    fn stale(&self) {
        self.ready.store(false, Ordering::Release);
    }

    /// Whether a decision reads the workload otherwise than before (new, or changed but for its
    /// resourceVersion); Err: the cache would weigh more than it may.
    fn apply(&self, facts: WorkloadFacts) -> Result<bool> {
        let Ok(mut held) = self.facts.write() else { return Ok(false) };
        let known = held.all.get(&facts.key());
        let changed = known.is_none_or(|known| !known.decides_as(&facts));
        let before = known.map_or(0, WorkloadFacts::weight);
        let weight = held.weight - before + facts.weight();
        if weight > lists::MAX_FACTS_BYTES {
            return Err(lists::too_heavy("in one member's cache"));
        }
        held.weight = weight;
        held.all.insert(facts.key(), facts);
        Ok(changed)
    }

    fn delete(&self, key: &str) {
        if let Ok(mut held) = self.facts.write()
            && let Some(gone) = held.all.remove(key)
        {
            held.weight -= gone.weight();
        }
    }
}

/// Where a member's workload changes go: a wake of the rollout a workload's `fleetroll.dev/rollout`
/// annotation names, when that rollout exists and reads member workloads of the workload's kind
/// ([`clusters::reads_member_workloads`]).
#[derive(Clone)]
pub struct MemberWakes {
    send: UnboundedSender<ObjectRef<FleetRollout>>,
    rollouts: Store<FleetRollout>,
}

impl MemberWakes {
    pub fn new(send: UnboundedSender<ObjectRef<FleetRollout>>, rollouts: Store<FleetRollout>) -> Self {
        Self { send, rollouts }
    }

    fn wake(&self, rollout: ObjectRef<FleetRollout>, cluster: &str, kind: TargetKind) {
        let concerned = self
            .rollouts
            .get(&rollout)
            .is_some_and(|fr| clusters::reads_member_workloads(&fr, cluster, kind));
        if concerned {
            let _ = self.send.unbounded_send(rollout);
        }
    }
}

/// Where one member's watch of one kind sends its wakes.
#[derive(Clone, Copy)]
struct Wake<'a> {
    to: &'a MemberWakes,
    cluster: &'a str,
    kind: TargetKind,
}

/// The watches of every member looked at so far.
#[derive(Clone)]
pub struct MemberWatches {
    members: Members,
    wake: MemberWakes,
    caches: Arc<Mutex<Caches>>,
}

/// The cache of each (member, kind) watched.
type Caches = HashMap<(String, TargetKind), Arc<Cache>>;

impl MemberWatches {
    pub fn new(members: Members, wake: MemberWakes) -> Self {
        Self { members, wake, caches: Default::default() }
    }

    /// The member clusters (and their clients) the watches use.
    pub fn members(&self) -> &Members {
        &self.members
    }

    /// The cache of `cluster`'s workloads of `kind`, its watch started if it was not yet. None for a kind
    /// that is not a workload.
    pub fn cache(&self, cluster: &str, kind: TargetKind) -> Option<Arc<Cache>> {
        let key = (cluster.to_string(), kind);
        let mut caches = self.caches.lock().ok()?;
        if let Some(c) = caches.get(&key) {
            return Some(c.clone());
        }
        let cache = Arc::new(Cache::default());
        let watch = Watch {
            members: self.members.clone(),
            key: key.clone(),
            cache: cache.clone(),
            caches: self.caches.clone(),
            wake: self.wake.clone(),
        };
        match kind {
            TargetKind::Deployment => tokio::spawn(watch.run::<Deployment>(workload::deployment_facts)),
            TargetKind::StatefulSet => tokio::spawn(watch.run::<StatefulSet>(workload::statefulset_facts)),
            TargetKind::DaemonSet => tokio::spawn(watch.run::<DaemonSet>(workload::daemonset_facts)),
            TargetKind::Node => return None,
        };
        caches.insert(key, cache.clone());
        Some(cache)
    }
}

/// One member's watch of one kind, and where its cache is kept.
struct Watch {
    members: Members,
    key: (String, TargetKind),
    cache: Arc<Cache>,
    caches: Arc<Mutex<Caches>>,
    wake: MemberWakes,
}

impl Watch {
    /// Keeps the cache filled from a list and then a watch of the member's workloads of kind `K` while the
    /// member exists: once no Secret names it any more, the watch ends and its cache is dropped (the next
    /// rollout that looks at that member starts another).
    async fn run<K>(self, facts: fn(&K) -> WorkloadFacts)
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    {
        let cluster = self.key.0.as_str();
        let mut wait = RESTART_AFTER;
        loop {
            match self.members.current(cluster).await {
                Ok((client, version)) => {
                    let e = self.list_and_watch(&client, &version, facts).await;
                    // A watch that listed and ran until now starts again soon; one that keeps failing, later.
                    wait = if self.cache.ready() {
                        RESTART_AFTER
                    } else {
                        (wait * 2).min(RESTART_AT_MOST_AFTER)
                    };
                    self.cache.stale();
                    if matches!(&e, Error::Kube(k) if members::is_unauthorized(k)) {
                        self.members.forget(cluster);
                    }
                    let error = match &e {
                        Error::Kube(k) => members::describe(k),
                        other => other.to_string(),
                    };
                    info!(cluster, kind = %K::kind(&()), error, "member watch failed; starting again");
                }
                Err(MemberError::NotFound { .. }) => {
                    info!(cluster, kind = %K::kind(&()), "no Secret names this member any more; its watch ends");
                    self.retire();
                    return;
                }
                Err(e) => {
                    debug!(cluster, error = %e, "no client for the member watch yet");
                    wait = (wait * 2).min(RESTART_AT_MOST_AFTER);
                }
            }
            tokio::time::sleep(wait).await;
        }
    }

    /// Lists the workloads into the cache (page by page and item by item, as every list of a member is
    /// read), then follows their changes from that list's version, each event bounded as one object, until
    /// something fails, or the member's Secret is no longer `secret` (it may point at another cluster
    /// now): its error. kube's own watcher is not used, as it decodes a whole page of a list at once.
    async fn list_and_watch<K>(
        &self,
        client: &Client,
        secret: &members::SecretVersion,
        facts: fn(&K) -> WorkloadFacts,
    ) -> Error
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        let (mut listing, mut weight) = (HashMap::new(), 0);
        let listed = lists::each(client, None, &ListParams::default(), |k: K| {
            let f = facts(&k);
            weight += f.weight();
            if weight > lists::MAX_FACTS_BYTES {
                return Err(lists::too_heavy("in one member's cache"));
            }
            listing.insert(f.key(), f);
            Ok(())
        })
        .await;
        // Watching from no version would replay every object as new, and miss the deletions in between.
        let mut version = match listed {
            Ok(Some(version)) => version,
            Ok(None) => {
                let missing = "the member's list has no resourceVersion to watch from";
                return kube::Error::Service(missing.into()).into();
            }
            Err(e) => return e,
        };
        self.cache.replace(listing, weight);
        let api = Api::<K>::all(client.clone());
        // The server ends each watch within the member client's read timeout (15 s), so an idle watch is
        // renewed from its last version, never timed out.
        let params = WatchParams::default().timeout(10);
        loop {
            let started = tokio::time::Instant::now();
            if let Some(changed) = self.secret_changed(secret).await {
                return changed;
            }
            let events = match api.watch(&params, &version).await {
                Ok(events) => events,
                Err(e) => return e.into(),
            };
            let fleet_namespace = self.members.fleet_namespace();
            let wake = Wake { to: &self.wake, cluster: &self.key.0, kind: self.key.1 };
            match follow(events, &self.cache, wake, fleet_namespace, facts).await {
                Ok(Some(latest)) => version = latest,
                // A watch the member ends at once, with nothing in it, is not asked again at once.
                Ok(None) => tokio::time::sleep_until(started + RENEW_AT_MOST_EVERY).await,
                // 410 Gone included: the version is too old to watch from, and the next list starts afresh.
                Err(e) => return e,
            }
        }
    }

    /// Why the watch must start again with another client, if the member's Secret is not `secret` any
    /// more (changed, gone, or refused now). A hub that cannot say for now ends nothing: every member's
    /// cache would be dropped and listed again at each hub hiccup.
    async fn secret_changed(&self, secret: &members::SecretVersion) -> Option<Error> {
        match self.members.current(&self.key.0).await {
            Ok((_, now)) if &now == secret => None,
            Err(MemberError::Hub(e)) => {
                debug!(cluster = %self.key.0, error = %e, "member Secret not looked at: the hub did not answer");
                None
            }
            Ok(_) => Some(Error::Config("the member's Secret changed".into())),
            Err(e) => Some(Error::Config(e.to_string())),
        }
    }

    /// Drops this watch's cache from the map, unless another took its place.
    fn retire(&self) {
        self.cache.stale();
        let mut caches = self.caches.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if caches.get(&self.key).is_some_and(|c| Arc::ptr_eq(c, &self.cache)) {
            caches.remove(&self.key);
        }
    }
}

/// Applies a watch's events to `cache` until the watch ends (the latest version seen, if any) or fails.
async fn follow<K>(
    events: impl futures::Stream<Item = Result<WatchEvent<K>, kube::Error>>,
    cache: &Cache,
    wake: Wake<'_>,
    fleet_namespace: &str,
    facts: fn(&K) -> WorkloadFacts,
) -> Result<Option<String>>
where
    K: Resource<DynamicType = ()>,
{
    // Anyone who may write a workload in a member may write this annotation: it wakes only rollouts that
    // read members' workloads of this kind (of the fleet namespace, across members), and only when a
    // decision reads the workload otherwise (a change of an annotation or a resourceVersion alone wakes
    // nothing).
    let wake_for = |obj: &K| {
        let named = obj.annotations().get(ROLLOUT_ANNOTATION).and_then(|r| r.split_once('/'));
        if let Some((ns, name)) = named.filter(|(ns, _)| *ns == fleet_namespace) {
            wake.to.wake(ObjectRef::new(name).within(ns), wake.cluster, wake.kind);
        }
    };
    let mut version = None;
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        let (seen, wakes) = match event? {
            WatchEvent::Added(obj) | WatchEvent::Modified(obj) => {
                let changed = cache.apply(facts(&obj))?;
                (obj, changed)
            }
            WatchEvent::Deleted(obj) => {
                cache.delete(&target_key(&obj.namespace().unwrap_or_default(), &obj.name_any()));
                (obj, true)
            }
            WatchEvent::Bookmark(b) => {
                if !b.metadata.resource_version.is_empty() {
                    version = Some(lists::bounded(b.metadata.resource_version)?);
                }
                continue;
            }
            WatchEvent::Error(status) => return Err(kube::Error::Api(status).into()),
        };
        if wakes {
            wake_for(&seen);
        }
        version =
            seen.resource_version().filter(|v| !v.is_empty()).map(lists::bounded).transpose()?.or(version);
    }
    Ok(version)
}

#[cfg(test)]
mod tests;
