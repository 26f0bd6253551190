//! Before the targets are looked at: a rollout this installation does not serve halts (a finished one keeps
//! its phase, and a rollback of it is refused), a
//! spec asking for another revision plans one, a revision without a plan retries, only a running rollout or
//! a rollback loads its plan, a refused plan halts all but an abort, and what a new revision's discovery
//! leads to.

use super::*;
use crate::core::{
    Blocked,
    plan::{Candidate, Discovered},
    scope::Rules,
};

fn not_served() -> Blocked {
    Blocked { reason: reason::NODE_ROLLOUTS_DISABLED, message: "node rollouts are disabled".into() }
}

fn tampered() -> Blocked {
    Blocked { reason: reason::PLAN_TAMPERED, message: "the plan does not match its hash".into() }
}

const RETRY: Step = Step::Retry { write: None, after: BLOCKED_RETRY };

fn take(step: Step) -> Prep<'static> {
    Prep::Take(Box::new(step))
}

/// The status a halt writes; panics on any other step.
fn halted(step: Step, why: &Blocked) -> FleetRolloutStatus {
    let Step::Write(t) = step else { panic!("a halt writes why: {step:?}") };
    assert_eq!(t.status.phase, Phase::Pending);
    assert_eq!(t.status.reason.as_deref(), Some(why.reason));
    assert_eq!(t.status.message.as_deref(), Some(why.message.as_str()));
    assert!(conditions::is_true(&t.status.conditions, conditions::DEGRADED));
    assert_eq!(t.events.iter().map(|e| e.reason).collect::<Vec<_>>(), [why.reason]);
    t.status
}

#[test]
fn a_running_rollout_this_installation_does_not_serve_halts_once_and_then_retries() {
    let mut sim = Sim::new(spec(5), 10);
    sim.step(); // intent of batch 0
    let why = not_served();
    let Prep::Take(step) = prepare(sim.now, 1, &sim.spec, &sim.status, Some(&why)) else {
        panic!("halts before anything else");
    };
    let written = halted(*step, &why);
    assert_eq!(written.batches, sim.status.batches, "where it stood is kept");
    assert_eq!(prepare(sim.now, 1, &sim.spec, &written, Some(&why)), take(RETRY), "no second write");
}

#[test]
fn a_spec_this_installation_does_not_serve_halts_before_it_is_planned() {
    let (spec, fresh, why) = (spec(5), FleetRolloutStatus::default(), not_served());
    let now = Timestamp::from_second(1_800_000_000).unwrap();
    let Prep::Take(step) = prepare(now, 1, &spec, &fresh, Some(&why)) else { panic!("no planning") };
    halted(*step, &why);
}

/// The status a refused rollback writes: why, as a halt says it, in the phase the rollout finished in.
fn refused(step: Step, why: &Blocked, finished: Phase) -> FleetRolloutStatus {
    let Step::Write(t) = step else { panic!("a refused rollback writes why: {step:?}") };
    assert_eq!(t.status.phase, finished, "the phase it finished in is kept");
    assert_eq!(t.status.reason.as_deref(), Some(why.reason));
    assert_eq!(t.status.message.as_deref(), Some(why.message.as_str()));
    assert!(conditions::is_true(&t.status.conditions, conditions::DEGRADED));
    assert!(conditions::is_true(&t.status.conditions, conditions::STALLED), "GitOps tools: it stopped short");
    assert_eq!(t.events.iter().map(|e| e.reason).collect::<Vec<_>>(), [why.reason]);
    t.status
}

#[test]
fn a_finished_rollout_keeps_its_phase_whatever_this_installation_does_not_serve() {
    let mut sim = Sim::new(spec(5), 10);
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
    let why = not_served();
    assert_eq!(prepare(sim.now, 1, &sim.spec, &sim.status, Some(&why)), Prep::Proceed { load: None });
}

#[test]
fn a_finished_rollout_this_installation_does_not_serve_neither_rolls_back_nor_plans_anew() {
    let mut sim = Sim::new(spec(5), 10);
    sim.settle();
    let why = not_served();
    // Asked to roll back: refused, and still Succeeded (its targets run the new image).
    sim.spec.rollback = true;
    let Prep::Take(step) = prepare(sim.now, 2, &sim.spec, &sim.status, Some(&why)) else {
        panic!("no rollback this installation does not serve");
    };
    let written = refused(*step, &why, Phase::Succeeded);
    assert_eq!(prepare(sim.now, 2, &sim.spec, &written, Some(&why)), take(RETRY), "no second write");
    // Served again: the rollback goes on, from the phase it kept.
    assert_eq!(
        prepare(sim.now, 2, &sim.spec, &written, None),
        Prep::Proceed { load: sim.status.plan.as_ref() }
    );
    // A new image for it: a new revision, which halts before it is planned, as a new rollout would.
    sim.spec.rollback = false;
    sim.spec.image = "web:v3".into();
    let Prep::Take(step) = prepare(sim.now, 3, &sim.spec, &sim.status, Some(&why)) else {
        panic!("no new revision this installation does not serve");
    };
    halted(*step, &why);
}

#[test]
fn a_finished_rollout_whose_plan_is_refused_keeps_its_phase_when_asked_to_roll_back() {
    let mut sim = Sim::new(spec(5), 10);
    sim.settle();
    sim.spec.rollback = true;
    let why = tampered();
    let step = plan_refused(sim.now, 2, &sim.spec, &sim.status, &why).expect("the rollback refused");
    let written = refused(step, &why, Phase::Succeeded);
    assert_eq!(plan_refused(sim.now, 2, &sim.spec, &written, &why), Some(RETRY), "no second write");
}

#[test]
fn a_spec_asking_for_another_revision_plans_one_running_or_finished() {
    let mut sim = Sim::new(spec(5), 10);
    let fresh = FleetRolloutStatus::default();
    assert_eq!(prepare(sim.now, 1, &sim.spec, &fresh, None), Prep::PlanRevision, "never planned");
    sim.spec.image = "web:v3".into();
    assert_eq!(prepare(sim.now, 2, &sim.spec, &sim.status, None), Prep::PlanRevision, "running");
    sim.spec.image = "web:v2".into();
    sim.settle();
    sim.spec.image = "web:v3".into();
    assert_eq!(prepare(sim.now, 3, &sim.spec, &sim.status, None), Prep::PlanRevision, "finished");
}

#[test]
fn a_revision_without_a_plan_retries_later() {
    let mut sim = Sim::new(spec(5), 10);
    sim.status.plan = None;
    assert_eq!(prepare(sim.now, 1, &sim.spec, &sim.status, None), take(RETRY));
}

#[test]
fn only_a_running_rollout_or_a_rollback_needs_its_plan() {
    let mut sim = Sim::new(spec(5), 10);
    let load = |sim: &Sim| match prepare(sim.now, 1, &sim.spec, &sim.status, None) {
        Prep::Proceed { load } => load.cloned(),
        other => panic!("goes on to the targets: {other:?}"),
    };
    let frozen = sim.status.plan.clone();
    assert_eq!(load(&sim), frozen, "running");
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert_eq!(load(&sim), None, "finished: no plan needed to stay finished");
    sim.spec.rollback = true;
    assert_eq!(load(&sim), frozen, "finished, and asked to roll back");
    sim.step();
    assert_eq!(sim.status.phase, Phase::RollingBack);
    assert_eq!(load(&sim), frozen, "rolling back");
}

#[test]
fn a_refused_plan_halts_a_running_rollout_once_and_then_retries() {
    let mut sim = Sim::new(spec(5), 10);
    sim.step(); // intent of batch 0
    let why = tampered();
    let step = plan_refused(sim.now, 1, &sim.spec, &sim.status, &why).expect("a halt");
    let written = halted(step, &why);
    assert_eq!(plan_refused(sim.now, 1, &sim.spec, &written, &why), Some(RETRY), "no second write");
}

#[test]
fn an_abort_goes_on_without_a_refused_plan() {
    let mut sim = Sim::new(spec(5), 10);
    sim.step(); // intent of batch 0
    let why = tampered();
    let halted = plan_refused(sim.now, 1, &sim.spec, &sim.status, &why);
    let Some(Step::Write(halted)) = halted else { panic!("halted first: {halted:?}") };
    sim.spec.abort = true;
    assert_eq!(plan_refused(sim.now, 2, &sim.spec, &sim.status, &why), None, "running");
    assert_eq!(plan_refused(sim.now, 2, &sim.spec, &halted.status, &why), None, "halted");
}

#[test]
fn a_rollback_halts_on_a_refused_plan_aborted_or_not() {
    let mut sim = Sim::new(spec(5), 10);
    sim.step(); // intent of batch 0
    sim.step(); // applied
    sim.spec.rollback = true;
    sim.step();
    assert_eq!(sim.status.phase, Phase::RollingBack);
    let why = tampered();
    let step = plan_refused(sim.now, 2, &sim.spec, &sim.status, &why).expect("a halt");
    halted(step, &why);
    sim.spec.abort = true;
    let step = plan_refused(sim.now, 3, &sim.spec, &sim.status, &why).expect("a halt, aborted too");
    let written = halted(step, &why);
    // Halted (Pending, no longer RollingBack) with both asked for: still halted, never the abort's way on
    // without the plan (which would start the rollback again: RollingBack, halt, and round again).
    let again = plan_refused(sim.now, 3, &sim.spec, &written, &why).expect("still halted");
    assert!(matches!(again, Step::Retry { write: None, .. }), "no second write: {again:?}");
}

fn rules() -> Rules {
    Rules {
        fleet_namespace: NAMESPACE.into(),
        protected_namespaces: vec!["kube-system".into()],
        self_workloads: Vec::new(),
    }
}

fn candidates(cluster: &str, namespace: &str, n: usize) -> Vec<Candidate> {
    (0..n)
        .map(|i| Candidate {
            cluster: cluster.into(),
            namespace: namespace.into(),
            name: format!("web-{i}"),
            current_image: "web:v1".into(),
        })
        .collect()
}

/// [`discovered`] for a rollout never planned yet.
fn first(spec: &FleetRolloutSpec, status: &FleetRolloutStatus, d: Result<Discovered, Blocked>) -> Discovery {
    let now = Timestamp::from_second(1_800_000_000).unwrap();
    discovered(now, 1, spec, status, d, &rules(), NAMESPACE)
}

#[test]
fn a_discovered_fleet_is_planned() {
    let fleet = Discovered::local(candidates("", "tenant-0", 3));
    let planned = first(&spec(5), &FleetRolloutStatus::default(), Ok(fleet.clone()));
    assert_eq!(planned, Discovery::Plan(fleet));
}

#[test]
fn a_blocked_discovery_halts_once_and_then_retries() {
    let why = Blocked { reason: reason::NO_TARGETS, message: "no Deployment matches app=web".into() };
    let Discovery::Take(step) = first(&spec(5), &FleetRolloutStatus::default(), Err(why.clone())) else {
        panic!("nothing to plan");
    };
    let written = halted(*step, &why);
    assert_eq!(first(&spec(5), &written, Err(why)), Discovery::Take(Box::new(RETRY)));
}

#[test]
fn a_fleet_the_scope_rules_refuse_entirely_halts() {
    let fleet = Discovered::local(candidates("", "kube-system", 2));
    let Discovery::Take(step) = first(&spec(5), &FleetRolloutStatus::default(), Ok(fleet)) else {
        panic!("refused");
    };
    let Step::Write(t) = *step else { panic!("a halt writes why") };
    assert_eq!(t.status.reason.as_deref(), Some(reason::TARGET_PROTECTED));
}

#[test]
fn planning_waits_for_picked_member_clusters_that_do_not_answer() {
    let fleet = Discovered {
        candidates: candidates("east", "tenant-0", 2),
        unanswered: vec![("west".into(), "connection refused".into())],
        ..Default::default()
    };
    let fresh = FleetRolloutStatus::default();
    let Discovery::Take(step) = first(&spec(5), &fresh, Ok(fleet.clone())) else { panic!("waits") };
    let Step::Retry { write: Some(t), after: CLUSTERS_RETRY } = *step else { panic!("saying why: {step:?}") };
    assert_eq!(t.status.reason.as_deref(), Some(reason::WAITING_FOR_CLUSTERS));
    let again = first(&spec(5), &t.status, Ok(fleet));
    let retry = Step::Retry { write: None, after: CLUSTERS_RETRY };
    assert_eq!(again, Discovery::Take(Box::new(retry)), "written once");
}

#[test]
fn no_member_cluster_with_targets_answering_halts() {
    // A rollout already running re-plans without waiting for member clusters.
    let sim = Sim::new(spec(5), 10);
    let fleet = Discovered { unanswered: vec![("west".into(), "timeout".into())], ..Default::default() };
    let decided = discovered(sim.now, 2, &sim.spec, &sim.status, Ok(fleet), &rules(), NAMESPACE);
    let Discovery::Take(step) = decided else { panic!("halts: {decided:?}") };
    let Step::Write(t) = *step else { panic!("a halt writes why") };
    assert_eq!(t.status.reason.as_deref(), Some(reason::CLUSTER_UNREACHABLE));
    assert!(t.status.message.as_deref().is_some_and(|m| m.ends_with("not answering: west")));
}
