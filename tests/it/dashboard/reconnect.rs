//! Lost watches resume without a reload: the dashboard reaches the API server through a proxy that cuts
//! every connection (as an API server restart does, for this dashboard alone: the other tests share the API
//! server). Each time the page says "reconnecting", and what changed meanwhile shows once the proxy lets it
//! through again, on the same page (a value the test left in it is still there): in the list, a rollout
//! changed and another deleted; in one rollout's view, a change; then that rollout deleted.

use kube::api::{Patch, PatchParams};
use std::time::Duration;

use serde_json::{Value, json};
use testkit::{
    browser::Browser,
    dashboard::Dashboard,
    fleet::{Fleet, with_fleet},
    frozen::{frozen, planned, unwatched},
    proxy::Proxy,
};

use super::{DEADLINE, open, open_grid};

const STATE: &str = "return document.querySelector('#connection')?.dataset.state";

/// Cuts the proxy, waits for the page to say it reconnects, runs `meanwhile`, and lets the proxy through
/// again once it is done.
async fn cut_while<F: Future<Output = ()>>(proxy: &Proxy, browser: &Browser, meanwhile: F) {
    proxy.cut().await;
    let reconnecting = format!("{STATE} === 'reconnecting'");
    browser.wait_js("the page to say it reconnects", &reconnecting, DEADLINE).await;
    let text = browser.text("#connection").await;
    assert!(text.to_lowercase().contains("reconnecting"), "{text}");
    meanwhile.await;
    proxy.restore();
    browser.wait_js("the page to be live again", &format!("{STATE} === 'live'"), DEADLINE).await;
}

async fn patch_status(fleet: &Fleet, name: &str, status: Value) {
    let patch = Patch::Merge(json!({"status": status}));
    fleet.rollouts().patch_status(name, &PatchParams::default(), &patch).await.unwrap();
}

#[tokio::test]
async fn cut_watches_show_reconnecting_and_recover_without_a_reload() {
    with_fleet("dash-reconnect", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        let status = json!({"message": "before the cut", "currentBatch": 0,
            "batches": [{"index": 0, "size": 2, "state": "Verifying", "idempotencyKey": "k/1/0"}]});
        let targets = || vec![planned(&unwatched(&ns), "web", 2, "app:1")];
        frozen(&fleet.client, &ns, "web", targets(), status).await;
        frozen(&fleet.client, &ns, "doomed", targets(), json!({})).await;
        let admin = &testkit::cluster().kubeconfig;
        let proxy = Proxy::to_cluster(admin).await;
        let dash = Dashboard::start(&proxy.kubeconfig_through(admin), &[]).await;
        let browser = Browser::start().await;
        let row =
            |name: &str| format!("document.querySelector('#rollouts tr[data-rollout=\"{ns}/{name}\"]')");

        // The list: one rollout paused and another deleted while cut.
        open(&browser, &dash, "").await;
        browser
            .wait_js(
                "both rows",
                &format!("return {} !== null && {} !== null", row("web"), row("doomed")),
                DEADLINE,
            )
            .await;
        browser.js("window.survivor = 42", vec![]).await;
        cut_while(&proxy, &browser, async {
            patch_status(&fleet, "web", json!({"phase": "Paused"})).await;
            fleet.rollouts().delete("doomed", &Default::default()).await.unwrap();
        })
        .await;
        let paused =
            format!("return {}?.querySelector('[data-phase]')?.dataset.phase === 'Paused'", row("web"));
        browser.wait_js("the paused rollout's row", &paused, DEADLINE).await;
        browser
            .wait_js(
                "the deleted rollout's row gone",
                &format!("return {} === null", row("doomed")),
                DEADLINE,
            )
            .await;

        // One rollout's view: a change made while cut.
        open_route(&browser, &format!("#/r/{ns}/web")).await;
        let shows = |text: &str| format!("return document.body.textContent.includes({})", Value::from(text));
        browser.wait_js("the message", &shows("before the cut"), DEADLINE).await;
        cut_while(&proxy, &browser, patch_status(&fleet, "web", json!({"message": "changed while cut"})))
            .await;
        browser.wait_js("the change made while cut", &shows("changed while cut"), DEADLINE).await;

        // The same view: its rollout deleted while cut.
        cut_while(&proxy, &browser, async {
            fleet.rollouts().delete("web", &Default::default()).await.unwrap();
        })
        .await;
        let gone = "const g = document.querySelector('#gone'); return g && !g.hidden ? g.textContent : null";
        let said = browser.wait_js("the page to say the rollout is gone", gone, DEADLINE).await;
        assert!(said.as_str().is_some_and(|s| s.contains("deleted")), "{said}");
        assert_eq!(
            browser.js("return window.survivor", vec![]).await,
            json!(42),
            "the same page throughout: no reload"
        );
    })
    .await;
}

/// Moves the page to `route` as a link would (no reload), and waits for the rollout's view.
async fn open_route(browser: &Browser, route: &str) {
    browser.js("location.hash = arguments[0]", vec![Value::from(route)]).await;
    let key = route.trim_start_matches("#/r/");
    let shown =
        format!("return document.querySelector('#rollout')?.dataset.rollout === {}", Value::from(key));
    browser.wait_js("the rollout's view", &shown, DEADLINE).await;
    browser.wait_js("its stream to be live", &format!("{STATE} === 'live'"), DEADLINE).await;
}

/// A page that goes ends its watches at once, however quiet its rollout: each watch holds its own
/// connection through the proxy, and a watch dropped mid-stream closes it (idle pooled connections stay).
#[tokio::test]
async fn a_closed_page_ends_its_watches() {
    with_fleet("dash-close", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        let status = json!({"currentBatch": 0, "batches": [{"index": 0, "size": 2, "state": "Verifying", "idempotencyKey": "k/1/0"}]});
        frozen(&fleet.client, &ns, "quiet", vec![planned(&unwatched(&ns), "web", 2, "app:1")], status).await;
        let admin = &testkit::cluster().kubeconfig;
        let proxy = Proxy::to_cluster(admin).await;
        let dash = Dashboard::start(&proxy.kubeconfig_through(admin), &[]).await;
        let browser = Browser::start().await;
        open_grid(&browser, &dash, &format!("#/r/{ns}/quiet"), 2).await;
        // The rollout's watch, its Events' and its targets': three connections held open while the page is,
        // counted once no connection has opened or closed for a second (the list's, closing; a watch still
        // opening).
        let watching = proxy.settled_connections(Duration::from_secs(1), DEADLINE).await;
        assert!(watching >= 3, "{watching} connections for three watches");
        browser.goto("about:blank").await;
        let what = format!("the watches to end with the page (of {watching} connections, 3 fewer)");
        proxy.wait_connections(&what, DEADLINE, |open| *open <= watching - 3).await;
    })
    .await;
}

/// The page's own stream to the dashboard broken (by the network between them: a proxy in front of a
/// dashboard that answers any Host, as `--allow-remote` makes it): the page says it lost the dashboard,
/// tries again with a backoff, and is live again, with what changed meanwhile, without a reload.
#[tokio::test]
async fn a_broken_page_stream_is_opened_again() {
    with_fleet("dash-pagecut", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        let status = json!({"message": "before the page was cut off"});
        frozen(&fleet.client, &ns, "web", vec![planned(&unwatched(&ns), "web", 2, "app:1")], status).await;
        let dash = Dashboard::start(&testkit::cluster().kubeconfig, &["--allow-remote"]).await;
        let served = dash.origin.trim_start_matches("http://").to_string();
        let front = Proxy::start(&served).await;
        let browser = Browser::start().await;
        browser.goto(&dash.url.replace(&served, &front.addr().to_string())).await;
        browser.wait_js("the list's stream to be live", &format!("{STATE} === 'live'"), DEADLINE).await;
        open_route(&browser, &format!("#/r/{ns}/web")).await;
        let shows = |text: &str| format!("return document.body.textContent.includes({})", Value::from(text));
        browser.wait_js("the message", &shows("before the page was cut off"), DEADLINE).await;
        browser.js("window.survivor = 7", vec![]).await;

        front.cut().await;
        let lost = format!(
            "{STATE} === 'reconnecting' && document.querySelector('#connection-detail').textContent.includes('Lost the dashboard')"
        );
        browser.wait_js("the page to say it lost the dashboard", &lost, DEADLINE).await;
        patch_status(&fleet, "web", json!({"message": "changed while the page was cut off"})).await;
        front.restore();
        browser.wait_js("the page to be live again", &format!("{STATE} === 'live'"), DEADLINE).await;
        browser.wait_js("the change made meanwhile", &shows("changed while the page was cut off"), DEADLINE).await;
        assert_eq!(browser.js("return window.survivor", vec![]).await, json!(7), "the same page: no reload");
    })
    .await;
}
