//! FleetRollouts as a watch shows them, so that polling (`tasks/get`, `get_rollout`, `list_rollouts`)
//! is answered from memory instead of costing the API server a request each time.
//!
//! The cache is a view of etcd, never a store of its own: it is used only while its watch is live, a
//! rollout it does not hold is read from the API server (one just created by another replica, say), and this
//! server's own writes are served until the watch delivers them, so a caller sees its own change at once.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use futures::StreamExt;
use kube::{
    Api, Client,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use tracing::{debug, warn};

use crate::{api::FleetRollout, edge::own_writes::OwnWrites};

/// The annotations tasks are read from (ownership, the task token's hash, replays); the cache keeps no
/// others.
const KEPT_ANNOTATIONS: [&str; 4] = [
    super::task::TASK_TOKEN_HASH_ANNOTATION,
    super::task::CREATED_BY_ANNOTATION,
    super::task::IDEMPOTENCY_KEY_HASH_ANNOTATION,
    super::task::REQUEST_HASH_ANNOTATION,
];

#[derive(Clone)]
pub struct Rollouts {
    client: Client,
    store: Store<FleetRollout>,
    /// True while the watch is connected and the store holds everything it has seen.
    live: Arc<AtomicBool>,
    own: Arc<OwnWrites<FleetRollout>>,
}

/// What the watch says about the store: whether it can be trusted right now.
fn liveness(event: &Result<watcher::Event<FleetRollout>, watcher::Error>) -> Option<bool> {
    match event {
        // A re-list is under way: the store still holds the old state until it is done.
        Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => None,
        Ok(watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_)) => Some(true),
        Err(_) => Some(false),
    }
}

impl Rollouts {
    /// Starts watching every FleetRollout the client may list; until the first list is in, reads go to
    /// the API server.
    pub fn watch(client: Client) -> Self {
        let (store, writer) = reflector::store();
        let live = Arc::new(AtomicBool::new(false));
        let flag = live.clone();
        let lister = client.clone();
        tokio::spawn(async move {
            // Listed as the controller's caches are: object by object, never a list held whole.
            let config = crate::edge::lists::watch_config(&lister).await;
            watcher(Api::<FleetRollout>::all(lister), config)
                .default_backoff()
                .modify(|fr| crate::api::kept_for_cache(fr, &KEPT_ANNOTATIONS))
                .reflect(writer)
                .for_each(move |event| {
                    if let Err(e) = &event {
                        warn!(error = %e, "FleetRollout watch failed; reading from the API server until it is back");
                    }
                    if let Some(now) = liveness(&event)
                        && flag.swap(now, Ordering::Relaxed) != now
                    {
                        debug!(live = now, "FleetRollout cache");
                    }
                    futures::future::ready(())
                })
                .await
        });
        Self { client, store, live, own: Arc::new(OwnWrites::default()) }
    }

    fn api(&self, ns: &str) -> Api<FleetRollout> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// The rollout, or None when it does not exist.
    pub async fn get(&self, ns: &str, name: &str) -> Result<Option<Arc<FleetRollout>>, kube::Error> {
        let key = ObjectRef::new(name).within(ns);
        if self.live.load(Ordering::Relaxed)
            && let Some(cached) = self.store.get(&key)
        {
            return Ok(Some(self.own.newest(cached)));
        }
        self.own.forget(&key);
        Ok(self.api(ns).get_opt(name).await?.map(Arc::new))
    }

    /// Every rollout (in `ns`, when given), sorted by namespace and name.
    pub async fn list(&self, ns: Option<&str>) -> Result<Vec<Arc<FleetRollout>>, kube::Error> {
        if !self.live.load(Ordering::Relaxed) {
            let api = match ns {
                Some(ns) => self.api(ns),
                None => Api::all(self.client.clone()),
            };
            return Ok(api.list(&Default::default()).await?.items.into_iter().map(Arc::new).collect());
        }
        let mut all: Vec<Arc<FleetRollout>> = self
            .store
            .state()
            .into_iter()
            .filter(|fr| ns.is_none() || fr.metadata.namespace.as_deref() == ns)
            .map(|fr| self.own.newest(fr))
            .collect();
        all.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        Ok(all)
    }

    /// Records a rollout we just wrote, so reads show it before the watch does.
    pub fn wrote(&self, fr: &FleetRollout) {
        let mut kept = fr.clone();
        crate::api::kept_for_cache(&mut kept, &KEPT_ANNOTATIONS);
        self.own.remember(&Arc::new(kept));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_trusted_only_while_its_watch_is_live() {
        let fr = || {
            FleetRollout::new(
                "r",
                serde_json::from_value(serde_json::json!({
            "image": "x", "targets": {"kind": "Deployment", "selector": {}}}))
                .unwrap(),
            )
        };
        let failed: Result<watcher::Event<FleetRollout>, watcher::Error> =
            Err(watcher::Error::NoResourceVersion);
        assert_eq!(liveness(&failed), Some(false));
        assert_eq!(liveness(&Ok(watcher::Event::Init)), None);
        assert_eq!(liveness(&Ok(watcher::Event::InitApply(fr()))), None);
        assert_eq!(liveness(&Ok(watcher::Event::InitDone)), Some(true));
        assert_eq!(liveness(&Ok(watcher::Event::Apply(fr()))), Some(true));
        assert_eq!(liveness(&Ok(watcher::Event::Delete(fr()))), Some(true));
    }
}
