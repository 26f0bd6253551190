//! Every action from the page, as the user, each after its confirmation, against the real operator: a
//! rollout paused and resumed, approved batch by batch, a target deleted under it shown skipped, the
//! rollout rolled back with the cells it put back shown restored; then a second one aborted.

use serde_json::json;
use testkit::{
    browser::Browser,
    dashboard::Dashboard,
    fleet::{NEXT_IMAGE, READY_IMAGE, image_of, phase, with_fleet},
    operator::Operator,
};

use super::{DEADLINE, open, press, wait_cells, wait_phase};
use fleetroll::api::{FleetRollout, Phase};

const BUTTON: &str = "#rollout button[data-action=";

fn button(action: &str) -> String {
    format!("{BUTTON}\"{action}\"]")
}

/// Waits until the rollout waits for the approval of batch `index` (0-based).
async fn awaiting(fleet: &testkit::fleet::Fleet, index: u32) -> FleetRollout {
    fleet
        .wait_rollout("web", &format!("batch {} to wait for its approval", index + 1), DEADLINE, |f| {
            let s = f.status.as_ref();
            phase(f) == Phase::WaitingForApproval
                && s.and_then(|s| s.pending_approval.as_ref()).is_some_and(|p| p.batch == index)
        })
        .await
}

#[tokio::test]
async fn pause_resume_approve_roll_back_and_abort_from_the_page() {
    with_fleet("dash-act", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        fleet.deployments(&ns, 6, READY_IMAGE).await;
        let _op = Operator::start(&ns, &[], &[]);
        let targets = json!({"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}});
        let spec = json!({"image": NEXT_IMAGE, "targets": targets, "strategy": {"batchSize": 2, "approval": "EveryBatch"}});
        fleet.rollout("web", spec.clone()).await;
        awaiting(&fleet, 0).await;
        let dash = Dashboard::start(&testkit::cluster().kubeconfig, &[]).await;
        let browser = Browser::start().await;
        open(&browser, &dash, &format!("#/r/{ns}/web")).await;
        let cell = |name: &str| format!("{ns}/{name}");

        // Paused and resumed: the spec says so, and the operator's phase follows on the page.
        let (outcome, said) = press(&browser, &button("pause")).await;
        assert_eq!((outcome.as_str(), said.contains("paused")), ("ok", true), "{said}");
        fleet.wait_rollout("web", "the pause", DEADLINE, |f| phase(f) == Phase::Paused).await;
        wait_phase(&browser, "Paused").await;
        let (outcome, said) = press(&browser, &button("resume")).await;
        assert_eq!((outcome.as_str(), said.contains("resumed")), ("ok", true), "{said}");
        awaiting(&fleet, 0).await;
        wait_phase(&browser, "WaitingForApproval").await;

        // Batch 1 approved from the page; then web-03, of batch 2, deleted: skipped, before and after its batch.
        let (outcome, said) = press(&browser, &button("approve")).await;
        assert_eq!(outcome, "ok", "{said}");
        awaiting(&fleet, 1).await;
        wait_cells(&browser, "batch 1 healthy", &[(cell("web-00"), "healthy"), (cell("web-01"), "healthy")]).await;
        let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> = kube::Api::namespaced(fleet.client.clone(), &ns);
        deployments.delete("web-03", &Default::default()).await.unwrap();
        wait_cells(&browser, "the deleted target skipped", &[(cell("web-03"), "skipped"), (cell("web-02"), "pending")]).await;
        let (outcome, said) = press(&browser, &button("approve")).await;
        assert_eq!(outcome, "ok", "{said}");
        let fr = awaiting(&fleet, 2).await;
        let skipped = fr.status.as_ref().map_or(0, |s| s.counts.skipped);
        assert_eq!(skipped, 1, "the operator skipped web-03 too");
        wait_cells(&browser, "batch 2", &[(cell("web-02"), "healthy"), (cell("web-03"), "skipped")]).await;

        // Rolled back: what it changed is put back and says so; what it never reached stays pending.
        let (outcome, said) = press(&browser, &button("rollback")).await;
        assert_eq!((outcome.as_str(), said.contains("rollback")), ("ok", true), "{said}");
        fleet.wait_rollout("web", "the rollback", DEADLINE, |f| phase(f) == Phase::RolledBack).await;
        wait_phase(&browser, "RolledBack").await;
        let after = [("web-00", "restored"), ("web-01", "restored"), ("web-02", "restored"), ("web-03", "skipped"),
                     ("web-04", "pending"), ("web-05", "pending")];
        wait_cells(&browser, "the rolled-back grid", &after.map(|(n, s)| (cell(n), s))).await;
        for name in ["web-00", "web-01", "web-02", "web-04"] {
            assert_eq!(image_of(&deployments.get(name).await.unwrap()), READY_IMAGE, "{name}");
        }
        let final_buttons = "return [...document.querySelectorAll('#rollout .actions button')].filter(b => !b.disabled).map(b => b.dataset.action)";
        assert_eq!(browser.js(final_buttons, vec![]).await, json!([]), "nothing more to do with a rolled-back rollout");

        // Another rollout of the same targets, aborted before anything changed.
        fleet.rollout("again", json!({"image": NEXT_IMAGE, "targets": targets, "strategy": {"batchSize": 2, "approval": "FirstBatch"}})).await;
        fleet.wait_rollout("again", "its approval gate", DEADLINE, |f| phase(f) == Phase::WaitingForApproval).await;
        open(&browser, &dash, &format!("#/r/{ns}/again")).await;
        let (outcome, said) = press(&browser, &button("abort")).await;
        assert_eq!((outcome.as_str(), said.contains("abort")), ("ok", true), "{said}");
        fleet.wait_rollout("again", "the abort", DEADLINE, |f| phase(f) == Phase::Aborted).await;
        wait_phase(&browser, "Aborted").await;
        // Nothing it changed, so nothing to roll back: the operator would not, and the page does not offer it.
        let enabled = browser.js(final_buttons, vec![]).await;
        assert_eq!(enabled, json!([]), "an aborted rollout that changed nothing offers nothing");
        let untouched = ["web-00", "web-01", "web-02", "web-04", "web-05"].map(|n| (cell(n), "pending"));
        wait_cells(&browser, "the aborted grid", &untouched).await;
        for name in ["web-00", "web-05"] {
            assert_eq!(image_of(&deployments.get(name).await.unwrap()), READY_IMAGE, "{name} untouched");
        }
    })
    .await;
}
