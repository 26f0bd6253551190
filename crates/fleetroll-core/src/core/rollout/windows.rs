//! The change-window gate: the next batch starts only while every window of the rollout, of the
//! FleetRolloutPolicies governing it, of its targets' namespaces and of their member clusters allows it (see [`crate::core::window`] for what a window means). A
//! batch already started finishes: its changes are sent when it starts, and what follows (health, soak,
//! analysis) changes nothing. Rollbacks and aborts are not held: undoing a change is what a freeze is for.

use std::collections::BTreeSet;

use super::{Event, Facts, gates::Gate, total_batches, trim_front, until, write_if_changed};
use crate::{
    api::{FleetRolloutStatus, HISTORY, Phase, WindowHold, WindowKind, WindowOverride, time},
    core::{
        plan, reason, text,
        window::{self, Owner, OwnerWindows, Verdict, WindowError},
    },
};

/// How often windows that have no opening in sight are judged again (a policy or the spec changing wakes
/// the rollout sooner).
const NO_OPENING_RETRY: std::time::Duration = std::time::Duration::from_secs(300);

/// Holds the next batch while a window is closed (or the windows cannot be read); records when they open.
pub(super) fn windowed(
    f: &Facts<'_>,
    s: &mut FleetRolloutStatus,
    events: &mut Vec<Event>,
    next: u32,
) -> Gate {
    let total = total_batches(f);
    let holds = holds(f, next);
    let mut shown = holds.iter().cloned();
    let Some(mut hold) = shown.next() else {
        if s.window_hold.take().is_some() {
            let message = format!("batch {}/{total} may start: every change window allows it", next + 1);
            events.push(Event::normal(reason::WINDOW_OPEN, Some(next), message));
        }
        return None;
    };
    hold.also = shown.take(ALSO_SHOWN).map(|h| text::cut(&what(&h), 512)).collect();
    if let Some(unshown) = holds.len().checked_sub(ALSO_SHOWN + 1).filter(|n| *n > 0) {
        hold.also.push(format!("{unshown} more"));
    }
    // What an override cites: every window holding the batch, so one lifts no hold it does not name.
    let cited: Vec<_> = holds.iter().map(|h| (&h.owner, &h.window, h.kind, &h.invalid)).collect();
    hold.hash = plan::short_hash(&(&f.plan.hash, next, &cited));
    if let Some(by) = overridden(f, s, next, &hold) {
        record_override(f, s, events, next, &hold, by);
        return None;
    }
    let why = if hold.invalid.is_some() { reason::INVALID_WINDOW } else { reason::OUTSIDE_WINDOW };
    if s.window_hold.as_ref() != Some(&hold) {
        let message = format!("batch {}/{total} waits: {}", next + 1, describe(&hold));
        let event = if hold.invalid.is_some() { Event::warning } else { Event::normal };
        events.push(event(why, Some(next), message));
    }
    let wake = match &hold.opens_at {
        Some(opens) => until(f.now, opens.0),
        None => NO_OPENING_RETRY,
    };
    s.window_hold = Some(hold);
    s.phase = Phase::Paused;
    s.reason = Some(why.into());
    s.pending_approval = None;
    Some(write_if_changed(f, s.clone(), std::mem::take(events), Some(wake)))
}

/// Records that `by` overrode `hold` of batch `next`, which starts now: in status and as an event.
fn record_override(
    f: &Facts<'_>,
    s: &mut FleetRolloutStatus,
    events: &mut Vec<Event>,
    next: u32,
    hold: &WindowHold,
    by: Option<String>,
) {
    s.window_hold = None;
    let message = format!(
        "batch {}/{} starts outside its change windows ({}): overridden by {}",
        next + 1,
        total_batches(f),
        describe(hold),
        by.as_deref().unwrap_or("an approver")
    );
    s.window_overrides.push(WindowOverride {
        batch: next,
        plan_hash: f.plan.hash.clone(),
        overridden_by: by,
        overrode: text::cut(&describe(hold), 1024),
        at: time(f.now),
    });
    trim_front(&mut s.window_overrides, HISTORY);
    events.push(Event::normal(reason::WINDOW_OVERRIDDEN, Some(next), message));
}

/// Who overrode `hold` of batch `next` (spec.approvals[].overrideWindows naming its hash, under the gates
/// as they are: a policy that changed its approvers since voids it, as it voids an approval), if someone
/// did: Some(None) when the approval names no one.
fn overridden(f: &Facts<'_>, s: &FleetRolloutStatus, next: u32, hold: &WindowHold) -> Option<Option<String>> {
    let gates = plan::gates_hash(f.spec, s.approver_epoch.as_ref().map(|e| e.nonce.as_str()));
    let given = f.spec.approvals.iter().find(|a| {
        a.batch == next
            && a.plan_hash == f.plan.hash
            && a.gates_hash == gates
            && a.override_windows.as_deref() == Some(hold.hash.as_str())
    });
    given.map(|a| a.approved_by.clone())
}

/// How many of the other windows holding a batch its hold names.
const ALSO_SHOWN: usize = 8;

/// Every window holding batch `next`: those that cannot be read first (then nothing opens until they are
/// fixed), then those closed now, freezes first; the first carries when they all next allow it.
fn holds(f: &Facts<'_>, next: u32) -> Vec<WindowHold> {
    let (owners, unreadable) = owners(f, next);
    let hold = |owner: &Owner, window: &str, kind, invalid: Option<&WindowError>| WindowHold {
        owner: text::cut(&owner.to_string(), 320),
        window: text::cut(window, 128),
        kind,
        opens_at: None,
        hash: String::new(),
        invalid: invalid.map(|why| text::cut(&why.to_string(), 1024)),
        also: Vec::new(),
    };
    let mut holds: Vec<WindowHold> =
        unreadable.iter().map(|(owner, why)| hold(owner, "", WindowKind::Allow, Some(why))).collect();
    if let Verdict::Closed { hold: first, others, opens } =
        window::judge(&owners.iter().collect::<Vec<_>>(), f.now)
    {
        let readable = holds.is_empty();
        holds.extend(std::iter::once(first).chain(others).map(|h| hold(&h.owner, &h.window, h.kind, None)));
        if readable {
            holds[0].opens_at = opens.map(time);
        }
    }
    holds
}

/// What one window holding a batch is, in words.
fn what(hold: &WindowHold) -> String {
    if let Some(why) = &hold.invalid {
        return format!("the change windows of {} cannot be read: {why}", hold.owner);
    }
    match hold.kind {
        WindowKind::Deny => format!("deny window {} of {} is open", hold.window, hold.owner),
        WindowKind::Allow => format!("outside the change windows of {}", hold.owner),
    }
}

/// A window hold in words, as status messages and events give it: every window holding the batch.
pub(crate) fn describe(hold: &WindowHold) -> String {
    let mut what = what(hold);
    for other in &hold.also {
        what = format!("{what}; and {other}");
    }
    if hold.invalid.is_some() {
        return what;
    }
    match &hold.opens_at {
        Some(t) => format!("{what}; opens at {}", t.0),
        None => format!(
            "{what}; no opening found yet (windows that never meet, a freeze without end, or one further ahead than the operator looks)"
        ),
    }
}

/// The windows that apply to batch `next`: each governing policy's, the rollout's own, and those the
/// namespaces of its targets in this cluster, and the member clusters of its others, declare; and apart,
/// those that cannot be read (every one: a tenant's unreadable windows hide no platform freeze).
fn owners(f: &Facts<'_>, next: u32) -> (Vec<OwnerWindows>, Vec<(Owner, WindowError)>) {
    let policies = f.guardrails.windows.iter().map(|(name, w)| (Owner::Policy(name.clone()), w.as_slice()));
    let own = std::iter::once((Owner::Rollout, f.spec.strategy.windows.as_slice()));
    let (mut owners, mut unreadable) = (Vec::new(), Vec::new());
    let mut sort = |compiled: Result<OwnerWindows, (Owner, WindowError)>| match compiled {
        Ok(windows) => owners.push(windows),
        Err(e) => unreadable.push(e),
    };
    for (owner, windows) in policies.chain(own).filter(|(_, w)| !w.is_empty()) {
        sort(OwnerWindows::compile(owner.clone(), windows).map_err(|e| (owner, e)));
    }
    let places: BTreeSet<Owner> = f
        .plan
        .batch(next)
        .iter()
        .map(|t| match t.cluster.as_str() {
            "" => Owner::Namespace(t.namespace.clone()),
            member => Owner::Cluster(member.to_string()),
        })
        .collect();
    // Owners declaring the same windows are judged once, under the first one's name: a batch may reach
    // thousands of tenants that all paste the platform's usual hours.
    let mut judged = BTreeSet::new();
    for owner in places {
        let text = (f.declared_windows)(&owner);
        if text.as_ref().is_some_and(|t| !judged.insert(t.clone())) {
            continue;
        }
        if let Some(declared) = window::declared(owner.clone(), text.as_deref()) {
            sort(declared);
        }
    }
    (owners, unreadable)
}
