//! A rollout as a task, whatever protocol carries it: where it stands, what it says, how often to ask
//! again, and what it waits for. Pure functions of the FleetRollout (plus, for an approval, the targets of
//! the batch waiting, which the edge reads from the frozen plan): the status in etcd is the task, so any
//! replica, after any restart, answers the same.

use k8s_openapi::jiff::Timestamp;
use kube_core::ResourceExt;
use serde::Serialize;

use crate::{
    api::{
        BatchAnalysis, ChangedByOthers, Counts, FleetRollout, FleetRolloutStatus, PendingApproval, Phase,
        PlannedTarget, TargetFailure,
    },
    core::reason::{ABORT_REQUESTED, ANALYSIS_ERROR, IMAGE_CHANGED},
};

/// How often clients should poll while a rollout runs, and while it waits for a person.
pub const POLL_WORKING_MS: u64 = 2_000;
pub const POLL_INPUT_MS: u64 = 5_000;
/// Targets an approval request names: enough to recognise the batch, short enough to read.
const TARGETS_NAMED: usize = 20;

/// What agents see of a rollout: the status, condensed.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub namespace: String,
    pub name: String,
    pub image: String,
    /// Who created it, as the API server recorded them (spec.creator), when recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub creator: Option<String>,
    pub phase: Phase,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub progress: String,
    pub batch: String,
    pub counts: Counts,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_approval: Option<PendingApproval>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<TargetFailure>,
    /// Targets of a succeeded rollout whose image someone else has changed since (its message says so too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed_by_others: Option<ChangedByOthers>,
    /// The metric analysis of the batch in flight (or last finished): counters and last measurements.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub analysis: Option<BatchAnalysis>,
    /// Across member clusters: counts per wave and per cluster, and the clusters in trouble.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clusters: Option<crate::api::ClustersStatus>,
    pub paused: bool,
}

pub fn summary(fr: &FleetRollout) -> Summary {
    let s = fr.status.clone().unwrap_or_default();
    Summary {
        namespace: fr.namespace().unwrap_or_default(),
        name: fr.name_any(),
        image: fr.spec.image.clone(),
        creator: fr.spec.creator.as_ref().map(|c| c.username.clone()),
        phase: s.phase,
        reason: s.reason.clone(),
        message: s.message.clone(),
        progress: s.progress.clone().unwrap_or_else(|| "0/0".into()),
        batch: s.batch.clone().unwrap_or_else(|| "0/0".into()),
        counts: s.counts.clone(),
        revision: s.revision.as_ref().map(|r| r.number),
        plan_hash: s.plan.as_ref().map(|p| p.hash.clone()),
        pending_approval: s.pending_approval.clone(),
        failures: s.failures.iter().rev().take(5).cloned().collect(),
        changed_by_others: s.changed_by_others.clone().filter(|_| s.phase == Phase::Succeeded),
        analysis: s.current().and_then(|b| b.analysis.clone()),
        clusters: s.clusters.clone(),
        paused: fr.spec.paused,
    }
}

/// One line for people (and models).
pub fn describe(s: &Summary) -> String {
    describe_for(s, true)
}

/// One line for whoever asks: an approval waiting is theirs to give (`may_approve`: they hold the approve
/// verb and did not create the rollout, or may approve their own), or someone else's.
pub fn describe_for(s: &Summary, may_approve: bool) -> String {
    let mut line = format!("FleetRollout {}/{} ({}): {}", s.namespace, s.name, s.image, s.phase);
    if let Some(m) = &s.message {
        line.push_str(&format!(" — {m}"));
    }
    if let Some(progress) = s.clusters.as_ref().map(crate::core::clusters::progress).filter(|p| !p.is_empty())
    {
        line.push_str(&format!(". {progress}"));
    }
    match (&s.pending_approval, may_approve) {
        (Some(p), true) => line.push_str(&format!(
            ". Batch {} waits for approval of plan {}: call approve_batch",
            p.batch + 1,
            p.plan_hash
        )),
        (Some(p), false) => line.push_str(&format!(
            ". Batch {} waits for approval of plan {} by someone who holds the approve verb on this rollout{}{}; \
             you may not give it",
            p.batch + 1,
            p.plan_hash,
            s.creator.as_ref().map(|c| format!(" and did not create it ({c} did)")).unwrap_or_default(),
            Some(&p.approvers)
                .filter(|a| !a.is_empty())
                .map(|a| format!(", and is {}", crate::core::policy::describe_approvers(a)))
                .unwrap_or_default()
        )),
        (None, _) => {}
    }
    if let Some(hold) = s.analysis.as_ref().and_then(|a| a.hold.as_ref()).filter(|_| s.phase == Phase::Paused)
    {
        line.push_str(&format!(
            ". {}: the metric analysis holds the rollout; call resume_rollout to go on anyway, or \
             abort_rollout or rollback_rollout",
            hold.reason
        ));
    }
    if s.phase == Phase::Paused && s.reason.as_deref() == Some(ANALYSIS_ERROR) {
        line.push_str(
            ". The metric analysis cannot measure (the backend is not answering, or refuses the query: see \
             the last measurement); the rollout goes on by itself at the first measurement taken",
        );
    }
    // A target someone else changed back is the one failure a person must act on elsewhere (a GitOps tool
    // re-applying its manifest, say): name it, not only count it.
    let changed: Vec<String> =
        s.failures.iter().filter(|f| f.reason == IMAGE_CHANGED).map(|f| f.key()).collect();
    if !changed.is_empty() {
        line.push_str(&format!(
            ". {IMAGE_CHANGED}: someone else changed the image of {} after fleetroll set it",
            changed.join(", ")
        ));
    }
    line
}

/// The key of the input request asking to approve `batch` of plan `plan_hash` in revision `revision`;
/// unique over the task's lifetime, as the Tasks extension requires.
pub fn approval_key(revision: u32, batch: u32, plan_hash: &str, gates_hash: &str) -> String {
    format!("approve-r{revision}-b{batch}-{plan_hash}-{gates_hash}")
}

/// (revision, batch, plan hash) of an approval key.
pub fn parse_approval_key(key: &str) -> Option<(u32, u32, String, String)> {
    let rest = key.strip_prefix("approve-r")?;
    let (revision, rest) = rest.split_once("-b")?;
    let (batch, hashes) = rest.split_once('-')?;
    let (plan, gates) = hashes.split_once('-')?;
    Some((revision.parse().ok()?, batch.parse().ok()?, plan.to_string(), gates.to_string()))
}

/// Where a rollout's task stands.
#[derive(Clone, Debug, PartialEq)]
pub enum TaskState {
    /// Running, or waiting for an approval the client cannot give through a form.
    Working,
    /// Waiting for a person to approve a batch.
    InputRequired(ApprovalRequest),
    /// Finished; `is_error` when the rollout did not do what was asked.
    Completed { is_error: bool },
    /// Aborted on request.
    Cancelled,
}

/// The question an approval form asks.
#[derive(Clone, Debug, PartialEq)]
pub struct ApprovalRequest {
    /// Unique over the task's lifetime: see [`approval_key`].
    pub key: String,
    pub message: String,
}

/// A rollout's task, before a protocol wraps it.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskView {
    pub state: TaskState,
    pub summary: Summary,
    /// One line saying where the rollout stands.
    pub message: String,
    pub created_at: Timestamp,
    pub last_updated_at: Timestamp,
    /// None: kept until deleted by hand.
    pub ttl_ms: Option<u64>,
    /// None: finished, nothing more to poll for.
    pub poll_interval_ms: Option<u64>,
}

/// The approval a rollout waits for, if it waits for one: what a form would ask about.
pub fn awaited_approval(fr: &FleetRollout) -> Option<&PendingApproval> {
    let s = fr.status.as_ref()?;
    if s.phase != Phase::WaitingForApproval {
        return None;
    }
    s.pending_approval.as_ref()
}

/// Who asks for a task, as far as its approval goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asker {
    /// The client can answer a form (elicitation).
    pub forms: bool,
    /// The caller may give the approval waiting (see [`describe_for`]).
    pub may_approve: bool,
}

/// Maps a rollout to its task for `asker`; `batch_targets`: the targets of the batch waiting for approval,
/// which the form names (the plan may live outside the status). Only a caller who may approve is asked.
///
/// | rollout | task |
/// |---|---|
/// | Pending, Progressing, Paused, RollingBack | working (the message says which) |
/// | WaitingForApproval | input required, if the caller may approve and can answer a form; else working |
/// | Succeeded | completed |
/// | Failed, RolledBack, Aborted by a failure policy | completed, as an error |
/// | Aborted on request | cancelled |
pub fn view(fr: &FleetRollout, asker: Asker, batch_targets: &[PlannedTarget], now: Timestamp) -> TaskView {
    let s = fr.status.clone().unwrap_or_default();
    let summary = summary(fr);
    let created_at = fr.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
    let state = match s.phase {
        Phase::Succeeded => TaskState::Completed { is_error: false },
        Phase::Failed | Phase::RolledBack => TaskState::Completed { is_error: true },
        Phase::Aborted if s.reason.as_deref() == Some(ABORT_REQUESTED) => TaskState::Cancelled,
        Phase::Aborted => TaskState::Completed { is_error: true },
        Phase::WaitingForApproval if asker.forms && asker.may_approve => {
            match approval_request(fr, &s, batch_targets) {
                Some(request) => TaskState::InputRequired(request),
                None => TaskState::Working,
            }
        }
        _ => TaskState::Working,
    };
    let poll_interval_ms = match state {
        TaskState::InputRequired(_) => Some(POLL_INPUT_MS),
        TaskState::Working => Some(POLL_WORKING_MS),
        TaskState::Completed { .. } | TaskState::Cancelled => None,
    };
    TaskView {
        message: describe_for(&summary, asker.may_approve),
        summary,
        state,
        created_at,
        last_updated_at: last_updated(&s, created_at),
        ttl_ms: ttl_ms(fr, &s, created_at, now),
        poll_interval_ms,
    }
}

/// The question for the pending approval, naming the first of the batch's targets.
fn approval_request(
    fr: &FleetRollout,
    s: &FleetRolloutStatus,
    batch_targets: &[PlannedTarget],
) -> Option<ApprovalRequest> {
    let pending = s.pending_approval.as_ref()?;
    let revision = s.revision_number();
    let total = s.plan.as_ref().map_or(0, |p| p.total_batches);
    let mut message = format!(
        "Approve batch {}/{total} of FleetRollout {}/{} (image {}, plan {}, gates {})?",
        pending.batch + 1,
        fr.namespace().unwrap_or_default(),
        fr.name_any(),
        fr.spec.image,
        pending.plan_hash,
        pending.gates_hash
    );
    if !batch_targets.is_empty() {
        let named: Vec<String> =
            batch_targets.iter().take(TARGETS_NAMED).map(|t| format!("{}/{}", t.namespace, t.name)).collect();
        message.push_str(&format!(" Targets: {}", named.join(", ")));
    }
    let key = approval_key(revision, pending.batch, &pending.plan_hash, &pending.gates_hash);
    Some(ApprovalRequest { key, message })
}

/// The TTL counts from creation: it covers the rollout so far plus the retention after it ends (the
/// operator deletes the rollout then). Unlimited (None) for rollouts without a TTL.
fn ttl_ms(fr: &FleetRollout, s: &FleetRolloutStatus, created: Timestamp, now: Timestamp) -> Option<u64> {
    let retention = u64::try_from(fr.spec.ttl_seconds_after_finished?).ok()?.saturating_mul(1000);
    let end = match (&s.finished_at, s.phase.is_terminal()) {
        (Some(t), true) => t.0,
        _ => now,
    };
    let elapsed = u64::try_from(end.duration_since(created).as_millis()).unwrap_or(0);
    Some(elapsed.saturating_add(retention).max(1))
}

fn last_updated(s: &FleetRolloutStatus, created: Timestamp) -> Timestamp {
    let batch_times = s.batches.iter().flat_map(|b| {
        [&b.started_at, &b.applied_at, &b.healthy_since, &b.finished_at].into_iter().flatten().map(|t| t.0)
    });
    let condition_times = s.conditions.iter().map(|c| c.last_transition_time.0);
    let others = [&s.started_at, &s.finished_at].into_iter().flatten().map(|t| t.0);
    batch_times.chain(condition_times).chain(others).fold(created, Timestamp::max)
}

#[cfg(test)]
mod tests;
