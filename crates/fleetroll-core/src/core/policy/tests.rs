use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::api::PlannedTarget;

fn policy(name: &str, spec: serde_json::Value) -> Arc<FleetRolloutPolicy> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRolloutPolicy",
            "metadata": {"name": name}, "spec": spec,
        }))
        .unwrap(),
    )
}

fn agent() -> Creator {
    Creator {
        username: "system:serviceaccount:team:agent".into(),
        uid: String::new(),
        groups: vec!["system:serviceaccounts".into(), "system:serviceaccounts:team".into()],
    }
}

fn alice() -> Creator {
    Creator { username: "alice".into(), uid: String::new(), groups: vec!["approvers".into()] }
}

fn plan(batches: &[&[(&str, &str)]]) -> Plan {
    let target = |(cluster, ns): &(&str, &str)| PlannedTarget {
        cluster: cluster.to_string(),
        namespace: ns.to_string(),
        name: "web".into(),
        previous_image: "old".into(),
    };
    Plan { hash: "h".into(), batches: batches.iter().map(|b| b.iter().map(target).collect()).collect() }
}

fn spec() -> FleetRolloutSpec {
    serde_json::from_value(
        json!({"image": "x", "targets": {"kind": "Deployment", "selector": {"matchLabels": {"a": "b"}}}}),
    )
    .unwrap()
}

#[test]
fn policies_govern_by_user_group_or_serviceaccount() {
    let every_sa = policy("every-sa", json!({"subjects": {"groups": ["system:serviceaccounts"]}}));
    let agents = policy("agents", json!({"subjects": {"groups": ["agents"]}}));
    let named =
        policy("named", json!({"subjects": {"serviceAccounts": [{"namespace": "team", "name": "agent"}]}}));
    let user = policy("user", json!({"subjects": {"users": ["alice"]}}));
    assert!(governs(&every_sa, &agent()) && !governs(&every_sa, &alice()));
    assert!(!governs(&agents, &agent()) && !governs(&agents, &alice()));
    let mut in_agents = alice();
    in_agents.groups.push("agents".into());
    assert!(governs(&agents, &in_agents));
    assert!(governs(&named, &agent()) && !governs(&named, &alice()));
    assert!(governs(&user, &alice()) && !governs(&user, &agent()));
}

#[test]
fn the_strictest_requirement_of_every_governing_policy_applies_and_names_its_policy() {
    let policies = [
        policy(
            "a-first",
            json!({"subjects": {"groups": ["system:serviceaccounts"]}, "approval": "FirstBatch", "maxBatchSize": 50}),
        ),
        policy(
            "b-every",
            json!({"subjects": {"groups": ["system:serviceaccounts:team"]}, "approval": "EveryBatch", "maxBatchSize": 80, "maxTargets": 200}),
        ),
        policy(
            "c-people",
            json!({"subjects": {"users": ["alice"]}, "approval": "EveryBatch", "maxBatchSize": 1}),
        ),
    ];
    let g = guardrails(&policies, Some(&agent()));
    assert_eq!(g.approval, Some((ApprovalMode::EveryBatch, "b-every".into())));
    assert_eq!(g.max_batch_size, Some((50, "a-first".into())));
    assert_eq!(g.max_targets, Some((200, "b-every".into())));
    assert_eq!(approval_mode(ApprovalMode::None, &g), ApprovalMode::EveryBatch);
    assert_eq!(
        approval_mode(ApprovalMode::FirstBatch, &g),
        ApprovalMode::EveryBatch,
        "stricter than the spec"
    );
    assert_eq!(guardrails(&policies, None), Guardrails::default(), "no recorded creator, no policy");
    let loose = guardrails(&policies[..1], Some(&agent()));
    assert_eq!(
        approval_mode(ApprovalMode::EveryBatch, &loose),
        ApprovalMode::EveryBatch,
        "never looser than the spec"
    );
}

#[test]
fn a_plan_breaking_a_policy_names_the_policy_and_the_rule() {
    let policies = [policy(
        "agents",
        json!({"subjects": {"groups": ["system:serviceaccounts"]}, "maxBatchSize": 2, "maxTargets": 5,
               "namespaces": ["team", "shop"], "clusters": ["edge-1"]}),
    )];
    let g = guardrails(&policies, Some(&agent()));
    let ok = plan(&[&[("", "team"), ("", "shop")], &[("edge-1", "team")]]);
    assert_eq!(violation(&g, &spec(), "team", &ok, 0), None);

    let wide = plan(&[&[("", "team"), ("", "team"), ("", "team")]]);
    let v = violation(&g, &spec(), "team", &wide, 0).unwrap();
    assert_eq!((v.policy.as_str(), v.rule), ("agents", "maxBatchSize"));
    assert_eq!(v.message, "batch 1 has 3 targets, at most 2 allowed");

    let many = plan(&[
        &[("", "team")],
        &[("", "team")],
        &[("", "team")],
        &[("", "team")],
        &[("", "team")],
        &[("", "team")],
    ]);
    assert_eq!(violation(&g, &spec(), "team", &many, 0).unwrap().rule, "maxTargets");

    let elsewhere = plan(&[&[("", "team"), ("", "payments")]]);
    let v = violation(&g, &spec(), "team", &elsewhere, 0).unwrap();
    assert_eq!(
        (v.rule, v.message.as_str()),
        ("namespaces", "namespace payments is not one its rollouts may roll")
    );
    let nodes = plan(&[&[("", "")]]);
    assert_eq!(
        violation(&g, &spec(), "team", &nodes, 0),
        None,
        "a node's target is in the rollout's namespace"
    );
    assert_eq!(violation(&g, &spec(), "kube-system", &nodes, 0).unwrap().rule, "namespaces");

    // Batches already done are not judged again: a policy written mid-rollout holds what is left.
    let wide_then_narrow = plan(&[&[("", "team"), ("", "team"), ("", "team")], &[("", "team")]]);
    assert_eq!(violation(&g, &spec(), "team", &wide_then_narrow, 0).unwrap().rule, "maxBatchSize");
    assert_eq!(violation(&g, &spec(), "team", &wide_then_narrow, 1), None);
    let done_elsewhere = plan(&[&[("", "payments")], &[("", "team")]]);
    assert_eq!(violation(&g, &spec(), "team", &done_elsewhere, 1), None);

    let other_member = plan(&[&[("edge-2", "team")]]);
    assert_eq!(violation(&g, &spec(), "team", &other_member, 0).unwrap().rule, "clusters");
}

#[test]
fn a_policy_requiring_analysis_holds_a_rollout_without_one() {
    let policies = [policy("measured", json!({"subjects": {"users": ["alice"]}, "requireAnalysis": true}))];
    let g = guardrails(&policies, Some(&alice()));
    let v = violation(&g, &spec(), "team", &plan(&[&[("", "team")]]), 0).unwrap();
    assert_eq!((v.policy.as_str(), v.rule), ("measured", "requireAnalysis"));
    assert_eq!(
        violation(&guardrails(&policies, Some(&agent())), &spec(), "team", &plan(&[&[("", "team")]]), 0),
        None
    );
}

#[test]
fn an_approver_must_satisfy_every_policy_naming_approvers_and_status_shows_them_bounded() {
    let policies = [
        policy(
            "a-people",
            json!({"subjects": {"groups": ["system:serviceaccounts"]}, "approvers": {"groups": ["approvers"]}}),
        ),
        policy(
            "b-sre",
            json!({"subjects": {"users": ["system:serviceaccount:team:agent"]}, "approvers": {"groups": ["sre"], "users": ["bob"]}}),
        ),
        policy("c-none", json!({"subjects": {"users": ["alice"]}, "approvers": {"users": ["carol"]}})),
    ];
    let shown = approvers(&guardrails(&policies, Some(&agent())));
    assert_eq!(shown.iter().map(|a| a.policy.as_str()).collect::<Vec<_>>(), ["a-people", "b-sre"]);
    let groups = |g: &[&str]| g.iter().map(|g| g.to_string()).collect::<Vec<_>>();
    assert!(allows_approver(&shown, "alice", &groups(&["approvers", "sre"])), "in both");
    assert!(allows_approver(&shown, "bob", &groups(&["approvers"])), "by name in one, by group in the other");
    assert!(!allows_approver(&shown, "alice", &groups(&["approvers"])), "only one policy's approvers");
    assert!(allows_approver(&[], "anyone", &[]), "no policy names approvers");
    assert_eq!(
        describe_approvers(&shown),
        "a member of group approvers (FleetRolloutPolicy a-people), and a member of group sre or user bob \
         (FleetRolloutPolicy b-sre)"
    );
    // A policy naming many: status shows 16 of each and says more exist; the rest are admission's to judge.
    let many: Vec<String> = (0..40).map(|i| format!("group-{i}")).collect();
    let big = [policy("big", json!({"subjects": {"users": ["alice"]}, "approvers": {"groups": many}}))];
    let shown = approvers(&guardrails(&big, Some(&alice())));
    assert_eq!((shown[0].groups.len(), shown[0].more), (16, true));
    assert!(allows_approver(&shown, "mallory", &[]), "a list cut short is not judged here");
    assert!(describe_approvers(&shown).contains("or another the policy names"));
}
