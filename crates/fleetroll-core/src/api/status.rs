//! The FleetRollout status: the durable checkpoint. Everything needed to answer "where is my rollout?" and
//! to resume after a crash is here (or in the plan objects it names), and nothing else is needed.
//!
//! Sizes are bounded whatever the fleet size: per-batch history is a window, failure details are capped,
//! and large plans live in immutable child ConfigMaps.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    analysis::BatchAnalysis,
    approvals::{ApprovalRecord, ApproverEpoch, PendingApproval},
    clusters::ClustersStatus,
    revision::{PlanRef, Revision, SupersededRevision},
};

/// How many recent batches `status.batches` keeps.
pub const BATCH_WINDOW: usize = 16;
/// How many target failures `status.failures` keeps (the count is exact regardless).
pub const FAILURE_DETAILS: usize = 20;
/// How many superseded revisions and approval records are kept.
pub const HISTORY: usize = 10;

/// Where the rollout is, written by the operator only: the durable checkpoint it resumes from after a
/// restart.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetRolloutStatus {
    /// The spec generation (metadata.generation) this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Where the rollout is: Pending (not planned yet, or cannot be planned: see the Degraded condition),
    /// Progressing, Paused (by spec.paused or an exceeded failure budget), WaitingForApproval, RollingBack,
    /// or one of the final phases Succeeded, Failed, Aborted, RolledBack.
    #[serde(default)]
    pub phase: Phase,

    /// Why the rollout is in this phase, machine-readable (CamelCase), e.g. Soaking, PausedBySpec,
    /// FailureBudgetExceeded, NoTargets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,

    /// A one-line summary for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// "updated/total" targets, e.g. "12/40", for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,

    /// "k/N": the batch in progress (1-based) of N batches, e.g. "2/5", for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,

    /// The revision being rolled out, stored when it was planned and never recomputed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<Revision>,

    /// Earlier revisions this rollout replaced mid-way, most recent last (the last 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub superseded: Vec<SupersededRevision>,

    /// The frozen plan of the current revision: which target is in which batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanRef>,

    /// How many targets of the plan are updated, healthy, failed, skipped or refused.
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

    /// Who may approve, as the operator last saw FleetRolloutPolicies name them, and the nonce the gates of
    /// an approval bind since; absent while no policy has named approvers for this rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approver_epoch: Option<ApproverEpoch>,

    /// The platform policy (FleetRolloutPolicy) that holds the next batch, if one does: the planned rollout
    /// breaks it. Gone once the spec or the policy changes so that it no longer does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_hold: Option<super::PolicyHold>,

    /// The change window that holds the next batch, if one does (spec.strategy.windows, a
    /// FleetRolloutPolicy's windows), and when every window next allows it. Gone once the batch may start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_hold: Option<super::WindowHold>,

    /// Batches started outside their change windows because someone who may approve overrode them
    /// (spec.approvals[].overrideWindows): who, when, and what they overrode (the last 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub window_overrides: Vec<super::WindowOverride>,

    /// Why the operator, which changes targets as the rollout's creator, cannot act as this one (never
    /// recorded, or not one Kubernetes lets anyone impersonate): every batch waits while it says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub creator_hold: Option<String>,

    /// Set when the API server refused a change made as the creator (its rights are gone): the batches
    /// after it wait for a person to resume the rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rights_hold: Option<super::RightsHold>,

    /// Approvals that released batches, with who gave them when known (the last 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<ApprovalRecord>,

    /// Matching targets that appeared after the plan was frozen; reported, never added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unplanned: Option<Unplanned>,

    /// Targets of a succeeded rollout whose image someone else has changed since fleetroll set it (a
    /// GitOps tool re-applying Git, say); recounted whenever one of its targets changes, gone once none is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_by_others: Option<ChangedByOthers>,

    /// Progress of a rollback, once one began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<RollbackStatus>,

    /// A rollout across member clusters (targets.clusters): counts per wave and per cluster, and the
    /// clusters in trouble.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusters: Option<ClustersStatus>,

    /// Notifications not yet delivered to every subscription (at most 32; older ones are dropped, and
    /// counted, beyond that).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notifications: Option<super::Outbox>,

    /// For people: Progressing, Paused, Degraded (the rollout cannot go on without help, or targets were
    /// changed by others since it succeeded) and Complete. For GitOps tools (kstatus): Ready (True once
    /// succeeded), Reconciling (True while it goes on, or waits for someone) and Stalled (True when it
    /// stopped short and will not go on by itself).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// When the rollout first started (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,

    /// When the rollout reached a final phase (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
}

/// Where a rollout is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum Phase {
    /// Not planned yet, or cannot be planned (see the Degraded condition).
    #[default]
    Pending,
    /// A batch is being applied or verified, or the next one is due.
    Progressing,
    /// Held before the next batch: by `spec.paused`, or because the failure budget was exceeded.
    Paused,
    /// The next batch waits for an approval in `spec.approvals`.
    WaitingForApproval,
    /// Previous images are being restored.
    RollingBack,
    /// Every batch succeeded.
    Succeeded,
    /// Stopped: the failure budget was exceeded and `onFailure` is Abort.
    Failed,
    /// Stopped by `spec.abort`.
    Aborted,
    /// Previous images were restored.
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

/// Target counts of the current revision's plan.
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

/// Where a batch is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum BatchState {
    /// Not started.
    #[default]
    Pending,
    /// Intent recorded; targets are being changed.
    Applying,
    /// Every target changed; waiting for health (and soak).
    Verifying,
    /// Every target healthy (and soaked), within the failure budget.
    Succeeded,
    /// More failures than the budget allowed.
    Failed,
}

/// A per-batch checkpoint.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchStatus {
    /// The batch's index, 0-based (status.batch shows it 1-based).
    pub index: u32,
    /// How many targets the batch holds.
    pub size: u32,
    /// Pending, Applying (targets are being changed), Verifying (waiting for health and soak), Succeeded,
    /// or Failed (more failures than the budget allowed).
    pub state: BatchState,
    /// `<rollout-uid>/<revision>/<batch>`: recorded here before any target changes, and stamped on each
    /// target as the `fleetroll.dev/applied` annotation, so a replay is a no-op.
    pub idempotency_key: String,
    /// When the batch started (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When every target of the batch had been changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_at: Option<Time>,
    /// Since when every target of the batch has been healthy together (the soak clock; RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_since: Option<Time>,
    /// When the batch succeeded or failed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// How many of the batch's targets failed.
    #[serde(default)]
    pub failed: u32,
    /// The batch's metric analysis, once its targets were healthy together (spec.analysis).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<BatchAnalysis>,
    /// Targets (`namespace/name`) whose change the API server refused (RBAC, an admission webhook or
    /// policy): failed at once, with its message in `failures`. At most 100 are listed; any beyond fail at
    /// the health timeout instead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denied: Vec<String>,
    /// Targets (`namespace/name`) the batch left alone: the scope rules refused them when it started, or
    /// another rollout, still running, had changed them first when it came to change them. Each is
    /// refused then, once (in `failures` with its reason, counted in `counts.refused`), and never awaited
    /// or judged afterwards, whatever becomes of the other rollout. At most 100 are listed; any beyond are
    /// judged when the batch settles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<String>,
    /// Member clusters the batch's change could not reach yet (unreachable, or credentials refused): their
    /// targets are changed, with the same key, once the cluster answers, or fail as ClusterUnreachable at
    /// the health timeout.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreached: Vec<String>,
}

/// How many denied targets a batch checkpoint lists.
pub const DENIED_LISTED: usize = 100;

/// The most bytes of a target failure's message status keeps (the operator cuts longer ones).
pub const FAILURE_MESSAGE_MAX: usize = 512;

/// A target that failed, or that the rollout refused to change.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetFailure {
    /// The member cluster the target is in; empty for the cluster the rollout lives in.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster: String,
    /// The target's namespace; empty for a node.
    pub namespace: String,
    /// The target's name: the workload, or the node.
    pub name: String,
    /// The index (0-based) of the batch it was in.
    pub batch: u32,
    /// e.g. Timeout, TargetMissing, HttpCheckFailed, ProgressDeadlineExceeded, or a refusal:
    /// NamespaceNotOptedIn, OutOfScope, TargetProtected, TargetHeldByAnotherRollout.
    pub reason: String,
    /// What happened, for people (at most FAILURE_MESSAGE_MAX bytes).
    pub message: String,
}

/// Matching targets that appeared after the plan was frozen.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Unplanned {
    /// How many there are.
    pub count: u32,
    /// Up to 10 of them, as namespace/name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sample: Vec<String>,
}

/// The targets of a succeeded rollout that no longer carry its image.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangedByOthers {
    /// How many there are.
    pub count: u32,
    /// Up to 10 of them, as `namespace/name: image they carry now`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sample: Vec<String>,
}

/// Where a rollback is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RollbackState {
    /// Intent recorded; previous images are being restored.
    #[default]
    Restoring,
    /// Every target restored, or skipped.
    Done,
}

/// A rollback: restoring every changed target's previous image.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollbackStatus {
    /// Restoring (previous images are being restored) or Done.
    pub state: RollbackState,
    /// `<rollout-uid>/<revision>/rollback`, stamped on each restored target.
    pub idempotency_key: String,
    /// Why: RollbackRequested or FailureBudgetExceeded.
    pub reason: String,
    /// When the rollback began (RFC 3339).
    pub started_at: Time,
    /// When the rollback was done (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Targets whose previous image was restored.
    #[serde(default)]
    pub restored: u32,
    /// Targets that could not be restored (gone, or no such container any more).
    #[serde(default)]
    pub skipped: u32,
    /// Member clusters that did not answer, whose changed targets still run the rollout's image: they are
    /// restored once each answers, and the rollback is done only then.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreached: Vec<String>,
}

/// Converts a timestamp to the API's time type.
pub fn time(t: Timestamp) -> Time {
    Time(t)
}

/// How people read a target: `namespace/name`, or just the name of a (cluster-scoped) node.
pub fn target_key(namespace: &str, name: &str) -> String {
    if namespace.is_empty() { name.to_string() } else { format!("{namespace}/{name}") }
}

/// How people read a target that may be in a member cluster: `cluster/namespace/name` there.
pub fn target_key_in(cluster: &str, namespace: &str, name: &str) -> String {
    let key = target_key(namespace, name);
    if cluster.is_empty() { key } else { format!("{cluster}/{key}") }
}

impl TargetFailure {
    /// How people read the target: see [`target_key_in`].
    pub fn key(&self) -> String {
        target_key_in(&self.cluster, &self.namespace, &self.name)
    }
}
