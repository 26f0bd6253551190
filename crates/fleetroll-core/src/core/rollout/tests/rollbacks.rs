//! Rollbacks: only what this revision changed is restored, and a rollback ends only once it has restored
//! everything it owes, member clusters that do not answer included.

use super::*;
use crate::{api::RollbackState, core::clusters::PlannedWave};

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

fn restores(sim: &Sim) -> usize {
    sim.changes.iter().filter(|(_, k)| k.ends_with("/rollback")).count()
}

#[test]
fn a_rollback_waits_for_a_member_that_does_not_answer_and_ends_only_once_it_is_restored() {
    let mut sim = across("10m");
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    sim.unreachable.insert("b".into(), "dial tcp 10.0.0.2:6443: i/o timeout".into());
    sim.spec.rollback = true;
    sim.generation = 2;
    sim.settle();
    assert_eq!(sim.status.phase, Phase::RollingBack, "{:?}", sim.status.message);
    assert_eq!(sim.status.reason.as_deref(), Some(reason::CLUSTER_UNREACHABLE));
    assert_eq!(images_in(&sim, "a"), ["web:v1"; 4], "what answers is restored at once");
    assert_eq!(images_in(&sim, "b"), ["web:v2"; 4], "b's targets still run the new image");
    let rb = sim.status.rollback.clone().unwrap();
    assert_eq!(
        (rb.state, rb.unreached.clone(), rb.restored),
        (RollbackState::Restoring, vec!["b".into()], 8)
    );
    let trouble = &sim.status.clusters.as_ref().unwrap().trouble;
    assert_eq!((trouble[0].name.as_str(), trouble[0].reason.as_str()), ("b", reason::CLUSTER_UNREACHABLE));
    let message = sim.status.message.clone().unwrap();
    assert!(message.contains("cluster(s) b") && message.contains("delete the rollout"), "{message}");
    let degraded = conditions::get(&sim.status.conditions, conditions::DEGRADED).unwrap();
    assert_eq!((degraded.status.as_str(), degraded.reason.as_str()), ("True", reason::CLUSTER_UNREACHABLE));

    // An hour on, b still silent: the rollback holds, and writes nothing while nothing changes.
    sim.pass(Duration::from_secs(3600));
    assert!(matches!(sim.step(), Step::Wait { .. }));
    assert_eq!(sim.status.phase, Phase::RollingBack);

    sim.unreachable.clear();
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::RolledBack);
    assert_eq!(sim.status.reason.as_deref(), Some(reason::ROLLBACK_REQUESTED));
    assert_eq!(images_in(&sim, "b"), ["web:v1"; 4]);
    let rb = sim.status.rollback.clone().unwrap();
    assert_eq!((rb.state, rb.restored, rb.skipped), (RollbackState::Done, 12, 0));
    assert!(rb.unreached.is_empty());
    assert_eq!(restores(&sim), 12, "each target restored exactly once");
    assert!(sim.status.clusters.as_ref().unwrap().trouble.is_empty());
    assert!(!conditions::is_true(&sim.status.conditions, conditions::DEGRADED));
}

#[test]
fn replaying_every_step_of_a_rollback_that_waits_for_a_member_restores_nothing_twice() {
    let mut sim = across("10m");
    sim.settle();
    sim.unreachable.insert("c".into(), "connection refused".into());
    sim.spec.rollback = true;
    for round in 0..50 {
        // A replay: the same step decided again from the same status, as after a crash before its write.
        if let Step::Restore { key: k, targets, .. } = sim.advance() {
            for t in &targets {
                sim.change(t, &t.previous_image.clone(), &k);
            }
        }
        if let Step::Wait { .. } = sim.step() {
            sim.pass(Duration::from_secs(10));
            if round > 20 {
                sim.unreachable.clear();
            }
        }
    }
    assert_eq!(sim.status.phase, Phase::RolledBack);
    assert_eq!(restores(&sim), 12);
    assert_eq!(sim.status.rollback.as_ref().map(|r| r.restored), Some(12));
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
