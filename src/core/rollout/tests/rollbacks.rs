//! Rollbacks: only what this revision changed is restored.

use super::*;
use crate::core::clusters::PlannedWave;

/// 4 targets in each of a (canary), b and c (prod, one cluster per batch), 3 per batch.
fn across(timeout: &str) -> Sim {
    let waves = vec![
        PlannedWave { name: "canary".into(), clusters: vec!["a".into()], max_concurrency: None },
        PlannedWave { name: "prod".into(), clusters: vec!["b".into(), "c".into()], max_concurrency: Some(1) },
    ];
    let mut s = spec(3);
    s.health.timeout = timeout.into();
    Sim::across(s, &[("a", 4), ("b", 4), ("c", 4)], &waves)
}

fn images_in(sim: &Sim, cluster: &str) -> Vec<String> {
    let mut targets: Vec<&PlannedTarget> = sim.plan.batches.iter().flatten().collect();
    targets.retain(|t| t.cluster == cluster);
    targets.iter().map(|t| sim.world[&key(t)].image.clone().unwrap()).collect()
}

#[test]
fn a_rollback_leaves_alone_targets_the_rollout_never_changed() {
    let mut s = spec(5);
    s.strategy.on_failure = FailurePolicy::Rollback;
    s.strategy.max_failures = IntOrString::Int(1);
    let mut sim = Sim::new(s, 15);
    // Batch 1: a target whose namespace had not opted in; batch 0: one the API server refused.
    let refused = key(&sim.plan.batches[1][0]);
    sim.refused.insert(refused.clone(), reason::NAMESPACE_NOT_OPTED_IN);
    let denied = key(&sim.plan.batches[0][1]);
    sim.denied.insert(denied.clone());
    // Batch 2 fails: past the budget, the rollout rolls back.
    sim.broken.push(key(&sim.plan.batches[2][0]));
    sim.settle();
    assert_eq!(sim.status.current_batch, Some(2));
    // Meanwhile the namespace opts in, and CI moves both untouched targets on.
    sim.refused.clear();
    for t in [&refused, &denied] {
        sim.world.get_mut(t).unwrap().image = Ok("web:v3".into());
    }
    sim.pass(Duration::from_secs(601));
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::RolledBack);
    for t in [&refused, &denied] {
        assert_eq!(sim.changes_of(t), 0, "{t} was never changed by the rollout, so never restored");
        assert_eq!(sim.world[t].image, Ok("web:v3".into()));
    }
    let rb = sim.status.rollback.clone().unwrap();
    assert_eq!((rb.restored, rb.skipped), (13, 0));
}

#[test]
fn a_rollback_touches_nothing_of_a_batch_whose_change_never_ran() {
    let mut s = spec(5);
    s.health.timeout = "1m".into();
    let mut sim = Sim::new(s, 10);
    // The intent of batch 0 is written; its change never runs (the API server failed it, say).
    assert!(matches!(sim.step(), Step::Write(_)));
    assert_eq!(sim.status.current().map(|b| b.state), Some(BatchState::Applying));
    sim.spec.rollback = true;
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::RolledBack);
    assert!(sim.changes.is_empty(), "{:?}", sim.changes);
    assert_eq!(sim.status.rollback.as_ref().map(|r| r.restored), Some(0));
}

#[test]
fn a_rollback_neither_waits_for_nor_touches_a_member_its_batches_never_reached() {
    let mut sim = across("2m");
    sim.spec.strategy.max_failures = IntOrString::Int(4);
    // b never answers while its batches run: its 4 targets fail at the timeout, within the budget.
    sim.unreachable.insert("b".into(), "connection refused".into());
    for _ in 0..20 {
        match sim.settle() {
            Some(d) => sim.pass(d),
            None => break,
        }
    }
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert_eq!(sim.status.counts.failed, 4);
    sim.spec.rollback = true;
    assert_eq!(sim.settle(), None, "b still silent: nothing of it to restore, nothing to wait for");
    assert_eq!(sim.status.phase, Phase::RolledBack);
    let rb = sim.status.rollback.clone().unwrap();
    assert_eq!((rb.restored, rb.skipped), (8, 0));
    assert_eq!(images_in(&sim, "b"), ["web:v1"; 4]);
    let b_changes: usize =
        sim.plan.batches.iter().flatten().filter(|t| t.cluster == "b").map(|t| sim.changes_of(&key(t))).sum();
    assert_eq!(b_changes, 0);
}
