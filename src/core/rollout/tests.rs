//! The state machine driven against a simulated fleet: every transition, the exactly-once guarantee under
//! replays, the failure policies and the gates, without a cluster.

use std::collections::HashMap;

use k8s_openapi::apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString};

use super::*;
use crate::api::{Approval, Health, HttpCheck, PlanStorage, Strategy, TargetKind, Targets};

const UID: &str = "0d4c8f2e";

fn spec(n_batch: i32) -> FleetRolloutSpec {
    FleetRolloutSpec {
        image: "web:v2".into(),
        container: None,
        targets: Targets {
            kind: TargetKind::Deployment,
            selector: LabelSelector::default(),
            namespace_selector: None,
            daemon_set: None,
            node_selector: None,
        },
        strategy: Strategy { batch_size: IntOrString::Int(n_batch), ..Strategy::default() },
        health: Health::default(),
        paused: false,
        abort: false,
        rollback: false,
        ttl_seconds_after_finished: None,
        approvals: Vec::new(),
    }
}

/// A fleet whose targets follow the simulated cluster: a change makes a target NotReady until the test
/// (or `auto_ready`) marks it Ready.
struct Sim {
    spec: FleetRolloutSpec,
    status: FleetRolloutStatus,
    plan: Plan,
    world: HashMap<String, TargetState>,
    now: Timestamp,
    generation: i64,
    /// Every (target, key) change the controller made, in order.
    changes: Vec<(String, String)>,
    writes: usize,
    auto_ready: bool,
    /// Targets that never become ready.
    broken: Vec<String>,
    /// Targets changed and not Ready yet (kept so a step need not scan the whole fleet).
    not_ready: std::collections::HashSet<String>,
    max_in_flight: usize,
    /// Targets the scope rules refuse now, and why.
    refused: HashMap<String, &'static str>,
    /// Targets whose change the API server refuses.
    denied: std::collections::HashSet<String>,
}

fn key(t: &PlannedTarget) -> String {
    format!("{}/{}", t.namespace, t.name)
}

impl Sim {
    fn new(spec: FleetRolloutSpec, n: usize) -> Self {
        let candidates: Vec<plan::Candidate> = (0..n)
            .map(|i| plan::Candidate {
                namespace: format!("tenant-{}", i % 4),
                name: format!("web-{i:02}"),
                current_image: "web:v1".into(),
            })
            .collect();
        let inputs = RevisionInputs::of(&spec);
        let plan = plan::build(candidates, &inputs, "spechash", &HashMap::new()).unwrap();
        let world = plan
            .batches
            .iter()
            .flatten()
            .map(|t| {
                (
                    key(t),
                    TargetState {
                        image: Ok("web:v1".into()),
                        applied: None,
                        readiness: Readiness::Ready,
                        http: None,
                    },
                )
            })
            .collect();
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let plan_ref = PlanRef {
            hash: plan.hash.clone(),
            total_targets: plan.total_targets(),
            total_batches: plan.total_batches(),
            storage: PlanStorage::Status,
            batches: plan.batches.clone(),
            shards: Vec::new(),
        };
        let t = start_revision(
            now,
            1,
            &spec,
            &FleetRolloutStatus::default(),
            NewRevision { inputs, spec_hash: "spechash".into(), plan: &plan, plan_ref },
        );
        Sim {
            spec,
            status: t.status,
            plan,
            world,
            now,
            generation: 1,
            changes: Vec::new(),
            writes: 1,
            auto_ready: true,
            broken: Vec::new(),
            not_ready: Default::default(),
            max_in_flight: 0,
            refused: HashMap::new(),
            denied: Default::default(),
        }
    }

    fn advance(&self) -> Step {
        let world = &self.world;
        let lookup = |t: &PlannedTarget| world.get(&key(t)).cloned();
        let refused = &self.refused;
        let scope = |t: &PlannedTarget| match refused.get(&key(t)) {
            Some(reason) => Err(Refusal { reason, message: format!("{}: refused", key(t)) }),
            None => Ok(()),
        };
        advance(&Facts {
            now: self.now,
            uid: UID,
            generation: self.generation,
            spec: &self.spec,
            status: &self.status,
            plan: &self.plan,
            target: &lookup,
            unplanned: &|| None,
            scope: &scope,
        })
    }

    /// Performs one step like the controller would. Returns it for inspection.
    fn step(&mut self) -> Step {
        let step = self.advance();
        match &step {
            Step::Write(t) => {
                self.status = t.status.clone();
                self.writes += 1;
            }
            Step::Apply { key: k, image, targets, after } => {
                let mut refused = Vec::new();
                for t in targets {
                    if self.denied.contains(&key(t)) {
                        refused.push((t.clone(), format!("admission webhook denied {}", key(t))));
                    } else {
                        self.change(t, image, k);
                    }
                }
                let batch = after.status.current_batch.unwrap_or_default();
                self.status = denied(after.clone(), batch, refused).status;
                self.writes += 1;
            }
            Step::Restore { key: k, targets, refused } => {
                let mut restored = 0;
                for t in targets {
                    self.change(t, &t.previous_image.clone(), k);
                    restored += 1;
                }
                self.status = restored_status(self, restored, refused.clone());
                self.writes += 1;
            }
            Step::Wait { .. } => {}
        }
        self.max_in_flight = self.max_in_flight.max(self.not_ready.len());
        if self.auto_ready {
            let ready: Vec<String> =
                self.not_ready.iter().filter(|t| !self.broken.contains(t)).cloned().collect();
            for t in ready {
                self.not_ready.remove(&t);
                if let Some(s) = self.world.get_mut(&t) {
                    s.readiness = Readiness::Ready;
                }
            }
        }
        step
    }

    fn change(&mut self, t: &PlannedTarget, image: &str, k: &str) {
        let Some(s) = self.world.get_mut(&key(t)) else {
            return;
        };
        if s.applied.as_deref() == Some(k) {
            return; // already carries the key: not changed again
        }
        s.image = Ok(image.to_string());
        s.applied = Some(k.to_string());
        s.readiness = Readiness::NotReady("rolling".into());
        self.not_ready.insert(key(t));
        self.changes.push((key(t), k.to_string()));
    }

    /// Steps until the machine waits; returns how long it wants to wait.
    fn settle(&mut self) -> Option<Duration> {
        for _ in 0..10_000 {
            if let Step::Wait { after } = self.step() {
                return after;
            }
        }
        panic!("no wait after 10000 steps: a hot loop");
    }

    fn pass(&mut self, d: Duration) {
        self.now = later(self.now, d);
    }

    fn changes_of(&self, target: &str) -> usize {
        self.changes.iter().filter(|(t, _)| t == target).count()
    }
}

fn restored_status(sim: &Sim, restored: u32, refused: Vec<TargetFailure>) -> FleetRolloutStatus {
    super::restored(sim.now, sim.generation, &sim.status, restored, 0, refused).status
}

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
fn targets_that_never_become_ready_fail_at_the_timeout_and_pause_the_rollout() {
    let mut s = spec(10);
    s.health.timeout = "2m".into();
    let mut sim = Sim::new(s, 20);
    sim.broken = vec!["tenant-0/web-00".into()];
    let wait = sim.settle().expect("waits for the timeout");
    assert!(wait <= Duration::from_secs(120));
    assert_eq!(sim.status.phase, Phase::Progressing);
    sim.pass(Duration::from_secs(121));
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::Paused);
    assert_eq!(sim.status.reason.as_deref(), Some(reason::FAILURE_BUDGET_EXCEEDED));
    assert_eq!(sim.status.counts.failed, 1);
    assert_eq!(sim.status.failures[0].reason, reason::TIMEOUT);
    assert!(conditions::is_true(&sim.status.conditions, conditions::DEGRADED));
    assert_eq!(sim.changes.len(), 10, "the next batch did not start");

    // Raising the budget lets it go on.
    sim.spec.strategy.max_failures = IntOrString::Int(1);
    sim.generation = 2;
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert_eq!(sim.changes.len(), 20);
    assert!(!conditions::is_true(&sim.status.conditions, conditions::DEGRADED));
}

#[test]
fn the_rollback_policy_restores_each_changed_target_once() {
    let mut s = spec(5);
    s.health.timeout = "1m".into();
    s.strategy.on_failure = FailurePolicy::Rollback;
    let mut sim = Sim::new(s, 15);
    // Batch 2 (targets 5..10) has a broken target.
    let victim = key(&sim.plan.batches[1][0]);
    sim.broken = vec![victim];
    sim.settle();
    sim.pass(Duration::from_secs(61));
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::RolledBack);
    let rb = sim.status.rollback.clone().unwrap();
    assert_eq!((rb.reason.as_str(), rb.restored), (reason::FAILURE_BUDGET_EXCEEDED, 10));
    // 10 forward changes, 10 restores, batch 3 never touched.
    let rollback_key = format!("{UID}/1/rollback");
    assert_eq!(sim.changes.iter().filter(|(_, k)| *k == rollback_key).count(), 10);
    assert_eq!(sim.changes.len(), 20);
    for t in sim.plan.through(1) {
        assert_eq!(sim.world[&key(t)].image, Ok("web:v1".into()));
    }
    for t in sim.plan.batch(2) {
        assert_eq!(sim.changes_of(&key(t)), 0);
    }
    // Done means done: nothing more happens.
    assert!(matches!(sim.advance(), Step::Wait { after: None }));
}

#[test]
fn the_abort_policy_stops_as_failed_and_leaves_targets_alone() {
    let mut s = spec(5);
    s.health.timeout = "1m".into();
    s.strategy.on_failure = FailurePolicy::Abort;
    let mut sim = Sim::new(s, 10);
    sim.broken = vec![key(&sim.plan.batches[0][2])];
    sim.settle();
    sim.pass(Duration::from_secs(61));
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Failed);
    assert_eq!(sim.status.reason.as_deref(), Some(reason::FAILURE_BUDGET_EXCEEDED));
    assert_eq!(sim.changes.len(), 5);
    assert!(!conditions::is_true(&sim.status.conditions, conditions::COMPLETE));
}

#[test]
fn abort_on_request_stops_before_the_next_batch() {
    let mut sim = Sim::new(spec(5), 20);
    sim.auto_ready = false;
    sim.step();
    sim.step(); // batch 1 applied
    sim.spec.abort = true;
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Aborted);
    assert_eq!(sim.status.reason.as_deref(), Some(reason::ABORT_REQUESTED));
    assert_eq!(sim.changes.len(), 5);
}

#[test]
fn a_requested_rollback_after_success_undoes_the_rollout() {
    let mut sim = Sim::new(spec(10), 20);
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
    sim.spec.rollback = true;
    sim.settle();
    assert_eq!(sim.status.phase, Phase::RolledBack);
    assert!(sim.world.values().all(|s| s.image == Ok("web:v1".into())));
    assert_eq!(sim.status.rollback.as_ref().map(|r| r.reason.as_str()), Some(reason::ROLLBACK_REQUESTED));
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
        NewRevision { inputs, spec_hash: "h2".into(), plan: &plan, plan_ref },
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
fn a_target_refused_at_its_batch_is_left_alone_and_reported_not_failed() {
    // A namespace opts out after the plan was frozen: its targets in later batches are never changed.
    let mut sim = Sim::new(spec(5), 10);
    let opted_out: Vec<String> = sim.plan.batches[1].iter().take(2).map(key).collect();
    for t in &opted_out {
        sim.refused.insert(t.clone(), crate::core::scope::reason::NOT_OPTED_IN);
    }
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    for t in &opted_out {
        assert_eq!(sim.changes_of(t), 0, "{t} was changed");
    }
    let c = &sim.status.counts;
    assert_eq!((c.updated, c.healthy, c.failed, c.refused), (8, 8, 0, 2));
    let reported: Vec<&str> = sim.status.failures.iter().map(|f| f.reason.as_str()).collect();
    assert_eq!(reported, [crate::core::scope::reason::NOT_OPTED_IN; 2]);
    assert!(sim.status.failures.iter().all(|f| f.batch == 1));
}

#[test]
fn a_target_changed_before_its_namespace_opted_out_is_judged_on_its_health() {
    let mut sim = Sim::new(spec(5), 10);
    sim.step(); // intent of batch 0
    sim.step(); // applied
    // Opted out after the change: the target carries the batch's key, so it counts as what it is.
    let first = key(&sim.plan.batches[0][0]);
    sim.refused.insert(first.clone(), crate::core::scope::reason::NOT_OPTED_IN);
    sim.settle();
    assert_eq!(sim.changes_of(&first), 1);
    assert_eq!(sim.status.counts.refused, 0);
    assert!(sim.status.batches.iter().any(|b| b.index == 0 && b.state == BatchState::Succeeded));
}

#[test]
fn a_rollback_restores_only_what_is_still_in_scope() {
    let mut s = spec(5);
    s.strategy.on_failure = FailurePolicy::Rollback;
    let mut sim = Sim::new(s, 10);
    sim.broken.push(key(&sim.plan.batches[1][4]));
    sim.settle();
    sim.pass(Duration::from_secs(601));
    // Meanwhile another rollout took over a target of batch 0.
    let taken = key(&sim.plan.batches[0][2]);
    sim.refused.insert(taken.clone(), crate::core::scope::reason::HELD);
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::RolledBack);
    let rb = sim.status.rollback.clone().unwrap();
    assert_eq!((rb.restored, rb.skipped), (9, 1));
    assert_eq!(sim.changes_of(&taken), 1, "changed by the rollout, never restored");
    assert!(sim.status.failures.iter().any(|f| f.reason == crate::core::scope::reason::HELD));
}

#[test]
fn a_change_the_api_server_refuses_fails_that_target_at_once_with_its_message() {
    let mut s = spec(5);
    s.strategy.max_failures = IntOrString::Int(1);
    let mut sim = Sim::new(s, 10);
    let refused = key(&sim.plan.batches[0][1]);
    sim.denied.insert(refused.clone());
    sim.step(); // intent
    sim.step(); // applied, one denied
    let b = &sim.status.batches[0];
    assert_eq!(b.denied, std::slice::from_ref(&refused));
    assert_eq!(sim.status.counts.failed, 1, "failed at once, not at the timeout");
    let f = sim.status.failures.last().unwrap();
    assert_eq!(
        (f.reason.as_str(), f.message.as_str()),
        (reason::CHANGE_DENIED, format!("admission webhook denied {refused}").as_str())
    );
    // The batch settles without waiting for it, and counts it once.
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    let c = &sim.status.counts;
    assert_eq!((c.updated, c.healthy, c.failed), (9, 9, 1));
    assert_eq!(sim.changes_of(&refused), 0);

    // Over the budget, the failure policy applies as for any failure.
    let mut sim = Sim::new(spec(5), 10);
    sim.denied.insert(key(&sim.plan.batches[0][0]));
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Paused);
    assert_eq!(sim.status.reason.as_deref(), Some(reason::FAILURE_BUDGET_EXCEEDED));
    assert_eq!(sim.status.batches[0].failed, 1);
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
