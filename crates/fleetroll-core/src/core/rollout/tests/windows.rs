//! The change-window gate: batches start only inside every window, a batch in flight finishes, a freeze
//! holds the next one, a rollback is never held, and windows that cannot be read hold with why.

use super::*;
use crate::api::{Approval, ChangeWindow, WindowKind};

fn window(kind: WindowKind, schedule: &str, duration: &str) -> ChangeWindow {
    ChangeWindow { name: None, kind, schedule: schedule.into(), duration: duration.into(), time_zone: None }
}

fn at(text: &str) -> Timestamp {
    text.parse().unwrap()
}

#[test]
fn a_rollout_outside_its_window_waits_for_the_opening_then_goes() {
    // The simulation starts at 2027-01-15T08:00:00Z.
    let mut s = spec(5);
    s.strategy.windows = vec![window(WindowKind::Allow, "0 22 * * *", "2h")];
    let mut sim = Sim::new(s, 10);
    assert_eq!(sim.settle(), Some(Duration::from_secs(14 * 3600)), "woken at the opening");
    assert!(sim.changes.is_empty());
    assert_eq!(
        (sim.status.phase, sim.status.reason.as_deref()),
        (Phase::Paused, Some(reason::OUTSIDE_WINDOW))
    );
    let hold = sim.status.window_hold.clone().unwrap();
    assert_eq!((hold.owner.as_str(), hold.kind), ("the rollout", WindowKind::Allow));
    assert_eq!(hold.opens_at.map(|t| t.0), Some(at("2027-01-15T22:00:00Z")));
    let message = sim.status.message.clone().unwrap();
    assert!(
        message.contains("outside the change windows of the rollout") && message.contains("22:00"),
        "{message}"
    );
    // Judged again, nothing changed: no write.
    let writes = sim.writes;
    assert!(matches!(sim.step(), Step::Wait { .. }));
    assert_eq!(sim.writes, writes);

    sim.pass(Duration::from_secs(14 * 3600));
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert_eq!(sim.changes.len(), 10);
    assert_eq!(sim.status.window_hold, None);
}

#[test]
fn a_freeze_lets_the_batch_in_flight_finish_and_holds_the_next_until_it_ends() {
    let mut sim = Sim::new(spec(5), 15);
    sim.auto_ready = false;
    sim.step(); // planned
    sim.step(); // batch 1 intent
    sim.step(); // batch 1 applied
    assert_eq!(sim.changes.len(), 5);
    // The platform freezes changes from now (08:00) for two hours.
    let freeze =
        ChangeWindow { name: Some("incident-4711".into()), ..window(WindowKind::Deny, "0 8 * * *", "2h") };
    sim.guardrails.windows = vec![("platform".into(), vec![freeze])];
    sim.auto_ready = true;
    for t in sim.plan.batches[0].clone() {
        sim.world.get_mut(&key(&t)).unwrap().readiness = Readiness::Ready;
    }
    assert_eq!(sim.settle(), Some(Duration::from_secs(2 * 3600)));
    assert_eq!(sim.status.batches[0].state, BatchState::Succeeded, "the batch in flight finished");
    assert_eq!(sim.changes.len(), 5, "no new batch in the freeze");
    let hold = sim.status.window_hold.clone().unwrap();
    assert_eq!(
        (hold.owner.as_str(), hold.window.as_str(), hold.kind),
        ("FleetRolloutPolicy platform", "incident-4711", WindowKind::Deny)
    );
    assert_eq!(hold.opens_at.map(|t| t.0), Some(at("2027-01-15T10:00:00Z")));

    sim.pass(Duration::from_secs(2 * 3600));
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert_eq!(sim.changes.len(), 15);
}

#[test]
fn a_rollback_is_not_held_by_a_freeze() {
    let mut sim = Sim::new(spec(5), 10);
    while sim.changes.is_empty() {
        sim.step();
    }
    sim.guardrails.windows = vec![("platform".into(), vec![window(WindowKind::Deny, "* * * * *", "1h")])];
    sim.settle();
    assert_eq!(sim.status.reason.as_deref(), Some(reason::OUTSIDE_WINDOW));
    assert_eq!(
        sim.status.window_hold.as_ref().and_then(|h| h.opens_at.as_ref()),
        None,
        "a freeze without end"
    );
    sim.spec.rollback = true;
    sim.generation = 2;
    sim.settle();
    assert_eq!(sim.status.phase, Phase::RolledBack, "{:?}", sim.status.message);
    assert_eq!(sim.status.window_hold, None, "nothing holds it any more");
}

#[test]
fn windows_the_operator_cannot_read_hold_with_why_until_fixed() {
    let mut s = spec(5);
    // Five fields the schema admits; no day ever matches.
    s.strategy.windows = vec![window(WindowKind::Allow, "0 0 30 2 *", "1h")];
    let mut sim = Sim::new(s, 10);
    sim.settle();
    assert!(sim.changes.is_empty());
    assert_eq!(sim.status.reason.as_deref(), Some(reason::INVALID_WINDOW));
    let message = sim.status.message.clone().unwrap();
    assert!(message.contains("cannot be read") && message.contains("never opens"), "{message}");
    sim.spec.strategy.windows = vec![window(WindowKind::Allow, "0 8 * * *", "1h")];
    sim.generation = 2;
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::Succeeded);
}

#[test]
fn an_override_by_an_approver_starts_the_held_batch_and_is_recorded() {
    let mut s = spec(5);
    s.strategy.windows = vec![window(WindowKind::Allow, "0 22 * * *", "2h")];
    let mut sim = Sim::new(s, 10);
    sim.settle();
    assert_eq!(sim.status.reason.as_deref(), Some(reason::OUTSIDE_WINDOW));
    let hold = sim.status.window_hold.clone().unwrap().hash;
    let gates = plan::gates_hash(&sim.spec, None);
    let current = sim.plan.hash.clone();
    let approval = |batch, plan_hash: &str, gates_hash: &str, overrides: &str| Approval {
        batch,
        plan_hash: plan_hash.into(),
        gates_hash: gates_hash.into(),
        approved_by: Some("erin".into()),
        override_windows: Some(overrides.into()),
    };
    // An override of another plan, batch, gates or hold (one written before a freeze began, say) lifts
    // nothing.
    for wrong in [
        approval(0, "0000000000000000", &gates, &hold),
        approval(1, &current, &gates, &hold),
        approval(0, &current, "0000000000000000", &hold),
        approval(0, &current, &gates, "0000000000000000"),
    ] {
        sim.spec.approvals = vec![wrong.clone()];
        sim.generation += 1;
        sim.settle();
        assert!(sim.changes.is_empty(), "{wrong:?}");
    }
    sim.spec.approvals = vec![approval(0, &current, &gates, &hold)];
    sim.generation += 1;
    sim.settle();
    assert_eq!(sim.changes.len(), 5, "batch 1 went; batch 2 waits for the window again");
    assert_eq!(sim.status.reason.as_deref(), Some(reason::OUTSIDE_WINDOW));
    assert_ne!(sim.status.window_hold.clone().unwrap().hash, hold, "batch 2's hold is another");
    let o = &sim.status.window_overrides;
    assert_eq!((o.len(), o[0].batch, o[0].overridden_by.as_deref()), (1, 0, Some("erin")));
    assert!(o[0].overrode.contains("outside the change windows of the rollout"), "{}", o[0].overrode);
}

#[test]
fn a_window_whose_duration_has_a_fraction_of_a_second_is_refused_not_a_write_loop() {
    let mut s = spec(5);
    s.strategy.windows = vec![window(WindowKind::Deny, "0 8 * * *", "1h500ms")];
    let mut sim = Sim::new(s, 10);
    sim.settle();
    assert_eq!(sim.status.reason.as_deref(), Some(reason::INVALID_WINDOW));
    let writes = sim.writes;
    for _ in 0..3 {
        sim.pass(Duration::from_secs(1));
        assert!(matches!(sim.step(), Step::Wait { .. }));
    }
    assert_eq!(sim.writes, writes);
}

#[test]
fn a_namespace_window_holds_only_the_batch_with_its_targets() {
    // One target per batch, in namespaces tenant-0 .. tenant-3; tenant-2 declares a window at 22:00.
    let mut sim = Sim::new(spec(1), 4);
    sim.namespace_windows
        .insert("tenant-2".into(), r#"[{"schedule": "0 22 * * *", "duration": "1h"}]"#.into());
    assert_eq!(sim.settle(), Some(Duration::from_secs(14 * 3600)));
    let changed: Vec<&str> = sim.changes.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(changed, ["tenant-0/web-00", "tenant-1/web-01"]);
    let hold = sim.status.window_hold.clone().unwrap();
    assert_eq!(
        (hold.owner.as_str(), hold.opens_at.map(|t| t.0)),
        ("namespace tenant-2", Some(at("2027-01-15T22:00:00Z")))
    );
    sim.pass(Duration::from_secs(14 * 3600));
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::Succeeded);

    // A namespace whose windows cannot be read holds its targets, naming it.
    let mut sim = Sim::new(spec(1), 4);
    sim.namespace_windows.insert("tenant-1".into(), "weeknights".into());
    sim.settle();
    assert_eq!(sim.changes.len(), 1);
    assert_eq!(sim.status.reason.as_deref(), Some(reason::INVALID_WINDOW));
    let message = sim.status.message.clone().unwrap();
    assert!(message.contains("namespace tenant-1") && message.contains("not a JSON list"), "{message}");
}

#[test]
fn an_approved_batch_held_by_a_window_is_idle_while_time_passes() {
    let mut s = spec(5);
    s.strategy.approval = ApprovalMode::FirstBatch;
    s.strategy.windows = vec![window(WindowKind::Allow, "0 22 * * *", "2h")];
    let mut sim = Sim::new(s, 10);
    sim.settle();
    let pending = sim.status.pending_approval.clone().unwrap();
    sim.spec.approvals = vec![Approval {
        batch: 0,
        plan_hash: pending.plan_hash,
        gates_hash: pending.gates_hash,
        approved_by: Some("erin".into()),
        override_windows: None,
    }];
    sim.generation += 1;
    sim.settle();
    assert_eq!(sim.status.reason.as_deref(), Some(reason::OUTSIDE_WINDOW));
    assert_eq!(sim.status.approvals.len(), 1);
    // Looked at again and again as the day goes by: no write, one record.
    let writes = sim.writes;
    for _ in 0..5 {
        sim.pass(Duration::from_secs(60));
        assert!(matches!(sim.step(), Step::Wait { .. }));
    }
    assert_eq!(sim.writes, writes);
    assert_eq!(sim.status.approvals.len(), 1);
    sim.pass(Duration::from_secs(14 * 3600));
    assert_eq!(sim.settle(), None);
    assert_eq!((sim.status.phase, sim.status.approvals.len()), (Phase::Succeeded, 1));
}

/// A tenant's own windows that cannot be read, or one closed window named first, hide no other: the hold
/// names them all, and an override cites them all (an override of one would have lifted the platform's
/// freeze unnamed).
#[test]
fn every_window_holding_a_batch_is_named_and_an_override_cites_them_all() {
    let mut s = spec(5);
    s.strategy.windows = vec![window(WindowKind::Allow, "0 0 30 2 *", "1h")];
    let mut sim = Sim::new(s, 10);
    let freeze =
        ChangeWindow { name: Some("incident-4711".into()), ..window(WindowKind::Deny, "0 8 * * *", "2h") };
    sim.guardrails.windows = vec![("platform".into(), vec![freeze])];
    sim.settle();
    assert!(sim.changes.is_empty());
    let held = sim.status.window_hold.clone().unwrap();
    assert!(held.invalid.as_deref().is_some_and(|why| why.contains("never opens")), "{held:?}");
    assert_eq!(held.also, ["deny window incident-4711 of FleetRolloutPolicy platform is open"]);
    let message = sim.status.message.clone().unwrap();
    assert!(message.contains("cannot be read") && message.contains("incident-4711"), "{message}");

    // Fixed, the tenant's window is closed too: still both, the freeze first.
    sim.spec.strategy.windows = vec![window(WindowKind::Allow, "0 22 * * *", "2h")];
    sim.generation += 1;
    sim.settle();
    let held = sim.status.window_hold.clone().unwrap();
    assert_eq!(
        (held.window.as_str(), held.also.as_slice()),
        ("incident-4711", &["outside the change windows of the rollout".to_string()][..])
    );
    assert_eq!(held.opens_at.map(|t| t.0), Some(at("2027-01-15T22:00:00Z")), "when both allow");
    // What the hash of the freeze alone would be lifts nothing.
    let alone =
        plan::short_hash(&(&sim.plan.hash, 0u32, &held.owner, &held.window, held.kind, &held.invalid));
    let (gates, current) = (plan::gates_hash(&sim.spec, None), sim.plan.hash.clone());
    let approval = |overrides: &str| Approval {
        batch: 0,
        plan_hash: current.clone(),
        gates_hash: gates.clone(),
        approved_by: Some("erin".into()),
        override_windows: Some(overrides.into()),
    };
    sim.spec.approvals = vec![approval(&alone)];
    sim.generation += 1;
    sim.settle();
    assert!(sim.changes.is_empty(), "an override of one hold lifts nothing");
    sim.spec.approvals = vec![approval(&held.hash)];
    sim.generation += 1;
    sim.settle();
    assert_eq!(sim.changes.len(), 5, "the override of both let batch 1 go");
    let overrode = &sim.status.window_overrides[0].overrode;
    assert!(overrode.contains("incident-4711") && overrode.contains("of the rollout"), "{overrode}");
}
