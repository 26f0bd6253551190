//! A lost watch resumes without a reload: the dashboard reaches the API server through a proxy that cuts
//! every connection (as an API server restart does, for this dashboard alone: the other tests share the API
//! server). The page says "reconnecting"; a change made meanwhile shows once the proxy lets it through again,
//! on the same page (a value the test left in it is still there).

use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use testkit::{browser::Browser, dashboard::Dashboard, fleet::with_fleet, proxy::Proxy};

use testkit::frozen::{frozen, planned, unwatched};

use super::{DEADLINE, open};

#[tokio::test]
async fn a_cut_watch_shows_reconnecting_and_recovers_without_a_reload() {
    with_fleet("dash-reconnect", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        let status = json!({"message": "before the cut", "currentBatch": 0,
            "batches": [{"index": 0, "size": 2, "state": "Verifying", "idempotencyKey": "k/1/0"}]});
        frozen(&fleet.client, &ns, "web", vec![planned(&unwatched(&ns), "web", 2, "app:1")], status).await;
        let admin = &testkit::cluster().kubeconfig;
        let proxy = Proxy::to_cluster(admin).await;
        let dash = Dashboard::start(&proxy.kubeconfig_through(admin), &[]).await;
        let browser = Browser::start().await;
        open(&browser, &dash, &format!("#/r/{ns}/web")).await;
        let shows = |text: &str| format!("return document.body.textContent.includes({})", Value::from(text));
        browser.wait_js("the message", &shows("before the cut"), DEADLINE).await;
        browser.js("window.survivor = 42", vec![]).await;

        proxy.cut().await;
        let state = "return document.querySelector('#connection')?.dataset.state";
        browser
            .wait_js("the page to say it reconnects", &format!("{state} === 'reconnecting'"), DEADLINE)
            .await;
        let text = browser.text("#connection").await;
        assert!(text.to_lowercase().contains("reconnecting"), "{text}");
        let changed = json!({"status": {"message": "changed while cut"}});
        fleet.rollouts().patch_status("web", &PatchParams::default(), &Patch::Merge(changed)).await.unwrap();

        proxy.restore();
        browser.wait_js("the page to be live again", &format!("{state} === 'live'"), DEADLINE).await;
        browser.wait_js("the change made while cut", &shows("changed while cut"), DEADLINE).await;
        assert_eq!(browser.js("return window.survivor", vec![]).await, json!(42), "the same page: no reload");
    })
    .await;
}
