//! Approvals from the page, as the user: a rollout waiting for an approval is in the inbox of a person who
//! may give it (an x509 user holding the approver role), and her button approves it as her (the approval
//! and the status record name her, as the API server authenticated her). A person who may edit the rollout
//! but not approve it sees no inbox entry; his button, pressed anyway, shows the API server's refusal word
//! for word, and nothing changes.

use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use serde_json::{Value, json};
use testkit::{
    browser::Browser,
    dashboard::Dashboard,
    fleet::{NEXT_IMAGE, READY_IMAGE, phase, with_fleet},
    operator::Operator,
    people::Person,
    tenant::{self, APPROVER_ROLE},
};

use super::{DEADLINE, open, press};
use fleetroll::api::Phase;

#[tokio::test]
async fn an_approver_approves_from_her_inbox_and_a_developer_is_refused_with_the_reason() {
    with_fleet("dash-approve", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        fleet.deployments(&ns, 2, READY_IMAGE).await;
        let (alice, bob) = tokio::join!(
            Person::x509(&fleet.client, "dash-alice", &["dash-approvers"]),
            Person::x509(&fleet.client, "dash-bob", &["dash-developers"]),
        );
        tenant::bind(&fleet.client, &ns, "dash-approvers", "Group", "dash-approvers", APPROVER_ROLE).await;
        tenant::bind(&fleet.client, &ns, "dash-developers", "Group", "dash-developers", "edit").await;
        // Both read rollouts across the cluster: the list and the inbox span it.
        let view: ClusterRoleBinding = serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": format!("{ns}-dash-view")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "fleetroll-view"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "dash-alice"},
                         {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "dash-bob"}],
        }))
        .unwrap();
        kube::Api::<ClusterRoleBinding>::all(fleet.client.clone()).create(&Default::default(), &view).await.unwrap();
        alice.wait_allowed(&fleet.client, &ns, "fleetroll.dev", "fleetrollouts", "approve").await;
        alice.wait_allowed(&fleet.client, "", "fleetroll.dev", "fleetrollouts", "list").await;
        bob.wait_allowed(&fleet.client, "", "fleetroll.dev", "fleetrollouts", "list").await;
        bob.wait_allowed(&fleet.client, &ns, "fleetroll.dev", "fleetrollouts", "patch").await;

        let _op = Operator::start(&ns, &[], &[]);
        let targets = json!({"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}});
        fleet.rollout("web", json!({"image": NEXT_IMAGE, "targets": targets, "strategy": {"batchSize": 1, "approval": "FirstBatch"}})).await;
        fleet.wait_rollout("web", "the approval gate", DEADLINE, |f| phase(f) == Phase::WaitingForApproval).await;
        let key = format!("{ns}/web");

        // bob: nothing in his inbox; on the rollout's page the button is there, and pressing it is refused.
        let (bobs, browser) = tokio::join!(Dashboard::start(&bob.kubeconfig, &[]), Browser::start());
        open(&browser, &bobs, "").await;
        let row = format!("return document.querySelector('#rollouts tr[data-rollout=\"{key}\"]') !== null");
        browser.wait_js("bob's list to show the rollout", &row, DEADLINE).await;
        let in_inbox = format!("return document.querySelector('#inbox li[data-rollout=\"{key}\"]') !== null");
        // The inbox is said after the list, once the API server has judged each waiting rollout.
        browser.wait_js("bob's inbox", "return document.querySelector('#inbox')?.dataset.received === 'true'", DEADLINE).await;
        assert_eq!(browser.js(&in_inbox, vec![]).await, Value::Bool(false), "not in bob's inbox");
        open(&browser, &bobs, &format!("#/r/{key}")).await;
        let (outcome, said) = press(&browser, "#rollout button[data-action=\"approve\"]").await;
        assert_eq!(outcome, "refused", "{said}");
        let reasons = ["dash-bob may not approve fleetrollouts", "may not approve"];
        assert!(reasons.iter().any(|r| said.contains(r)), "the API server's reason, verbatim: {said}");
        let still = fleet.rollouts().get("web").await.unwrap();
        assert!(still.spec.approvals.is_empty(), "nothing changed: {:?}", still.spec.approvals);
        drop(browser);

        // alice: in her inbox; her button approves it, as her.
        let (alices, browser) = tokio::join!(Dashboard::start(&alice.kubeconfig, &[]), Browser::start());
        open(&browser, &alices, "").await;
        browser.wait_js("alice's inbox to list the rollout", &in_inbox, DEADLINE).await;
        let (outcome, said) = press(&browser, &format!("#inbox li[data-rollout=\"{key}\"] button[data-action=\"approve\"]")).await;
        assert_eq!(outcome, "ok", "{said}");
        assert!(said.contains("dash-alice"), "the page says who approved: {said}");
        let approved = fleet.rollouts().get("web").await.unwrap();
        assert_eq!(approved.spec.approvals.first().and_then(|a| a.approved_by.as_deref()), Some("dash-alice"));
        let done = fleet.wait_rollout("web", "success", DEADLINE, |f| phase(f) == Phase::Succeeded).await;
        let record = &done.status.unwrap().approvals[0];
        assert_eq!(record.approved_by.as_deref(), Some("dash-alice"), "the approver the API server authenticated");
        browser.wait_js("the inbox to empty", &format!("return !({})", in_inbox.trim_start_matches("return ")), DEADLINE).await;
    })
    .await;
}
