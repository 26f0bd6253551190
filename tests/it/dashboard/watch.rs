//! The demo's rollout (40 Deployments in 4 tenant namespaces, 10 at a time, a soak) watched in the
//! dashboard from start to end: the page records every cell's state as it changes (a MutationObserver), the
//! test records when the status said each batch succeeded, and each batch's cells must go from pending
//! through changing to healthy, batch after batch, each batch healthy on the page within 1 s of its status.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{SystemTime, UNIX_EPOCH},
};

use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use testkit::{
    browser::Browser,
    dashboard::Dashboard,
    fleet::{FLEET_LABEL, NEXT_IMAGE, has_plan, phase, with_fleet},
    operator::Operator,
};

use super::{DEADLINE, cells, open_grid, screenshot_path};
use fleetroll::api::{BatchState, Phase};

/// Logs `[target, state, Date.now()]` for every cell added to the grid and every change of its state.
const RECORDER: &str = r#"
window.cellLog = [];
const note = (el) => { if (el.dataset && el.dataset.target) window.cellLog.push([el.dataset.target, el.dataset.state, Date.now()]); };
new MutationObserver((records) => {
  for (const r of records) {
    if (r.type === 'attributes') note(r.target);
    for (const n of r.addedNodes || []) { if (n.nodeType === 1) { note(n); n.querySelectorAll('[data-target]').forEach(note); } }
  }
}).observe(document.body, {subtree: true, childList: true, attributes: true, attributeFilter: ['data-state']});
document.querySelectorAll('#grid [data-target]').forEach(note);
"#;

fn now_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs_f64() * 1e3
}

#[tokio::test]
async fn the_demos_rollout_is_watched_from_start_to_end() {
    with_fleet("dash-watch", 4, |fleet| async move {
        fleet.tenant_deployments(10).await;
        let _op = Operator::start(&fleet.ns, &[], &[]);
        let targets = json!({"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}},
                             "namespaceSelector": {"matchLabels": {FLEET_LABEL: fleet.ns}}});
        let spec = json!({"image": NEXT_IMAGE, "targets": targets, "paused": true,
                          "strategy": {"batchSize": 10, "pauseBetweenBatches": "2s"}, "health": {"soak": "2s"}});
        fleet.rollout("tenants", spec).await;
        fleet.wait_rollout("tenants", "a plan", DEADLINE, has_plan).await;

        let dash = Dashboard::start(&testkit::cluster().kubeconfig, &[]).await;
        let browser = Browser::start().await;
        open_grid(&browser, &dash, &format!("#/r/{}/tenants", fleet.ns), 40).await;
        assert!(cells(&browser).await.values().all(|s| s == "pending"), "before it starts, every cell is pending");
        browser.js(RECORDER, vec![]).await;

        // The test's own record of when status said each batch succeeded.
        let succeeded: Arc<Mutex<HashMap<u32, f64>>> = Arc::default();
        let seen = succeeded.clone();
        let config = watcher::Config::default().fields("metadata.name=tenants");
        let watch = tokio::spawn(watcher(fleet.rollouts(), config).applied_objects().for_each(move |fr| {
            if let Ok(fr) = fr {
                let batches = fr.status.map(|s| s.batches).unwrap_or_default();
                for b in batches.iter().filter(|b| b.state == BatchState::Succeeded) {
                    seen.lock().unwrap().entry(b.index).or_insert_with(now_ms);
                }
            }
            futures::future::ready(())
        }));
        fleet.patch_spec("tenants", json!({"paused": false})).await;
        fleet.wait_rollout("tenants", "success", DEADLINE * 3, |f| phase(f) == Phase::Succeeded).await;
        browser
            .wait_js("every cell healthy", "return [...document.querySelectorAll('#grid [data-target]')].every(c => c.dataset.state === 'healthy')", DEADLINE)
            .await;
        watch.abort();
        browser.screenshot(&screenshot_path("rollout")).await;

        let log = browser.js("return window.cellLog", vec![]).await;
        let plan = fleet.plan(&fleet.rollouts().get("tenants").await.unwrap()).await;
        let succeeded = succeeded.lock().unwrap().clone();
        let mut previous_healthy = 0.0;
        for (index, batch) in plan.batches.iter().enumerate() {
            let keys: Vec<String> = batch.iter().map(|t| t.key()).collect();
            let mut transitional = false;
            let mut healthy_at: f64 = 0.0;
            let mut left_pending: f64 = f64::MAX;
            for key in &keys {
                let states = states_of(&log, key);
                let words: Vec<&str> = states.iter().map(|(s, _)| s.as_str()).collect();
                assert_eq!(words.first(), Some(&"pending"), "{key} starts pending: {words:?}");
                assert_eq!(words.last(), Some(&"healthy"), "{key} ends healthy: {words:?}");
                let order = |w: &str| ["pending", "changing", "soaking", "healthy"].iter().position(|o| *o == w);
                let ranks: Vec<_> = words.iter().map(|w| order(w).unwrap_or_else(|| panic!("{key}: {w}"))).collect();
                assert!(ranks.windows(2).all(|w| w[0] < w[1]), "{key} goes forward only: {words:?}");
                transitional |= words.contains(&"changing");
                left_pending = left_pending.min(states[1].1);
                healthy_at = healthy_at.max(states.last().unwrap().1);
            }
            assert!(transitional, "batch {index}: some cell showed its target changing");
            // Cells the same update changes are noted within the same callback, a few ms apart at most.
            assert!(left_pending + 20.0 >= previous_healthy, "batch {index} started on the page after batch {} was healthy", index.max(1) - 1);
            let status_at = succeeded[&(index as u32)];
            assert!(
                healthy_at <= status_at + 1000.0,
                "batch {index} healthy on the page {:.0} ms after its status said so",
                healthy_at - status_at
            );
            eprintln!("batch {index}: healthy on the page {:+.0} ms after its status", healthy_at - status_at);
            previous_healthy = healthy_at;
        }
    })
    .await;
}

/// A cell's states in the order the page showed them, repeats left out, with when (ms since 1970).
fn states_of(log: &Value, key: &str) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = Vec::new();
    for entry in log.as_array().expect("the log").iter().filter(|e| e[0] == key) {
        let state = entry[1].as_str().unwrap_or_default().to_string();
        if out.last().is_none_or(|(s, _)| *s != state) {
            out.push((state, entry[2].as_f64().unwrap_or_default()));
        }
    }
    out
}
