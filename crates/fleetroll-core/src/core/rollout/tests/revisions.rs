//! Revisions: new ones only when targets would change, superseding, blocked specs, TTLs, and durations
//! or timestamps read back from the cluster that must not panic.

use super::*;
use crate::core::Blocked;

#[test]
fn spec_changes_are_new_revisions_only_when_they_change_what_targets_become() {
    let sim = Sim::new(spec(10), 10);
    let mut s = sim.spec.clone();
    assert!(!needs_new_revision(&s, &sim.status));
    s.paused = true;
    s.health.timeout = "1h".into();
    s.strategy.max_failures = IntOrString::Int(3);
    assert!(!needs_new_revision(&s, &sim.status));
    s.image = "web:v3".into();
    assert!(needs_new_revision(&s, &sim.status));
    let mut s = sim.spec.clone();
    s.strategy.batch_size = IntOrString::Int(2);
    assert!(needs_new_revision(&s, &sim.status));
}

#[test]
fn a_superseding_revision_records_the_old_one() {
    let mut sim = Sim::new(spec(5), 10);
    sim.step();
    sim.step();
    let mut new_spec = sim.spec.clone();
    new_spec.image = "web:v3".into();
    let inputs = RevisionInputs::of(&new_spec);
    let plan = sim.plan.clone();
    let plan_ref = sim.status.plan.clone().unwrap();
    let t = start_revision(
        sim.now,
        2,
        &new_spec,
        &sim.status,
        NewRevision {
            inputs,
            spec_hash: "h2".into(),
            plan: &plan,
            plan_ref,
            waves: &[],
            refused: &[],
            left_out: &[],
        },
    );
    assert_eq!(t.status.revision.as_ref().map(|r| r.number), Some(2));
    assert_eq!(t.status.superseded.len(), 1);
    assert_eq!((t.status.superseded[0].number, t.status.superseded[0].updated), (1, 5));
    assert_eq!(t.status.counts.updated, 0);
    assert!(t.events.iter().any(|e| e.reason == reason::SUPERSEDED));
}

#[test]
fn a_blocked_spec_is_degraded_with_its_reason_and_written_once() {
    let why = Blocked { reason: "NoTargets", message: "no Deployment matches app=web".into() };
    let now = Timestamp::from_second(1_800_000_000).unwrap();
    let t = blocked(now, 1, &FleetRolloutStatus::default(), &why).unwrap();
    assert_eq!(t.status.phase, Phase::Pending);
    let d = conditions::get(&t.status.conditions, conditions::DEGRADED).unwrap();
    assert_eq!((d.status.as_str(), d.reason.as_str()), ("True", "NoTargets"));
    assert!(blocked(now, 1, &t.status, &why).is_none(), "unchanged: no second write");
}

#[test]
fn a_finished_rollout_with_a_ttl_expires_after_it() {
    let mut sim = Sim::new(spec(10), 10);
    assert_eq!(expires_at(&sim.spec, &sim.status), None);
    sim.spec.ttl_seconds_after_finished = Some(60);
    assert_eq!(expires_at(&sim.spec, &sim.status), None, "not before it finishes");
    sim.settle();
    let finished = sim.status.finished_at.clone().unwrap().0;
    assert_eq!(expires_at(&sim.spec, &sim.status), Some(finished + SignedDuration::from_secs(60)));
}

#[test]
fn timestamps_at_the_end_of_time_saturate_instead_of_panicking() {
    // The longest durations the schema admits, and checkpoints (read back from the cluster, so input too)
    // at the very end of the representable time: every deadline saturates.
    let mut s = spec(5);
    s.health.timeout = duration::MAX_TEXT.into();
    s.health.soak = duration::MAX_TEXT.into();
    s.strategy.pause_between_batches = duration::MAX_TEXT.into();
    let mut sim = Sim::new(s, 10);
    sim.auto_ready = false;
    // A day before the end: every deadline 30 days out lies past it.
    sim.now = Timestamp::MAX - SignedDuration::from_hours(24);
    sim.step(); // intent, stamped near the end of time
    sim.step(); // applied
    let waited = sim.settle();
    assert!(waited.is_some(), "waits for health, never panics: {waited:?} {:#?}", sim.status);
    let ready: Vec<String> = sim.not_ready.drain().collect();
    for t in ready {
        sim.world.get_mut(&t).unwrap().readiness = Readiness::Ready;
    }
    sim.settle(); // soaking from the end of time
    assert!(sim.status.batches[0].healthy_since.is_some());
    assert_eq!(sim.status.phase, Phase::Progressing);
}

#[test]
fn a_rollout_halted_mid_way_goes_on_where_it_stood_once_the_cause_is_gone() {
    let mut sim = Sim::new(spec(5), 10);
    sim.step(); // intent of batch 0
    sim.step(); // applied
    let why = Blocked { reason: "PlanTampered", message: "the plan does not match".into() };
    sim.status = blocked(sim.now, sim.generation, &sim.status, &why).unwrap().status;
    assert_eq!(sim.status.phase, Phase::Pending);
    assert!(conditions::is_true(&sim.status.conditions, conditions::DEGRADED));
    // The cause is gone (the controller calls advance again only then): nothing is applied twice.
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert!(!conditions::is_true(&sim.status.conditions, conditions::DEGRADED));
    assert!(sim.world.keys().all(|t| sim.changes_of(t) == 1));
}

#[test]
fn durations_stored_before_the_schema_limited_them_are_read_as_the_defaults_not_a_panic() {
    // The schema's 30-day maximum guards new writes only; an object stored earlier keeps its value.
    let mut s = spec(5);
    s.health.timeout = "99999999h".into();
    s.health.soak = "99999999h".into();
    s.strategy.pause_between_batches = "99999999h".into();
    let mut sim = Sim::new(s, 10);
    sim.broken.push(key(&sim.plan.batches[0][0]));
    sim.settle();
    // The default timeout (10m) applies: the broken target fails then, no sooner, no later.
    sim.pass(Duration::from_secs(599));
    sim.settle();
    assert_eq!(sim.status.counts.failed, 0);
    sim.pass(Duration::from_secs(2));
    sim.settle();
    assert_eq!(sim.status.counts.failed, 1);
    assert_eq!(sim.status.phase, Phase::Paused);
}
