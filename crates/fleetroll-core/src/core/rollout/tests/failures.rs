//! Failures: timeouts, the failure policies, aborts and rollbacks, refused and denied targets.

use super::*;

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
fn a_target_refused_at_its_batch_is_left_alone_and_reported_not_failed() {
    // A namespace opts out after the plan was frozen: its targets in later batches are never changed.
    let mut sim = Sim::new(spec(5), 10);
    let opted_out: Vec<String> = sim.plan.batches[1].iter().take(2).map(key).collect();
    for t in &opted_out {
        sim.refused.insert(t.clone(), reason::NAMESPACE_NOT_OPTED_IN);
    }
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    for t in &opted_out {
        assert_eq!(sim.changes_of(t), 0, "{t} was changed");
    }
    let c = &sim.status.counts;
    assert_eq!((c.updated, c.healthy, c.failed, c.refused), (8, 8, 0, 2));
    let reported: Vec<&str> = sim.status.failures.iter().map(|f| f.reason.as_str()).collect();
    assert_eq!(reported, [reason::NAMESPACE_NOT_OPTED_IN; 2]);
    assert!(sim.status.failures.iter().all(|f| f.batch == 1));
}

#[test]
fn a_target_changed_before_its_namespace_opted_out_is_judged_on_its_health() {
    let mut sim = Sim::new(spec(5), 10);
    sim.step(); // intent of batch 0
    sim.step(); // applied
    // Opted out after the change: the target carries the batch's key, so it counts as what it is.
    let first = key(&sim.plan.batches[0][0]);
    sim.refused.insert(first.clone(), reason::NAMESPACE_NOT_OPTED_IN);
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
    sim.refused.insert(taken.clone(), reason::TARGET_HELD);
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::RolledBack);
    let rb = sim.status.rollback.clone().unwrap();
    assert_eq!((rb.restored, rb.skipped), (9, 1));
    assert_eq!(sim.changes_of(&taken), 1, "changed by the rollout, never restored");
    assert!(sim.status.failures.iter().any(|f| f.reason == reason::TARGET_HELD));
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
fn a_target_another_rollout_changed_first_is_refused_at_once_and_never_awaited() {
    let mut sim = Sim::new(spec(5), 10);
    let taken = key(&sim.plan.batches[0][2]);
    sim.taken.insert(taken.clone(), "team/other".into());
    sim.step(); // intent
    sim.step(); // applied, one held by the other rollout
    let b = &sim.status.batches[0];
    assert_eq!(b.refused, std::slice::from_ref(&taken));
    assert_eq!((sim.status.counts.refused, sim.status.counts.updated), (1, 4), "refused at once");
    let f = sim.status.failures.last().unwrap();
    assert_eq!(f.reason, reason::TARGET_HELD);
    assert!(f.message.contains("FleetRollout team/other, still running, changed it first"), "{}", f.message);
    // The other rollout finishes meanwhile: the target is still not this batch's to wait for or fail.
    sim.refused.clear();
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    let c = &sim.status.counts;
    assert_eq!((c.updated, c.healthy, c.failed, c.refused), (9, 9, 0, 1), "counted once, as refused");
    assert_eq!(sim.changes_of(&taken), 0, "never changed by this rollout");
}

#[test]
fn a_target_refused_when_its_batch_started_stays_refused_once_what_held_it_has_finished() {
    let mut sim = Sim::new(spec(5), 10);
    let taken = key(&sim.plan.batches[0][1]);
    // Another running rollout changed it before this batch started: the scope rules refuse it.
    sim.refused.insert(taken.clone(), reason::TARGET_HELD);
    let state = sim.world.get_mut(&taken).unwrap();
    (state.image, state.applied) = (Ok("web:other".into()), Some("other-uid/1/0".into()));
    sim.step(); // intent
    sim.step(); // applied: refused now, once
    assert_eq!(sim.status.counts.refused, 1);
    assert_eq!(sim.status.batches[0].refused, std::slice::from_ref(&taken));
    // The other rollout finishes before this batch settles: the target is not this batch's to judge.
    sim.refused.clear();
    assert_eq!(sim.settle(), None);
    let c = &sim.status.counts;
    assert_eq!((sim.status.phase, c.updated, c.healthy, c.failed, c.refused), (Phase::Succeeded, 9, 9, 0, 1));
    assert_eq!(sim.status.failures.iter().filter(|f| key_of(f) == taken).count(), 1, "reported once");
}

#[test]
fn a_change_someone_overwrote_before_it_was_seen_fails_at_the_health_timeout_never_waits_for_ever() {
    let mut sim = Sim::new(spec(5), 5);
    sim.auto_ready = false;
    sim.step(); // intent
    sim.step(); // applied
    // Another writer changed the first target (image and key) before the cache ever showed our change.
    let overwritten = key(&sim.plan.batches[0][0]);
    let state = sim.world.get_mut(&overwritten).unwrap();
    (state.image, state.applied) = (Ok("web:theirs".into()), Some("someone/else".into()));
    for t in sim.plan.batches[0].clone().iter().skip(1) {
        sim.world.get_mut(&key(t)).unwrap().readiness = Readiness::Ready;
    }
    let wait = sim.settle().expect("waits for the change to show, until the health timeout");
    assert_eq!(sim.status.phase, Phase::Progressing);
    sim.pass(wait);
    sim.settle();
    let f = sim.status.failures.iter().find(|f| key_of(f) == overwritten).expect("judged");
    assert_eq!(f.reason, reason::IMAGE_CHANGED);
    assert!(f.message.contains("does not show this batch's change"), "{}", f.message);
    assert_eq!(sim.status.counts.failed, 1);
}

fn key_of(f: &crate::api::TargetFailure) -> String {
    format!("{}/{}", f.namespace, f.name)
}

/// Batch 0 applied, then a GitOps tool re-applies its manifest on its first target: the old image is back,
/// our annotations stay. Returns the events of the step that judges the batch.
fn reverted_in_flight(sim: &mut Sim) -> Vec<Event> {
    sim.auto_ready = false;
    sim.step(); // intent
    sim.step(); // applied
    let [reverted, healthy] = [0, 1].map(|i| key(&sim.plan.batches[0][i]));
    sim.world.get_mut(&reverted).unwrap().image = Ok("web:v1".into());
    sim.world.get_mut(&healthy).unwrap().readiness = Readiness::Ready;
    match sim.step() {
        Step::Write(t) => t.events,
        step => panic!("the batch was not judged: {step:?}"),
    }
}

#[test]
fn an_image_changed_by_someone_else_fails_its_target_and_a_warning_says_so() {
    let changed_warning = |events: &[Event]| {
        events
            .iter()
            .find(|e| e.reason == reason::IMAGE_CHANGED && e.type_ == EventType::Warning)
            .map(|e| e.message.clone())
    };
    // Within the budget: the batch goes on, and the warning names the target and both images.
    let mut s = spec(2);
    s.strategy.max_failures = IntOrString::Int(1);
    let mut sim = Sim::new(s, 4);
    let events = reverted_in_flight(&mut sim);
    let reverted = key(&sim.plan.batches[0][0]);
    let message = changed_warning(&events).expect("a warning names the change");
    assert_eq!(
        message,
        format!("{reverted} was changed to web:v1 by someone else after fleetroll set web:v2")
    );
    assert!(events.iter().any(|e| e.reason == reason::BATCH_SUCCEEDED));
    let f = sim.status.failures.last().unwrap();
    assert_eq!((f.reason.as_str(), f.message.as_str()), (reason::IMAGE_CHANGED, message.as_str()));

    // Over the budget: the batch fails, and the warning comes with it.
    let mut sim = Sim::new(spec(2), 4);
    let events = reverted_in_flight(&mut sim);
    assert_eq!(sim.status.phase, Phase::Paused);
    assert!(events.iter().any(|e| e.reason == reason::BATCH_FAILED));
    assert!(changed_warning(&events).is_some(), "{events:?}");
}

#[test]
fn a_creator_whose_rights_are_gone_holds_every_later_batch_until_a_person_resumes() {
    let mut spec = spec(2);
    spec.strategy.max_failures = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(4);
    let mut sim = Sim::new(spec, 6);
    // The creator's RoleBinding goes after batch 1: every change of batch 2 is refused by RBAC.
    sim.creator.denial = Some("the API server refused the change (403 Forbidden): deployments.apps \"web\" is forbidden: User \"system:serviceaccount:team:agent\" cannot patch resource \"deployments\" in API group \"apps\"".into());
    for t in sim.plan.batch(1).to_vec() {
        sim.denied.insert(key(&t));
    }
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Paused);
    assert_eq!(sim.status.reason.as_deref(), Some(reason::CREATOR_LACKS_RIGHTS));
    assert_eq!(sim.status.counts.failed, 2, "within the budget of 4, and held all the same");
    assert_eq!(sim.changes.len(), 2, "batch 3 not changed: {:?}", sim.changes);
    assert_eq!(sim.status.rights_hold.as_ref().map(|h| h.batch), Some(1));
    let message = sim.status.message.clone().unwrap();
    assert!(
        message.starts_with("held before batch 3/3: changes made as the rollout's creator were refused"),
        "{message}"
    );
    // The rights are back and a person resumes: batch 3 goes.
    sim.denied.clear();
    sim.spec.resume_token = Some("2026-12-03T16:00:00Z".into());
    sim.settle();
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert_eq!(sim.status.rights_hold, None);
    assert_eq!(sim.changes.len(), 4);
}

#[test]
fn only_an_authorization_refusal_means_the_creator_lost_its_rights() {
    use super::super::failure::refused_by_authorization;
    assert!(refused_by_authorization(
        "the API server refused the change (403 Forbidden): deployments.apps \"a\" is forbidden: User \"bob\" cannot patch resource \"deployments\" in API group \"apps\" in the namespace \"t\""
    ));
    assert!(!refused_by_authorization(
        "the API server refused the change (403 Forbidden): deployments.apps \"a\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: no"
    ));
    assert!(!refused_by_authorization(
        "the API server refused the change (422 Invalid): spec.template: Invalid value"
    ));
    assert!(!refused_by_authorization(
        "cannot act as \"root\": members of system:masters cannot be impersonated"
    ));
}
