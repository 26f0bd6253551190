//! Member clusters as pure decisions: which clusters a rollout reaches, the waves they are rolled in, where
//! a batch must end so that it stays in one wave and within a wave's `maxConcurrency`, and the counts
//! status keeps per wave and per cluster.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::LabelSelector, jiff::Timestamp};
use kube_core::{Selector, SelectorExt};

use crate::{
    api::{
        CLUSTERS_LISTED, ClusterCount, ClusterTrouble, ClustersStatus, FleetRollout, PlannedTarget,
        TROUBLE_LISTED, TargetKind, UNASSIGNED_WAVE, Wave, WaveStatus,
    },
    core::{Blocked, count, reason},
};

/// Whether a change of `cluster`'s workload of `kind` may concern `fr`: only a rollout across member
/// clusters of that kind reads member workloads, as its spec asks or as the revision it runs was planned,
/// and of those only one whose plan may reach `cluster`. Anyone who may write a member's workload may name
/// any rollout in it; no other rollout is woken.
pub fn reads_member_workloads(fr: &FleetRollout, cluster: &str, kind: TargetKind) -> bool {
    let targets = &fr.spec.targets;
    let revision = fr.status.as_ref().and_then(|s| s.revision.as_ref());
    let of_kind = (targets.clusters.is_some() && targets.kind == kind)
        || revision.is_some_and(|r| r.inputs.clusters.is_some() && r.inputs.kind == kind);
    of_kind && may_reach(fr, cluster)
}

/// Whether `fr`'s plan may hold targets in `cluster`: it lists that cluster, or it is not listed whole (a
/// revision still to be planned for the spec, or more clusters than status lists).
fn may_reach(fr: &FleetRollout, cluster: &str) -> bool {
    let Some(status) = fr.status.as_ref() else { return true };
    let planned = status.revision.is_some() && status.observed_generation == fr.metadata.generation;
    let Some(clusters) = status.clusters.as_ref().filter(|_| planned) else { return true };
    let planned_clusters: u64 = clusters.waves.iter().map(|w| u64::from(w.clusters)).sum();
    let listed_whole = planned_clusters <= clusters.members.len() as u64;
    !listed_whole || clusters.members.iter().any(|m| m.name == cluster)
}

/// A member cluster as discovery found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cluster {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Its API server's URL, as its Secret gives it.
    pub server: String,
    /// The TLS server name its Secret asks for, if any: one endpoint may route to several API servers by it.
    pub tls_server_name: Option<String>,
}

/// One wave of a plan: its clusters, in order, and how many of them a batch may reach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedWave {
    pub name: String,
    pub clusters: Vec<String>,
    pub max_concurrency: Option<u32>,
}

fn selector(what: &str, s: &LabelSelector) -> Result<Selector, Blocked> {
    Selector::try_from(s.clone())
        .map_err(|e| Blocked { reason: reason::INVALID_SELECTOR, message: format!("{what}: {e}") })
}

/// The clusters `targets.clusters.selector` picks, sorted by name; an error when it picks none.
pub fn select<'a>(clusters: &'a [Cluster], pick: &LabelSelector) -> Result<Vec<&'a Cluster>, Blocked> {
    let pick = selector("targets.clusters.selector", pick)?;
    let mut chosen: Vec<&Cluster> = clusters.iter().filter(|c| pick.matches(&c.labels)).collect();
    chosen.sort_by(|a, b| a.name.cmp(&b.name));
    if chosen.is_empty() {
        return Err(Blocked {
            reason: reason::NO_CLUSTERS,
            message: format!(
                "no member cluster matches targets.clusters.selector ({pick}); {} member cluster(s) known",
                clusters.len()
            ),
        });
    }
    if let Some((a, b)) = same_server(&chosen) {
        return Err(Blocked {
            reason: reason::DUPLICATE_CLUSTER,
            message: format!(
                "member clusters {} and {} are the same API server ({}): one cluster picked under two names \
                 would be rolled twice; narrow targets.clusters.selector to one of them",
                a.name, b.name, a.server
            ),
        });
    }
    Ok(chosen)
}

/// Two clusters whose Secrets name the same API server (scheme, host, port, path and TLS server name
/// alike), if any.
fn same_server<'a>(clusters: &[&'a Cluster]) -> Option<(&'a Cluster, &'a Cluster)> {
    let mut seen: HashMap<(String, Option<String>), &Cluster> = HashMap::new();
    for c in clusters {
        let server_name = c.tls_server_name.as_ref().map(|n| n.to_ascii_lowercase());
        if let Some(first) = seen.insert((server_identity(&c.server), server_name), c) {
            return Some((first, c));
        }
    }
    None
}

/// A server URL as the API server it reaches: `HTTPS://Example.com:443/` and `https://example.com` alike.
fn server_identity(server: &str) -> String {
    match url::Url::parse(server) {
        Ok(u) => format!(
            "{}://{}:{}{}",
            u.scheme(),
            u.host_str().unwrap_or_default(),
            u.port_or_known_default().unwrap_or_default(),
            u.path().trim_end_matches('/')
        ),
        Err(_) => server.to_string(),
    }
}

/// Puts each cluster in the first wave that selects it, and those no wave selects in a last wave,
/// "(unassigned)". Waves that select no cluster are left out.
pub fn assign(waves: &[Wave], clusters: &[&Cluster]) -> Result<Vec<PlannedWave>, Blocked> {
    let selectors: Vec<Selector> = waves
        .iter()
        .map(|w| selector(&format!("strategy.waves[{}].clusterSelector", w.name), &w.cluster_selector))
        .collect::<Result<_, _>>()?;
    let mut planned: Vec<PlannedWave> = waves
        .iter()
        .map(|w| PlannedWave {
            name: w.name.clone(),
            clusters: Vec::new(),
            max_concurrency: w.max_concurrency,
        })
        .collect();
    let mut rest = PlannedWave { name: UNASSIGNED_WAVE.into(), clusters: Vec::new(), max_concurrency: None };
    for c in clusters {
        match selectors.iter().position(|s| s.matches(&c.labels)) {
            Some(i) => planned[i].clusters.push(c.name.clone()),
            None => rest.clusters.push(c.name.clone()),
        }
    }
    planned.push(rest);
    planned.retain(|w| !w.clusters.is_empty());
    Ok(planned)
}

/// Where each cluster stands in the plan: its wave's index and `maxConcurrency`; and, within a wave, when
/// each namespace's change windows first allow a change (targets that may change sooner go first).
#[derive(Clone, Debug, Default)]
pub struct Order {
    of: HashMap<String, (usize, Option<u32>)>,
    /// By (cluster, namespace): when the windows its owners declare first allow a change, at planning
    /// (Timestamp::MAX: never found). Absent: no windows, any time.
    opens: HashMap<(String, String), Timestamp>,
}

impl Order {
    pub fn new(waves: &[PlannedWave]) -> Self {
        let of = waves
            .iter()
            .enumerate()
            .flat_map(|(i, w)| w.clusters.iter().map(move |c| (c.clone(), (i, w.max_concurrency))))
            .collect();
        Self { of, opens: HashMap::new() }
    }

    /// With the openings of the namespaces whose owners declare change windows: see [`Order::opens`].
    pub fn with_openings(mut self, opens: HashMap<(String, String), Timestamp>) -> Self {
        self.opens = opens;
        self
    }

    /// When a target's own windows (its namespace's) first allow a change; MIN when it has none.
    pub fn opens(&self, cluster: &str, namespace: &str) -> Timestamp {
        self.opens.get(&(cluster.to_string(), namespace.to_string())).copied().unwrap_or(Timestamp::MIN)
    }

    /// The wave (index) a target's cluster is in; 0 for the rollout's own cluster.
    pub fn wave(&self, cluster: &str) -> usize {
        self.of.get(cluster).map_or(0, |(i, _)| *i)
    }

    /// Whether `next` must start a new batch after `batch`: it is in another wave, its windows open at
    /// another time, or it would make the batch reach more clusters than its wave's `maxConcurrency`.
    pub fn must_cut(&self, batch: &[PlannedTarget], next: &PlannedTarget) -> bool {
        let Some(last) = batch.last() else { return false };
        if self.wave(&last.cluster) != self.wave(&next.cluster) {
            return true;
        }
        if self.opens(&last.cluster, &last.namespace) != self.opens(&next.cluster, &next.namespace) {
            return true;
        }
        let limit = self.of.get(&next.cluster).and_then(|(_, m)| *m);
        let Some(limit) = limit else { return false };
        let mut reached: Vec<&str> = batch.iter().map(|t| t.cluster.as_str()).collect();
        reached.dedup();
        !reached.contains(&next.cluster.as_str()) && count(reached.len()) >= limit
    }
}

/// The clusters part of a new plan's status: every wave with its batches, and the counts per cluster.
pub fn planned_status(waves: &[PlannedWave], batches: &[Vec<PlannedTarget>]) -> ClustersStatus {
    let order = Order::new(waves);
    let mut status = ClustersStatus {
        waves: waves
            .iter()
            .map(|w| WaveStatus {
                name: w.name.clone(),
                clusters: count(w.clusters.len()),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let mut per_cluster: BTreeMap<(usize, &str), u32> = BTreeMap::new();
    let mut seen = vec![false; waves.len()];
    for (index, batch) in batches.iter().enumerate() {
        for t in batch {
            let wave = order.wave(&t.cluster);
            *per_cluster.entry((wave, &t.cluster)).or_default() += 1;
            let Some(w) = status.waves.get_mut(wave) else { continue };
            w.total += 1;
            if !seen[wave] {
                seen[wave] = true;
                w.first_batch = count(index);
            }
            w.last_batch = count(index);
        }
    }
    status.members = per_cluster
        .into_iter()
        .take(CLUSTERS_LISTED)
        .map(|((wave, name), total)| ClusterCount {
            name: name.to_string(),
            wave: waves.get(wave).map(|w| w.name.clone()).unwrap_or_default(),
            total,
            ..Default::default()
        })
        .collect();
    status
}

/// The waves of a plan in one line, for the event that announces it: `canary: member-1 (batches 1-2); ...`.
pub fn describe(status: &ClustersStatus) -> String {
    let waves: Vec<String> = status
        .waves
        .iter()
        .map(|w| {
            let names: Vec<&str> =
                status.members.iter().filter(|m| m.wave == w.name).map(|m| m.name.as_str()).take(5).collect();
            let more = w.clusters.saturating_sub(count(names.len()));
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            format!(
                "{}: {}{more} ({} targets, batches {}-{})",
                w.name,
                names.join(", "),
                w.total,
                w.first_batch + 1,
                w.last_batch + 1
            )
        })
        .collect();
    format!("waves: {}", waves.join("; "))
}

/// Which count of a cluster and its wave changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    Updated,
    Failed,
}

/// How many clusters of a wave a progress line names, with their counts.
const CLUSTERS_IN_PROGRESS: usize = 5;

/// Where a rollout across member clusters stands, in one line for people and models: each wave's
/// progress with its first clusters', then the clusters in trouble.
pub fn progress(status: &ClustersStatus) -> String {
    let waves: Vec<String> = status
        .waves
        .iter()
        .map(|w| {
            let failed = if w.failed > 0 { format!(", {} failed", w.failed) } else { String::new() };
            let mut each: Vec<String> = status
                .members
                .iter()
                .filter(|m| m.wave == w.name)
                .take(CLUSTERS_IN_PROGRESS)
                .map(|m| {
                    let failed = if m.failed > 0 { format!(", {} failed", m.failed) } else { String::new() };
                    format!("{} {}/{}{failed}", m.name, m.updated, m.total)
                })
                .collect();
            let more = w.clusters.saturating_sub(count(each.len()));
            if more > 0 {
                each.push(format!("{more} more"));
            }
            let each = if each.is_empty() { String::new() } else { format!(" ({})", each.join(", ")) };
            format!("{} {}/{} updated{failed}{each}", w.name, w.updated, w.total)
        })
        .collect();
    // Before the plan is made (while planning waits for clusters) there are no waves yet.
    let mut parts = Vec::new();
    if !waves.is_empty() {
        parts.push(format!("waves: {}", waves.join("; ")));
    }
    if !status.left_out.is_empty() {
        let out: Vec<String> =
            status.left_out.iter().map(|t| format!("{} ({})", t.name, t.message)).collect();
        parts.push(format!("left out of the plan, not reachable when it was made: {}", out.join(", ")));
    }
    if !status.trouble.is_empty() {
        let trouble: Vec<String> =
            status.trouble.iter().map(|t| format!("{} ({}: {})", t.name, t.reason, t.message)).collect();
        parts.push(format!("clusters in trouble: {}", trouble.join(", ")));
    }
    parts.join("; ")
}

/// Whether batch `index` is in wave `w`. A wave without targets has no batch (status is read back from
/// the cluster: its batch range says nothing).
fn holds(w: &WaveStatus, index: u32) -> bool {
    w.total > 0 && (w.first_batch..=w.last_batch).contains(&index)
}

/// The wave batch `index` is in.
pub fn wave_of(status: &ClustersStatus, index: u32) -> Option<&WaveStatus> {
    status.waves.iter().find(|w| holds(w, index))
}

/// Adds `delta` (one per target) to a count of each target's cluster (when listed) and of the wave of
/// batch `batch` (every target of a batch is in that batch's wave).
pub fn tally<'a>(
    status: &mut ClustersStatus,
    batch: u32,
    targets: impl IntoIterator<Item = &'a str>,
    which: Count,
    delta: i32,
) {
    let add = |n: &mut u32| *n = n.saturating_add_signed(delta);
    let wave = status.waves.iter().position(|w| holds(w, batch));
    for cluster in targets {
        if let Some(member) = status.members.iter_mut().find(|m| m.name == cluster) {
            add(if which == Count::Failed { &mut member.failed } else { &mut member.updated });
        }
        if let Some(w) = wave.and_then(|i| status.waves.get_mut(i)) {
            add(if which == Count::Failed { &mut w.failed } else { &mut w.updated });
        }
    }
}

/// The clusters in trouble now, from what this step saw (`unreachable`: cluster → why), keeping the time
/// each trouble began. Capped, in name order.
pub fn trouble(
    previous: &[ClusterTrouble],
    unreachable: &BTreeMap<String, String>,
    now: k8s_openapi::jiff::Timestamp,
) -> Vec<ClusterTrouble> {
    unreachable
        .iter()
        .take(TROUBLE_LISTED)
        .map(|(name, why)| {
            let since = previous
                .iter()
                .find(|p| &p.name == name && p.reason == reason::CLUSTER_UNREACHABLE)
                .map_or_else(|| crate::api::time(now), |p| p.since.clone());
            ClusterTrouble {
                name: name.clone(),
                reason: reason::CLUSTER_UNREACHABLE.into(),
                message: crate::core::text::cut(why, 256),
                since,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
