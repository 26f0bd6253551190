//! What GitOps tools read: `Ready`, `Reconciling` and `Stalled` follow the phase the way kstatus expects,
//! at most one of Reconciling and Stalled is true, and every condition carries the generation it reflects.

use super::*;
use crate::core::{
    Blocked,
    rollout::summary::{GitOpsState, gitops_state},
};

/// The kstatus reading of a status, by the rules cli-utils applies to a custom resource (the live test in
/// tests/it/gitops.rs runs the library itself): Reconciling=True, then Stalled=True, then Ready=False.
fn kstatus(s: &FleetRolloutStatus) -> GitOpsState {
    let on = |t| conditions::is_true(&s.conditions, t);
    let reconciling = on(conditions::RECONCILING);
    let stalled = on(conditions::STALLED);
    assert!(!(reconciling && stalled), "Reconciling and Stalled both true: {:?}", s.conditions);
    let not_ready = conditions::get(&s.conditions, conditions::READY).is_some_and(|c| c.status == "False");
    match (reconciling, stalled, not_ready) {
        (true, _, _) => GitOpsState::InProgress,
        (_, true, _) => GitOpsState::Failed,
        (_, _, true) => GitOpsState::InProgress,
        _ => GitOpsState::Current,
    }
}

fn assert_generation(s: &FleetRolloutStatus, generation: i64) {
    assert_eq!(s.observed_generation, Some(generation));
    for c in &s.conditions {
        assert_eq!(c.observed_generation, Some(generation), "{c:?}");
    }
}

#[test]
fn a_rollout_reads_in_progress_until_it_succeeds_then_current() {
    let mut sim = Sim::new(spec(5), 10);
    let mut seen = Vec::new();
    for _ in 0..100 {
        if let Step::Wait { after: None } = sim.step() {
            break;
        }
        seen.push((sim.status.phase, kstatus(&sim.status)));
    }
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert!(seen.iter().any(|(p, _)| *p == Phase::Progressing));
    for (phase, state) in &seen {
        let expected =
            if *phase == Phase::Succeeded { GitOpsState::Current } else { GitOpsState::InProgress };
        assert_eq!(*state, expected, "{phase}");
    }
    assert_eq!(kstatus(&sim.status), GitOpsState::Current);
    let ready = conditions::get(&sim.status.conditions, conditions::READY).expect("Ready");
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("True", reason::SUCCEEDED));
    assert_generation(&sim.status, sim.generation);
}

#[test]
fn paused_and_waiting_for_approval_read_in_progress() {
    let mut sim = Sim::new(spec(5), 10);
    sim.spec.paused = true;
    sim.settle();
    assert_eq!((sim.status.phase, kstatus(&sim.status)), (Phase::Paused, GitOpsState::InProgress));
    let reconciling = conditions::get(&sim.status.conditions, conditions::RECONCILING).expect("Reconciling");
    assert_eq!(reconciling.reason, reason::PAUSED_BY_SPEC);

    let mut s = spec(5);
    s.strategy.approval = crate::api::ApprovalMode::FirstBatch;
    let mut sim = Sim::new(s, 10);
    sim.settle();
    assert_eq!(
        (sim.status.phase, kstatus(&sim.status)),
        (Phase::WaitingForApproval, GitOpsState::InProgress)
    );
}

#[test]
fn a_pause_forced_by_the_failure_budget_reads_failed_until_the_budget_is_raised() {
    let mut s = spec(10);
    s.health.timeout = "1m".into();
    let mut sim = Sim::new(s, 20);
    sim.broken = vec!["tenant-0/web-00".into()];
    sim.settle();
    sim.pass(Duration::from_secs(61));
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Paused);
    assert_eq!(kstatus(&sim.status), GitOpsState::Failed);
    let stalled = conditions::get(&sim.status.conditions, conditions::STALLED).expect("Stalled");
    assert_eq!(stalled.reason, reason::FAILURE_BUDGET_EXCEEDED);
    assert!(stalled.message.contains("failure budget"), "{}", stalled.message);

    // A spec change is InProgress until it is observed, then the rollout goes on and succeeds.
    sim.spec.strategy.max_failures = IntOrString::Int(1);
    sim.generation = 2;
    assert_eq!(sim.settle(), None);
    assert_eq!((sim.status.phase, kstatus(&sim.status)), (Phase::Succeeded, GitOpsState::Current));
    assert!(!conditions::is_true(&sim.status.conditions, conditions::STALLED));
    assert_generation(&sim.status, 2);
}

#[test]
fn an_abort_and_a_rollback_read_failed() {
    let mut sim = Sim::new(spec(5), 10);
    sim.step();
    sim.step();
    sim.spec.abort = true;
    sim.generation = 2;
    sim.settle();
    assert_eq!((sim.status.phase, kstatus(&sim.status)), (Phase::Aborted, GitOpsState::Failed));
    assert_generation(&sim.status, 2);

    let mut sim = Sim::new(spec(5), 10);
    sim.settle();
    sim.spec.rollback = true;
    sim.generation = 2;
    sim.settle();
    assert_eq!((sim.status.phase, kstatus(&sim.status)), (Phase::RolledBack, GitOpsState::Failed));
    let stalled = conditions::get(&sim.status.conditions, conditions::STALLED).expect("Stalled");
    assert_eq!(stalled.reason, reason::ROLLBACK_REQUESTED);
}

#[test]
fn a_spec_the_operator_cannot_act_on_reads_failed_and_recovers() {
    let mut sim = Sim::new(spec(5), 10);
    let why = Blocked { reason: reason::PLAN_TAMPERED, message: "the plan does not match".into() };
    sim.status = blocked(sim.now, sim.generation, &sim.status, &why).expect("a change").status;
    assert_eq!(kstatus(&sim.status), GitOpsState::Failed);
    let stalled = conditions::get(&sim.status.conditions, conditions::STALLED).expect("Stalled");
    assert_eq!(
        (stalled.reason.as_str(), stalled.message.as_str()),
        (reason::PLAN_TAMPERED, why.message.as_str())
    );
    assert_eq!(sim.settle(), None);
    assert_eq!(kstatus(&sim.status), GitOpsState::Current);
}

#[test]
fn every_phase_maps_to_one_kstatus_reading() {
    use GitOpsState::*;
    let cases = [
        (Phase::Pending, None, false, InProgress),
        (Phase::Pending, Some(reason::NO_TARGETS), true, Failed),
        (Phase::Progressing, Some(reason::SOAKING), false, InProgress),
        (Phase::Paused, Some(reason::PAUSED_BY_SPEC), false, InProgress),
        (Phase::Paused, Some(reason::FAILURE_BUDGET_EXCEEDED), false, Failed),
        // Waiting for a change window is nothing wrong; windows the operator cannot read need a person.
        (Phase::Paused, Some(reason::OUTSIDE_WINDOW), false, InProgress),
        (Phase::Paused, Some(reason::INVALID_WINDOW), false, Failed),
        (Phase::WaitingForApproval, Some(reason::WAITING_FOR_APPROVAL), false, InProgress),
        (Phase::RollingBack, Some(reason::ROLLBACK_REQUESTED), false, InProgress),
        (Phase::Succeeded, Some(reason::SUCCEEDED), false, Current),
        (Phase::Failed, Some(reason::FAILURE_BUDGET_EXCEEDED), false, Failed),
        (Phase::Aborted, Some(reason::ABORT_REQUESTED), false, Failed),
        (Phase::RolledBack, Some(reason::ROLLED_BACK), false, Failed),
    ];
    for (phase, why, blocked, expected) in cases {
        assert_eq!(gitops_state(phase, why, blocked, false), expected, "{phase} {why:?}");
    }
}

#[test]
fn a_finished_rollout_observes_a_later_spec_change_so_it_does_not_read_in_progress_for_ever() {
    let mut sim = Sim::new(spec(5), 10);
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
    // Git (or a person) edits a field that starts nothing on a finished rollout.
    sim.spec.paused = true;
    sim.generation = 2;
    assert_eq!(sim.settle(), None);
    assert_generation(&sim.status, 2);
    assert_eq!((sim.status.phase, kstatus(&sim.status)), (Phase::Succeeded, GitOpsState::Current));
}

#[test]
fn a_succeeded_rollout_whose_targets_someone_else_changed_since_reads_failed_until_they_carry_its_image() {
    assert_eq!(gitops_state(Phase::Succeeded, Some(reason::SUCCEEDED), false, true), GitOpsState::Failed);
    let mut sim = Sim::new(spec(5), 10);
    sim.settle();
    assert_eq!(kstatus(&sim.status), GitOpsState::Current);
    // A GitOps tool re-applies Git on two targets: their old image is back, fleetroll's key stays.
    let mut reverted: Vec<String> = sim.world.keys().take(2).cloned().collect();
    reverted.sort();
    for t in &reverted {
        sim.world.get_mut(t).unwrap().image = Ok("web:v1".into());
    }
    let Step::Write(t) = sim.step() else { panic!("the change is recorded") };
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
    let changed = sim.status.changed_by_others.clone().expect("changed targets are counted");
    assert_eq!(changed.count, 2);
    assert_eq!(changed.sample, reverted.iter().map(|t| format!("{t}: web:v1")).collect::<Vec<_>>());
    assert_eq!(kstatus(&sim.status), GitOpsState::Failed);
    let stalled = conditions::get(&sim.status.conditions, conditions::STALLED).expect("Stalled");
    assert_eq!(stalled.reason, reason::IMAGE_CHANGED);
    assert!(stalled.message.starts_with("2 targets no longer carry web:v2"), "{}", stalled.message);
    assert!(conditions::is_true(&sim.status.conditions, conditions::DEGRADED));
    assert!(conditions::is_true(&sim.status.conditions, conditions::COMPLETE), "it did complete");
    let warnings: Vec<_> = t.events.iter().filter(|e| e.reason == reason::IMAGE_CHANGED).collect();
    assert_eq!(warnings.len(), 1, "{:?}", t.events);
    // Seen again with nothing new: no write, no second warning.
    assert!(matches!(sim.step(), Step::Wait { .. }));

    // A target another rollout takes over carries that rollout's key: not counted here.
    sim.world.get_mut(&reverted[0]).unwrap().applied = Some("other-uid/1/0".into());
    sim.settle();
    assert_eq!(sim.status.changed_by_others.as_ref().map(|c| c.count), Some(1));
    // The image put back: the rollout reads Current again.
    sim.world.get_mut(&reverted[1]).unwrap().image = Ok("web:v2".into());
    sim.settle();
    assert_eq!(sim.status.changed_by_others, None);
    assert_eq!(kstatus(&sim.status), GitOpsState::Current);
    assert!(!conditions::is_true(&sim.status.conditions, conditions::DEGRADED));
}

#[test]
fn only_targets_the_rollout_may_touch_and_whose_image_can_be_judged_count_as_changed() {
    let mut sim = Sim::new(spec(5), 10);
    sim.settle();
    let mut targets: Vec<String> = sim.world.keys().cloned().collect();
    targets.sort();
    // Someone copies this rollout's key onto a workload out of its scope, with another image.
    sim.world.get_mut(&targets[0]).unwrap().image = Ok("web:v1".into());
    sim.refused.insert(targets[0].clone(), reason::OUT_OF_SCOPE);
    // A second container was added to another target: the rolled one cannot be told apart any more.
    sim.world.get_mut(&targets[1]).unwrap().image = Err("2 containers, name one".into());
    assert!(matches!(sim.step(), Step::Wait { .. }), "nothing to record");
    assert_eq!(sim.status.changed_by_others, None);
    assert_eq!(kstatus(&sim.status), GitOpsState::Current);
}

#[test]
fn a_rollback_after_success_undoes_only_fleetrolls_own_changes() {
    let mut sim = Sim::new(spec(5), 10);
    sim.settle();
    let mut targets: Vec<String> = sim.world.keys().cloned().collect();
    targets.sort();
    // After success: CI moves one target on to v3; another rollout takes a second one over.
    sim.world.get_mut(&targets[0]).unwrap().image = Ok("web:v3".into());
    let other = sim.world.get_mut(&targets[1]).unwrap();
    other.image = Ok("web:v4".into());
    other.applied = Some("other-uid/1/0".into());
    sim.settle();
    assert_eq!(sim.status.changed_by_others.as_ref().map(|c| c.count), Some(1));

    sim.spec.rollback = true;
    sim.generation = 2;
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::RolledBack);
    assert_eq!(sim.status.changed_by_others, None, "a rolled back rollout claims nothing");
    let image = |t: &str| sim.world[t].image.clone().unwrap();
    assert_eq!(
        (image(&targets[0]), image(&targets[1])),
        ("web:v3".into(), "web:v4".into()),
        "left as they are"
    );
    assert!(targets[2..].iter().all(|t| image(t) == "web:v1"), "the rest restored");
    let rb = sim.status.rollback.clone().unwrap();
    assert_eq!((rb.restored, rb.skipped), (8, 2));
    let why: Vec<(&str, &str)> =
        sim.status.failures.iter().map(|f| (f.name.as_str(), f.reason.as_str())).rev().take(2).collect();
    let names: Vec<&str> = targets[..2].iter().map(|t| t.split_once('/').unwrap().1).collect();
    assert!(why.contains(&(names[0], reason::IMAGE_CHANGED)), "{why:?}");
    assert!(why.contains(&(names[1], reason::TARGET_HELD)), "{why:?}");
}
