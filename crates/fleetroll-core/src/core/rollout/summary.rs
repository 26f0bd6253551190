//! What people read of a rollout: the summary fields (`progress`, `batch`, `message`) and the conditions,
//! derived from the rest of the status after every transition.

use k8s_openapi::jiff::Timestamp;

use crate::{
    api::{FleetRolloutStatus, MetricPhase, Phase},
    core::{
        Blocked,
        conditions::{self, Desired},
        reason,
    },
};

/// Derives the summary fields and conditions from the rest of the status.
pub(super) fn finish(s: &mut FleetRolloutStatus, generation: i64, now: Timestamp) {
    s.observed_generation = Some(generation);
    let total_batches = s.plan.as_ref().map_or(0, |p| p.total_batches);
    s.progress = Some(format!("{}/{}", s.counts.updated, s.counts.total));
    s.batch = Some(match s.current_batch {
        Some(i) => format!("{}/{total_batches}", i + 1),
        None => format!("0/{total_batches}"),
    });
    s.message = Some(message(s, total_batches));
    // Across member clusters, the wave of the batch in flight, so `kubectl get` shows where it is.
    let wave =
        s.clusters.as_ref().zip(s.current_batch).and_then(|(c, i)| crate::core::clusters::wave_of(c, i));
    if let (Some(w), Some(m)) = (wave, s.message.as_mut()) {
        m.push_str(&format!("; wave {} {}/{} updated", w.name, w.updated, w.total));
    }
    set_conditions(s, generation, now, None);
}

fn message(s: &FleetRolloutStatus, total_batches: u32) -> String {
    let batch = s.current_batch.map_or(0, |i| i + 1);
    let c = &s.counts;
    let tally = format!("{}/{} updated, {} healthy, {} failed", c.updated, c.total, c.healthy, c.failed);
    match s.phase {
        Phase::Pending => "waiting to be planned".into(),
        Phase::Progressing => match s.reason.as_deref() {
            Some(reason::WAITING_BETWEEN_BATCHES) => {
                format!("waiting before batch {}/{total_batches}; {tally}", batch + 1)
            }
            Some(reason::SOAKING) => format!("batch {batch}/{total_batches} soaking; {tally}"),
            Some(reason::ANALYSIS_RUNNING) => {
                format!("batch {batch}/{total_batches} analysis running{}; {tally}", analysis_progress(s))
            }
            _ if s.current_batch.is_none() => format!("planned in {total_batches} batches; {tally}"),
            _ => format!("batch {batch}/{total_batches} in progress; {tally}"),
        },
        Phase::Paused => paused(s, batch, total_batches, &tally),
        Phase::WaitingForApproval => match &s.pending_approval {
            Some(p) => {
                format!("batch {}/{total_batches} waits for approval of plan {}", p.batch + 1, p.plan_hash)
            }
            None => "waiting for approval".into(),
        },
        Phase::RollingBack => rolling_back(s),
        Phase::Succeeded => match changed_by_others(s) {
            Some(changed) => format!("succeeded: {tally}; {changed}"),
            None => format!("succeeded: {tally}"),
        },
        Phase::Failed if s.reason.as_deref() == Some(reason::ANALYSIS_FAILED) => {
            format!(
                "failed: analysis failed in batch {batch}/{total_batches}{}; {tally}",
                analysis_progress(s)
            )
        }
        Phase::Failed => format!("failed: failure budget exceeded; {tally}"),
        Phase::Aborted => format!("aborted on request; {tally}"),
        Phase::RolledBack => match &s.rollback {
            Some(rb) => format!(
                "rolled back ({}): {} targets restored, {} could not be",
                rb.reason, rb.restored, rb.skipped
            ),
            None => "rolled back".into(),
        },
    }
}

/// Why a paused rollout is paused, and what releases it.
fn paused(s: &FleetRolloutStatus, batch: u32, total_batches: u32, tally: &str) -> String {
    match s.reason.as_deref() {
        Some(reason::POLICY_VIOLATION) => match &s.policy_hold {
            Some(h) => format!(
                "held before batch {}/{total_batches} by FleetRolloutPolicy {} ({}): {}; change the spec or abort; {tally}",
                batch + 1,
                h.policy,
                h.rule,
                h.message
            ),
            None => {
                format!("held before batch {}/{total_batches} by a FleetRolloutPolicy; {tally}", batch + 1)
            }
        },
        Some(reason::OUTSIDE_WINDOW | reason::INVALID_WINDOW) => match &s.window_hold {
            Some(h) => {
                format!("batch {}/{total_batches} waits: {}; {tally}", batch + 1, super::windows::describe(h))
            }
            None => format!("batch {}/{total_batches} waits for a change window; {tally}", batch + 1),
        },
        Some(reason::CANNOT_ACT_AS_CREATOR) => format!(
            "held before batch {}/{total_batches}: fleetroll changes targets as the rollout's creator, and {}; {tally}",
            batch + 1,
            s.creator_hold.as_deref().unwrap_or("cannot act as this one")
        ),
        Some(reason::CREATOR_LACKS_RIGHTS) => format!(
            "held before batch {}/{total_batches}: changes made as the rollout's creator were refused ({}); resume once its rights are back, or abort or roll back; {tally}",
            batch + 1,
            s.rights_hold.as_ref().map_or("its rights are gone", |h| h.message.as_str())
        ),
        Some(reason::FAILURE_BUDGET_EXCEEDED) => {
            format!("paused: failure budget exceeded in batch {batch}/{total_batches}; {tally}")
        }
        Some(reason::ANALYSIS_FAILED) => {
            format!(
                "paused: analysis failed in batch {batch}/{total_batches}{}; {tally}",
                analysis_progress(s)
            )
        }
        Some(reason::ANALYSIS_INCONCLUSIVE) => format!(
            "paused: analysis inconclusive in batch {batch}/{total_batches}{}; resume, abort or roll back; {tally}",
            analysis_progress(s)
        ),
        Some(reason::ANALYSIS_ERROR) => format!(
            "paused: the metrics backend is not answering in batch {batch}/{total_batches}{}; measuring on; {tally}",
            analysis_progress(s)
        ),
        _ => format!("paused before batch {}/{total_batches}; {tally}", batch + 1),
    }
}

/// The reasons that make a rollout Degraded (ClusterUnreachable: a rollback waiting for a member cluster).
const DEGRADING: [&str; 3] =
    [reason::FAILURE_BUDGET_EXCEEDED, reason::ANALYSIS_FAILED, reason::CLUSTER_UNREACHABLE];

/// A rollback under way, in words: which member clusters it waits for, and what a person can do about it.
fn rolling_back(s: &FleetRolloutStatus) -> String {
    let Some(rb) = s.rollback.as_ref().filter(|rb| !rb.unreached.is_empty()) else {
        return format!("rolling back {} targets", s.counts.updated);
    };
    let image = s.revision.as_ref().map_or("", |r| r.inputs.image.as_str());
    format!(
        "rolling back: {} targets restored; waiting for cluster(s) {} to answer: their changed targets still \
         run {image} and are restored once they do; fix the connection or credentials of the cluster(s), or \
         delete the rollout to leave those targets as they are",
        rb.restored,
        rb.unreached.join(", ")
    )
}

pub(super) fn set_conditions(
    s: &mut FleetRolloutStatus,
    generation: i64,
    now: Timestamp,
    blocked: Option<&Blocked>,
) {
    let reason = s.reason.clone().unwrap_or_else(|| s.phase.to_string());
    let message = s.message.clone().unwrap_or_default();
    let phase = s.phase;
    let progressing = matches!(phase, Phase::Progressing | Phase::RollingBack) && blocked.is_none();
    let changed = changed_by_others(s);
    let cs = &mut s.conditions;
    conditions::set(
        cs,
        Desired {
            type_: conditions::PROGRESSING,
            status: progressing,
            reason: &reason,
            message: message.clone(),
        },
        generation,
        now,
    );
    let paused = matches!(phase, Phase::Paused | Phase::WaitingForApproval);
    conditions::set(
        cs,
        Desired {
            type_: conditions::PAUSED,
            status: paused,
            reason: if paused { &reason } else { "NotPaused" },
            message: if paused { message.clone() } else { String::new() },
        },
        generation,
        now,
    );
    let (degraded, degraded_reason, degraded_message) = match (blocked, changed.clone()) {
        (Some(b), _) => (true, b.reason.to_string(), b.message.clone()),
        (None, _) if DEGRADING.contains(&reason.as_str()) => (true, reason.clone(), message.clone()),
        (None, Some(changed)) => (true, reason::IMAGE_CHANGED.to_string(), changed),
        (None, None) => (false, "AsExpected".to_string(), String::new()),
    };
    conditions::set(
        cs,
        Desired {
            type_: conditions::DEGRADED,
            status: degraded,
            reason: &degraded_reason,
            message: degraded_message,
        },
        generation,
        now,
    );
    let complete = phase == Phase::Succeeded;
    conditions::set(
        cs,
        Desired {
            type_: conditions::COMPLETE,
            status: complete,
            reason: if complete { reason::SUCCEEDED } else { phase.as_str() },
            message: if complete { message } else { String::new() },
        },
        generation,
        now,
    );
    set_gitops_conditions(s, generation, now, blocked, changed);
}

/// How GitOps tools are to judge a rollout: kstatus (Flux `wait`, `dependsOn` and health checks, kpt,
/// cli-utils appliers) reads only the `Ready`, `Reconciling` and `Stalled` conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GitOpsState {
    /// Done: every target carries the image (kstatus Current).
    Current,
    /// Not done, nothing wrong: it goes on by itself or after someone acts (kstatus InProgress).
    InProgress,
    /// It stopped short and will not go on without a change (kstatus Failed).
    Failed,
}

/// The kstatus verdict on a rollout. Paused and WaitingForApproval are InProgress: nothing is wrong and the
/// rollout goes on once someone resumes or approves it, so a Flux `wait` or `dependsOn` must not go ahead
/// (Current) and must not report a failure either; its timeout is what says a person is needed. A pause
/// the failure budget or a failed analysis forced is Failed: nothing happens until someone decides. A
/// pause for an inconclusive analysis or a metrics outage is InProgress: nothing says the image is bad.
/// A succeeded rollout some of whose targets someone else has changed since is Failed too: what it
/// promised no longer holds, and the operator will not undo someone else's change; so is one asked to roll
/// back when the rollback cannot run (this installation does not serve it, or its plan is refused).
pub fn gitops_state(
    phase: Phase,
    reason: Option<&str>,
    blocked: bool,
    changed_by_others: bool,
) -> GitOpsState {
    match phase {
        // Its targets changed by someone else, or a rollback asked of it that cannot run.
        Phase::Succeeded if changed_by_others || blocked => GitOpsState::Failed,
        Phase::Succeeded => GitOpsState::Current,
        Phase::Failed | Phase::Aborted | Phase::RolledBack => GitOpsState::Failed,
        Phase::Pending if blocked => GitOpsState::Failed,
        Phase::Paused
            if matches!(
                reason,
                Some(reason::FAILURE_BUDGET_EXCEEDED | reason::ANALYSIS_FAILED | reason::INVALID_WINDOW)
            ) =>
        {
            GitOpsState::Failed
        }
        Phase::Pending
        | Phase::Progressing
        | Phase::RollingBack
        | Phase::Paused
        | Phase::WaitingForApproval => GitOpsState::InProgress,
    }
}

fn set_gitops_conditions(
    s: &mut FleetRolloutStatus,
    generation: i64,
    now: Timestamp,
    blocked: Option<&Blocked>,
    changed: Option<String>,
) {
    let (reason, message) = match (blocked, &changed) {
        (Some(b), _) => (b.reason.to_string(), b.message.clone()),
        (None, Some(changed)) => (reason::IMAGE_CHANGED.to_string(), changed.clone()),
        (None, None) => {
            (s.reason.clone().unwrap_or_else(|| s.phase.to_string()), s.message.clone().unwrap_or_default())
        }
    };
    let state = gitops_state(s.phase, s.reason.as_deref(), blocked.is_some(), changed.is_some());
    let at_rest = s.phase.as_str();
    for (type_, on) in [
        (conditions::READY, state == GitOpsState::Current),
        (conditions::RECONCILING, state == GitOpsState::InProgress),
        (conditions::STALLED, state == GitOpsState::Failed),
    ] {
        // Ready carries the rollout's reason either way; the abnormal-true two only while true.
        let told = on || type_ == conditions::READY;
        let desired = Desired {
            type_,
            status: on,
            reason: if told { &reason } else { at_rest },
            message: if told { message.clone() } else { String::new() },
        };
        conditions::set(&mut s.conditions, desired, generation, now);
    }
}

/// What `status.changedByOthers` says, in words, for a succeeded rollout.
fn changed_by_others(s: &FleetRolloutStatus) -> Option<String> {
    let changed = s.changed_by_others.as_ref().filter(|_| s.phase == Phase::Succeeded)?;
    let image = s.revision.as_ref().map_or("", |r| r.inputs.image.as_str());
    Some(super::drift::message(changed.count, image, &changed.sample))
}

/// The batch in flight's metrics, in words: " (error-rate 2/4, latency Failed)"; empty without analysis.
fn analysis_progress(s: &FleetRolloutStatus) -> String {
    let Some(a) = s.current().and_then(|b| b.analysis.as_ref()) else { return String::new() };
    let parts: Vec<String> = a
        .metrics
        .iter()
        .map(|r| {
            let dry = if r.dry_run { ", dry run" } else { "" };
            match r.phase {
                MetricPhase::Running => format!("{} {} taken{dry}", r.name, crate::core::analysis::taken(r)),
                phase => format!("{} {}{dry}", r.name, phase.as_str()),
            }
        })
        .collect();
    if parts.is_empty() { String::new() } else { format!(" ({})", parts.join(", ")) }
}
