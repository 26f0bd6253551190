//! Workloads in member clusters, read and changed through each member's own client: the fleet of a new
//! revision across the members `targets.clusters` picks (for the controller and for a preview), the
//! batch in flight read from each member's watch cache (live until it is filled), and changes made
//! cluster by cluster. A member that does not answer is reported as such, never as an error of the whole
//! step: the core decides what it means.

use std::collections::{BTreeMap, HashSet};

use futures::future::join_all;
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client, ResourceExt};
use tracing::{info, warn};

use crate::{
    api::{FleetRollout, FleetRolloutStatus, PlannedTarget, TargetKind},
    core::{
        Blocked,
        clusters::{self, Cluster, PlannedWave},
        plan::{Candidate, Discovered},
        reason,
        workload::WorkloadFacts,
    },
    edge::{
        discovery,
        members::{self, MemberError, Members, watch::MemberWatches},
        workloads::{self, Change, Outcome},
    },
    error::{Error, Result},
    metrics::Metrics,
};

/// Why a call to a member failed, as one line for people; `unreachable` when the member did not answer
/// (or refused the operator's credentials even from a client built anew), as opposed to an answer that
/// refused the call (a 500 from a webhook, a 429, a 403 on a read).
#[derive(Debug, Default)]
pub(crate) struct Failure {
    pub message: String,
    pub unreachable: bool,
    unauthorized: bool,
    /// No Secret of the fleet namespace names the member (any more).
    pub unknown: bool,
}

impl Failure {
    fn unreachable(message: String) -> Self {
        Self { message, unreachable: true, ..Self::default() }
    }

    fn of(e: &Error) -> Self {
        match e {
            Error::Kube(k) => {
                let unauthorized = members::is_unauthorized(k);
                let unreachable = members::is_unreachable(k) || unauthorized;
                Self { message: members::describe(k), unreachable, unauthorized, ..Self::default() }
            }
            other => Self { message: other.to_string(), ..Self::default() },
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A client for a member, or why there is none (a member without a usable Secret is not reachable).
async fn client(members: &Members, cluster: &str) -> Result<Client, Failure> {
    members.client(cluster).await.map_err(|e| match e {
        MemberError::Hub(e) => {
            let message = format!("the member Secrets could not be read: {e}");
            Failure { message, ..Failure::default() }
        }
        e @ MemberError::NotFound { .. } => Failure { unknown: true, ..Failure::unreachable(e.to_string()) },
        e => Failure::unreachable(e.to_string()),
    })
}

/// The longest all the requests of one call to a member may take together, the retry after a 401
/// included: well within a reconcile's own bound (60 s), so that a member answering slowly is reported as
/// not answering instead of stalling every step of the rollout.
const MEMBER_CALL_BUDGET: std::time::Duration = std::time::Duration::from_secs(20);

/// Runs `call` against a member; after a 401 the client is rebuilt from its Secret, read again, and the
/// call tried once more (rotated credentials need no restart).
pub(crate) async fn with_member<T, F, Fut>(members: &Members, cluster: &str, call: F) -> Result<T, Failure>
where
    F: Fn(Client) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    // Bounded whatever the member does: kube refreshes an exec plugin's token inside a request, without a
    // timeout of its own, and a member may trickle its answer.
    let late = |_| Failure::unreachable(format!("no answer within {}s", MEMBER_CALL_BUDGET.as_secs()));
    let deadline = tokio::time::Instant::now() + MEMBER_CALL_BUDGET;
    let first = tokio::time::timeout_at(deadline, async {
        call(client(members, cluster).await?).await.map_err(|e| Failure::of(&e))
    });
    match first.await.map_err(late)? {
        Err(f) if f.unauthorized => {
            info!(cluster, "member refused its credentials; rebuilding its client");
            members.forget(cluster);
            let again = async { call(client(members, cluster).await?).await.map_err(|e| Failure::of(&e)) };
            tokio::time::timeout_at(deadline, again).await.map_err(late)?
        }
        other => other,
    }
}

/// Only rollouts in the fleet namespace reach member clusters.
pub(crate) fn may_reach_members(fleet_namespace: &str, fr: &FleetRollout) -> Result<(), Blocked> {
    let own = fr.namespace().unwrap_or_default();
    if !fleet_namespace.is_empty() && own == fleet_namespace {
        return Ok(());
    }
    let message = format!(
        "targets.clusters is honoured only for FleetRollouts in the fleet namespace {fleet_namespace:?}; this one \
         is in {own:?} (no member cluster was contacted)"
    );
    Err(Blocked { reason: reason::CROSS_NAMESPACE_NOT_ALLOWED, message })
}

/// The fleet of a new revision across the member clusters the rollout picks, in waves. A member that
/// cannot be reached is left out of the plan and named in `refused`; in each member only the namespaces
/// opted in there are matched, as in the rollout's own cluster.
pub(crate) async fn discover(
    members: &Members,
    fleet_namespace: &str,
    fr: &FleetRollout,
) -> Result<Result<Discovered, Blocked>> {
    // Nothing of a member is read for a rollout that may not reach members.
    if let Err(b) = may_reach_members(fleet_namespace, fr) {
        return Ok(Err(b));
    }
    let (found, refused) = members.list().await?;
    let mut notes: Vec<String> = refused.iter().map(ToString::to_string).collect();
    let known: Vec<Cluster> = found.iter().map(cluster_of).collect();
    let pick = fr.spec.targets.clusters.clone().unwrap_or_default().selector;
    let chosen = match clusters::select(&known, &pick) {
        Ok(c) => c,
        Err(b) => return Ok(Err(with_refused(b, &notes))),
    };
    let listed = join_all(chosen.iter().map(|c| async move {
        let listed =
            with_member(members, &c.name, |client| list_member(client, members.hub(), fleet_namespace, fr))
                .await;
        (*c, listed)
    }))
    .await;
    let mut found = Listed::default();
    let mut reached = Vec::new();
    let (mut left_out, mut unanswered) = (Vec::new(), Vec::new());
    for (cluster, listed) in listed {
        match listed {
            Ok(Ok(listed)) => {
                found.add(&cluster.name, listed);
                reached.push(cluster);
            }
            // A member without matching namespaces or workloads adds nothing to the plan (nor to a wave).
            Ok(Err(b)) if [reason::NO_NAMESPACES, reason::NO_TARGETS].contains(&b.reason) => {
                notes.push(format!("member cluster {} has no target: {}", cluster.name, b.message));
            }
            Ok(Err(b)) => {
                let message = format!("member cluster {}: {}", cluster.name, b.message);
                return Ok(Err(Blocked { reason: b.reason, message }));
            }
            Err(why) => {
                warn!(cluster = %cluster.name, %why, "member cluster not reached at planning");
                left_out.push((cluster.name.clone(), why.message.clone()));
                if why.unreachable {
                    unanswered.push((cluster.name.clone(), why.message.clone()));
                }
                notes.push(format!(
                    "member cluster {} could not be reached at planning ({why}); its targets are not in this plan \
                     (a new rollout waits for a cluster that does not answer, up to health.timeout)",
                    cluster.name
                ));
            }
        }
    }
    let candidates = match found.candidates(fr) {
        Ok(c) => c,
        // The targets may all be in members that did not answer: planning waits for them.
        Err(_) if !unanswered.is_empty() => Vec::new(),
        Err(b) => return Ok(Err(b)),
    };
    let waves = match waves_of(fr, reached, &candidates, &mut notes) {
        Ok(w) => w,
        Err(b) => return Ok(Err(b)),
    };
    Ok(Ok(Discovered { candidates, waves, refused: notes, left_out, unanswered }))
}

/// `blocked`, saying why Secrets were refused when no member matched: the member wanted may be among them.
fn with_refused(mut blocked: Blocked, refused: &[String]) -> Blocked {
    if blocked.reason == reason::NO_CLUSTERS && !refused.is_empty() {
        let shown: Vec<&str> = refused.iter().take(3).map(String::as_str).collect();
        let more = refused.len().saturating_sub(shown.len());
        let more = if more > 0 { format!("; and {more} more") } else { String::new() };
        blocked.message.push_str(&format!(
            "; {} Secret(s) refused: {}{more}",
            refused.len(),
            shown.join("; ")
        ));
    }
    blocked
}

/// What members hold of a rollout's fleet: workloads (with the namespaces they were looked for in), or the
/// nodes of a node rollout.
#[derive(Default)]
struct Listed {
    workloads: Vec<(String, WorkloadFacts)>,
    namespaces: Vec<String>,
    nodes: Vec<Candidate>,
}

impl Listed {
    /// Adds what one member holds.
    fn add(&mut self, cluster: &str, listed: Listed) {
        self.workloads.extend(listed.workloads.into_iter().map(|(_, f)| (cluster.to_string(), f)));
        self.namespaces.extend(listed.namespaces.into_iter().map(|n| format!("{cluster}/{n}")));
        self.nodes.extend(listed.nodes.into_iter().map(|n| Candidate { cluster: cluster.to_string(), ..n }));
    }

    fn candidates(self, fr: &FleetRollout) -> Result<Vec<Candidate>, Blocked> {
        if fr.spec.targets.kind != TargetKind::Node {
            return discovery::candidates(fr, self.workloads, &self.namespaces);
        }
        if self.nodes.is_empty() {
            let message = format!(
                "no member cluster runs a pod of DaemonSet {} on a node matching targets.nodeSelector",
                fr.spec.targets.daemon_set.as_deref().unwrap_or_default()
            );
            return Err(Blocked { reason: reason::NO_TARGETS, message });
        }
        Ok(self.nodes)
    }
}

/// The fleet of a rollout in one member, through its client.
async fn list_member(
    client: Client,
    hub: &Client,
    fleet_namespace: &str,
    fr: &FleetRollout,
) -> Result<Result<Listed, Blocked>> {
    if fr.spec.targets.kind == TargetKind::Node {
        let nodes = super::nodes::list(&client, hub, fleet_namespace, fr).await?;
        return Ok(nodes.map(|nodes| Listed { nodes, ..Default::default() }));
    }
    let listed = discovery::list_fleet(&client, fleet_namespace, fr).await?;
    Ok(listed.map(|(found, namespaces)| Listed {
        workloads: found.into_iter().map(|f| (String::new(), f)).collect(),
        namespaces,
        nodes: Vec::new(),
    }))
}

/// A member as the core's decisions see it.
fn cluster_of(m: &members::Member) -> Cluster {
    Cluster {
        name: m.name.clone(),
        labels: m.labels.clone(),
        server: m.server.clone(),
        tls_server_name: m.tls_server_name.clone(),
    }
}

/// The waves of the `reached` clusters that hold some of `candidates`. Only clusters with targets are in a
/// wave: a canary cluster with none must not leave its wave standing empty in the plan (the next wave
/// would go first without a word). A cluster or wave left out is named in `notes`, not skipped in silence.
fn waves_of(
    fr: &FleetRollout,
    reached: Vec<&Cluster>,
    candidates: &[Candidate],
    notes: &mut Vec<String>,
) -> Result<Vec<PlannedWave>, Blocked> {
    let (with_targets, without): (Vec<&Cluster>, Vec<&Cluster>) =
        reached.into_iter().partition(|c| candidates.iter().any(|t| t.cluster == c.name));
    for c in without {
        notes.push(format!("member cluster {} has no target: nothing in it matches the rollout", c.name));
    }
    let waves = clusters::assign(&fr.spec.strategy.waves, &with_targets)?;
    for w in fr.spec.strategy.waves.iter().filter(|w| !waves.iter().any(|p| p.name == w.name)) {
        notes.push(format!(
            "wave {} reaches no member cluster with targets; it is left out of this plan",
            w.name
        ));
    }
    Ok(waves)
}

/// What one step sees in the member clusters: workload facts (by [`PlannedTarget::key`]), namespace
/// labels (by cluster and namespace), and the members that did not answer.
#[derive(Default)]
pub(crate) struct Read {
    pub facts: std::collections::HashMap<String, WorkloadFacts>,
    pub namespaces: std::collections::HashMap<(String, String), BTreeMap<String, String>>,
    pub unreachable: BTreeMap<String, String>,
    /// Whether some member's workloads were read live (its watch cache is not filled yet): nothing would
    /// wake the rollout when they change.
    pub unwatched: bool,
}

/// Reads `targets`, every member at once. In each, the labels of the namespaces they are in are read live
/// (which also tells whether the member answers now); the workloads come from the member's watch cache
/// once it is filled, and are listed live (matching the revision's selector) until then.
pub(crate) async fn read(
    watches: &MemberWatches,
    status: &FleetRolloutStatus,
    kind: TargetKind,
    targets: &[&PlannedTarget],
) -> Read {
    let mut by_cluster: BTreeMap<&str, Vec<&PlannedTarget>> = BTreeMap::new();
    for t in targets {
        by_cluster.entry(t.cluster.as_str()).or_default().push(t);
    }
    let selector = selector(status);
    let reads = join_all(by_cluster.into_iter().map(|(cluster, targets)| {
        let selector = &selector;
        async move {
            let cache = watches.cache(cluster, kind).filter(|c| c.ready());
            let namespaces: HashSet<&str> = targets.iter().map(|t| t.namespace.as_str()).collect();
            let list = cache.is_none();
            let read = with_member(watches.members(), cluster, |client| {
                read_namespaces(client, kind, namespaces.clone(), selector.clone(), list)
            })
            .await;
            let cached = cache.map(|c| targets.iter().filter_map(|t| c.get(&t.namespace, &t.name)).collect());
            (cluster, list, read.map(|(listed, labels)| (cached.unwrap_or(listed), labels)))
        }
    }))
    .await;
    let mut seen = Read::default();
    for (cluster, listed, read) in reads {
        seen.unwatched |= listed;
        match read {
            Ok((facts, labels)) => {
                let key = |f: &WorkloadFacts| crate::api::target_key_in(cluster, &f.namespace, &f.name);
                seen.facts.extend(facts.into_iter().map(|f: WorkloadFacts| (key(&f), f)));
                seen.namespaces.extend(labels.into_iter().map(|(ns, l)| ((cluster.to_string(), ns), l)));
            }
            // Whatever kept the batch's namespaces from being read, nothing can be judged of the member now.
            Err(why) => {
                seen.unreachable.insert(cluster.to_string(), why.message);
            }
        }
    }
    seen
}

/// The label selector the revision was planned with, as a string (empty when it cannot be read: the
/// namespace's workloads are then all read, and only planned targets are ever looked up).
fn selector(status: &FleetRolloutStatus) -> String {
    status
        .revision
        .as_ref()
        .and_then(|r| kube::core::Selector::try_from(r.inputs.selector.clone()).ok())
        .map(|s| s.to_string())
        .unwrap_or_default()
}

/// Reads, in one member, the workloads matching `selector` and the labels of each of `namespaces`.
async fn read_namespaces(
    client: Client,
    kind: TargetKind,
    namespaces: HashSet<&str>,
    selector: String,
    list: bool,
) -> Result<(Vec<WorkloadFacts>, Vec<(String, BTreeMap<String, String>)>)> {
    let (mut facts, mut weight) = (Vec::new(), 0);
    let mut labels = Vec::new();
    for ns in namespaces {
        if let Some(n) = Api::<Namespace>::all(client.clone()).get_opt(ns).await? {
            labels.push((ns.to_string(), n.labels().clone()));
        }
        if list {
            discovery::list_workloads(&client, kind, ns, &selector, (&mut facts, &mut weight)).await?;
        }
    }
    Ok((facts, labels))
}

/// Changes (or restores) `targets` cluster by cluster, all clusters at once; a cluster that cannot be
/// reached is reported in `unreached`, its targets left for the core to retry.
pub(crate) async fn change(
    watches: &MemberWatches,
    metrics: &Metrics,
    change: &Change<'_>,
    targets: &[PlannedTarget],
    image_of: impl Fn(&PlannedTarget) -> String + Sync,
) -> Result<Outcome> {
    let image_of = &image_of;
    each_member(watches.members(), targets, |cluster, client, targets| async move {
        // The member's watch cache, as the rollout's own cluster's, spares a read before each patch.
        let cache = watches.cache(cluster, change.kind);
        let cached = |t: &PlannedTarget| cache.as_ref().filter(|c| c.ready())?.get(&t.namespace, &t.name);
        workloads::patch_all(&client, &client, &cached, metrics, change, &targets, image_of).await
    })
    .await
}

/// Runs `act` on the targets of each member cluster, through its client, all clusters at once, and adds
/// up what it did; a cluster that cannot be reached is reported in `unreached`, its targets left for the
/// core to retry.
pub(crate) async fn each_member<'a, F, Fut>(
    members: &Members,
    targets: &'a [PlannedTarget],
    act: F,
) -> Result<Outcome>
where
    F: Fn(&'a str, Client, Vec<PlannedTarget>) -> Fut + Sync,
    Fut: std::future::Future<Output = Result<Outcome>>,
{
    let mut by_cluster: BTreeMap<&str, Vec<PlannedTarget>> = BTreeMap::new();
    for t in targets {
        by_cluster.entry(t.cluster.as_str()).or_default().push(t.clone());
    }
    let act = &act;
    let results = join_all(by_cluster.into_iter().map(|(cluster, targets)| async move {
        (cluster, with_member(members, cluster, |client| act(cluster, client, targets.clone())).await)
    }))
    .await;
    let mut outcome = Outcome::default();
    for (cluster, out) in results {
        match out {
            Ok(o) => outcome.add(o),
            Err(why) if why.unreachable => {
                warn!(cluster, %why, "member cluster not reached; its targets wait for it");
                outcome.unreached.insert(cluster.to_string(), why.message);
            }
            // An answer refusing the change (a failing webhook, throttling): retried with the reconcile's
            // backoff, as the same error in the rollout's own cluster is.
            Err(why) => {
                return Err(Error::Target(format!("member cluster {cluster}: {why}")));
            }
        }
    }
    Ok(outcome)
}
