//! Member clusters: the spec that picks them and orders them in waves, and the bounded summary status keeps
//! of them. Members are not registered here: they are the Argo CD cluster Secrets and Cluster API kubeconfig
//! Secrets in the operator's fleet namespace (see `edge::members`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube_derive::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The name of the wave that holds the clusters no wave of `strategy.waves` selects; it always comes last.
/// Parentheses keep it apart from any wave a person names.
pub const UNASSIGNED_WAVE: &str = "(unassigned)";
/// How many clusters `status.clusters.members` lists (the wave counts cover every cluster).
pub const CLUSTERS_LISTED: usize = 200;
/// How many clusters in trouble `status.clusters.trouble` lists.
pub const TROUBLE_LISTED: usize = 10;

/// Which member clusters a rollout reaches.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct ClusterTargets {
    /// Label selector on the member clusters: the labels of an Argo CD cluster Secret, or of the Cluster
    /// API `Cluster` whose kubeconfig Secret names it. Empty: every member cluster of the fleet namespace.
    #[serde(default)]
    pub selector: LabelSelector,
}

/// A wave of member clusters: every batch of a wave finishes before the next wave starts.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct Wave {
    /// The wave's name, e.g. canary or eu; a DNS label.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("a wave name must be a DNS label: lower-case letters, digits and '-', such as canary or eu-west"))]
    pub name: String,

    /// The member clusters of this wave, by their labels. A cluster belongs to the first wave that selects
    /// it; clusters no wave selects form a last wave, "(unassigned)". Empty: every cluster not taken yet.
    #[serde(default)]
    pub cluster_selector: LabelSelector,

    /// How many clusters of this wave one batch may reach, at least 1. Unset: no limit (a batch may span
    /// every cluster of the wave).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_concurrency: Option<u32>,
}

/// Where a rollout stands in each wave and member cluster: counts only, so that it stays small however large
/// the fleet (the per-target detail is in the plan).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClustersStatus {
    /// Every wave of the plan, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waves: Vec<WaveStatus>,
    /// Counts per member cluster, in plan order (at most 200 listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<ClusterCount>,
    /// Member clusters in trouble now: not answering, or refusing the operator's credentials (at most 10
    /// listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trouble: Vec<ClusterTrouble>,
    /// Member clusters the selector picked but the plan left out: they did not answer when it was made,
    /// nor in the health timeout planning waited for them (at most 10 listed). Their targets are not changed by this revision; change the spec (or
    /// recreate the rollout) to plan again once they answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<ClusterTrouble>,
    /// Since when planning has waited for picked member clusters that do not answer (they are in
    /// `trouble`). It waits up to health.timeout, then plans without them and lists them in `leftOut`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planning_since: Option<Time>,
}

/// One wave of the plan and how far it is.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaveStatus {
    /// The wave's name from strategy.waves, or "(unassigned)".
    pub name: String,
    /// The batches (0-based, inclusive) the wave spans.
    pub first_batch: u32,
    /// The last batch of the wave.
    pub last_batch: u32,
    /// How many member clusters it reaches.
    pub clusters: u32,
    /// Targets in the wave.
    pub total: u32,
    /// Targets changed so far.
    pub updated: u32,
    /// Targets failed so far.
    pub failed: u32,
}

/// One member cluster and how far its targets are.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCount {
    /// The member cluster's name.
    pub name: String,
    /// The wave it belongs to.
    pub wave: String,
    /// Its targets in the plan.
    pub total: u32,
    /// Its targets changed so far.
    pub updated: u32,
    /// Its targets failed so far (ClusterUnreachable among them).
    pub failed: u32,
}

/// A member cluster in trouble.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterTrouble {
    /// The member cluster's name.
    pub name: String,
    /// ClusterUnreachable: no answer, or its credentials refused.
    pub reason: String,
    /// What happened, for people.
    pub message: String,
    /// Since when (RFC 3339).
    pub since: Time,
}
