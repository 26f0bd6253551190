//! Batches: every target changed once, in order, each batch with its key and its intent written first;
//! replays, stale views, deleted targets, idling, and status bounded for a large fleet.

use super::*;

#[test]
fn forty_targets_ten_at_a_time_succeed_with_every_target_changed_once() {
    let mut sim = Sim::new(spec(10), 40);
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert_eq!(
        sim.status.counts,
        crate::api::Counts { total: 40, updated: 40, healthy: 40, failed: 0, skipped: 0, refused: 0 }
    );
    assert_eq!(sim.changes.len(), 40);
    assert!(sim.world.keys().all(|t| sim.changes_of(t) == 1));
    assert!(sim.max_in_flight <= 10, "{} targets in flight", sim.max_in_flight);
    assert!(conditions::is_true(&sim.status.conditions, conditions::COMPLETE));
    assert_eq!(sim.status.batch.as_deref(), Some("4/4"));
    assert_eq!(sim.status.progress.as_deref(), Some("40/40"));
    // Intent, applied, finished+next intent: at most 3 status writes per batch (here 2 + the plan).
    assert!(sim.writes <= 1 + 4 * 3, "{} writes", sim.writes);
}

#[test]
fn batches_run_in_order_and_each_carries_its_own_key() {
    let mut sim = Sim::new(spec(10), 40);
    sim.settle();
    let keys: Vec<&str> = sim.changes.iter().map(|(_, k)| k.as_str()).collect();
    let mut expected = Vec::new();
    for b in 0..4 {
        expected.extend(std::iter::repeat_n(format!("{UID}/1/{b}"), 10));
    }
    assert_eq!(keys, expected);
}

#[test]
fn the_intent_is_written_before_any_target_changes() {
    let mut sim = Sim::new(spec(10), 20);
    let first = sim.step();
    let Step::Write(t) = first else { panic!("expected the intent write, got {first:?}") };
    let b = &t.status.batches[0];
    assert_eq!((b.state, b.idempotency_key.as_str()), (BatchState::Applying, "0d4c8f2e/1/0"));
    assert!(sim.changes.is_empty());
    assert!(matches!(sim.step(), Step::Apply { .. }));
}

#[test]
fn a_replay_after_a_crash_mid_batch_changes_no_target_twice() {
    let mut sim = Sim::new(spec(10), 20);
    sim.step(); // intent
    let Step::Apply { key: k, image, targets, .. } = sim.advance() else { panic!("expected Apply") };
    // The process dies after changing 4 of the 10 targets: the status still says Applying.
    for t in &targets[..4] {
        sim.change(t, &image, &k);
    }
    assert_eq!(sim.status.batches[0].state, BatchState::Applying);
    // The restarted controller decides the same step again, and the replay skips the 4.
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert_eq!(sim.changes.len(), 20);
    assert!(sim.world.keys().all(|t| sim.changes_of(t) == 1));
}

#[test]
fn a_stale_view_of_a_target_waits_instead_of_failing() {
    let mut sim = Sim::new(spec(5), 5);
    sim.auto_ready = false;
    sim.step(); // intent
    let Step::Apply { after, .. } = sim.advance() else { panic!("expected Apply") };
    // The patch went out but the cache does not show it yet.
    sim.status = after.status;
    sim.pass(Duration::from_secs(5));
    assert!(matches!(sim.advance(), Step::Wait { after: Some(_) }));
}

#[test]
fn a_deleted_target_is_skipped_not_failed() {
    let mut sim = Sim::new(spec(5), 10);
    let gone = key(&sim.plan.batches[1][3]);
    sim.world.remove(&gone);
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert_eq!((sim.status.counts.skipped, sim.status.counts.failed), (1, 0));
    assert_eq!(sim.status.failures[0].reason, reason::TARGET_MISSING);
}

#[test]
fn nothing_is_written_while_idle() {
    let mut sim = Sim::new(spec(10), 10);
    sim.settle();
    let writes = sim.writes;
    for _ in 0..5 {
        assert!(matches!(sim.step(), Step::Wait { after: None }));
    }
    assert_eq!(sim.writes, writes);
}

#[test]
fn status_stays_bounded_for_ten_thousand_targets() {
    let mut s = spec(10);
    s.health.timeout = "1m".into();
    s.strategy.max_failures = IntOrString::String("100%".into());
    let mut sim = Sim::new(s, 10_000);
    // Keep the plan out of status, as the controller does for big plans.
    if let Some(p) = sim.status.plan.as_mut() {
        p.batches.clear();
        p.storage = PlanStorage::ConfigMaps;
        p.shards = (0..5).map(|i| format!("web-rollout-0123456789abcdef-{i}")).collect();
    }
    sim.broken = sim.plan.batches.iter().flatten().step_by(20).map(key).collect();
    let mut rounds = 0;
    while sim.status.phase != Phase::Succeeded {
        if let Some(d) = sim.settle() {
            sim.pass(d);
        }
        rounds += 1;
        assert!(rounds < 5000);
    }
    let size = serde_json::to_vec(&sim.status).unwrap().len();
    assert!(size < 64 * 1024, "status is {size} bytes");
    assert_eq!(sim.status.batches.len(), BATCH_WINDOW);
    assert_eq!(sim.status.failures.len(), FAILURE_DETAILS);
    assert_eq!(sim.status.counts.failed, 500);
}
