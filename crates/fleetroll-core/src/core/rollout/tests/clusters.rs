//! Rollouts across member clusters: waves, per-cluster counts, clusters that do not answer when their
//! batch comes or drop while it runs, and the failure budget across clusters.

use super::*;
use crate::core::clusters::PlannedWave;

fn waves() -> Vec<PlannedWave> {
    vec![
        PlannedWave { name: "canary".into(), clusters: vec!["a".into()], max_concurrency: None },
        PlannedWave { name: "prod".into(), clusters: vec!["b".into(), "c".into()], max_concurrency: Some(1) },
    ]
}

/// 4 targets in each of a (canary), b and c (prod, one cluster per batch), 3 per batch.
fn sim(timeout: &str) -> Sim {
    let mut s = spec(3);
    s.health.timeout = timeout.into();
    Sim::across(s, &[("a", 4), ("b", 4), ("c", 4)], &waves())
}

fn clusters_of(batch: &[PlannedTarget]) -> Vec<&str> {
    let mut c: Vec<&str> = batch.iter().map(|t| t.cluster.as_str()).collect();
    c.dedup();
    c
}

#[test]
fn waves_order_the_plan_and_every_target_changes_once() {
    let mut sim = sim("10m");
    let shape: Vec<Vec<&str>> = sim.plan.batches.iter().map(|b| clusters_of(b)).collect();
    assert_eq!(shape, [vec!["a"], vec!["a"], vec!["b"], vec!["b"], vec!["c"], vec!["c"]]);
    assert_eq!(sim.plan.batches.iter().map(Vec::len).collect::<Vec<_>>(), [3, 1, 3, 1, 3, 1]);
    let clusters = sim.status.clusters.clone().expect("a rollout across clusters reports them");
    assert_eq!(
        clusters.waves.iter().map(|w| (w.first_batch, w.last_batch)).collect::<Vec<_>>(),
        [(0, 1), (2, 5)]
    );
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    for t in sim.plan.batches.iter().flatten() {
        assert_eq!(sim.changes_of(&key(t)), 1, "{}", key(t));
        assert!(key(t).starts_with(&format!("{}/", t.cluster)), "the key names the cluster: {}", key(t));
    }
    let done = sim.status.clusters.clone().unwrap();
    assert!(done.members.iter().all(|m| m.updated == 4 && m.failed == 0), "{:?}", done.members);
    assert_eq!(done.waves.iter().map(|w| w.updated).collect::<Vec<_>>(), [4, 8]);
}

#[test]
fn a_cluster_down_when_its_batch_comes_is_changed_once_it_answers() {
    let mut sim = sim("10m");
    sim.unreachable.insert("b".into(), "connection refused".into());
    let wait = sim.settle().expect("waits for cluster b");
    assert!(wait <= Duration::from_secs(600));
    let current = sim.status.current().cloned().unwrap();
    assert_eq!((current.index, current.unreached.clone()), (2, vec!["b".to_string()]));
    assert_eq!(sim.changes.len(), 4, "only cluster a changed");
    assert_eq!(sim.status.phase, Phase::Progressing);
    let trouble = &sim.status.clusters.as_ref().unwrap().trouble;
    assert_eq!((trouble[0].name.as_str(), trouble[0].reason.as_str()), ("b", reason::CLUSTER_UNREACHABLE));

    sim.pass(Duration::from_secs(60));
    sim.unreachable.clear();
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert_eq!(sim.changes.len(), 12, "every target changed exactly once");
    let done = sim.status.clusters.clone().unwrap();
    assert!(done.trouble.is_empty());
    assert!(done.members.iter().all(|m| m.updated == 4), "{:?}", done.members);
    assert_eq!(sim.status.counts.updated, 12);
}

#[test]
fn a_cluster_down_for_the_health_timeout_fails_its_targets_against_the_budget() {
    let mut sim = sim("2m");
    sim.spec.strategy.max_failures = IntOrString::Int(2);
    sim.unreachable.insert("b".into(), "i/o timeout".into());
    sim.settle();
    sim.pass(Duration::from_secs(121));
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::Paused);
    assert_eq!(sim.status.reason.as_deref(), Some(reason::FAILURE_BUDGET_EXCEEDED));
    assert_eq!(sim.status.counts.failed, 3);
    assert!(sim.status.failures.iter().all(|f| f.reason == reason::CLUSTER_UNREACHABLE && f.cluster == "b"));
    assert!(sim.status.failures[0].message.contains("i/o timeout"), "{}", sim.status.failures[0].message);
    let clusters = sim.status.clusters.clone().unwrap();
    let b = clusters.members.iter().find(|m| m.name == "b").unwrap();
    assert_eq!((b.updated, b.failed), (0, 3));
    assert_eq!(clusters.waves[1].failed, 3);
    assert_eq!(sim.changes.len(), 4, "nothing of b changed, c never started");
}

#[test]
fn a_cluster_that_drops_mid_batch_is_not_taken_for_healthy() {
    let mut sim = sim("10m");
    sim.auto_ready = false;
    // Batch 1 (cluster a) is applied; a drops before its targets are ready.
    sim.settle();
    sim.unreachable.insert("a".into(), "connection reset".into());
    for t in sim.plan.batch(0).to_vec() {
        sim.world.get_mut(&key(&t)).unwrap().readiness = Readiness::Ready;
    }
    sim.pass(Duration::from_secs(30));
    assert!(sim.settle().is_some());
    assert_eq!(sim.status.current_batch, Some(0), "still waiting for cluster a");
    assert_eq!(sim.status.current().unwrap().state, BatchState::Verifying);
    sim.unreachable.clear();
    sim.auto_ready = true;
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert_eq!(sim.changes.len(), 12);
}

#[test]
fn replaying_every_step_of_a_rollout_across_clusters_changes_nothing_twice() {
    let mut sim = sim("10m");
    sim.unreachable.insert("c".into(), "refused".into());
    for _ in 0..200 {
        // A replay: the same step decided again from the same status, as after a crash before its write.
        let again = sim.advance();
        if let Step::Apply { key: k, image, targets, .. } = &again {
            let reached: Vec<PlannedTarget> =
                targets.iter().filter(|t| !sim.unreachable.contains_key(&t.cluster)).cloned().collect();
            for t in &reached {
                sim.change(t, image, k);
            }
        }
        if let Step::Wait { .. } = sim.step() {
            sim.pass(Duration::from_secs(10));
            if sim.status.current_batch == Some(4) {
                sim.unreachable.clear();
            }
        }
        if sim.status.phase == Phase::Succeeded {
            break;
        }
    }
    assert_eq!(sim.status.phase, Phase::Succeeded);
    for t in sim.plan.batches.iter().flatten() {
        assert_eq!(sim.changes_of(&key(t)), 1, "{}", key(t));
    }
}

#[test]
fn status_stays_under_64_kib_at_fifty_clusters_of_two_hundred_targets() {
    // The longest names a member Secret may give (253 characters), ARN-like.
    let names: Vec<String> = (0..50)
        .map(|i| {
            let arn = format!("arn:aws:eks:eu-west-1:123456789012:cluster/region-{i:02}-");
            format!("{arn}{}", "x".repeat(253 - arn.len()))
        })
        .collect();
    let fleet: Vec<(&str, usize)> = names.iter().map(|n| (n.as_str(), 200)).collect();
    let waves = vec![
        PlannedWave { name: "canary".into(), clusters: vec![names[0].clone()], max_concurrency: None },
        PlannedWave { name: "eu".into(), clusters: names[1..25].to_vec(), max_concurrency: Some(5) },
        PlannedWave { name: "(unassigned)".into(), clusters: names[25..].to_vec(), max_concurrency: None },
    ];
    let mut s = spec(100);
    s.health.timeout = "1m".into();
    s.strategy.max_failures = IntOrString::String("100%".into());
    let mut sim = Sim::across(s, &fleet, &waves);
    // Keep the plan out of status, as the controller does for big plans.
    if let Some(p) = sim.status.plan.as_mut() {
        p.batches.clear();
        p.storage = PlanStorage::ConfigMaps;
        p.shards = (0..5).map(|i| format!("web-rollout-0123456789abcdef-{i}")).collect();
    }
    sim.broken = sim.plan.batches.iter().flatten().step_by(20).map(key).collect();
    // Twelve clusters never answer: more than status lists in trouble.
    for n in names.iter().skip(30).take(12) {
        sim.unreachable.insert(n.clone(), format!("dial tcp {n}.example.com:6443: i/o timeout after 5s"));
    }
    let (mut rounds, mut largest) = (0, 0);
    while !sim.status.phase.is_terminal() {
        if let Some(d) = sim.settle() {
            sim.pass(d);
        }
        largest = largest.max(serde_json::to_vec(&sim.status).unwrap().len());
        rounds += 1;
        assert!(rounds < 5000);
    }
    assert!(largest < 64 * 1024, "status grew to {largest} bytes");
    eprintln!("50 clusters x 200 targets: status at most {largest} bytes");
    let clusters = sim.status.clusters.clone().unwrap();
    assert_eq!(clusters.members.len(), 50);
    assert!(clusters.trouble.len() <= crate::api::TROUBLE_LISTED);
    let failed: u32 = clusters.waves.iter().map(|w| w.failed).sum();
    assert_eq!(failed, sim.status.counts.failed, "wave counts add up to the rollout's");
    assert_eq!(sim.status.counts.failed, 12 * 200 + (10_000 - 12 * 200) / 20);
}

#[test]
fn a_member_that_answers_only_after_the_health_timeout_is_not_changed_then() {
    let mut sim = sim("2m");
    sim.spec.strategy.max_failures = IntOrString::Int(10);
    sim.unreachable.insert("b".into(), "connection refused".into());
    sim.settle();
    assert_eq!(sim.status.current().unwrap().unreached, ["b"]);
    sim.pass(Duration::from_secs(121));
    sim.unreachable.clear();
    sim.settle();
    let b_changes: usize = sim.plan.batch(2).iter().map(|t| sim.changes_of(&key(t))).sum();
    assert_eq!(b_changes, 0, "nothing is changed past the health timeout");
    let failed: Vec<&str> = sim.status.failures.iter().map(|f| f.reason.as_str()).collect();
    assert_eq!(failed, [reason::CLUSTER_UNREACHABLE; 3]);
}

#[test]
fn a_denied_target_of_a_member_that_then_drops_is_failed_once() {
    let mut sim = sim("2m");
    sim.spec.strategy.max_failures = IntOrString::Int(10);
    sim.auto_ready = false;
    let denied = key(&sim.plan.batch(0)[0]);
    sim.denied.insert(denied.clone());
    sim.settle();
    assert_eq!(sim.status.counts.failed, 1, "denied at once");
    sim.unreachable.insert("a".into(), "i/o timeout".into());
    sim.pass(Duration::from_secs(121));
    sim.settle();
    // The two other targets of the batch fail as ClusterUnreachable; the denied one is not failed again.
    assert_eq!(sim.status.counts.failed, 3, "{:?}", sim.status.failures);
    let a = sim.status.clusters.as_ref().unwrap().members.iter().find(|m| m.name == "a").cloned().unwrap();
    assert_eq!(a.failed, 3);
}

#[test]
fn clusters_left_out_at_planning_stay_in_status_and_in_every_progress_line() {
    let sim = sim("10m");
    let left_out = [("d".to_string(), "dial tcp: i/o timeout".to_string())];
    let (w, refused) = (waves(), ["member cluster d could not be reached at planning".to_string()]);
    let new = NewRevision { refused: &refused, ..new_revision(&sim, &w, &left_out) };
    let t = start_revision(sim.now, 1, &sim.spec, &FleetRolloutStatus::default(), new);
    let clusters = t.status.clusters.clone().unwrap();
    assert_eq!(
        (clusters.left_out[0].name.as_str(), clusters.left_out[0].reason.as_str()),
        ("d", reason::CLUSTER_UNREACHABLE)
    );
    let line = crate::core::clusters::progress(&clusters);
    assert!(
        line.contains("left out of the plan, not reachable when it was made: d (dial tcp: i/o timeout)"),
        "{line}"
    );
    assert!(t.events.iter().any(|e| e.reason == reason::CLUSTER_REFUSED && e.type_ == EventType::Warning));
}

/// A revision of the simulated plan, with `left_out` not reached at planning.
fn new_revision<'a>(
    sim: &'a Sim,
    waves: &'a [PlannedWave],
    left_out: &'a [(String, String)],
) -> NewRevision<'a> {
    NewRevision {
        inputs: RevisionInputs::of(&sim.spec),
        spec_hash: "spechash".into(),
        plan: &sim.plan,
        plan_ref: sim.status.plan.clone().unwrap(),
        waves,
        refused: &[],
        left_out,
    }
}

#[test]
fn planning_waits_for_a_cluster_that_does_not_answer_up_to_the_health_timeout_then_leaves_it_out() {
    let sim = sim("10m");
    let t0 = sim.now;
    let down = [("d".to_string(), "dial tcp: connection refused".to_string())];
    let unborn = FleetRolloutStatus::default();
    let ClusterWait::Wait(Some(first)) = await_clusters(t0, 1, &sim.spec, &unborn, &down) else {
        panic!("a cluster that does not answer at planning is waited for");
    };
    let waiting = first.status;
    assert_eq!(
        (waiting.phase, waiting.reason.as_deref()),
        (Phase::Pending, Some(reason::WAITING_FOR_CLUSTERS))
    );
    assert!(
        waiting.message.as_deref().unwrap_or_default().contains("answer: d (until"),
        "{:?}",
        waiting.message
    );
    assert!(!conditions::is_true(&waiting.conditions, conditions::STALLED), "kstatus reads InProgress");
    assert!(
        first
            .events
            .iter()
            .any(|e| e.reason == reason::WAITING_FOR_CLUSTERS && e.type_ == EventType::Warning)
    );
    let clusters = waiting.clusters.clone().unwrap();
    assert_eq!(clusters.planning_since, Some(time(t0)));
    assert_eq!(clusters.trouble.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["d"]);
    assert_eq!(
        crate::core::clusters::progress(&clusters),
        "clusters in trouble: d (ClusterUnreachable: dial tcp: connection refused)"
    );

    // Looked at again within the timeout: still waiting, nothing to write, no second event.
    let later = |secs: i64| t0.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(secs)).unwrap();
    assert_eq!(await_clusters(later(5), 1, &sim.spec, &waiting, &down), ClusterWait::Wait(None));
    assert_eq!(await_clusters(later(599), 1, &sim.spec, &waiting, &down), ClusterWait::Wait(None));
    // Every cluster answers: plan at once.
    assert_eq!(await_clusters(later(30), 1, &sim.spec, &waiting, &[]), ClusterWait::Plan);
    // The timeout has passed: plan without it, out of the plan since planning first missed it.
    assert_eq!(await_clusters(later(600), 1, &sim.spec, &waiting, &down), ClusterWait::Plan);
    let w = waves();
    let started = start_revision(later(600), 1, &sim.spec, &waiting, new_revision(&sim, &w, &down));
    assert_eq!(started.status.phase, Phase::Progressing);
    let clusters = started.status.clusters.unwrap();
    assert_eq!(clusters.planning_since, None);
    assert_eq!((clusters.left_out[0].name.as_str(), &clusters.left_out[0].since), ("d", &time(t0)));
}

#[test]
fn a_spec_edit_keeps_the_wait_and_neither_an_abort_nor_a_running_revision_is_held() {
    let sim = sim("1m");
    let down = [("d".to_string(), "i/o timeout".to_string())];
    let unborn = FleetRolloutStatus::default();
    let ClusterWait::Wait(Some(first)) = await_clusters(sim.now, 1, &sim.spec, &unborn, &down) else {
        panic!("waits");
    };
    let at = |secs: i64| sim.now.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(secs)).unwrap();
    // An edit (a new generation) does not restart the clock, nor announce the wait again.
    let ClusterWait::Wait(Some(edited)) = await_clusters(at(30), 2, &sim.spec, &first.status, &down) else {
        panic!("still waits after an edit");
    };
    assert!(edited.events.is_empty());
    assert_eq!(
        edited.status.clusters.as_ref().unwrap().planning_since,
        first.status.clusters.unwrap().planning_since
    );
    assert_eq!(await_clusters(at(61), 2, &sim.spec, &edited.status, &down), ClusterWait::Plan);
    // A start read back from the future is not believed past now.
    let mut hostile = edited.status.clone();
    hostile.clusters.as_mut().unwrap().planning_since = Some(time(at(1_000_000)));
    let ClusterWait::Wait(Some(clamped)) = await_clusters(at(61), 2, &sim.spec, &hostile, &down) else {
        panic!("waits from now, not from the future");
    };
    assert_eq!(clamped.status.clusters.unwrap().planning_since, Some(time(at(61))));
    // An abort is not held, nor is a rollout that already has a revision.
    let mut abort = sim.spec.clone();
    abort.abort = true;
    assert_eq!(await_clusters(at(1), 2, &abort, &edited.status, &down), ClusterWait::Plan);
    assert_eq!(await_clusters(sim.now, 1, &sim.spec, &sim.status, &down), ClusterWait::Plan);
}
