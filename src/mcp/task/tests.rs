use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::{SignedDuration, Timestamp},
};
use rmcp::model::TaskStatus;
use serde_json::json;

use super::*;
use crate::{
    api::{FleetRolloutStatus, PendingApproval, Phase, PlanRef, PlanStorage},
    core::task::{Asker, POLL_INPUT_MS, POLL_WORKING_MS, approval_key, parse_approval_key, summary, view},
};

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn rollout(phase: Phase, reason: Option<&str>) -> FleetRollout {
    let spec = serde_json::from_value(json!({"image": "web:v2", "ttlSecondsAfterFinished": 3600,
        "targets": {"kind": "Deployment", "selector": {}}}))
    .unwrap();
    let mut fr = FleetRollout::new("web", spec);
    fr.metadata.namespace = Some("team".into());
    fr.metadata.creation_timestamp = Some(Time(at(0)));
    fr.metadata.annotations = Some([(TASK_TOKEN_HASH_ANNOTATION.to_string(), token_hash(TOKEN))].into());
    fr.status = Some(FleetRolloutStatus {
        phase,
        reason: reason.map(String::from),
        started_at: Some(Time(at(1))),
        finished_at: phase.is_terminal().then(|| Time(at(60))),
        plan: Some(PlanRef {
            hash: "feedbeef00000000".into(),
            total_targets: 4,
            total_batches: 2,
            storage: PlanStorage::Status,
            batches: vec![],
            shards: vec![],
        }),
        ..Default::default()
    });
    fr
}

fn id() -> TaskId {
    TaskId { namespace: "team".into(), name: "web".into(), token: TOKEN.into() }
}

fn status_of(fr: &FleetRollout, elicitation: bool) -> (TaskStatus, serde_json::Value) {
    let d = detailed(&id(), view(fr, Asker { forms: elicitation, may_approve: true }, &[], at(30)));
    (d.status(), serde_json::to_value(&d).unwrap())
}

#[test]
fn task_ids_round_trip_and_reject_anything_else() {
    assert_eq!(TaskId::parse(&id().to_string()), Some(id()));
    for bad in [
        "",
        "team/web",
        "team/web/short",
        "team/web/0123456789abcdef0123456789abcdeX",
        "/web/0123456789abcdef0123456789abcdef",
        "team/web/0123456789abcdef0123456789abcdef/extra",
        "tasks-conformance-nonexistent-12345",
    ] {
        assert_eq!(TaskId::parse(bad), None, "{bad:?}");
    }
    let fr = rollout(Phase::Progressing, None);
    assert!(id().matches(&fr));
    let wrong = TaskId { token: "f".repeat(32), ..id() };
    assert!(!wrong.matches(&fr));
    assert_ne!(new_token(), new_token());
    assert!(TaskId::parse(&format!("a/b/{}", new_token())).is_some());
    assert_eq!(TaskId::new(&fr, TOKEN.into()), Some(id()));
}

#[test]
fn only_a_hash_of_the_token_is_stored_and_a_stored_token_does_not_match() {
    let fr = rollout(Phase::Progressing, None);
    let annotations = fr.metadata.annotations.clone().unwrap();
    let stored = &annotations[TASK_TOKEN_HASH_ANNOTATION];
    assert_eq!(stored.len(), 64, "sha256, hex");
    assert!(!annotations.values().any(|v| v.contains(TOKEN)), "the token itself is nowhere: {annotations:?}");
    // The stored hash is not a token that works, whether whole or cut to a token's length.
    assert!(!TaskId { token: stored[..32].to_string(), ..id() }.matches(&fr));
    // Domain-separated: the same input under another purpose hashes differently.
    assert_ne!(token_hash(TOKEN), key_hash(TOKEN, "", ""));
    assert_ne!(token_hash(TOKEN), crate::core::plan::sha256_hex(&TOKEN));
    let mut plain = fr.clone();
    plain.metadata.annotations = Some([(TASK_TOKEN_HASH_ANNOTATION.to_string(), TOKEN.to_string())].into());
    assert!(!id().matches(&plain), "a plain-text token in the annotation does not match");
}

#[test]
fn keyed_tokens_are_stable_for_the_same_request_and_differ_for_any_other() {
    let t = keyed_token("deploy-42", "alice", "team", "web");
    assert_eq!(t, keyed_token("deploy-42", "alice", "team", "web"), "a replay derives the same token");
    assert_eq!(t.len(), 32);
    assert!(TaskId::parse(&format!("team/web/{t}")).is_some(), "it is a valid task token");
    for other in [
        keyed_token("deploy-43", "alice", "team", "web"),
        keyed_token("deploy-42", "bob", "team", "web"),
        keyed_token("deploy-42", "alice", "other", "web"),
        keyed_token("deploy-42", "alice", "team", "api"),
        // The encoding keeps the fields apart: moving a boundary changes the token.
        keyed_token("deploy-42", "alice", "tea", "mweb"),
    ] {
        assert_ne!(t, other);
    }
    assert_eq!(key_hash("k", "alice", "team"), key_hash("k", "alice", "team"));
    assert_ne!(key_hash("k", "alice", "team"), key_hash("k", "bob", "team"));
    assert!(!key_hash("deploy-42", "alice", "team").contains("deploy-42"));
}

#[test]
fn summaries_never_carry_the_task_id() {
    let fr = rollout(Phase::Progressing, None);
    let s = serde_json::to_value(summary(&fr)).unwrap();
    assert!(s.get("taskId").is_none(), "{s}");
    assert!(!s.to_string().contains(TOKEN));
    let result = serde_json::to_value(tool_result(&summary(&fr), false)).unwrap();
    assert!(!result.to_string().contains(TOKEN), "{result}");
}

#[test]
fn running_phases_are_working() {
    for phase in [Phase::Pending, Phase::Progressing, Phase::Paused, Phase::RollingBack] {
        let (status, wire) = status_of(&rollout(phase, None), true);
        assert_eq!(status, TaskStatus::Working, "{phase}");
        assert_eq!(wire["pollIntervalMs"], json!(POLL_WORKING_MS));
        assert!(wire["statusMessage"].as_str().unwrap().contains(phase.as_str()));
    }
}

#[test]
fn success_completes_and_failures_complete_with_is_error() {
    let (status, wire) = status_of(&rollout(Phase::Succeeded, Some("Succeeded")), false);
    assert_eq!(status, TaskStatus::Completed);
    assert_eq!(wire["result"]["isError"], json!(false));
    assert_eq!(wire["result"]["resultType"], json!("complete"), "clients reject a result without it");
    assert_eq!(wire["result"]["structuredContent"]["phase"], json!("Succeeded"));
    for (phase, reason) in [
        (Phase::Failed, "FailureBudgetExceeded"),
        (Phase::RolledBack, "FailureBudgetExceeded"),
        (Phase::Aborted, "FailureBudgetExceeded"),
    ] {
        let (status, wire) = status_of(&rollout(phase, Some(reason)), false);
        assert_eq!(status, TaskStatus::Completed, "{phase}");
        assert_eq!(wire["result"]["isError"], json!(true), "{phase}");
    }
}

#[test]
fn an_abort_on_request_is_a_cancelled_task() {
    let (status, _) = status_of(&rollout(Phase::Aborted, Some("AbortRequested")), false);
    assert_eq!(status, TaskStatus::Cancelled);
}

#[test]
fn waiting_for_approval_asks_with_a_form_only_when_the_client_can_answer() {
    let mut fr = rollout(Phase::WaitingForApproval, Some("WaitingForApproval"));
    let s = fr.status.as_mut().unwrap();
    s.revision = Some(crate::api::Revision {
        number: 2,
        spec_hash: "h".into(),
        inputs: crate::api::RevisionInputs::of(&fr.spec),
        started_at: Time(at(1)),
    });
    s.pending_approval = Some(PendingApproval {
        batch: 1,
        plan_hash: "feedbeef00000000".into(),
        gates_hash: "0123abcd0123abcd".into(),
        since: Time(at(20)),
        approvers: vec![],
    });
    let (status, wire) = status_of(&fr, true);
    assert_eq!(status, TaskStatus::InputRequired);
    let key = approval_key(2, 1, "feedbeef00000000", "0123abcd0123abcd");
    let request = &wire["inputRequests"][&key];
    assert_eq!(request["method"], json!("elicitation/create"));
    assert_eq!(request["params"]["mode"], json!("form"));
    assert_eq!(request["params"]["requestedSchema"]["required"], json!(["approve"]));
    assert_eq!(wire["pollIntervalMs"], json!(POLL_INPUT_MS));
    assert_eq!(parse_approval_key(&key), Some((2, 1, "feedbeef00000000".into(), "0123abcd0123abcd".into())));

    let (status, wire) = status_of(&fr, false);
    assert_eq!(status, TaskStatus::Working, "no elicitation capability: no input request");
    assert!(wire["statusMessage"].as_str().unwrap().contains("approve_batch"));
}

#[test]
fn ttl_covers_the_rollout_and_its_retention() {
    let (_, wire) = status_of(&rollout(Phase::Progressing, None), false);
    assert_eq!(wire["ttlMs"], json!(30_000 + 3_600_000), "running: elapsed so far plus retention");
    let (_, wire) = status_of(&rollout(Phase::Succeeded, None), false);
    assert_eq!(wire["ttlMs"], json!(60_000 + 3_600_000), "finished: its duration plus retention");
    let mut kept = rollout(Phase::Succeeded, None);
    kept.spec.ttl_seconds_after_finished = None;
    let (_, wire) = status_of(&kept, false);
    assert_eq!(wire["ttlMs"], json!(null), "no TTL: unlimited");
}

#[test]
fn timestamps_are_iso_and_last_update_follows_the_status() {
    let (_, wire) = status_of(&rollout(Phase::Succeeded, None), false);
    assert_eq!(wire["createdAt"], json!("2027-01-15T08:00:00Z"));
    let finished = at(60);
    let expected = finished.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    assert_eq!(wire["lastUpdatedAt"], json!(expected));
    assert!(at(0) + SignedDuration::from_secs(60) == finished);
}
