use super::*;
use crate::api::{BatchStatus, ChangedByOthers, Creator, Revision, SecretRef, SinkKind};

fn subscription(name: &str, events: &[NotificationKind]) -> Subscription {
    Subscription {
        name: name.into(),
        sink: SinkKind::Webhook,
        secret_ref: SecretRef { name: format!("{name}-secret") },
        events: events.to_vec(),
    }
}

fn spec(subscriptions: Vec<Subscription>) -> FleetRolloutSpec {
    FleetRolloutSpec {
        image: "web:v2".into(),
        creator: Some(Creator { username: "agent-7".into(), ..Default::default() }),
        notify: subscriptions,
        ..Default::default()
    }
}

fn now() -> Timestamp {
    "2026-12-04T10:00:00Z".parse().unwrap()
}

const ORIGIN: Origin = Origin { rollout: "shop/web", over_mcp: true };

fn revision(number: u32) -> Option<Revision> {
    let inputs = crate::api::RevisionInputs::of(&FleetRolloutSpec::default());
    Some(Revision { number, spec_hash: String::new(), inputs, started_at: Time(now()) })
}

/// Records the change from `before` to `after` as the edge does, with nothing delivered yet.
fn write(
    spec: &FleetRolloutSpec,
    before: &FleetRolloutStatus,
    mut after: FleetRolloutStatus,
) -> FleetRolloutStatus {
    let guardrails = Guardrails::default();
    let subscribers = subscribers(spec, &guardrails);
    let told = happened(spec, ORIGIN, before, &after);
    record("u1", told, before, &mut after, &subscribers, &BTreeSet::new(), now());
    after
}

fn pending(status: &FleetRolloutStatus) -> Vec<(String, NotificationKind, Vec<String>)> {
    let outbox = status.notifications.clone().unwrap_or_default();
    outbox.pending.into_iter().map(|n| (n.id, n.kind, n.to)).collect()
}

#[test]
fn a_new_revision_is_told_once_with_who_started_it_and_over_what() {
    let spec = spec(vec![subscription("team", &[]), subscription("pager", &[NotificationKind::Failed])]);
    let before = FleetRolloutStatus::default();
    let mut after =
        FleetRolloutStatus { revision: revision(1), phase: Phase::Progressing, ..Default::default() };
    after.counts.total = 40;
    let written = write(&spec, &before, after.clone());
    assert_eq!(
        pending(&written),
        vec![("u1/1/0".into(), NotificationKind::Started, vec!["rollout/team".into()])]
    );
    let message = &written.notifications.as_ref().unwrap().pending[0].message;
    assert!(
        message.contains("agent-7") && message.contains("over MCP") && message.contains("40 targets"),
        "{message}"
    );
    // The transition lost a race and is decided again from the same status: the same single notification.
    assert_eq!(write(&spec, &before, after.clone()), written);
    // The next transition, from the written status, tells nothing new and keeps what is owed.
    let mut next = written.clone();
    next.message = Some("batch 1 applying".into());
    assert_eq!(pending(&write(&spec, &written, next)), pending(&written));
}

#[test]
fn each_ending_failure_hold_and_change_by_others_is_told_to_those_who_hear_it() {
    let spec = spec(vec![subscription("all", &[]), subscription("ends", &[NotificationKind::RolledBack])]);
    let base = FleetRolloutStatus { revision: revision(2), phase: Phase::Progressing, ..Default::default() };
    let batch = |state| BatchStatus { index: 1, size: 10, failed: 3, state, ..Default::default() };
    let mut failed = base.clone();
    failed.batches = vec![batch(BatchState::Failed)];
    failed.phase = Phase::Paused;
    failed.reason = Some(reason::FAILURE_BUDGET_EXCEEDED.into());
    let mut before = base.clone();
    before.batches = vec![batch(BatchState::Verifying)];
    let kinds =
        |s: &FleetRolloutStatus| pending(s).into_iter().map(|(_, k, to)| (k, to.len())).collect::<Vec<_>>();
    let written = write(&spec, &before, failed.clone());
    assert_eq!(kinds(&written), vec![(NotificationKind::BatchFailed, 1), (NotificationKind::Held, 1)]);
    assert_eq!(written.notifications.as_ref().unwrap().pending[0].batch, Some(1));
    let mut rolled_back = written.clone();
    rolled_back.phase = Phase::RolledBack;
    rolled_back.reason = Some(reason::ROLLED_BACK.into());
    let written = write(&spec, &written, rolled_back);
    assert_eq!(kinds(&written)[2], (NotificationKind::RolledBack, 2), "both hear a rollback");
    // A budget exceeded that ends the rollout is told as Failed, not as a hold.
    let mut aborted = failed.clone();
    aborted.phase = Phase::Failed;
    let told: Vec<_> = happened(&spec, ORIGIN, &before, &aborted).into_iter().map(|h| h.kind).collect();
    assert_eq!(told, vec![NotificationKind::BatchFailed, NotificationKind::Failed]);
    let mut drifted = FleetRolloutStatus { phase: Phase::Succeeded, ..base.clone() };
    let succeeded = drifted.clone();
    drifted.changed_by_others = Some(ChangedByOthers { count: 2, sample: vec![] });
    let told: Vec<_> = happened(&spec, ORIGIN, &succeeded, &drifted).into_iter().map(|h| h.kind).collect();
    assert_eq!(told, vec![NotificationKind::ChangedByOthers]);
    let told: Vec<_> = happened(&spec, ORIGIN, &base, &succeeded).into_iter().map(|h| h.kind).collect();
    assert_eq!(told, vec![NotificationKind::Succeeded]);
}

#[test]
fn delivered_notifications_leave_the_outbox_and_it_never_holds_more_than_its_bound() {
    let spec = spec(vec![subscription("a", &[]), subscription("b", &[])]);
    let guardrails = Guardrails::default();
    let subs = subscribers(&spec, &guardrails);
    let many: Vec<Happening> = (0..40)
        .map(|i| Happening {
            kind: NotificationKind::Held,
            batch: Some(i),
            reason: reason::OUTSIDE_WINDOW.into(),
            message: "held".into(),
        })
        .collect();
    let before = FleetRolloutStatus { revision: revision(1), ..Default::default() };
    let mut after = before.clone();
    record("u1", many, &before, &mut after, &subs, &BTreeSet::new(), now());
    let outbox = after.notifications.clone().unwrap();
    assert_eq!((outbox.pending.len(), outbox.dropped, outbox.next), (OUTBOX_MAX, 8, 40));
    assert_eq!(outbox.pending[0].id, "u1/1/8", "the oldest are dropped");
    // "a" has the first, "b" has it too: it is gone; the second is still owed to "b".
    let delivered = BTreeSet::from([
        ("u1/1/8".to_string(), "rollout/a".to_string()),
        ("u1/1/8".to_string(), "rollout/b".to_string()),
        ("u1/1/9".to_string(), "rollout/a".to_string()),
    ]);
    assert!(owes_write(&after, &delivered, &subs));
    let mut acked = after.clone();
    record("u1", vec![], &after, &mut acked, &subs, &delivered, now());
    let acked_box = acked.notifications.clone().unwrap();
    assert_eq!(acked_box.pending.len(), OUTBOX_MAX - 1);
    assert_eq!(
        (acked_box.pending[0].id.as_str(), acked_box.pending[0].to.clone()),
        ("u1/1/9", vec!["rollout/b".into()])
    );
    assert!(!owes_write(&acked, &delivered, &subs));
    // A subscription taken out of the spec is owed nothing more.
    let gone = self::spec(vec![]);
    let none = subscribers(&gone, &guardrails);
    assert!(owes_write(&acked, &BTreeSet::new(), &none));
    let mut emptied = acked.clone();
    record("u1", vec![], &acked, &mut emptied, &none, &BTreeSet::new(), now());
    let emptied = emptied.notifications.unwrap();
    assert!(emptied.pending.is_empty() && emptied.next == 40 && emptied.dropped == 8, "{emptied:?}");
}

#[test]
fn the_state_machine_cannot_drop_or_forge_the_outbox_and_policies_subscribe_too() {
    let spec = spec(vec![]);
    let guardrails = Guardrails {
        notify: vec![("platform".into(), vec![subscription("oncall", &[])])],
        ..Default::default()
    };
    let subs = subscribers(&spec, &guardrails);
    assert_eq!((subs[0].key.as_str(), subs[0].policy), ("policy/platform/oncall", Some("platform")));
    let mut before = FleetRolloutStatus { revision: revision(3), ..Default::default() };
    record(
        "u1",
        vec![happening()],
        &FleetRolloutStatus::default(),
        &mut before,
        &subs,
        &BTreeSet::new(),
        now(),
    );
    // A transition built from scratch (no outbox) or carrying a forged one still writes the outbox read.
    let mut forged = FleetRolloutStatus {
        notifications: Some(Outbox { next: 99, ..Default::default() }),
        ..before.clone()
    };
    record("u1", vec![], &before, &mut forged, &subs, &BTreeSet::new(), now());
    assert_eq!(forged.notifications, before.notifications);
    let mut fresh = FleetRolloutStatus::default();
    record("u1", vec![], &before, &mut fresh, &subs, &BTreeSet::new(), now());
    assert_eq!(fresh.notifications, before.notifications);
    // No subscriber: nothing is written at all.
    let mut quiet = FleetRolloutStatus::default();
    record("u1", vec![happening()], &FleetRolloutStatus::default(), &mut quiet, &[], &BTreeSet::new(), now());
    assert_eq!(quiet.notifications, None);
}

fn happening() -> Happening {
    Happening {
        kind: NotificationKind::Started,
        batch: None,
        reason: reason::PLANNED.into(),
        message: "x".into(),
    }
}

#[test]
fn a_ttl_deletion_waits_a_while_for_undelivered_notifications_and_aborts_and_waits_are_told() {
    let finished = now();
    let mut status = FleetRolloutStatus {
        phase: Phase::Succeeded,
        finished_at: Some(Time(finished)),
        ..Default::default()
    };
    let later = |s: i64| finished.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(s)).unwrap();
    assert_eq!(holds_deletion(&status, later(1)), None, "nothing owed: deleted at once");
    let spec = spec(vec![subscription("a", &[])]);
    let before = status.clone();
    record(
        "u1",
        vec![happening()],
        &FleetRolloutStatus::default(),
        &mut status,
        &subscribers(&spec, &Guardrails::default()),
        &BTreeSet::new(),
        now(),
    );
    assert!(holds_deletion(&status, later(1)).is_some());
    assert_eq!(holds_deletion(&status, later(601)), None, "not for ever");
    // Aborted is told; a hold is told whatever phase the running rollout shows (member clusters: Pending).
    let aborted = FleetRolloutStatus { phase: Phase::Aborted, ..before.clone() };
    let running = FleetRolloutStatus { phase: Phase::Progressing, ..Default::default() };
    let kinds = |a: &FleetRolloutStatus, b: &FleetRolloutStatus| -> Vec<NotificationKind> {
        happened(&spec, ORIGIN, a, b).into_iter().map(|h| h.kind).collect()
    };
    assert_eq!(kinds(&running, &aborted), [NotificationKind::Aborted]);
    let waiting = FleetRolloutStatus {
        phase: Phase::Pending,
        reason: Some(reason::WAITING_FOR_CLUSTERS.into()),
        ..running.clone()
    };
    assert_eq!(kinds(&running, &waiting), [NotificationKind::Held]);
    let rolling_back = FleetRolloutStatus {
        phase: Phase::RollingBack,
        reason: Some(reason::FAILURE_BUDGET_EXCEEDED.into()),
        ..running.clone()
    };
    assert!(kinds(&running, &rolling_back).is_empty(), "a rollback is not a hold");
}

#[test]
fn a_full_outbox_drops_what_only_the_rollout_is_owed_before_what_the_platform_is() {
    let spec = spec(vec![subscription("tenant", &[NotificationKind::Held])]);
    let guardrails = Guardrails {
        notify: vec![("platform".into(), vec![subscription("oncall", &[NotificationKind::Failed])])],
        ..Default::default()
    };
    let subs = subscribers(&spec, &guardrails);
    let told = |kind| Happening { kind, batch: None, reason: String::new(), message: String::new() };
    let mut many = vec![told(NotificationKind::Failed)];
    many.extend((0..40).map(|_| told(NotificationKind::Held)));
    let before = FleetRolloutStatus { revision: revision(1), ..Default::default() };
    let mut after = before.clone();
    record("u1", many, &before, &mut after, &subs, &BTreeSet::new(), now());
    let outbox = after.notifications.unwrap();
    assert_eq!((outbox.pending.len(), outbox.dropped), (OUTBOX_MAX, 9));
    assert_eq!(outbox.pending[0].kind, NotificationKind::Failed, "the platform's is kept, oldest as it is");
    assert_eq!(outbox.pending[1].id, "u1/1/10", "the tenant's oldest went");
}

/// A tenant that makes events faster than the platform's sink hears them cannot make the platform lose one
/// unsaid: what is dropped is folded into a notice of the gap, first in line, owed to the platform alone.
#[test]
fn what_the_platform_is_owed_is_dropped_only_into_a_notice_of_the_gap() {
    let spec = spec(vec![subscription("tenant", &[])]);
    let guardrails = Guardrails {
        notify: vec![("platform".into(), vec![subscription("audit", &[])])],
        ..Default::default()
    };
    let subs = subscribers(&spec, &guardrails);
    let told = |i| Happening {
        kind: NotificationKind::Held,
        batch: None,
        reason: String::new(),
        message: format!("hold {i}"),
    };
    let before = FleetRolloutStatus { revision: revision(1), ..Default::default() };
    let mut after = before.clone();
    record("u1", (0..40).map(told).collect(), &before, &mut after, &subs, &BTreeSet::new(), now());
    let outbox = after.notifications.clone().unwrap();
    assert_eq!((outbox.pending.len(), outbox.dropped), (OUTBOX_MAX, 9), "the notice takes a place");
    let gap = &outbox.pending[0];
    assert_eq!((gap.id.as_str(), gap.reason.as_str()), ("u1/1/0/dropped", reason::NOTIFICATIONS_DROPPED));
    assert_eq!(gap.to, ["policy/platform/audit"], "the tenant's own sink is not told of the gap");
    assert!(gap.message.contains("u1/1/0 to u1/1/8") && gap.message.contains("hold 8"), "{}", gap.message);
    assert_eq!(outbox.pending[1].id, "u1/1/9", "every later one kept");
    // Delivered, the notice goes; a later gap gets a notice of its own.
    let delivered = BTreeSet::from([(gap.id.clone(), gap.to[0].clone())]);
    let before = after.clone();
    record("u1", vec![told(40), told(41)], &before, &mut after, &subs, &delivered, now());
    let outbox = after.notifications.unwrap();
    assert_eq!(outbox.pending[0].id, "u1/1/9/dropped", "{:?}", outbox.pending[0]);
    assert_eq!(outbox.pending.len(), OUTBOX_MAX);
}
