//! The FleetRollout status: the durable checkpoint. Everything needed to answer "where is my rollout?" and
//! to resume after a crash is here (or in the plan objects it names), and nothing else is needed.
//!
//! Sizes are bounded whatever the fleet size: per-batch history is a window, failure details are capped,
//! and large plans live in immutable child ConfigMaps.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time},
    jiff::Timestamp,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::spec::{FleetRolloutSpec, TargetKind};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// How many recent batches `status.batches` keeps.
pub const BATCH_WINDOW: usize = 16;
/// How many target failures `status.failures` keeps (the count is exact regardless).
pub const FAILURE_DETAILS: usize = 20;
/// How many superseded revisions and approval records are kept.
pub const HISTORY: usize = 10;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetRolloutStatus {
    /// The spec generation this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    #[serde(default)]
    pub phase: Phase,

    /// Why the rollout is in this phase (CamelCase, machine-readable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,

    /// A one-line summary for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// "updated/total", for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,

    /// "k/N": the batch in progress (1-based) of N, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,

    /// The revision being rolled out, stored when it was planned and never recomputed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<Revision>,

    /// Earlier revisions this rollout replaced mid-way (most recent last).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub superseded: Vec<SupersededRevision>,

    /// The frozen plan of the current revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanRef>,

    #[serde(default)]
    pub counts: Counts,

    /// Index (0-based) of the batch in progress or last finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_batch: Option<u32>,

    /// Per-batch checkpoints of the most recent batches (a window of 16; older ones are summarised in counts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batches: Vec<BatchStatus>,

    /// Details of the most recent target failures (at most 20; `counts.failed` is exact).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<TargetFailure>,

    /// The approval the rollout is waiting for, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_approval: Option<PendingApproval>,

    /// Approvals that released batches, with who gave them when known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<ApprovalRecord>,

    /// Matching targets that appeared after the plan was frozen; reported, never added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unplanned: Option<Unplanned>,

    /// Progress of a rollback, once one began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<RollbackStatus>,

    /// Progressing, Paused, Degraded, Complete.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum Phase {
    /// Not planned yet, or cannot be planned (see the Degraded condition).
    #[default]
    Pending,
    Progressing,
    Paused,
    WaitingForApproval,
    RollingBack,
    Succeeded,
    Failed,
    Aborted,
    RolledBack,
}

impl FleetRolloutStatus {
    /// The batch with this index, while status still holds it (it keeps the last [`BATCH_WINDOW`]).
    pub fn batch(&self, index: u32) -> Option<&BatchStatus> {
        self.batches.iter().find(|b| b.index == index)
    }

    pub fn batch_mut(&mut self, index: u32) -> Option<&mut BatchStatus> {
        self.batches.iter_mut().find(|b| b.index == index)
    }

    /// The batch in flight, or the last one started.
    pub fn current(&self) -> Option<&BatchStatus> {
        self.current_batch.and_then(|i| self.batch(i))
    }

    /// The number of the revision being rolled out; 0 before the first is planned.
    pub fn revision_number(&self) -> u32 {
        self.revision.as_ref().map_or(0, |r| r.number)
    }
}

impl Phase {
    pub const ALL: [Phase; 9] = [
        Phase::Pending,
        Phase::Progressing,
        Phase::Paused,
        Phase::WaitingForApproval,
        Phase::RollingBack,
        Phase::Succeeded,
        Phase::Failed,
        Phase::Aborted,
        Phase::RolledBack,
    ];

    /// Terminal phases change only when a new revision starts.
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed | Phase::Aborted | Phase::RolledBack)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Progressing => "Progressing",
            Phase::Paused => "Paused",
            Phase::WaitingForApproval => "WaitingForApproval",
            Phase::RollingBack => "RollingBack",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
            Phase::Aborted => "Aborted",
            Phase::RolledBack => "RolledBack",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The inputs that define what each target becomes and in which order. A change to any of them starts a
/// new revision; changes to anything else (health, pacing, budget, controls) apply to the running one.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevisionInputs {
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    pub kind: TargetKind,
    pub selector: LabelSelector,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    pub batch_size: IntOrString,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon_set: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
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
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Revision {
    /// 1 for the first revision, +1 for each superseding one. Part of every idempotency key.
    pub number: u32,
    /// sha256 of the canonical JSON of `inputs`, computed once when the revision was planned.
    pub spec_hash: String,
    pub inputs: RevisionInputs,
    pub started_at: Time,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SupersededRevision {
    pub number: u32,
    pub image: String,
    /// Targets it had changed when it was replaced.
    pub updated: u32,
    pub superseded_at: Time,
}

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
    pub total_targets: u32,
    pub total_batches: u32,
    pub storage: PlanStorage,
    /// The plan itself, when small enough to live in status.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batches: Vec<Vec<PlannedTarget>>,
    /// ConfigMaps (in the rollout's namespace, owned by it) holding the plan, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<String>,
}

/// One target of the plan.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedTarget {
    pub namespace: String,
    pub name: String,
    /// The container image before this rollout first changed the target.
    pub previous_image: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    /// Targets in the plan.
    #[serde(default)]
    pub total: u32,
    /// Targets changed to the revision's image.
    #[serde(default)]
    pub updated: u32,
    /// Targets verified healthy on it.
    #[serde(default)]
    pub healthy: u32,
    /// Targets that failed their health check.
    #[serde(default)]
    pub failed: u32,
    /// Targets that disappeared during the rollout (not counted as failures).
    #[serde(default)]
    pub skipped: u32,
    /// Targets left alone because the rollout may not change them now (their namespace opted out, they
    /// are protected, another running rollout holds them); `failures` says which and why. Not failures.
    #[serde(default)]
    pub refused: u32,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum BatchState {
    #[default]
    Pending,
    /// Intent recorded; targets are being changed.
    Applying,
    /// Every target changed; waiting for health (and soak).
    Verifying,
    Succeeded,
    /// More failures than the budget allowed.
    Failed,
}

/// A per-batch checkpoint.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchStatus {
    /// 0-based.
    pub index: u32,
    pub size: u32,
    pub state: BatchState,
    /// `<rollout-uid>/<revision>/<batch>`: recorded here before any target changes, and stamped on each
    /// target as the `fleetroll.dev/applied` annotation, so a replay is a no-op.
    pub idempotency_key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_at: Option<Time>,
    /// When every target of the batch was last seen healthy together (the soak clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_since: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    #[serde(default)]
    pub failed: u32,
    /// Targets (`namespace/name`) whose change the API server refused (RBAC, an admission webhook or
    /// policy): failed at once, with its message in `failures`. At most 100 are listed; any beyond fail at
    /// the health timeout instead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denied: Vec<String>,
}

/// How many denied targets a batch checkpoint lists.
pub const DENIED_LISTED: usize = 100;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetFailure {
    pub namespace: String,
    pub name: String,
    pub batch: u32,
    /// e.g. Timeout, TargetMissing, HttpCheckFailed, ProgressDeadlineExceeded, or a refusal:
    /// NamespaceNotOptedIn, OutOfScope, TargetProtected, TargetHeldByAnotherRollout
    pub reason: String,
    pub message: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingApproval {
    pub batch: u32,
    pub plan_hash: String,
    pub since: Time,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRecord {
    pub batch: u32,
    pub plan_hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    pub approved_at: Time,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Unplanned {
    pub count: u32,
    /// Up to 10 of them, as namespace/name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sample: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RollbackState {
    /// Intent recorded; previous images are being restored.
    #[default]
    Restoring,
    Done,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollbackStatus {
    pub state: RollbackState,
    /// `<rollout-uid>/<revision>/rollback`, stamped on each restored target.
    pub idempotency_key: String,
    /// Why: RollbackRequested or FailureBudgetExceeded.
    pub reason: String,
    pub started_at: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Targets whose previous image was restored.
    #[serde(default)]
    pub restored: u32,
    /// Targets that could not be restored (gone, or no such container any more).
    #[serde(default)]
    pub skipped: u32,
}

/// Converts a timestamp to the API's time type.
pub fn time(t: Timestamp) -> Time {
    Time(t)
}

/// How people read a target: `namespace/name`, or just the name of a (cluster-scoped) node.
pub fn target_key(namespace: &str, name: &str) -> String {
    if namespace.is_empty() { name.to_string() } else { format!("{namespace}/{name}") }
}
