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
    Api, Resource, ResourceExt,
    runtime::{
        reflector::ObjectRef,
        watcher::{self, Event},
    },
};
use serde::de::DeserializeOwned;
use tracing::{debug, info};

use super::members::{self, MemberError, Members};

use crate::{
    api::{FleetRollout, ROLLOUT_ANNOTATION, TargetKind, target_key},
    core::workload::{self, WorkloadFacts},
};

/// How long a failed watch waits before it starts again (a member that is down is not hammered).
const RESTART_AFTER: Duration = Duration::from_secs(2);

/// The facts of one member's workloads of one kind, by `namespace/name`.
#[derive(Default)]
pub struct Cache {
    facts: RwLock<HashMap<String, WorkloadFacts>>,
    ready: AtomicBool,
}

impl Cache {
    /// A workload's facts; None when it does not exist (only meaningful once [`Cache::ready`]).
    pub fn get(&self, namespace: &str, name: &str) -> Option<WorkloadFacts> {
        self.facts.read().ok()?.get(&target_key(namespace, name)).cloned()
    }

    /// Whether the first list is complete, so that a workload missing here does not exist.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    fn replace(&self, all: HashMap<String, WorkloadFacts>) {
        if let Ok(mut facts) = self.facts.write() {
            *facts = all;
        }
        self.ready.store(true, Ordering::Release);
    }

    /// Not to be trusted until the next complete list: the watch failed, or lists again.
    fn stale(&self) {
        self.ready.store(false, Ordering::Release);
    }

    fn apply(&self, facts: WorkloadFacts) {
        if let Ok(mut all) = self.facts.write() {
            all.insert(facts.key(), facts);
        }
    }

    fn delete(&self, key: &str) {
        if let Ok(mut all) = self.facts.write() {
            all.remove(key);
        }
    }
}

/// The watches of every member looked at so far.
#[derive(Clone)]
pub struct MemberWatches {
    members: Members,
    /// Wakes the rollout named in a changed workload's `fleetroll.dev/rollout` annotation.
    wake: UnboundedSender<ObjectRef<FleetRollout>>,
    caches: Arc<Mutex<Caches>>,
}

/// The cache of each (member, kind) watched.
type Caches = HashMap<(String, TargetKind), Arc<Cache>>;

impl MemberWatches {
    pub fn new(members: Members, wake: UnboundedSender<ObjectRef<FleetRollout>>) -> Self {
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
    wake: UnboundedSender<ObjectRef<FleetRollout>>,
}

impl Watch {
    /// Keeps the cache filled from a watch of the member's workloads of kind `K` while the member exists:
    /// once no Secret names it any more, the watch ends and its cache is dropped (the next rollout that
    /// looks at that member starts another).
    async fn run<K>(self, facts: fn(&K) -> WorkloadFacts)
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    {
        let cluster = self.key.0.as_str();
        loop {
            match self.members.client(cluster).await {
                Ok(client) => {
                    // The server ends each watch within the member client's read timeout (15 s), so an idle
                    // watch is renewed (from its last resourceVersion, no new list), never timed out.
                    let config = watcher::Config::default().any_semantic().timeout(10);
                    let events = watcher::watcher(Api::<K>::all(client), config);
                    let fleet_namespace = self.members.fleet_namespace();
                    let error = follow(events, &self.cache, &self.wake, fleet_namespace, facts).await;
                    self.cache.stale();
                    if let Some(e) = error {
                        if let watcher::Error::InitialListFailed(k) | watcher::Error::WatchStartFailed(k) = &e
                            && members::is_unauthorized(k)
                        {
                            self.members.forget(cluster);
                        }
                        let error = describe(&e);
                        info!(cluster, kind = %K::kind(&()), error, "member watch failed; starting again");
                    }
                }
                Err(MemberError::NotFound { .. }) => {
                    info!(cluster, kind = %K::kind(&()), "no Secret names this member any more; its watch ends");
                    self.retire();
                    return;
                }
                Err(e) => debug!(cluster, error = %e, "no client for the member watch yet"),
            }
            tokio::time::sleep(RESTART_AFTER).await;
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

/// A failed watch in words for the log, cut as a member's errors are everywhere (a member's Status
/// message may be megabytes, and a failed watch is tried again every few seconds).
fn describe(e: &watcher::Error) -> String {
    match e {
        watcher::Error::InitialListFailed(k) => format!("the list failed: {}", members::describe(k)),
        watcher::Error::WatchStartFailed(k) => format!("the watch did not start: {}", members::describe(k)),
        watcher::Error::WatchFailed(k) => format!("the watch failed: {}", members::describe(k)),
        watcher::Error::WatchError(status) => {
            format!("the watch failed: {}", members::describe(&kube::Error::Api(status.clone())))
        }
        watcher::Error::NoResourceVersion => e.to_string(),
    }
}

/// Applies a watch's events to `cache` until the watch fails (its error) or ends (None).
async fn follow<K>(
    events: impl futures::Stream<Item = Result<Event<K>, watcher::Error>>,
    cache: &Cache,
    wake: &UnboundedSender<ObjectRef<FleetRollout>>,
    fleet_namespace: &str,
    facts: fn(&K) -> WorkloadFacts,
) -> Option<watcher::Error>
where
    K: Resource<DynamicType = ()>,
{
    // Anyone who may write a workload in a member may write this annotation: it wakes only rollouts that
    // can reach members (those of the fleet namespace), and a wake is a reconcile that changes nothing
    // unless the facts say so.
    let wake_for = |obj: &K| {
        let named = obj.annotations().get(ROLLOUT_ANNOTATION).and_then(|r| r.split_once('/'));
        if let Some((ns, name)) = named.filter(|(ns, _)| *ns == fleet_namespace) {
            let _ = wake.unbounded_send(ObjectRef::new(name).within(ns));
        }
    };
    let mut listing: HashMap<String, WorkloadFacts> = HashMap::new();
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => {
                listing.clear();
                cache.stale();
            }
            Ok(Event::InitApply(obj)) => {
                let f = facts(&obj);
                listing.insert(f.key(), f);
            }
            Ok(Event::InitDone) => cache.replace(std::mem::take(&mut listing)),
            Ok(Event::Apply(obj)) => {
                cache.apply(facts(&obj));
                wake_for(&obj);
            }
            Ok(Event::Delete(obj)) => {
                cache.delete(&target_key(&obj.namespace().unwrap_or_default(), &obj.name_any()));
                wake_for(&obj);
            }
            Err(e) => return Some(e),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use k8s_openapi::api::apps::v1::Deployment;
    use serde_json::json;

    use super::*;

    fn deployment(ns: &str, name: &str, rollout: &str) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "annotations": {ROLLOUT_ANNOTATION: rollout}},
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn the_watch_of_a_member_no_secret_names_ends_and_drops_its_cache() {
        let (members, _hub) = crate::edge::members::registry_tests::fleet(Vec::new());
        let (wake, _woken) = futures::channel::mpsc::unbounded();
        let watches = MemberWatches::new(members, wake);
        let cache = watches.cache("gone", TargetKind::Deployment).unwrap();
        let key = ("gone".to_string(), TargetKind::Deployment);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while watches.caches.lock().unwrap().contains_key(&key) {
            assert!(tokio::time::Instant::now() < deadline, "the watch of a member that is gone still runs");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(!cache.ready(), "a retired cache is never read as current");
    }

    #[tokio::test]
    async fn a_member_workload_wakes_only_a_rollout_of_the_fleet_namespace_it_names() {
        let events = futures::stream::iter([
            Ok(Event::Apply(deployment("tenant", "web", "fleet/across"))),
            Ok(Event::Apply(deployment("tenant", "api", "tenant/victim"))),
            Ok(Event::Delete(deployment("tenant", "db", "kube-system/other"))),
            Ok(Event::Apply(deployment("tenant", "odd", "no-slash"))),
        ]);
        let (wake, mut woken) = futures::channel::mpsc::unbounded();
        let cache = Cache::default();
        assert!(follow(events, &cache, &wake, "fleet", workload::deployment_facts).await.is_none());
        drop(wake);
        let woken: Vec<ObjectRef<FleetRollout>> = woken.by_ref().collect().await;
        assert_eq!(woken, [ObjectRef::new("across").within("fleet")]);
    }
}
