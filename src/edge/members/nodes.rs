//! Node rollouts across member clusters (`targets.kind: Node` with `targets.clusters`): in each member the
//! selector picks, the DaemonSet `targets.daemonSet` of every namespace `targets.namespaceSelector` picks
//! there (opted in there), its pods replaced node by node through the member's own client exactly as in
//! the rollout's own cluster ([`super::nodes`]). A target is `cluster/namespace/node`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use futures::future::join_all;
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client, ResourceExt};
use tracing::warn;

use crate::{
    api::{FleetRollout, FleetRolloutStatus, PlannedTarget},
    core::{Blocked, plan::Candidate, reason, rollout::TargetState},
    edge::{
        discovery,
        members::{
            Members,
            workloads::{each_member, with_member},
        },
        nodes::{self, At, View},
        workloads::Outcome,
    },
    error::{Error, Result},
    metrics::Metrics,
};

/// The nodes of a new revision in one member (`client`), in every namespace the rollout may touch there
/// that holds its DaemonSet, or why there are none.
pub(crate) async fn list(
    client: &Client,
    hub: &Client,
    fleet_namespace: &str,
    fr: &FleetRollout,
) -> Result<Result<Vec<Candidate>, Blocked>> {
    let listed = discovery::namespaces(client).await?;
    let namespaces = match discovery::allowed_namespaces(fr, fleet_namespace, Some(&listed)) {
        Ok(n) => n,
        Err(b) => return Ok(Err(b)),
    };
    let mut found = Vec::new();
    for namespace in &namespaces {
        match nodes::discover(At::member(client, hub, namespace), fr).await? {
            Ok(nodes) => {
                found.extend(nodes.into_iter().map(|c| Candidate { namespace: namespace.clone(), ..c }))
            }
            // A namespace without the DaemonSet, or without a matching node running it, adds nothing.
            Err(b) if [reason::DAEMONSET_NOT_FOUND, reason::NO_TARGETS].contains(&b.reason) => {}
            Err(b) => return Ok(Err(b)),
        }
    }
    if found.is_empty() {
        let message = format!(
            "no node matching targets.nodeSelector runs a pod of DaemonSet {} in namespace(s) {}",
            fr.spec.targets.daemon_set.as_deref().unwrap_or_default(),
            namespaces.join(", ")
        );
        return Ok(Err(Blocked { reason: reason::NO_TARGETS, message }));
    }
    Ok(Ok(found))
}

/// What one step sees of the node targets in member clusters.
#[derive(Default)]
pub(crate) struct Read {
    /// By [`PlannedTarget::key`]; a node that is gone, or no longer runs the DaemonSet, is absent.
    pub states: HashMap<String, TargetState>,
    /// The rollout (`namespace/name`) holding the DaemonSet of a cluster's namespace, when not this one.
    pub holders: HashMap<(String, String), String>,
    /// The labels of the DaemonSets' namespaces, by cluster and namespace.
    pub namespaces: HashMap<(String, String), BTreeMap<String, String>>,
    pub unreachable: BTreeMap<String, String>,
}

/// One namespace of one member, as read: its labels, its node targets' states, and who holds its DaemonSet.
type Place = (String, Option<BTreeMap<String, String>>, HashMap<String, TargetState>, Option<String>);

/// Reads the nodes, pods and DaemonSet of every (cluster, namespace) of `targets`, every member at once.
pub(crate) async fn read(
    members: &Members,
    fr: &FleetRollout,
    status: &FleetRolloutStatus,
    targets: &[&PlannedTarget],
) -> Read {
    let mut places: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for t in targets {
        places.entry(t.cluster.as_str()).or_default().insert(t.namespace.as_str());
    }
    let own = format!("{}/{}", fr.namespace().unwrap_or_default(), fr.name_any());
    let reads = join_all(places.into_iter().map(|(cluster, namespaces)| {
        let own = &own;
        async move {
            let read = with_member(members, cluster, |client| {
                let namespaces = namespaces.clone();
                async move {
                    let mut read: Vec<Place> = Vec::new();
                    for namespace in namespaces {
                        let labels = Api::<Namespace>::all(client.clone()).get_opt(namespace).await?;
                        let at = At::member(&client, members.hub(), namespace);
                        let view = View::read(at, fr).await?;
                        let holder = view
                            .daemonset
                            .as_ref()
                            .and_then(|ds| crate::core::nodes::held_by_other(ds.annotations(), own));
                        let states = view.rollout_states(fr, status, status.current_batch);
                        read.push((
                            namespace.to_string(),
                            labels.map(|n| n.labels().clone()),
                            states,
                            holder.map(String::from),
                        ));
                    }
                    Ok::<_, Error>(read)
                }
            })
            .await;
            (cluster, read)
        }
    }))
    .await;
    let mut seen = Read::default();
    for (cluster, read) in reads {
        match read {
            Ok(places) => {
                for (namespace, labels, states, holder) in places {
                    let key = |node: &str| crate::api::target_key_in(cluster, &namespace, node);
                    seen.states.extend(states.into_iter().map(|(node, s)| (key(&node), s)));
                    let place = (cluster.to_string(), namespace.clone());
                    if let Some(labels) = labels {
                        seen.namespaces.insert(place.clone(), labels);
                    }
                    if let Some(holder) = holder {
                        seen.holders.insert(place, holder);
                    }
                }
            }
            Err(why) => {
                seen.unreachable.insert(cluster.to_string(), why.message);
            }
        }
    }
    seen
}

/// What a batch (or a rollback) does to the node targets of one namespace of a member.
#[derive(Clone, Copy)]
pub(crate) enum Act<'a> {
    /// Rolls out `image` of revision `revision` (its key), as rollout `rollout` (`namespace/name`).
    Apply { revision: &'a str, image: &'a str, rollout: &'a str },
    /// Restores the template from before the rollout and replaces the pods it created.
    Restore,
}

/// Applies `act` to `targets`, member by member (all at once) and namespace by namespace within each; a
/// member that cannot be reached is reported in `unreached`, its targets left for the core to retry.
pub(crate) async fn change(
    members: &Members,
    metrics: &Metrics,
    fr: &FleetRollout,
    act: Act<'_>,
    targets: &[PlannedTarget],
) -> Result<Outcome> {
    each_member(members, targets, |_, client, targets| async move {
        let mut by_namespace: BTreeMap<String, Vec<PlannedTarget>> = BTreeMap::new();
        for t in targets {
            by_namespace.entry(t.namespace.clone()).or_default().push(t);
        }
        let mut outcome = Outcome::default();
        for (namespace, targets) in by_namespace {
            let at = At::member(&client, members.hub(), &namespace);
            outcome.add(match act {
                Act::Apply { revision, image, rollout } => {
                    nodes::apply(at, metrics, fr, revision, image, rollout, &targets).await?
                }
                Act::Restore => nodes::restore(at, metrics, fr, &targets).await?,
            });
        }
        Ok(outcome)
    })
    .await
}

/// Hands back the DaemonSet of every (cluster, namespace) of `targets` this rollout holds (see
/// [`nodes::release`]), every member at once. A member that does not answer is an error naming
/// it, once every other member has been handed back: its DaemonSet stays with this rollout until it
/// answers, and the caller tries again. When the rollout is being `deleted`, a member no Secret names any
/// more is passed over with a warning: it can never be reached again, and waiting for it would keep the
/// rollout from being deleted (at the end of a rollout it is waited for, as its Secret may be replaced).
pub(crate) async fn release(
    members: &Members,
    fr: &FleetRollout,
    targets: &[PlannedTarget],
    finished: bool,
    deleted: bool,
) -> Result<()> {
    let mut places: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for t in targets {
        places.entry(t.cluster.as_str()).or_default().insert(t.namespace.as_str());
    }
    let released = join_all(places.into_iter().map(|(cluster, namespaces)| async move {
        let released = with_member(members, cluster, |client| {
            let namespaces = namespaces.clone();
            async move {
                for namespace in namespaces {
                    nodes::release(
                        At::member(&client, members.hub(), namespace),
                        fr,
                        finished,
                    )
                    .await?;
                }
                Ok(())
            }
        })
        .await;
        match released {
            Err(why) if why.unknown && deleted => {
                warn!(cluster, %why, "member DaemonSets not handed back: no Secret names the cluster any more");
                Ok(())
            }
            other => other.map_err(|why| format!("member cluster {cluster}: {why}")),
        }
    }))
    .await;
    let held: Vec<String> = released.into_iter().filter_map(Result::err).collect();
    match held.is_empty() {
        true => Ok(()),
        false => Err(Error::Target(format!(
            "{}; their DaemonSets are handed back once they answer",
            held.join("; ")
        ))),
    }
}
