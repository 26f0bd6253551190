//! Gates: pause and resume, approvals bound to the plan, soak, pacing, and HTTP checks.

use super::*;
use crate::api::{Approval, HttpCheck, PendingApproval};

/// Approves the batch the rollout waits for (as `who`, when named), citing the hashes it names, and lets
/// the batch be applied without its targets becoming ready. Returns the wait it answered.
fn approve_and_apply_unready(sim: &mut Sim, who: Option<&str>) -> PendingApproval {
    let pending = sim.status.pending_approval.clone().expect("a batch waits for approval");
    sim.spec.approvals.push(Approval {
        batch: pending.batch,
        plan_hash: pending.plan_hash.clone(),
        gates_hash: pending.gates_hash.clone(),
        approved_by: who.map(String::from),
        override_windows: None,
    });
    sim.auto_ready = false;
    sim.step(); // approved, intent
    sim.step(); // applied
    pending
}

/// Makes the first batch's targets ready, and lets later ones become ready on their own.
fn ready_first_batch(sim: &mut Sim) {
    for t in sim.plan.batches[0].clone() {
        sim.world.get_mut(&key(&t)).unwrap().readiness = Readiness::Ready;
    }
    sim.auto_ready = true;
}

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

    let gates = pending.gates_hash.clone();
    assert_eq!(gates, plan::gates_hash(&sim.spec, None));
    let approval = |plan_hash: &str, gates_hash: &str| Approval {
        batch: 0,
        plan_hash: plan_hash.into(),
        gates_hash: gates_hash.into(),
        approved_by: Some("alice".into()),
        override_windows: None,
    };
    sim.spec.approvals = vec![approval("0000000000000000", &gates)];
    sim.settle();
    assert_eq!(sim.status.phase, Phase::WaitingForApproval, "an approval of another plan does not count");
    sim.spec.approvals = vec![approval(&pending.plan_hash, "0000000000000000")];
    sim.settle();
    assert_eq!(sim.status.phase, Phase::WaitingForApproval, "nor one of other gates");

    sim.spec.approvals = vec![approval(&pending.plan_hash, &gates)];
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded, "FirstBatch gates only the first batch");
    assert_eq!(sim.status.approvals[0].approved_by.as_deref(), Some("alice"));
}

#[test]
fn gates_loosened_after_an_approval_hold_the_next_batch_for_another() {
    let mut s = spec(5);
    s.strategy.approval = ApprovalMode::FirstBatch;
    s.health.timeout = "10m".into();
    let mut sim = Sim::new(s, 15);
    sim.settle();
    let pending = approve_and_apply_unready(&mut sim, Some("alice"));
    assert_eq!(sim.status.approvals.len(), 1);
    // Loosened after the approval: a later batch waits for another, whatever FirstBatch says; so does
    // turning approvals off.
    for loosen in [
        |s: &mut FleetRolloutSpec| s.strategy.max_failures = IntOrString::String("100%".into()),
        |s: &mut FleetRolloutSpec| s.health.timeout = "720h".into(),
        |s: &mut FleetRolloutSpec| s.strategy.on_failure = FailurePolicy::Abort,
        |s: &mut FleetRolloutSpec| s.strategy.approval = ApprovalMode::None,
        |s: &mut FleetRolloutSpec| s.resume_token = Some("release-the-hold".into()),
    ] {
        let mut loosened = sim.spec.clone();
        loosen(&mut loosened);
        assert_ne!(plan::gates_hash(&loosened, None), pending.gates_hash);
    }
    sim.spec.strategy.approval = ApprovalMode::None;
    ready_first_batch(&mut sim);
    sim.settle();
    assert_eq!(sim.status.phase, Phase::WaitingForApproval);
    let again = sim.status.pending_approval.clone().unwrap();
    assert_eq!(again.batch, 1);
    assert_ne!(again.gates_hash, pending.gates_hash);
    assert_eq!(sim.changes.len(), 5, "nothing past the approved batch changed");
    // The new gates approved: on it goes, and the unchanged gates let the rest through.
    sim.spec.approvals.push(Approval {
        batch: 1,
        plan_hash: again.plan_hash,
        gates_hash: again.gates_hash,
        approved_by: Some("bob".into()),
        override_windows: None,
    });
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
}

#[test]
fn an_approval_recorded_before_approvals_bound_gates_holds_nothing_back() {
    let mut s = spec(5);
    s.strategy.approval = ApprovalMode::FirstBatch;
    let mut sim = Sim::new(s, 10);
    sim.settle();
    approve_and_apply_unready(&mut sim, None);
    // As an operator upgraded mid-rollout reads the record an older one wrote (no gates hash).
    sim.status.approvals.last_mut().unwrap().gates_hash = String::new();
    ready_first_batch(&mut sim);
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded, "not held for gates it never bound");
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
        let gates_hash = plan::gates_hash(&sim.spec, None);
        sim.spec.approvals.push(Approval {
            batch,
            plan_hash: sim.plan.hash.clone(),
            gates_hash,
            approved_by: None,
            override_windows: None,
        });
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

#[test]
fn a_policy_the_plan_breaks_holds_the_first_batch_until_it_no_longer_does() {
    use crate::core::policy::Guardrails;
    let mut sim = Sim::new(spec(4), 8);
    sim.guardrails = Guardrails { max_batch_size: Some((2, "agents".into())), ..Default::default() };
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Paused);
    assert!(sim.changes.is_empty(), "nothing changed: {:?}", sim.changes);
    assert_eq!(sim.status.reason.as_deref(), Some(reason::POLICY_VIOLATION));
    let hold = sim.status.policy_hold.clone().unwrap();
    assert_eq!((hold.policy.as_str(), hold.rule.as_str()), ("agents", "maxBatchSize"));
    assert!(sim.status.message.as_deref().unwrap().contains("held before batch 1/2 by FleetRolloutPolicy agents (maxBatchSize): batch 1 has 4 targets, at most 2 allowed"), "{:?}", sim.status.message);
    // The platform raises its cap: the rollout goes on, and the hold is gone.
    sim.guardrails.max_batch_size = Some((4, "agents".into()));
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert_eq!(sim.status.policy_hold, None);
    assert_eq!(sim.changes.len(), 8);
}

#[test]
fn a_policy_requiring_approval_holds_a_rollout_whose_spec_asks_for_none() {
    use crate::core::policy::Guardrails;
    let mut sim = Sim::new(spec(4), 8);
    sim.guardrails =
        Guardrails { approval: Some((ApprovalMode::FirstBatch, "agents".into())), ..Default::default() };
    sim.settle();
    assert_eq!(sim.status.phase, Phase::WaitingForApproval);
    assert!(sim.changes.is_empty(), "the first batch waits for a person");
    assert_eq!(sim.status.pending_approval.as_ref().map(|p| p.batch), Some(0));
}

#[test]
fn the_waiting_approval_names_the_approvers_of_its_policies_as_they_change() {
    use crate::{api::Approvers, core::policy::Guardrails};
    let mut sim = Sim::new(spec(4), 8);
    let approvers = |groups: &[&str]| Approvers {
        groups: groups.iter().map(|g| g.to_string()).collect(),
        ..Default::default()
    };
    sim.guardrails = Guardrails {
        approval: Some((ApprovalMode::FirstBatch, "agents".into())),
        approvers: vec![("agents".into(), approvers(&["approvers"]))],
        ..Default::default()
    };
    sim.settle();
    let pending = sim.status.pending_approval.clone().unwrap();
    assert_eq!(pending.approvers.len(), 1);
    assert_eq!(
        (pending.approvers[0].policy.as_str(), &pending.approvers[0].groups[..]),
        ("agents", &["approvers".to_string()][..])
    );
    // The platform changes who may approve while the batch waits: the batch waits for an approval of new
    // gates (an approval of the old ones was not judged under the new approvers), naming them.
    sim.guardrails.approvers = vec![("agents".into(), approvers(&["sre"]))];
    sim.settle();
    let now = sim.status.pending_approval.clone().unwrap();
    assert_eq!(now.batch, pending.batch);
    assert_ne!(now.gates_hash, pending.gates_hash);
    assert_eq!(now.approvers[0].groups, vec!["sre".to_string()]);
    assert!(sim.changes.is_empty());
}

#[test]
fn a_creator_the_operator_cannot_act_as_holds_every_batch_until_it_can() {
    let mut sim = Sim::new(spec(4), 8);
    sim.creator.cannot_act =
        Some("cannot act as \"root\": members of system:masters cannot be impersonated".into());
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Paused);
    assert!(sim.changes.is_empty(), "nothing changed: {:?}", sim.changes);
    assert_eq!(sim.status.reason.as_deref(), Some(reason::CANNOT_ACT_AS_CREATOR));
    let message = sim.status.message.clone().unwrap();
    assert!(
        message.starts_with("held before batch 1/2: fleetroll changes targets as the rollout's creator, and cannot act as \"root\": members of system:masters"),
        "{message}"
    );
    // Held again by the same cause: no second write.
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.creator_hold.as_deref().map(|w| w.contains("system:masters")), Some(true));
    // The operator may act now (run with --act-as operator, say): the rollout goes on.
    sim.creator.cannot_act = None;
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert_eq!(sim.status.creator_hold, None);
    assert_eq!(sim.changes.len(), 8);
}

#[test]
fn a_batch_begun_before_the_creator_could_no_longer_be_acted_as_changes_nothing_until_it_can() {
    let mut sim = Sim::new(spec(4), 8);
    // The first batch's intent is written (an operator of the previous version, say); then the operator
    // can no longer act as the creator.
    for _ in 0..10 {
        if sim.status.current().is_some_and(|b| b.state == crate::api::BatchState::Applying) {
            break;
        }
        sim.step();
    }
    assert!(sim.status.current().is_some_and(|b| b.state == crate::api::BatchState::Applying));
    sim.creator.cannot_act =
        Some("cannot act as \"root\": members of system:masters cannot be impersonated".into());
    sim.settle();
    assert!(sim.changes.is_empty(), "changed: {:?}", sim.changes);
    assert_eq!(sim.status.reason.as_deref(), Some(reason::CANNOT_ACT_AS_CREATOR));
    assert!(sim.status.creator_hold.as_deref().is_some_and(|w| w.contains("system:masters")));
    sim.creator.cannot_act = None;
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert_eq!(sim.changes.len(), 8);
}

#[test]
fn an_approval_given_before_a_policy_named_approvers_does_not_count() {
    use crate::{api::Approvers, core::policy::Guardrails};
    let mut s = spec(4);
    s.strategy.approval = ApprovalMode::FirstBatch;
    let mut sim = Sim::new(s, 8);
    sim.settle();
    let before = sim.status.pending_approval.clone().unwrap();
    assert_eq!(before.gates_hash, plan::gates_hash(&sim.spec, None), "no policy: the spec's gates alone");
    assert_eq!(sim.status.approver_epoch, None);
    let erin = |gates_hash: &str| Approval {
        batch: 0,
        plan_hash: before.plan_hash.clone(),
        gates_hash: gates_hash.into(),
        approved_by: Some("erin".into()),
        override_windows: None,
    };
    sim.spec.approvals = vec![erin(&before.gates_hash)];
    // Before the operator sees it, the platform names who approves: erin's approval is not judged by it.
    let named = |groups: &[&str]| Approvers {
        groups: groups.iter().map(|g| g.to_string()).collect(),
        ..Default::default()
    };
    sim.guardrails = Guardrails {
        approvers: vec![("agents".into(), named(&["release-managers", "sre"]))],
        ..Default::default()
    };
    sim.settle();
    assert_eq!(sim.status.phase, Phase::WaitingForApproval);
    assert!(sim.changes.is_empty(), "nothing changed: {:?}", sim.changes);
    let epoch = sim.status.approver_epoch.clone().expect("an epoch once approvers are named");
    let now = sim.status.pending_approval.clone().unwrap();
    assert_eq!(now.gates_hash, plan::gates_hash(&sim.spec, Some(&epoch.nonce)), "the gates bind its nonce");
    assert_ne!(now.gates_hash, before.gates_hash);
    // The same approvers listed in another order are no change: the epoch (and its nonce) stays.
    sim.guardrails.approvers[0].1 = named(&["sre", "release-managers"]);
    sim.settle();
    assert_eq!(sim.status.approver_epoch.as_ref(), Some(&epoch));
    // The policy is deleted (and will be re-created): erin's approval does not come back to life.
    sim.guardrails = Guardrails::default();
    sim.settle();
    assert_eq!(sim.status.phase, Phase::WaitingForApproval, "FirstBatch by the spec still waits");
    assert!(sim.changes.is_empty(), "erin's approval of the spec's gates alone does not count");
    let gone = sim.status.approver_epoch.clone().unwrap();
    assert_ne!(gone.nonce, epoch.nonce, "a new epoch: no one names approvers now");
    assert_eq!(gone.approvers, "");
    sim.guardrails =
        Guardrails { approvers: vec![("agents".into(), named(&["release-managers"]))], ..Default::default() };
    sim.settle();
    let back = sim.status.approver_epoch.clone().unwrap();
    assert!(back.nonce != gone.nonce && back.nonce != epoch.nonce);
    // An approval of these gates (admission judged its approver under the policy) lets the batch go.
    let gates = sim.status.pending_approval.clone().unwrap().gates_hash;
    sim.spec.approvals = vec![erin(&gates)];
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
}

#[test]
fn approvers_named_after_an_approval_hold_the_next_batch_for_theirs() {
    use crate::{api::Approvers, core::policy::Guardrails};
    let mut s = spec(4);
    s.strategy.approval = ApprovalMode::FirstBatch;
    s.health.timeout = "10m".into();
    let mut sim = Sim::new(s, 8);
    sim.settle();
    approve_and_apply_unready(&mut sim, Some("erin"));
    let approvers = Approvers { groups: vec!["release-managers".into()], ..Default::default() };
    sim.guardrails = Guardrails { approvers: vec![("agents".into(), approvers)], ..Default::default() };
    ready_first_batch(&mut sim);
    sim.settle();
    assert_eq!(sim.status.phase, Phase::WaitingForApproval, "FirstBatch, yet the next batch waits");
    assert_eq!(sim.status.pending_approval.as_ref().map(|p| p.batch), Some(1));
    assert_eq!(sim.changes.len(), 4, "only the batch erin approved changed");
}
