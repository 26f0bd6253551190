//! The rest of one rollout's view, used as a person would: the grid by keyboard alone (one cell in the tab
//! order, arrows and Home/End moving it, each state told by its sign and its word), the batch's analysis
//! measurements as charts, and the plan a pasted manifest would get, from the same planning as
//! `kubectl fleetroll plan -f` against the Deployments in the namespace.

use fleetroll::api::PlannedTarget;
use serde_json::{Value, json};
use testkit::{
    browser::{Browser, Key},
    dashboard::Dashboard,
    fleet::{READY_IMAGE, with_fleet},
    frozen::{frozen, planned, unwatched},
};

use super::{DEADLINE, open, open_grid};

fn measurement(value: &str, phase: &str, at: &str) -> Value {
    json!({"phase": phase, "value": value, "at": at})
}

#[tokio::test]
async fn the_grid_by_keyboard_the_analysis_charts_and_a_previewed_plan() {
    with_fleet("dash-views", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        fleet.deployments(&ns, 3, READY_IMAGE).await;
        let measurements = [
            measurement("0.010", "Successful", "2026-12-05T10:00:00Z"),
            measurement("0.020", "Successful", "2026-12-05T10:00:30Z"),
            measurement("0.300", "Failed", "2026-12-05T10:01:00Z"),
        ];
        let analysis = json!({"startedAt": "2026-12-05T10:00:00Z", "metrics": [
            {"name": "error-rate", "phase": "Failed", "successful": 2, "failed": 1, "measurements": measurements}]});
        let status = json!({"currentBatch": 0, "batches": [
            {"index": 0, "size": 4, "state": "Verifying", "idempotencyKey": "k/1/0", "analysis": analysis}]});
        let tns = unwatched(&ns);
        let batches = planned(&tns, "cell", 8, "app:1").chunks(4).map(<[_]>::to_vec).collect();
        frozen(&fleet.client, &ns, "views", batches, status).await;
        let dash = Dashboard::start(&testkit::cluster().kubeconfig, &[]).await;
        let browser = Browser::start().await;
        open_grid(&browser, &dash, &format!("#/r/{ns}/views"), 8).await;

        // One cell in the tab order; the arrows and Home/End move it, and focus follows.
        let tabbable = "return document.querySelectorAll('#grid [tabindex=\"0\"]').length";
        assert_eq!(browser.js(tabbable, vec![]).await, json!(1));
        browser.click(&format!("#grid [data-target=\"{tns}/cell-00000\"]")).await;
        let focused = "return document.activeElement?.dataset.target";
        for (key, expected) in [(Key::Right, "cell-00001"), (Key::End, "cell-00003"), (Key::Home, "cell-00000")] {
            browser.press(key).await;
            assert_eq!(browser.js(focused, vec![]).await, json!(format!("{tns}/{expected}")), "after {key:?}");
        }
        assert_eq!(browser.js(tabbable, vec![]).await, json!(1), "still one cell in the tab order");
        // Each state by its sign and its word, not by colour alone: in the cell's own text, and its label.
        let told = "const c = document.activeElement; return [c.textContent, c.getAttribute('aria-label')]";
        let told = browser.js(told, vec![]).await;
        assert!(told[0].as_str().is_some_and(|t| t.contains("changing")), "{told}");
        assert!(told[1].as_str().is_some_and(|t| t.ends_with(": changing")), "{told}");
        let legend = browser.text("#legend").await;
        for word in ["pending", "changing", "soaking", "healthy", "failed", "refused", "skipped", "restored"] {
            assert!(legend.contains(word), "the legend names {word}: {legend}");
        }

        // The batch's measurements as a chart: one mark per measurement, the metric named.
        let chart = browser
            .wait_js("the analysis chart", "const a = document.querySelector('#analysis'); return a && a.querySelector('svg') ? a.textContent : null", DEADLINE)
            .await;
        assert!(chart.as_str().is_some_and(|t| t.contains("error-rate")), "{chart}");
        let marks = "return document.querySelectorAll('#analysis svg .pt').length";
        assert_eq!(browser.js(marks, vec![]).await, json!(3), "one mark per measurement");

        // A pasted manifest's plan: the namespace's three Deployments, two at a time.
        let manifest = format!(
            "apiVersion: fleetroll.dev/v1alpha1\nkind: FleetRollout\nmetadata: {{name: preview, namespace: {ns}}}\n\
             spec: {{image: registry.k8s.io/pause:3.9, targets: {{kind: Deployment, selector: {{matchLabels: {{fleet: web}}}}}}, strategy: {{batchSize: 2}}}}\n"
        );
        let paste = "const t = document.querySelector('#preview-manifest'); t.value = arguments[0]; \
                     t.dispatchEvent(new Event('input', {bubbles: true}));";
        browser.js(paste, vec![Value::from(manifest)]).await;
        browser.click("#preview-run").await;
        let answered = "const o = document.querySelector('#preview-result')?.dataset.outcome; \
                        return o && o !== 'pending' ? o : null";
        let outcome = browser.wait_js("the preview's answer", answered, DEADLINE).await;
        assert_eq!(outcome, json!("ok"), "{}", browser.text("#preview-result").await);
        // Its batches' targets are listed once opened, as a person opens them.
        browser.js("for (const d of document.querySelectorAll('#preview-result details')) d.open = true", vec![]).await;
        let shown = browser
            .wait_js("the preview", "const r = document.querySelector('#preview-result'); return r && r.textContent.includes('web-02') ? r.textContent : null", DEADLINE)
            .await;
        let shown = shown.as_str().unwrap_or_default();
        for name in ["web-00", "web-01", "web-02"] {
            assert!(shown.contains(&format!("{ns}/{name}")), "{name} in the preview: {shown}");
        }
        let nothing = fleet.rollouts().get_opt("preview").await.unwrap();
        assert!(nothing.is_none(), "a preview writes nothing");
        assert!(shown.contains("3 targets in 2 batches"), "{shown}");
    })
    .await;
}

/// A failed target in a member cluster, clicked: its detail names its cluster and wave, and carries the
/// failure the operator recorded of it (filed, as the operator files it, under `cluster`, `namespace`, `name`).
#[tokio::test]
async fn a_member_clusters_failed_target_shows_its_failure() {
    with_fleet("dash-member-fail", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        let in_member = |cluster: &str, name: &str| PlannedTarget {
            cluster: cluster.into(),
            namespace: "shop".into(),
            name: name.into(),
            previous_image: "app:1".into(),
        };
        let batches = vec![vec![in_member("member-1", "web-00")], vec![in_member("member-2", "web-00")]];
        let status = json!({"currentBatch": 1,
            "batches": [{"index": 1, "size": 1, "state": "Verifying", "idempotencyKey": "k/1/1"}],
            // The same name in the other cluster, and an older record of this target: neither is its detail.
            "failures": [{"cluster": "member-1", "namespace": "shop", "name": "web-00", "batch": 0,
                          "reason": "HttpCheckFailed", "message": "the other cluster's"},
                         {"cluster": "member-2", "namespace": "shop", "name": "web-00", "batch": 1,
                          "reason": "PodFailed", "message": "an older record"},
                         {"cluster": "member-2", "namespace": "shop", "name": "web-00", "batch": 1,
                          "reason": "Timeout", "message": "not ready within 5m"}],
            "clusters": {"waves": [
                {"name": "canary", "firstBatch": 0, "lastBatch": 0, "clusters": 1, "total": 1, "updated": 1, "failed": 0},
                {"name": "prod", "firstBatch": 1, "lastBatch": 1, "clusters": 1, "total": 1, "updated": 1, "failed": 1}]}});
        frozen(&fleet.client, &ns, "across", batches, status).await;
        let dash = Dashboard::start(&testkit::cluster().kubeconfig, &[]).await;
        let browser = Browser::start().await;
        open(&browser, &dash, &format!("#/r/{ns}/across")).await;
        let cell = "#grid [data-target=\"member-2/shop/web-00\"]";
        browser.wait_js("the member's cell", &format!("return document.querySelector('{cell}')?.dataset.state === 'failed'"), DEADLINE).await;
        browser.click(cell).await;
        let detail = browser.text("#cell-detail").await;
        for said in ["cluster member-2", "wave prod", "Timeout: not ready within 5m"] {
            assert!(detail.contains(said), "{said} in the detail: {detail}");
        }
        for other in ["the other cluster's", "an older record"] {
            assert!(!detail.contains(other), "{other} not in the detail: {detail}");
        }
    })
    .await;
}
