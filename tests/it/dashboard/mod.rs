//! `kubectl fleetroll dashboard` in a real browser (headless Chromium through chromedriver), against the real
//! control plane and operator: a rollout watched live from start to end, approvals as the user from the
//! inbox, every other action pressed on the page (skipped and restored cells among what they leave), a
//! rollout across member clusters by wave and cluster, tenant-controlled text rendered as text under the
//! CSP, watches (and the page's own stream) cut and resumed without a reload, and ended when the page goes,
//! the 10,000-target grid and the 100-rollout list rendered within a second, and the grid by keyboard, the
//! analysis charts and a previewed plan.

mod actions;
mod approvals;
mod connections;
mod hostile;
mod members;
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

/// Presses the action button `css`, confirms it, and returns the answer the page shows: (outcome, text).
async fn press(browser: &Browser, css: &str) -> (String, String) {
    browser.js("window.previousResult = document.querySelector('#action-result')?.textContent", vec![]).await;
    // The view's buttons wait for the rollout itself (its first event) to know what they may do.
    let enabled =
        format!("const b = document.querySelector({}); return b !== null && !b.disabled", Value::from(css));
    browser.wait_js("the button to be enabled", &enabled, DEADLINE).await;
    browser.click(css).await;
    browser
        .wait_js("the confirmation", "return document.querySelector('#confirm')?.open === true", DEADLINE)
        .await;
    browser.click("#confirm-ok").await;
    let shown = browser
        .wait_js(
            "the action's answer",
            "const r = document.querySelector('#action-result'); \
             return r && ['ok', 'refused'].includes(r.dataset.outcome) && r.textContent !== window.previousResult ? [r.dataset.outcome, r.textContent] : null",
            DEADLINE,
        )
        .await;
    (shown[0].as_str().unwrap_or_default().into(), shown[1].as_str().unwrap_or_default().into())
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

/// Opens the rollout's view at `route` (as [`open`] does) and waits for its grid's `cells` cells.
async fn open_grid(browser: &Browser, dash: &Dashboard, route: &str, cells: usize) {
    open(browser, dash, route).await;
    let shown = format!("return document.querySelectorAll('#grid [data-target]').length === {cells}");
    browser.wait_js(&format!("the grid's {cells} cells"), &shown, DEADLINE).await;
}

/// Waits until every target of `expected` shows its state in the grid.
async fn wait_cells(browser: &Browser, what: &str, expected: &[(String, &str)]) {
    let want: serde_json::Map<String, Value> =
        expected.iter().map(|(target, state)| (target.clone(), Value::from(*state))).collect();
    let script = format!(
        "const want = {}; return Object.entries(want).every(([t, s]) => \
         document.querySelector(`#grid [data-target=\"${{CSS.escape(t)}}\"]`)?.dataset.state === s)",
        Value::Object(want)
    );
    browser.wait_js(what, &script, DEADLINE).await;
}

/// The page's phase of the rollout it shows.
async fn wait_phase(browser: &Browser, phase: &str) {
    let script = format!("return document.querySelector('#phase')?.dataset.phase === {}", Value::from(phase));
    browser.wait_js(&format!("the page to show the phase {phase}"), &script, DEADLINE).await;
}

/// Where a test's screenshots go.
fn screenshot_path(name: &str) -> PathBuf {
    let dir = testkit::repo_root().join("target/dashboard");
    std::fs::create_dir_all(&dir).expect("target/dashboard");
    dir.join(format!("{name}.png"))
}
