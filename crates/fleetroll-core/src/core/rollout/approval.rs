//! The approval gate: a batch that needs one waits for an approval bound to its plan, its gates and the
//! approvers policies name (through the rollout's approver epoch), and records it once given.

use super::{Event, Facts, Step, gates::Gate, total_batches, trim_front, write_if_changed};
use crate::{
    api::{
        ApprovalMode, ApprovalRecord, ApproverEpoch, FleetRolloutStatus, HISTORY, PendingApproval, Phase,
        time,
    },
    core::{plan, policy, reason},
};

/// A batch that needs an approval waits for one bound to this plan's hash and these gates, and records it
/// once given. Once a batch was approved, a change of the gates (health, analysis, failure budget and
/// policy, the approval mode, the approvers policies name) makes the next batch wait for another approval,
/// whatever the mode says.
pub(super) fn approved(
    f: &Facts<'_>,
    s: &mut FleetRolloutStatus,
    events: &mut Vec<Event>,
    next: u32,
) -> Gate {
    let gates = plan::gates_hash(f.spec, approver_nonce(f, s));
    // A record written before approvals bound gates (no hash) binds none: its rollout goes on as approved.
    let loosened = s.approvals.last().is_some_and(|a| !a.gates_hash.is_empty() && a.gates_hash != gates);
    let mode = policy::approval_mode(f.spec.strategy.approval, f.guardrails);
    if !needs_approval(mode, next) && !loosened {
        return None;
    }
    let total = total_batches(f);
    let plan_hash = f.plan.hash.clone();
    let given = f
        .spec
        .approvals
        .iter()
        .find(|a| a.batch == next && a.plan_hash == plan_hash && a.gates_hash == gates);
    let Some(a) = given else {
        let waiting = PendingApproval {
            batch: next,
            plan_hash,
            gates_hash: gates,
            since: time(f.now),
            approvers: policy::approvers(f.guardrails),
        };
        return Some(wait_for_approval(f, s, events, waiting, loosened));
    };
    // Recorded once: a gate after this one (pacing, a change window) may hold the batch for hours, and a
    // record written again at every look would be a status write at every look.
    let recorded =
        s.approvals.iter().any(|r| r.batch == next && r.plan_hash == plan_hash && r.gates_hash == gates);
    if recorded {
        return None;
    }
    s.approvals.push(ApprovalRecord {
        batch: next,
        plan_hash,
        gates_hash: gates,
        approved_by: a.approved_by.clone(),
        approved_at: time(f.now),
    });
    trim_front(&mut s.approvals, HISTORY);
    let by = a.approved_by.as_deref().map(|w| format!(" by {w}")).unwrap_or_default();
    events.push(Event::normal(
        reason::APPROVED,
        Some(next),
        format!("batch {}/{total} approved{by}", next + 1),
    ));
    None
}

/// The nonce approvals bind: a fresh one when the approvers policies name for the rollout changed since the
/// operator last looked (named, changed, or no longer named), so that no approval written before cites it.
fn approver_nonce<'s>(f: &Facts<'_>, s: &'s mut FleetRolloutStatus) -> Option<&'s str> {
    let approvers = policy::approvers_digest(f.guardrails);
    let changed = s.approver_epoch.as_ref().map_or(!approvers.is_empty(), |e| e.approvers != approvers);
    if changed {
        s.approver_epoch = Some(ApproverEpoch { approvers, nonce: f.nonce.to_string() });
    }
    s.approver_epoch.as_ref().map(|e| e.nonce.as_str())
}

/// The batch waits for `waiting`; its event is told once, when the wait (batch, plan, gates) begins (new
/// approvers are new gates: a new wait).
fn wait_for_approval(
    f: &Facts<'_>,
    s: &mut FleetRolloutStatus,
    events: &mut Vec<Event>,
    waiting: PendingApproval,
    loosened: bool,
) -> Step {
    let same = |p: &PendingApproval| {
        (p.batch, &p.plan_hash, &p.gates_hash) == (waiting.batch, &waiting.plan_hash, &waiting.gates_hash)
    };
    match s.pending_approval.as_mut() {
        Some(p) if same(p) => p.approvers = waiting.approvers,
        _ => {
            let why = if loosened { ": its gates changed since the last approval" } else { "" };
            let by = if waiting.approvers.is_empty() {
                String::new()
            } else {
                format!(" by {}", policy::describe_approvers(&waiting.approvers))
            };
            let message = format!(
                "batch {}/{} waits for an approval of plan {} and gates {}{by}{why}",
                waiting.batch + 1,
                total_batches(f),
                waiting.plan_hash,
                waiting.gates_hash
            );
            events.push(Event::normal(reason::WAITING_FOR_APPROVAL, Some(waiting.batch), message));
            s.pending_approval = Some(waiting);
        }
    }
    s.phase = Phase::WaitingForApproval;
    s.reason = Some(reason::WAITING_FOR_APPROVAL.into());
    write_if_changed(f, s.clone(), std::mem::take(events), None)
}

fn needs_approval(mode: ApprovalMode, batch: u32) -> bool {
    match mode {
        ApprovalMode::None => false,
        ApprovalMode::FirstBatch => batch == 0,
        ApprovalMode::EveryBatch => true,
    }
}
