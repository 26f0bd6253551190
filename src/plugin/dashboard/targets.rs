//! A rollout's targets in this cluster as the user's own watch sees them: whether each carries a batch's
//! key and how ready it is, and which are gone (a complete list of where they live lacks them). The watch
//! is of the kind and namespaces the planned revision targets, as the user: in the rollout's namespace, or
//! across the cluster when the revision's selector reaches other namespaces and the user may list there.

use std::collections::{HashMap, HashSet};

use futures::{StreamExt, TryStreamExt, stream::BoxStream};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use kube::{
    Api, Resource, ResourceExt,
    api::ListParams,
    runtime::{WatchStreamExt, watcher},
};
use serde::de::DeserializeOwned;

use super::view::{Seen, Sight};
use crate::{
    api::{FleetRollout, PlannedTarget, TargetKind},
    core::{
        plan::Plan,
        workload::{self, WorkloadFacts},
    },
};

/// What the watch tells: first where it watches, then its events, each a target's key and what was seen.
pub enum Change {
    /// One namespace, or (None) the whole cluster.
    Within(Option<String>),
    Event(Result<watcher::Event<(String, Seen)>, watcher::Error>),
}

/// What the watch has seen of the plan's targets in this cluster.
#[derive(Default)]
pub struct Targets {
    /// The plan's targets in this cluster (`namespace/name`): the only ones kept.
    keys: HashSet<String>,
    seen: HashMap<String, Seen>,
    /// Where they are watched, once the watch says: one namespace, or (None) the whole cluster.
    within: Option<Option<String>>,
    /// Whether a complete list has arrived: until then, a target not seen is not known to be gone.
    listed: bool,
    /// The targets a list in progress has found: those seen before and not found again are gone.
    relisting: Option<HashSet<String>>,
}

impl Targets {
    pub fn of(plan: &Plan) -> Self {
        let keys =
            plan.batches.iter().flatten().filter(|t| t.cluster.is_empty()).map(PlannedTarget::key).collect();
        Targets { keys, ..Targets::default() }
    }

    /// Takes in what the watch said; true when a target's sight may have changed.
    pub fn apply(&mut self, change: Change) -> bool {
        let event = match change {
            Change::Within(within) => {
                self.within = Some(within);
                return false;
            }
            Change::Event(event) => event,
        };
        match event {
            // A watch across the cluster sees every workload of the kind: only the plan's are kept.
            Ok(watcher::Event::Apply((k, s)) | watcher::Event::InitApply((k, s)))
                if self.keys.contains(&k) =>
            {
                if let Some(found) = self.relisting.as_mut() {
                    found.insert(k.clone());
                }
                self.seen.insert(k, s);
                true
            }
            Ok(watcher::Event::Delete((k, _))) => self.seen.remove(&k).is_some(),
            // A list again (the watch was lost): what it does not find was deleted meanwhile.
            Ok(watcher::Event::Init) => {
                self.relisting = Some(HashSet::new());
                false
            }
            Ok(watcher::Event::InitDone) => {
                let found = self.relisting.take().unwrap_or_default();
                self.seen.retain(|k, _| found.contains(k));
                self.listed = true;
                true
            }
            // The targets are an extra: a user who may not read them still sees the rollout.
            Ok(watcher::Event::Apply(_) | watcher::Event::InitApply(_)) | Err(_) => false,
        }
    }

    /// What the watch says of `t`: seen, gone (a complete list of where it lives lacks it), or nothing (a
    /// member cluster's, not readable, or not listed yet).
    pub fn sight(&self, t: &PlannedTarget) -> Sight {
        if !t.cluster.is_empty() {
            return Sight::Unread;
        }
        if let Some(seen) = self.seen.get(&t.key()) {
            return Sight::Seen(seen.clone());
        }
        let covered = self.within.as_ref().is_some_and(|w| w.as_ref().is_none_or(|ns| *ns == t.namespace));
        if self.listed && covered { Sight::Gone } else { Sight::Unread }
    }
}

/// The watch of the rollout's targets in this cluster, as the user, of what its planned revision (else its
/// spec) targets; None for nodes. Where it watches is found by its first step, not before it is polled.
pub fn watch(client: &kube::Client, fr: &FleetRollout) -> Option<BoxStream<'static, Change>> {
    let revision = fr.status.as_ref().and_then(|s| s.revision.as_ref()).map(|r| &r.inputs);
    let (kind, across) = match revision {
        Some(r) => (r.kind, r.namespace_selector.is_some()),
        None => (fr.spec.targets.kind, fr.spec.targets.namespace_selector.is_some()),
    };
    let (client, ns) = (client.clone(), fr.namespace().unwrap_or_default());
    Some(match kind {
        TargetKind::Deployment => watch_kind::<Deployment>(client, across, ns, workload::deployment_facts),
        TargetKind::StatefulSet => watch_kind::<StatefulSet>(client, across, ns, workload::statefulset_facts),
        TargetKind::DaemonSet => watch_kind::<DaemonSet>(client, across, ns, workload::daemonset_facts),
        TargetKind::Node => return None,
    })
}

fn watch_kind<K>(
    client: kube::Client,
    across: bool,
    ns: String,
    facts: fn(&K) -> WorkloadFacts,
) -> BoxStream<'static, Change>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    futures::stream::once(async move {
        let all = Api::<K>::all(client.clone());
        // Only a refusal keeps the watch to the rollout's namespace: one failing for a passing reason
        // (across, the watch retries) would keep it there for the whole session.
        let refused = |r: Result<_, kube::Error>| matches!(r, Err(kube::Error::Api(s)) if s.code == 403);
        let (api, within) = match across && !refused(all.list_metadata(&ListParams::default().limit(1)).await)
        {
            true => (all, None),
            false => (Api::<K>::namespaced(client, &ns), Some(ns)),
        };
        let seen = move |o: &K| {
            let f = facts(o);
            (f.key(), Seen { applied: f.applied.clone(), readiness: f.readiness() })
        };
        let events = watcher(api, watcher::Config::default()).default_backoff().map_ok(move |e| match e {
            watcher::Event::Apply(o) => watcher::Event::Apply(seen(&o)),
            watcher::Event::InitApply(o) => watcher::Event::InitApply(seen(&o)),
            watcher::Event::Delete(o) => watcher::Event::Delete(seen(&o)),
            watcher::Event::Init => watcher::Event::Init,
            watcher::Event::InitDone => watcher::Event::InitDone,
        });
        futures::stream::once(async move { Change::Within(within) }).chain(events.map(Change::Event))
    })
    .flatten()
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::workload::Readiness;

    fn target(ns: &str, name: &str) -> PlannedTarget {
        PlannedTarget {
            cluster: String::new(),
            namespace: ns.into(),
            name: name.into(),
            previous_image: String::new(),
        }
    }

    fn event(e: watcher::Event<(String, Seen)>) -> Change {
        Change::Event(Ok(e))
    }

    fn seen(key: &str) -> (String, Seen) {
        (key.into(), Seen { applied: Some("u1/1/0".into()), readiness: Readiness::Ready })
    }

    #[test]
    fn a_target_is_gone_only_once_a_complete_list_of_where_it_lives_lacks_it() {
        let plan = Plan {
            hash: "h".into(),
            batches: vec![vec![target("shop", "a"), target("shop", "b"), target("other", "c")]],
        };
        let mut targets = Targets::of(&plan);
        let [a, b, c] = [&plan.batches[0][0], &plan.batches[0][1], &plan.batches[0][2]];
        targets.apply(Change::Within(Some("shop".into())));
        targets.apply(event(watcher::Event::Init));
        assert!(targets.apply(event(watcher::Event::InitApply(seen("shop/a")))));
        assert!(!targets.apply(event(watcher::Event::InitApply(seen("shop/unplanned")))), "not the plan's");
        assert_eq!(targets.sight(b), Sight::Unread, "not listed yet");
        targets.apply(event(watcher::Event::InitDone));
        assert!(matches!(targets.sight(a), Sight::Seen(_)));
        assert_eq!(targets.sight(b), Sight::Gone, "listed, and not found");
        assert_eq!(targets.sight(c), Sight::Unread, "in a namespace the watch does not cover");

        // The watch is lost and lists again: a target deleted meanwhile (no Delete event) is gone.
        targets.apply(event(watcher::Event::Init));
        assert!(matches!(targets.sight(a), Sight::Seen(_)), "kept until the list is complete");
        targets.apply(event(watcher::Event::InitDone));
        assert_eq!(targets.sight(a), Sight::Gone);
    }

    #[test]
    fn nothing_is_gone_before_the_watch_says_where_it_looks() {
        let plan = Plan { hash: "h".into(), batches: vec![vec![target("shop", "a")]] };
        let mut targets = Targets::of(&plan);
        targets.apply(event(watcher::Event::Init));
        targets.apply(event(watcher::Event::InitDone));
        assert_eq!(targets.sight(&plan.batches[0][0]), Sight::Unread);
        targets.apply(Change::Within(None));
        assert_eq!(
            targets.sight(&plan.batches[0][0]),
            Sight::Gone,
            "across the cluster covers every namespace"
        );
    }
}
