use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::*;

/// A caller who may approve, with a client that answers forms; and one whose client does not.
const ASKED: Asker = Asker { forms: true, may_approve: true };
const NO_FORMS: Asker = Asker { forms: false, may_approve: true };

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

/// A rollout waiting for the approval of batch 2 of 2, its plan inline with `inline` targets per batch.
fn waiting(inline: usize) -> FleetRollout {
    let batch = |b: usize| -> Vec<serde_json::Value> {
        (0..inline).map(|i| json!({"namespace": "team", "name": format!("web-{b}-{i:02}"), "previousImage": "web:v1"})).collect()
    };
    serde_json::from_value(json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
        "metadata": {"name": "web", "namespace": "team", "creationTimestamp": "2027-01-15T08:00:00Z"},
        "spec": {"image": "web:v2", "targets": {"kind": "Deployment", "selector": {}}},
        "status": {
            "phase": "WaitingForApproval",
            "pendingApproval": {"batch": 1, "planHash": "feedbeef", "gatesHash": "0123abcd", "since": "2027-01-15T08:00:20Z"},
            "plan": {"hash": "feedbeef", "totalTargets": 2 * inline, "totalBatches": 2, "storage": "Status",
                     "batches": [batch(0), batch(1)]},
        },
    }))
    .unwrap()
}

fn targets(names: &[&str]) -> Vec<PlannedTarget> {
    names
        .iter()
        .map(|n| PlannedTarget {
            cluster: String::new(),
            namespace: "shard".into(),
            name: n.to_string(),
            previous_image: "web:v1".into(),
        })
        .collect()
}

#[test]
fn the_approval_form_names_the_targets_it_is_given_whatever_the_status_holds() {
    // The status holds a plan of its own; the form names what the caller read from the frozen plan.
    let named = view(&waiting(3), ASKED, &targets(&["a", "b"]), now());
    let TaskState::InputRequired(request) = named.state else { panic!("{:?}", named.state) };
    assert_eq!(request.key, approval_key(0, 1, "feedbeef", "0123abcd"));
    assert!(request.message.starts_with(
        "Approve batch 2/2 of FleetRollout team/web (image web:v2, plan feedbeef, gates 0123abcd)?"
    ));
    assert!(request.message.ends_with(" Targets: shard/a, shard/b"), "{}", request.message);
    assert_eq!(named.poll_interval_ms, Some(POLL_INPUT_MS));

    let unknown = view(&waiting(3), ASKED, &[], now());
    let TaskState::InputRequired(request) = unknown.state else { panic!("{:?}", unknown.state) };
    assert!(!request.message.contains("Targets"), "no targets known, none named: {}", request.message);
}

#[test]
fn the_approval_form_names_at_most_twenty_targets() {
    let names: Vec<String> = (0..25).map(|i| format!("t{i:02}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let view = view(&waiting(0), ASKED, &targets(&names), now());
    let TaskState::InputRequired(request) = view.state else { panic!("{:?}", view.state) };
    assert!(request.message.contains("shard/t19"), "{}", request.message);
    assert!(!request.message.contains("shard/t20"), "{}", request.message);
}

#[test]
fn only_a_rollout_waiting_for_approval_awaits_one() {
    let fr = waiting(1);
    assert_eq!(awaited_approval(&fr).map(|p| p.batch), Some(1));
    let mut running = fr.clone();
    running.status.as_mut().unwrap().phase = Phase::Progressing;
    assert_eq!(awaited_approval(&running), None, "a stale pending approval asks nothing");
    let mut unasked = fr;
    unasked.status.as_mut().unwrap().pending_approval = None;
    assert_eq!(awaited_approval(&unasked), None);
    assert_eq!(view(&unasked, ASKED, &[], now()).state, TaskState::Working, "nothing to ask: working");
}

#[test]
fn without_a_form_a_waiting_rollout_is_working_and_its_message_says_what_to_do() {
    let view = view(&waiting(1), NO_FORMS, &targets(&["a"]), now());
    assert_eq!(view.state, TaskState::Working);
    assert_eq!(view.poll_interval_ms, Some(POLL_WORKING_MS));
    assert!(view.message.contains("call approve_batch"), "{}", view.message);
}

#[test]
fn a_caller_who_may_not_approve_is_not_asked_and_is_told_who_may() {
    let mut fr = waiting(1);
    fr.spec.creator = Some(crate::api::Creator {
        username: "system:serviceaccount:team:agent".into(),
        ..Default::default()
    });
    let view = view(&fr, Asker { forms: true, may_approve: false }, &targets(&["a"]), now());
    assert_eq!(view.state, TaskState::Working, "the agent that created it is not offered the form");
    assert!(!view.message.contains("call approve_batch"), "{}", view.message);
    assert!(
        view.message.contains("by someone who holds the approve verb on this rollout and did not create it (system:serviceaccount:team:agent did)"),
        "{}",
        view.message
    );
    assert_eq!(view.summary.creator.as_deref(), Some("system:serviceaccount:team:agent"));
    // Under a policy naming approvers, the message names them too.
    let pending = fr.status.as_mut().unwrap().pending_approval.as_mut().unwrap();
    pending.approvers = vec![crate::api::PolicyApprovers {
        policy: "agents-need-people".into(),
        groups: vec!["approvers".into()],
        ..Default::default()
    }];
    let view = super::view(&fr, Asker { forms: true, may_approve: false }, &targets(&["a"]), now());
    assert!(
        view.message.contains("did not create it (system:serviceaccount:team:agent did), and is a member of group approvers (FleetRolloutPolicy agents-need-people); you may not give it"),
        "{}",
        view.message
    );
}

#[test]
fn the_message_names_targets_someone_else_changed_back() {
    let mut fr = waiting(1);
    let failure = |name: &str, reason: &str| TargetFailure {
        cluster: String::new(),
        namespace: "team".into(),
        name: name.into(),
        batch: 0,
        reason: reason.into(),
        message: format!("team/{name}: {reason}"),
    };
    let status = fr.status.as_mut().unwrap();
    status.failures = vec![failure("web-a", "Timeout"), failure("web-b", IMAGE_CHANGED)];
    let message = describe(&summary(&fr));
    assert!(
        message.ends_with(
            ". ImageChangedByOthers: someone else changed the image of team/web-b after fleetroll set it"
        ),
        "{message}"
    );
    fr.status.as_mut().unwrap().failures.clear();
    assert!(!describe(&summary(&fr)).contains(IMAGE_CHANGED));
}

#[test]
fn a_held_analysis_is_in_the_summary_and_the_message_says_how_to_release_it() {
    let mut fr = waiting(1);
    let status: FleetRolloutStatus = serde_json::from_value(json!({
        "phase": "Paused", "reason": "AnalysisInconclusive", "currentBatch": 0,
        "batches": [{"index": 0, "size": 1, "state": "Verifying", "idempotencyKey": "u/1/0", "analysis": {
            "startedAt": "2027-01-15T08:00:20Z",
            "hold": {"reason": "AnalysisInconclusive", "since": "2027-01-15T08:00:21Z"},
            "metrics": [{"name": "error-rate", "phase": "Inconclusive", "inconclusive": 1}],
        }}],
    }))
    .unwrap();
    fr.status = Some(status);
    let s = summary(&fr);
    assert_eq!(s.analysis.as_ref().map(|a| a.metrics[0].name.as_str()), Some("error-rate"));
    let view = view(&fr, ASKED, &[], now());
    assert!(
        view.message
            .contains("AnalysisInconclusive: the metric analysis holds the rollout; call resume_rollout"),
        "{}",
        view.message
    );
    assert!(matches!(view.state, TaskState::Working), "a hold is work waiting, not a form");
    // A metrics outage goes on by itself, and says so.
    let status = fr.status.as_mut().unwrap();
    status.reason = Some(ANALYSIS_ERROR.into());
    status.batches[0].analysis.as_mut().unwrap().hold = None;
    assert!(
        describe(&summary(&fr)).ends_with("the rollout goes on by itself at the first measurement taken")
    );
}
