//! The revision a rollout rolls out and its frozen plan, as recorded in status: what each target becomes,
//! in which batch, and what it had before (for a rollback). Written once when a revision is planned.

use k8s_openapi::apimachinery::pkg::{
    apis::meta::v1::{LabelSelector, Time},
    util::intstr::IntOrString,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    clusters::{ClusterTargets, Wave},
    spec::{FleetRolloutSpec, TargetKind},
};

/// The inputs that define what each target becomes and in which order. A change to any of them starts a
/// new revision; changes to anything else (health, pacing, budget, controls) apply to the running one.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevisionInputs {
    /// spec.image when the revision was planned.
    pub image: String,
    /// spec.container when the revision was planned; unset when the targets' only container was meant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// spec.targets.kind when the revision was planned.
    pub kind: TargetKind,
    /// spec.targets.selector when the revision was planned.
    pub selector: LabelSelector,
    /// spec.targets.namespaceSelector when the revision was planned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// spec.strategy.batchSize when the revision was planned: a count or a percentage ("25%").
    pub batch_size: IntOrString,
    /// spec.strategy.steps when the revision was planned: counts or percentages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<IntOrString>,
    /// spec.targets.daemonSet when the revision was planned (kind Node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon_set: Option<String>,
    /// spec.targets.nodeSelector when the revision was planned (kind Node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// spec.targets.clusters when the revision was planned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusters: Option<ClusterTargets>,
    /// spec.strategy.waves when the revision was planned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub waves: Vec<Wave>,
}

impl RevisionInputs {
    pub fn of(spec: &FleetRolloutSpec) -> Self {
        Self {
            image: spec.image.clone(),
            container: spec.container.clone(),
            kind: spec.targets.kind,
            selector: spec.targets.selector.clone(),
            namespace_selector: spec.targets.namespace_selector.clone(),
            batch_size: spec.strategy.batch_size.clone(),
            steps: spec.strategy.steps.clone(),
            daemon_set: spec.targets.daemon_set.clone(),
            node_selector: spec.targets.node_selector.clone(),
            clusters: spec.targets.clusters.clone(),
            waves: spec.strategy.waves.clone(),
        }
    }
}

/// A revision: one set of inputs rolled out under one frozen plan.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Revision {
    /// 1 for the first revision, +1 for each superseding one. Part of every idempotency key.
    pub number: u32,
    /// sha256 of the canonical JSON of `inputs`, computed once when the revision was planned.
    pub spec_hash: String,
    /// The spec fields this revision was planned from. A spec that differs in any of them starts a new
    /// revision; the others (health, pacing, budget, controls) apply to this one.
    pub inputs: RevisionInputs,
    /// When this revision was planned (RFC 3339).
    pub started_at: Time,
}

/// A revision replaced by a newer one before it finished.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SupersededRevision {
    /// Its revision number (status.revision.number at the time).
    pub number: u32,
    /// The image it was rolling out.
    pub image: String,
    /// Targets it had changed when it was replaced.
    pub updated: u32,
    /// When it was replaced (RFC 3339).
    pub superseded_at: Time,
}

/// Where the frozen plan is kept.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PlanStorage {
    /// The plan is in `status.plan.batches`.
    #[default]
    Status,
    /// The plan is in the immutable ConfigMaps named in `status.plan.shards`.
    ConfigMaps,
}

/// The frozen plan: which target is in which batch, and each target's previous image (for rollback).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanRef {
    /// Identifies this exact plan; approvals must cite it.
    pub hash: String,
    /// How many targets the plan holds (the fleet when it was frozen).
    pub total_targets: u32,
    /// How many batches the plan cuts them into.
    pub total_batches: u32,
    /// Where the plan is kept: Status (in `batches` here) or ConfigMaps (in `shards`, when too large for
    /// status).
    pub storage: PlanStorage,
    /// The plan itself, when small enough to live in status: one list of targets per batch, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batches: Vec<Vec<PlannedTarget>>,
    /// ConfigMaps (in the rollout's namespace, owned by it) holding the plan, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<String>,
}

/// One target of the plan.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedTarget {
    /// The member cluster the target is in; empty for the cluster the rollout lives in.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster: String,
    /// The target's namespace; empty for a node.
    pub namespace: String,
    /// The target's name: the workload, or the node.
    pub name: String,
    /// The container image before this rollout first changed the target.
    pub previous_image: String,
}

impl PlannedTarget {
    /// How people (and status lists) name the target: `namespace/name`, `cluster/namespace/name` in a member
    /// cluster, or a node's name.
    pub fn key(&self) -> String {
        super::status::target_key_in(&self.cluster, &self.namespace, &self.name)
    }
}
