//! `kubectl fleetroll dashboard` in a real browser (headless Chromium through chromedriver), against the real
//! control plane and operator: a rollout watched live from start to end, approvals as the user from the
//! inbox, tenant-controlled text rendered as text under the CSP, a watch cut and resumed without a reload,
//! the 10,000-target grid and the 100-rollout list rendered within a second, and the grid by keyboard, the
//! analysis charts and a previewed plan.

mod approvals;
mod hostile;
mod reconnect;
mod scale;
mod views;
mod watch;

use std::{path::PathBuf, time::Duration};

use serde_json::Value;
use testkit::{browser::Browser, dashboard::Dashboard};

const DEADLINE: Duration = Duration::from_secs(60);

/// Opens the dashboard's page in `browser` (the address with the session token), then the route, and waits
/// until the page says its stream is live.
async fn open(browser: &Browser, dash: &Dashboard, route: &str) {
    browser.goto(&dash.url).await;
    browser
        .wait_js(
            "the list's stream to be live",
            r#"return document.querySelector('#connection')?.dataset.state === 'live'"#,
            DEADLINE,
        )
        .await;
    if !route.is_empty() {
        browser.js("location.hash = arguments[0]", vec![Value::from(route)]).await;
        let key = route.trim_start_matches("#/r/");
        let shown =
            format!("return document.querySelector('#rollout')?.dataset.rollout === {}", Value::from(key));
        browser.wait_js("the rollout's view", &shown, DEADLINE).await;
    }
}

/// The state of every cell on the page, by target.
async fn cells(browser: &Browser) -> serde_json::Map<String, Value> {
    let script = "const out = {}; for (const c of document.querySelectorAll('#grid [data-target]')) \
                  out[c.dataset.target] = c.dataset.state; return out;";
    match browser.js(script, vec![]).await {
        Value::Object(m) => m,
        other => panic!("cells: {other}"),
    }
}

/// Where a test's screenshots go.
fn screenshot_path(name: &str) -> PathBuf {
    let dir = testkit::repo_root().join("target/dashboard");
    std::fs::create_dir_all(&dir).expect("target/dashboard");
    dir.join(format!("{name}.png"))
}
