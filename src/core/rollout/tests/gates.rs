//! Gates: pause and resume, approvals bound to the plan, soak, pacing, and HTTP checks.

use super::*;
use crate::api::{Approval, HttpCheck};

#[test]
fn pause_holds_the_next_batch_and_resume_releases_it() {
    let mut sim = Sim::new(spec(5), 15);
    sim.spec.paused = true;
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Paused);
    assert!(sim.changes.is_empty());
    assert!(conditions::is_true(&sim.status.conditions, conditions::PAUSED));
    // Idle while paused: no writes.
    let writes = sim.writes;
    assert!(matches!(sim.step(), Step::Wait { after: None }));
    assert_eq!(sim.writes, writes);
    sim.spec.paused = false;
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
}

#[test]
fn approvals_are_bound_to_the_plan_hash() {
    let mut s = spec(5);
    s.strategy.approval = ApprovalMode::FirstBatch;
    let mut sim = Sim::new(s, 10);
    sim.settle();
    assert_eq!(sim.status.phase, Phase::WaitingForApproval);
    let pending = sim.status.pending_approval.clone().unwrap();
    assert_eq!((pending.batch, pending.plan_hash.as_str()), (0, sim.plan.hash.as_str()));

    sim.spec.approvals = vec![Approval { batch: 0, plan_hash: "0000000000000000".into(), approved_by: None }];
    sim.settle();
    assert_eq!(sim.status.phase, Phase::WaitingForApproval, "an approval of another plan does not count");

    sim.spec.approvals =
        vec![Approval { batch: 0, plan_hash: pending.plan_hash.clone(), approved_by: Some("alice".into()) }];
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded, "FirstBatch gates only the first batch");
    assert_eq!(sim.status.approvals[0].approved_by.as_deref(), Some("alice"));
}

#[test]
fn every_batch_approval_gates_each_batch() {
    let mut s = spec(5);
    s.strategy.approval = ApprovalMode::EveryBatch;
    let mut sim = Sim::new(s, 15);
    for batch in 0..3u32 {
        sim.settle();
        assert_eq!(sim.status.phase, Phase::WaitingForApproval);
        assert_eq!(sim.status.pending_approval.as_ref().map(|p| p.batch), Some(batch));
        assert_eq!(sim.changes.len(), 5 * batch as usize);
        sim.spec.approvals.push(Approval { batch, plan_hash: sim.plan.hash.clone(), approved_by: None });
    }
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
}

#[test]
fn soak_requires_the_batch_to_stay_healthy() {
    let mut s = spec(5);
    s.health.soak = "30s".into();
    let mut sim = Sim::new(s, 10);
    assert_eq!(sim.settle(), Some(Duration::from_secs(30)));
    assert!(sim.status.batches[0].healthy_since.is_some());
    // A target drops out mid-soak: the clock stops.
    sim.world.get_mut(&key(&sim.plan.batches[0][0])).unwrap().readiness = Readiness::NotReady("crash".into());
    sim.auto_ready = false;
    sim.pass(Duration::from_secs(10));
    sim.settle();
    assert!(sim.status.batches[0].healthy_since.is_none());
    sim.auto_ready = true;
    sim.world.get_mut(&key(&sim.plan.batches[0][0])).unwrap().readiness = Readiness::Ready;
    assert_eq!(sim.settle(), Some(Duration::from_secs(30)));
    sim.pass(Duration::from_secs(30));
    sim.settle();
    sim.pass(Duration::from_secs(30));
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
}

#[test]
fn pause_between_batches_is_a_timer_not_a_loop() {
    let mut s = spec(5);
    s.strategy.pause_between_batches = "1m".into();
    let mut sim = Sim::new(s, 10);
    assert_eq!(sim.settle(), Some(Duration::from_secs(60)));
    assert_eq!(sim.status.reason.as_deref(), Some(reason::WAITING_BETWEEN_BATCHES));
    assert_eq!(sim.changes.len(), 5);
    sim.pass(Duration::from_secs(60));
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::Succeeded);
}

/// Five targets, each with an HTTP check and a 30 s health timeout.
fn http_checked() -> FleetRolloutSpec {
    let mut s = spec(5);
    s.health.timeout = "30s".into();
    s.health.http = Some(HttpCheck { url: "http://{name}/healthz".into(), expect_status: 200 });
    s
}

#[test]
fn a_failing_http_check_fails_the_target_at_the_timeout() {
    let mut sim = Sim::new(http_checked(), 5);
    for st in sim.world.values_mut() {
        st.http = Some(Err("503 Service Unavailable".into()));
    }
    sim.settle();
    sim.pass(Duration::from_secs(31));
    sim.settle();
    assert_eq!(sim.status.counts.failed, 5);
    assert_eq!(sim.status.failures[0].reason, reason::HTTP_CHECK_FAILED);
}

#[test]
fn a_ready_target_is_never_healthy_before_its_http_check_has_run() {
    let mut sim = Sim::new(http_checked(), 5);
    // Ready, but not probed yet (it became ready after this step's probes ran).
    let wait = sim.settle().expect("waits for the probe");
    assert!(wait <= Duration::from_millis(200), "the probe is due soon, not at the timeout: {wait:?}");
    assert_eq!(sim.status.counts.healthy, 0);
    assert_eq!(sim.status.phase, Phase::Progressing);
    for st in sim.world.values_mut() {
        st.http = Some(Ok(()));
    }
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.counts.healthy, 5);
}
