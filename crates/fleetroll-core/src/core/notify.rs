//! Notifications as functions of a status change. What a transition tells (a rollout started, a batch
//! waits for approval or failed, batches are held, the rollout ended, others changed its targets) is read
//! off the status before and after it, and written to the outbox in the same status write: a transition
//! that is written has its notifications written, one that loses a race has neither, and replaying it
//! cannot record them twice. Delivery reads the outbox and sends each notification to every
//! subscription still owed it; what was delivered is taken out by the next status write.
//!
//! The state machine never touches the outbox: [`record`] carries it over from the status read, so no
//! transition can drop it.

pub mod deletion;

use std::collections::BTreeSet;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

use crate::{
    api::{
        BatchState, FleetRolloutSpec, FleetRolloutStatus, Notification, NotificationKind, OUTBOX_MAX, Outbox,
        Phase, Subscription,
    },
    core::{policy::Guardrails, reason, text},
};

/// The longest message a notification carries, in bytes.
pub const MESSAGE_MAX: usize = 1024;

/// Reasons a running rollout waits for until something changes: a window, a policy, the failure budget,
/// the analysis, the creator's rights, member clusters that do not answer (a pause asked for in the spec
/// is not news to whoever asked).
const HOLDS: [&str; 10] = [
    reason::OUTSIDE_WINDOW,
    reason::INVALID_WINDOW,
    reason::POLICY_VIOLATION,
    reason::FAILURE_BUDGET_EXCEEDED,
    reason::ANALYSIS_FAILED,
    reason::ANALYSIS_INCONCLUSIVE,
    reason::ANALYSIS_ERROR,
    reason::CANNOT_ACT_AS_CREATOR,
    reason::CREATOR_LACKS_RIGHTS,
    reason::WAITING_FOR_CLUSTERS,
];

/// A subscription with the key its deliveries are tracked by: `rollout/<name>` or
/// `policy/<policy>/<name>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscriber<'a> {
    pub key: String,
    /// The policy whose subscription it is (its Secret is in the operator's namespace); None: the
    /// rollout's own (its Secret is in the rollout's namespace).
    pub policy: Option<&'a str>,
    pub subscription: &'a Subscription,
}

impl Subscriber<'_> {
    fn hears(&self, kind: NotificationKind) -> bool {
        self.subscription.events.is_empty() || self.subscription.events.contains(&kind)
    }
}

/// Every subscription a rollout's notifications go to: its own, then those of the policies that govern it.
pub fn subscribers<'a>(spec: &'a FleetRolloutSpec, guardrails: &'a Guardrails) -> Vec<Subscriber<'a>> {
    let own = spec.notify.iter().map(|s| Subscriber {
        key: format!("rollout/{}", s.name),
        policy: None,
        subscription: s,
    });
    let platform = guardrails.notify.iter().flat_map(|(policy, subs)| {
        subs.iter().map(move |s| Subscriber {
            key: format!("policy/{policy}/{}", s.name),
            policy: Some(policy.as_str()),
            subscription: s,
        })
    });
    own.chain(platform).collect()
}

/// Whether a delivery key is a platform's subscription (a FleetRolloutPolicy's), not the rollout's own:
/// those are delivered in a pool of their own, which the tenants' subscriptions cannot fill.
pub fn is_platform(key: &str) -> bool {
    key.starts_with("policy/")
}

/// The subscriber a delivery key names, if it still subscribes.
pub fn subscriber<'a>(all: &'a [Subscriber<'a>], key: &str) -> Option<&'a Subscriber<'a>> {
    all.iter().find(|s| s.key == key)
}

/// What a transition tells, before it is given an id and its subscribers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Happening {
    pub kind: NotificationKind,
    pub batch: Option<u32>,
    pub reason: String,
    pub message: String,
}

/// Who started the rollout and over which interface, for the Started notification.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Origin<'a> {
    /// The rollout's `namespace/name`.
    pub rollout: &'a str,
    /// Whether it was created over MCP (it carries a task's annotations).
    pub over_mcp: bool,
}

/// What happened between `before` and `after`, in the order a reader would tell it.
pub fn happened(
    spec: &FleetRolloutSpec,
    origin: Origin,
    before: &FleetRolloutStatus,
    after: &FleetRolloutStatus,
) -> Vec<Happening> {
    let mut told = Vec::new();
    let mut tell = |kind, batch, reason: &str, message: String| {
        told.push(Happening { kind, batch, reason: reason.into(), message: text::cut(&message, MESSAGE_MAX) })
    };
    if let Some(revision) = &after.revision
        && before.revision.as_ref().is_none_or(|r| r.number != revision.number)
    {
        tell(NotificationKind::Started, None, reason::PLANNED, started(spec, origin, revision.number, after));
    }
    for b in &after.batches {
        let was = before.batch(b.index).map(|b| b.state);
        if b.state == BatchState::Failed && was != Some(BatchState::Failed) {
            let message =
                format!("batch {} failed: {} of its {} targets failed", b.index + 1, b.failed, b.size);
            tell(NotificationKind::BatchFailed, Some(b.index), reason::BATCH_FAILED, message);
        }
    }
    if let Some(p) = &after.pending_approval
        && before.pending_approval.as_ref().is_none_or(|q| (q.batch, &q.plan_hash) != (p.batch, &p.plan_hash))
    {
        tell(
            NotificationKind::WaitingForApproval,
            Some(p.batch),
            reason::WAITING_FOR_APPROVAL,
            waiting(origin, after),
        );
    }
    let reason = after.reason.as_deref().unwrap_or_default();
    let holding = !after.phase.is_terminal() && after.phase != Phase::RollingBack;
    if HOLDS.contains(&reason) && holding && before.reason.as_deref() != Some(reason) {
        tell(NotificationKind::Held, after.current_batch, reason, message(after));
    }
    let ended = |phase| after.phase == phase && before.phase != phase;
    for (phase, kind) in [
        (Phase::Succeeded, NotificationKind::Succeeded),
        (Phase::Failed, NotificationKind::Failed),
        (Phase::RolledBack, NotificationKind::RolledBack),
        (Phase::Aborted, NotificationKind::Aborted),
    ] {
        if ended(phase) {
            tell(kind, None, reason, message(after));
        }
    }
    let changed = |s: &FleetRolloutStatus| s.changed_by_others.as_ref().map_or(0, |c| c.count);
    if changed(after) > changed(before) {
        tell(NotificationKind::ChangedByOthers, None, reason::IMAGE_CHANGED, message(after));
    }
    told
}

fn message(status: &FleetRolloutStatus) -> String {
    status.message.clone().unwrap_or_default()
}

fn started(spec: &FleetRolloutSpec, origin: Origin, revision: u32, after: &FleetRolloutStatus) -> String {
    let who = spec.creator.as_ref().map_or("someone unrecorded", |c| c.username.as_str());
    let over = match origin.over_mcp {
        true => "MCP",
        false => "the Kubernetes API (kubectl, the plugin or GitOps)",
    };
    format!(
        "{who} started revision {revision} of {} over {over}: {} to {} targets",
        origin.rollout, spec.image, after.counts.total,
    )
}

fn waiting(origin: Origin, after: &FleetRolloutStatus) -> String {
    let (namespace, name) = origin.rollout.split_once('/').unwrap_or(("", origin.rollout));
    let who: Vec<String> = after
        .pending_approval
        .iter()
        .flat_map(|p| &p.approvers)
        .map(|a| {
            let names: Vec<&str> =
                a.users.iter().map(String::as_str).chain(a.groups.iter().map(String::as_str)).collect();
            format!("one of {} ({})", names.join(", "), a.policy)
        })
        .collect();
    let who = match who.is_empty() {
        true => "anyone who holds the approve verb, but its creator".to_string(),
        false => who.join(" and "),
    };
    format!(
        "{}; it may be approved by {who}: kubectl fleetroll approve -n {namespace} {name}, or the MCP tool \
         approve_batch with namespace {namespace} and name {name}",
        message(after)
    )
}

/// Writes what happened between `before` and `after` to `after`'s outbox, each notification owed to the
/// subscribers that hear its kind, and takes out what `delivered` (id and subscriber key) says has been
/// delivered. The outbox is `before`'s: the state machine's copy is ignored.
pub fn record(
    uid: &str,
    happenings: Vec<Happening>,
    before: &FleetRolloutStatus,
    after: &mut FleetRolloutStatus,
    subscribers: &[Subscriber],
    delivered: &BTreeSet<(String, String)>,
    now: Timestamp,
) {
    let mut outbox = before.notifications.clone().unwrap_or_default();
    acknowledge(&mut outbox, delivered, subscribers);
    let revision = after.revision_number();
    for h in happenings {
        let to: Vec<String> = subscribers.iter().filter(|s| s.hears(h.kind)).map(|s| s.key.clone()).collect();
        if to.is_empty() {
            continue;
        }
        let id = format!("{uid}/{revision}/{}", outbox.next);
        outbox.next += 1;
        outbox.pending.push(Notification {
            id,
            kind: h.kind,
            at: Time(now),
            revision: Some(revision),
            batch: h.batch,
            reason: h.reason,
            message: h.message,
            to,
        });
    }
    // Full: the oldest go first, those owed to the platform last, so that a tenant who makes many events
    // cannot push out one a platform subscription is owed; and one the platform is owed is never dropped
    // unsaid: it is folded into a notice of the gap, first in the outbox, owed to the platform.
    while outbox.pending.len() > OUTBOX_MAX {
        outbox.dropped += 1;
        match outbox.pending.iter().position(|n| !owed_to_platform(n)) {
            Some(oldest) => drop(outbox.pending.remove(oldest)),
            None => fold_into_gap(&mut outbox.pending),
        }
    }
    after.notifications = (outbox != Outbox::default()).then_some(outbox);
}

fn owed_to_platform(n: &Notification) -> bool {
    n.to.iter().any(|key| key.starts_with("policy/"))
}

/// Drops the oldest notification but the notice of a gap at the front, folding it into that notice (made
/// in its place if there is none): what the platform's subscriptions were owed, and which ids they lost.
fn fold_into_gap(pending: &mut Vec<Notification>) {
    let gap = pending.first().is_some_and(|n| n.reason == reason::NOTIFICATIONS_DROPPED);
    let lost = pending.remove(usize::from(gap));
    let (first, mut to) = match gap {
        true => (pending[0].id.trim_end_matches("/dropped").to_string(), std::mem::take(&mut pending[0].to)),
        false => (lost.id.clone(), Vec::new()),
    };
    to.extend(lost.to.iter().filter(|key| key.starts_with("policy/")).cloned());
    to.sort();
    to.dedup();
    let notice = Notification {
        id: format!("{first}/dropped"),
        reason: reason::NOTIFICATIONS_DROPPED.into(),
        message: text::cut(
            &format!(
                "notifications {first} to {} of this rollout were dropped undelivered: it changed faster than \
                 they could be delivered (the last dropped: {})",
                lost.id, lost.message
            ),
            1024,
        ),
        to,
        ..lost
    };
    match gap {
        true => pending[0] = notice,
        false => pending.insert(0, notice),
    }
}

/// Takes delivered (id, subscriber) pairs out of the outbox, and subscribers that no longer subscribe;
/// a notification owed to no one is gone.
pub fn acknowledge(outbox: &mut Outbox, delivered: &BTreeSet<(String, String)>, subscribers: &[Subscriber]) {
    for n in &mut outbox.pending {
        n.to.retain(|key| {
            !delivered.contains(&(n.id.clone(), key.clone())) && subscriber(subscribers, key).is_some()
        });
    }
    outbox.pending.retain(|n| !n.to.is_empty());
}

/// Whether writing the status would take anything out of its outbox: a delivered notification, or one
/// owed to a subscriber that is gone.
pub fn owes_write(
    status: &FleetRolloutStatus,
    delivered: &BTreeSet<(String, String)>,
    subscribers: &[Subscriber],
) -> bool {
    let Some(outbox) = &status.notifications else { return false };
    let mut after = outbox.clone();
    acknowledge(&mut after, delivered, subscribers);
    after != *outbox
}

/// How long a finished rollout's TTL deletion waits, at most, for its outbox to be delivered.
pub const DELETION_GRACE: std::time::Duration = std::time::Duration::from_secs(600);

/// When a rollout whose TTL has passed still owes notifications, and finished less than
/// [`DELETION_GRACE`] ago: how soon to look again instead of deleting it.
pub fn holds_deletion(status: &FleetRolloutStatus, now: Timestamp) -> Option<std::time::Duration> {
    let owed = status.notifications.as_ref().is_some_and(|o| !o.pending.is_empty());
    let finished = status.finished_at.as_ref()?.0;
    let grace = k8s_openapi::jiff::SignedDuration::try_from(DELETION_GRACE).ok()?;
    let until = finished.checked_add(grace).ok()?;
    (owed && now < until).then_some(std::time::Duration::from_secs(5))
}

/// The (notification, subscriber) pairs of an outbox, oldest first.
pub fn owed(outbox: &Outbox) -> impl Iterator<Item = (&Notification, &str)> {
    outbox.pending.iter().flat_map(|n| n.to.iter().map(move |key| (n, key.as_str())))
}

#[cfg(test)]
mod tests;
