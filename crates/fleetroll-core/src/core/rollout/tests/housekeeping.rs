//! Housekeeping: a node rollout holds its DaemonSet before anything changes and hands it back once done;
//! a rollout's TTL deletes it, but never while it holds a DaemonSet; which targets are probed.

use super::*;
use crate::api::HttpCheck;

fn node_spec() -> FleetRolloutSpec {
    let mut s = spec(5);
    s.targets.kind = TargetKind::Node;
    s.targets.daemon_set = Some("edge-agent".into());
    s
}

#[test]
fn a_node_rollout_holds_its_daemonset_before_its_first_batch_and_hands_it_back_when_done() {
    let mut sim = Sim::new(node_spec(), 10);
    assert_eq!(sim.advance(), Step::HoldDaemonSet, "held before any batch starts");
    sim.step();
    assert!(matches!(sim.advance(), Step::Write(_)), "then the first intent: {:?}", sim.advance());
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert!(!sim.holds_daemonset, "handed back once it succeeded");
    assert!(matches!(sim.advance(), Step::Wait { .. }), "and then idle");
}

#[test]
fn a_failed_node_rollout_keeps_its_daemonset_and_its_ttl_waits_until_it_is_handed_back() {
    let mut s = node_spec();
    s.strategy.on_failure = crate::api::FailurePolicy::Abort;
    s.health.timeout = "30s".into();
    s.ttl_seconds_after_finished = Some(0);
    let mut sim = Sim::new(s, 10);
    sim.broken = sim.plan.batches[0].iter().map(key).collect();
    sim.settle();
    sim.pass(Duration::from_secs(31));
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Failed);
    assert!(sim.holds_daemonset, "a failed node rollout keeps the DaemonSet on OnDelete");
    sim.pass(Duration::from_secs(3600));
    assert!(matches!(sim.advance(), Step::Wait { .. }), "no deletion while it holds the DaemonSet");
    sim.holds_daemonset = false; // deleted by hand, or rolled back: handed back
    assert_eq!(sim.advance(), Step::Delete);
}

#[test]
fn a_finished_rollout_is_deleted_once_its_ttl_has_passed_and_waits_for_it_until_then() {
    let mut s = spec(5);
    s.ttl_seconds_after_finished = Some(60);
    let mut sim = Sim::new(s, 10);
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
    match sim.advance() {
        Step::Wait { after: Some(left) } => assert!(left <= Duration::from_secs(60), "{left:?}"),
        other => panic!("waits for the TTL: {other:?}"),
    }
    sim.pass(Duration::from_secs(60));
    assert_eq!(sim.advance(), Step::Delete);
}

#[test]
fn only_ready_targets_of_a_batch_being_verified_are_probed() {
    let mut s = spec(5);
    s.health.http = Some(HttpCheck { url: "http://{name}/healthz".into(), expect_status: 200 });
    let mut sim = Sim::new(s, 10);
    sim.auto_ready = false;
    let probes = |sim: &Sim| {
        let world = &sim.world;
        probes(&sim.spec, &sim.status, &sim.plan, &|t: &PlannedTarget| world.get(&key(t)).cloned()).len()
    };
    assert_eq!(probes(&sim), 0, "no batch in flight");
    sim.step(); // intent
    sim.step(); // applied: every target of batch 1 is rolling
    assert_eq!(probes(&sim), 0, "none is ready yet");
    let first = key(&sim.plan.batches[0][0]);
    sim.world.get_mut(&first).unwrap().readiness = Readiness::Ready;
    assert_eq!(probes(&sim), 1);
}
