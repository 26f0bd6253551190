//! The dashboard at the sizes the issue names, in headless Chromium, with the build under test: the list of
//! 100 rollouts and the grid of a 10,000-target rollout rendered (from their data arriving in the page, and
//! from the view being asked for, the server's reads of the plan's ConfigMaps included), and the grid kept
//! live while 100 targets change a second: each second a batch of 100 succeeds in status and the next
//! starts (200 cells change), while keys are pressed in the grid. Reported: when each change shows on the
//! page after its status write, how soon a key press reaches the next frame, and the page's long tasks.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleetroll::api::FleetRollout;
use futures::StreamExt;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};
use testkit::{
    bench::percentile,
    browser::{Browser, Key},
    dashboard::{Dashboard, render_time},
    frozen::{frozen, planned, unwatched},
};

use crate::{LONG, Report, Sizes, row};

const BATCH: usize = 100;
const RENDERS: usize = 5;

/// Notes, in the page, when each cell changes state, every key press's delay to the next frame, and long
/// tasks.
const RECORDER: &str = r#"
window.bench = {cells: [], keys: [], long: []};
new MutationObserver((records) => {
  const now = Date.now();
  for (const r of records) if (r.target.dataset && r.target.dataset.target) window.bench.cells.push([r.target.dataset.target, r.target.dataset.state, now]);
}).observe(document.querySelector('#grid'), {subtree: true, attributes: true, attributeFilter: ['data-state']});
document.querySelector('#grid').addEventListener('keydown', (e) => {
  const at = e.timeStamp;
  requestAnimationFrame(() => window.bench.keys.push(performance.now() - at));
});
new PerformanceObserver((l) => { for (const e of l.getEntries()) window.bench.long.push(e.duration); }).observe({type: 'longtask'});
"#;

fn now_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

pub async fn views(client: &Client, sizes: &Sizes, report: &mut Report, namespaces: &mut Vec<String>) {
    let (n, rollouts) = (sizes.dashboard_targets, sizes.dashboard_rollouts);
    eprintln!("dashboard: a {n}-target rollout and {rollouts} rollouts in the list");
    let ns = testkit::create_namespace(client, "bench-dashboard", &[]).await;
    namespaces.push(ns.clone());
    let batches: Vec<_> =
        planned(&unwatched(&ns), "t", n, "app:1").chunks(BATCH).map(<[_]>::to_vec).collect();
    let first = json!({"currentBatch": 0, "batches": [{"index": 0, "size": BATCH, "state": "Verifying", "idempotencyKey": "k/1/0"}]});
    frozen(client, &ns, "big", batches.clone(), first).await;
    futures::stream::iter(1..rollouts)
        .for_each_concurrent(16, |i| {
            let ns = ns.clone();
            async move {
                frozen(
                    client,
                    &ns,
                    &format!("r-{i:03}"),
                    vec![planned(&unwatched(&ns), "w", 2, "app:1")],
                    json!({}),
                )
                .await;
            }
        })
        .await;
    let dash = Dashboard::start(&testkit::cluster().kubeconfig, &[]).await;
    let browser = Browser::start().await;
    browser.goto(&dash.url).await;
    let list_done =
        format!("document.querySelectorAll('#rollouts tr[data-rollout^=\"{ns}/\"]').length === {rollouts}");
    browser.wait_js("the list", &format!("return {list_done}"), LONG).await;
    let grid_done = format!("document.querySelectorAll('#grid [data-target]').length === {n}");
    let (mut lists, mut grids) = (Vec::new(), Vec::new());
    for _ in 0..RENDERS {
        grids.push(render_time(&browser, &format!("#/r/{ns}/big"), &grid_done, LONG).await);
        lists.push(render_time(&browser, "#/", &list_done, LONG).await);
    }
    let median = |v: &[(f64, f64)], pick: fn(&(f64, f64)) -> f64| {
        let mut x: Vec<f64> = v.iter().map(pick).collect();
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    for (what, times) in
        [(format!("the list of {rollouts} rollouts"), &lists), (format!("the grid of {n} targets"), &grids)]
    {
        let (render, whole) = (median(times, |t| t.0), median(times, |t| t.1));
        report.rows.push(row(
            format!("dashboard: {what} in headless Chromium: data in → painted / asked → painted (median of {RENDERS})"),
            format!("{render:.0} ms / {whole:.0} ms"),
            "painted ≤ 1 s",
            Some(render <= 1000.0),
        ));
    }
    live(client, &ns, &browser, sizes, batches.len(), report).await;
}

/// The grid kept live while a batch of 100 succeeds and the next starts each second, keys pressed meanwhile.
async fn live(
    client: &Client,
    ns: &str,
    browser: &Browser,
    sizes: &Sizes,
    batches: usize,
    report: &mut Report,
) {
    let grid_done =
        format!("document.querySelectorAll('#grid [data-target]').length === {}", sizes.dashboard_targets);
    render_time(browser, &format!("#/r/{ns}/big"), &grid_done, LONG).await;
    browser.js(RECORDER, vec![]).await;
    browser.click("#grid [data-target]").await;
    let api: Api<FleetRollout> = Api::namespaced(client.clone(), ns);
    let seconds = sizes.dashboard_seconds.min(batches as u64 - 1);
    let mut written = Vec::new();
    let start = Instant::now();
    for k in 1..=seconds as usize {
        let status = json!({"status": {"currentBatch": k, "batches": [
            {"index": k - 1, "size": BATCH, "state": "Succeeded", "idempotencyKey": format!("k/1/{}", k - 1)},
            {"index": k, "size": BATCH, "state": "Verifying", "idempotencyKey": format!("k/1/{k}")}]}});
        written.push(now_ms());
        api.patch_status("big", &PatchParams::default(), &Patch::Merge(status))
            .await
            .expect("status written");
        let due = start + Duration::from_secs(k as u64);
        while Instant::now() < due {
            browser.press(Key::Right).await;
        }
    }
    let last_batch = format!(
        "document.querySelectorAll('#grid [data-state=\"healthy\"]').length >= {}",
        seconds as usize * BATCH
    );
    browser.wait_js("the last batch healthy", &format!("return {last_batch}"), LONG).await;
    let bench = browser.js("return window.bench", vec![]).await;
    let shown = shown_after(&bench["cells"], &written);
    let sorted = |v: &Value| {
        let mut x: Vec<f64> =
            v.as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default();
        x.sort_by(f64::total_cmp);
        x
    };
    let (keys, long) = (sorted(&bench["keys"]), sorted(&bench["long"]));
    let p = |v: &[f64], q| percentile(v, q);
    report.rows.push(row(
        format!(
            "dashboard: {BATCH} targets changing a second for {seconds} s (a batch succeeding, the next starting): status write → shown p50 / p99; \
             key press → next frame p50 / p99 ({} presses); long tasks (> 50 ms)",
            keys.len()
        ),
        format!(
            "{:.0} / {:.0} ms; {:.0} / {:.0} ms; {} (longest {:.0} ms)",
            p(&shown, 50.0),
            p(&shown, 99.0),
            p(&keys, 50.0),
            p(&keys, 99.0),
            long.len(),
            long.last().copied().unwrap_or(0.0)
        ),
        "shown ≤ 1 s",
        Some(p(&shown, 99.0) <= 1000.0),
    ));
}

/// For each status write k (ms since 1970), how long until the page showed batch k-1's last cell healthy.
fn shown_after(cells: &Value, written: &[f64]) -> Vec<f64> {
    let mut healthy_at = vec![f64::NAN; written.len()];
    for c in cells.as_array().into_iter().flatten() {
        let (target, state, at) = (
            c[0].as_str().unwrap_or_default(),
            c[1].as_str().unwrap_or_default(),
            c[2].as_f64().unwrap_or(0.0),
        );
        let index: usize = target.rsplit('-').next().and_then(|i| i.parse().ok()).unwrap_or(usize::MAX);
        if state == "healthy" && index / BATCH < written.len() {
            let slot = &mut healthy_at[index / BATCH];
            *slot = if slot.is_nan() { at } else { slot.max(at) };
        }
    }
    let mut shown: Vec<f64> =
        healthy_at.iter().zip(written).map(|(h, w)| h - w).filter(|d| d.is_finite()).collect();
    shown.sort_by(f64::total_cmp);
    shown
}
