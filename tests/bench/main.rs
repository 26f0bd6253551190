//! `make bench`: fleetroll measured against the floor, on the local control plane with kwok nodes.
//!
//!   cargo test --release --test bench -- --full    the full run (make bench); writes bench/results/
//!   cargo test --test bench                        a reduced smoke run, part of `make test`
//!   ... -- --full --only transitions,mcp           some scenarios only (overhead, transitions, analysis, members, scale, mcp,
//!                                                  fairness, memory, impersonation, notifications, dashboard)
//!
//! Every figure that has a goal is a ratio or a latency measured side by side in the same run, because these
//! machines are noisy. Goals are reported, not asserted: the run fails only when an invariant breaks (a
//! rollout that does not complete, a target changed twice).
#![allow(clippy::unwrap_used)]

mod analysis;
mod dashboard;
mod fairness;
mod members;
mod memory;
mod notifications;

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use fleetroll::api::{FleetRollout, Phase};
use futures::{StreamExt, stream};
use kube::{Api, Client, api::PostParams};
use serde_json::json;
use testkit::bench::{Observer, Row, row};
use testkit::operator::Operator;

struct Sizes {
    name: &'static str,
    overhead_targets: usize,
    overhead_batch: usize,
    overhead_runs: usize,
    overhead_replicas: i32,
    transition_targets: usize,
    scale_targets: usize,
    scale_batch: &'static str,
    concurrent_rollouts: usize,
    concurrent_targets: usize,
    mcp_clients: usize,
    mcp_requests: usize,
    mcp_starts: usize,
    /// How long an agent polls its task, unflooded and then beside another tenant's slow-body flood.
    fairness_seconds: u64,
    analysis_targets: usize,
    /// Deployments in each of the two members, and per batch.
    members_targets: usize,
    members_batch: usize,
    /// Deployments over the hub and the two members, for the operator's memory.
    members_scale_targets: usize,
    /// Tenant Deployments of near-maximal size beside which the operator's memory is measured.
    heavy_deployments: usize,
    /// Writes made directly and as an impersonated creator, interleaved, to price impersonation.
    impersonated_writes: usize,
    /// The dashboard's rollout grid, list, and how long its targets change a second.
    dashboard_targets: usize,
    dashboard_rollouts: usize,
    dashboard_seconds: u64,
}

const FULL: Sizes = Sizes {
    name: "full",
    overhead_targets: 1000,
    overhead_batch: 100,
    overhead_runs: 2,
    overhead_replicas: 1,
    transition_targets: 100,
    scale_targets: 10_000,
    scale_batch: "10%",
    concurrent_rollouts: 100,
    concurrent_targets: 100,
    mcp_clients: 64,
    mcp_requests: 20_000,
    mcp_starts: 200,
    fairness_seconds: 30,
    analysis_targets: 50,
    members_targets: 250,
    members_batch: 50,
    members_scale_targets: 10_000,
    heavy_deployments: 200,
    impersonated_writes: 1000,
    dashboard_targets: 10_000,
    dashboard_rollouts: 100,
    dashboard_seconds: 10,
};

const SMOKE: Sizes = Sizes {
    name: "smoke",
    overhead_targets: 20,
    overhead_batch: 5,
    overhead_runs: 1,
    overhead_replicas: 1,
    transition_targets: 10,
    scale_targets: 50,
    scale_batch: "25%",
    concurrent_rollouts: 5,
    concurrent_targets: 10,
    mcp_clients: 8,
    mcp_requests: 400,
    mcp_starts: 10,
    fairness_seconds: 5,
    analysis_targets: 10,
    members_targets: 10,
    members_batch: 5,
    members_scale_targets: 30,
    heavy_deployments: 20,
    impersonated_writes: 50,
    dashboard_targets: 500,
    dashboard_rollouts: 10,
    dashboard_seconds: 3,
};

const LONG: Duration = Duration::from_secs(3600);

fn main() {
    if let Ok(spec) = std::env::var(fairness::FLOODER_ENV) {
        fairness::flooder(&spec);
        return;
    }
    let full = std::env::args().any(|a| a == "--full");
    let sizes = if full { FULL } else { SMOKE };
    let only: Option<Vec<String>> = std::env::args()
        .skip_while(|a| a != "--only")
        .nth(1)
        .map(|list| list.split(',').map(String::from).collect());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(run(sizes, only));
}

/// Results shared by the scenarios (a timeline for the plot, the rows for the table).
struct Report {
    rows: Vec<Row>,
    timeline: Vec<(String, Vec<(f64, f64)>)>,
}

async fn run(sizes: Sizes, only: Option<Vec<String>>) {
    let wanted = |scenario: &str| only.as_ref().is_none_or(|o| o.iter().any(|s| s == scenario));
    let client = testkit::client().await;
    testkit::fleet::ensure_crd(&client).await;
    let started = Instant::now();
    let speed = testkit::bench::MachineSpeed::measure();
    eprintln!("bench ({}): starting", sizes.name);
    let mut report = Report { rows: Vec::new(), timeline: Vec::new() };
    let mut namespaces = Vec::new();

    if wanted("overhead") {
        overhead(&client, &sizes, &mut report, &mut namespaces).await;
    }
    if wanted("transitions") {
        transitions(&client, &sizes, &mut report, &mut namespaces).await;
    }
    if wanted("analysis") {
        analysis::cost(&client, &sizes, &mut report, &mut namespaces).await;
    }
    if wanted("notifications") {
        notifications::cost(&client, &sizes, &mut report, &mut namespaces).await;
        notifications::platform_latency(&client, &mut report, &mut namespaces).await;
    }
    if wanted("members") {
        members::overhead(&client, &sizes, &mut report, &mut namespaces).await;
    }
    if wanted("mcp") {
        mcp(&client, &sizes, &mut report, &mut namespaces).await;
    }
    if wanted("fairness") {
        fairness::mcp_fairness(&client, &sizes, &mut report, &mut namespaces).await;
    }
    if wanted("memory") {
        memory::tenant_sized(&client, &sizes, &mut report, &mut namespaces).await;
    }
    if wanted("impersonation") {
        impersonation(&client, &sizes, &mut report, &mut namespaces).await;
    }
    if wanted("dashboard") {
        dashboard::views(&client, &sizes, &mut report, &mut namespaces).await;
    }
    // Last: 10,000 Deployments keep the control plane busy for minutes after the rollout ends, which
    // would be measured as the next scenario's latency.
    if wanted("scale") {
        scale(&client, &sizes, &mut report, &mut namespaces).await;
    }
    if wanted("members") {
        // The scale scenario's 10,000 Deployments gone first: they would be cached by this operator too.
        testkit::bench::cleanup_and_wait(&client, &mut namespaces).await;
        members::scale(&client, &sizes, &mut report, &mut namespaces).await;
    }
    testkit::bench::cleanup(&client, &namespaces).await;

    let table = testkit::bench::table(&report.rows);
    println!("\n{table}");
    let out = testkit::bench::results_dir(sizes.name == "full" && only.is_none());
    let plotted = plot(&report.timeline, &out.join("timeline.png"));
    let facts = testkit::bench::machine_table(&speed);
    let doc = format!(
        "# fleetroll benchmark ({} run)\n\nProduced by `make bench` (`cargo test --release --test bench -- --full`) in {:.0} s on \
         the local control plane (kwok nodes). Ratios are measured side by side in the same run.\n\n{table}\n{}\n\n## Machine\n\n{facts}",
        sizes.name,
        started.elapsed().as_secs_f64(),
        if plotted {
            "![batch timeline](timeline.png)\n\nBatch timeline: each bar is one batch, from its first target changed to its last target rolled out, for fleetroll and for the bare client on the same fleet."
        } else {
            ""
        },
    );
    std::fs::write(out.join("latest.md"), doc).unwrap();
    eprintln!(
        "bench ({}): done in {:.0}s; results in {}",
        sizes.name,
        started.elapsed().as_secs_f64(),
        out.display()
    );
}

fn rollout(name: &str, image: &str, selector: serde_json::Value, batch: serde_json::Value) -> FleetRollout {
    serde_json::from_value(json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": name},
        "spec": {"image": image, "targets": {"kind": "Deployment", "selector": {"matchLabels": selector}},
                 "strategy": {"batchSize": batch}, "health": {"timeout": "30m"}}
    }))
    .unwrap()
}

async fn wait_succeeded(api: &Api<FleetRollout>, name: &str) -> FleetRollout {
    testkit::wait_for(api, name, "the rollout to succeed", LONG, |f| {
        let phase = f.status.as_ref().map(|s| s.phase);
        assert!(
            !matches!(phase, Some(Phase::Failed | Phase::Aborted | Phase::RolledBack | Phase::Paused)),
            "{name}: {phase:?}"
        );
        phase == Some(Phase::Succeeded)
    })
    .await
}

/// Per batch: (first target changed, last target rolled out), seconds after `t0`.
fn batch_spans(obs: &Observer, batches: &[Vec<String>], image: &str, t0: Instant) -> Vec<(f64, f64)> {
    let s = obs.state.lock().unwrap();
    batches
        .iter()
        .map(|b| {
            let start = b.iter().filter_map(|k| s.get(k)?.changed_at.get(image)).min().copied().unwrap_or(t0);
            let end = b.iter().filter_map(|k| s.get(k)?.rolled_at.get(image)).max().copied().unwrap_or(t0);
            (start.duration_since(t0).as_secs_f64(), end.duration_since(t0).as_secs_f64())
        })
        .collect()
}

/// From one batch's last target rolled out to the next batch's first target changed, seconds.
fn transitions_of(spans: &[(f64, f64)]) -> Vec<f64> {
    spans.windows(2).map(|w| (w[1].0 - w[0].1).max(0.0)).collect()
}

/// What a write made as the rollout's creator costs over one made directly: the same server-side apply of
/// a Deployment's annotation, one at a time, alternately by the admin and by the admin impersonating a
/// ServiceAccount with `edit` (as the operator acts as a creator), so both see the same API server.
async fn impersonation(client: &Client, sizes: &Sizes, report: &mut Report, namespaces: &mut Vec<String>) {
    let n = sizes.impersonated_writes;
    eprintln!("impersonation: {n} writes each, direct and as a creator, interleaved");
    let ns = testkit::create_namespace(client, "bench-impersonation", &[]).await;
    namespaces.push(ns.clone());
    testkit::bench::fleet(client, &ns, 10, 0, 10).await;
    let creator = testkit::tenant::Tenant::create(
        client,
        &ns,
        "creator",
        &[testkit::tenant::Grant::cluster_role("edit")],
    )
    .await;
    let as_creator =
        testkit::tenant::client_from(&testkit::cluster().kubeconfig, Some(&creator.username)).await;
    let apply = |c: Client, i: usize| {
        let ns = ns.clone();
        async move {
            let api: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(c, &ns);
            let body = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                              "metadata": {"annotations": {"bench.fleetroll.dev/write": i.to_string()}}});
            let params = kube::api::PatchParams::apply("fleetroll-bench").force();
            let t0 = Instant::now();
            api.patch(&format!("t-{:05}", i % 10), &params, &kube::api::Patch::Apply(&body)).await.unwrap();
            t0.elapsed().as_secs_f64()
        }
    };
    let (mut direct, mut impersonated) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        direct.push(apply(client.clone(), i).await);
        impersonated.push(apply(as_creator.clone(), i).await);
    }
    direct.sort_by(f64::total_cmp);
    impersonated.sort_by(f64::total_cmp);
    let (d50, i50) =
        (testkit::bench::percentile(&direct, 50.0), testkit::bench::percentile(&impersonated, 50.0));
    report.rows.push(row(
        format!(
            "impersonation: one target patch as its creator / directly ({n} each, interleaved): p50 / p99"
        ),
        format!(
            "{} vs {}; {:+.2} ms per write at p50 ({:.2}x)",
            testkit::bench::p50_p99_ms(&impersonated),
            testkit::bench::p50_p99_ms(&direct),
            (i50 - d50) * 1000.0,
            i50 / d50
        ),
        "",
        None,
    ));
}

async fn overhead(client: &Client, sizes: &Sizes, report: &mut Report, namespaces: &mut Vec<String>) {
    let (n, b) = (sizes.overhead_targets, sizes.overhead_batch);
    eprintln!("overhead: {n} Deployments, batch {b}");
    let ns = testkit::create_namespace(client, "bench-overhead", &[]).await;
    namespaces.push(ns.clone());
    let obs = Observer::start(client, vec![ns.clone()]);
    testkit::bench::fleet(client, &ns, n, sizes.overhead_replicas, n).await;
    let mut keys: Vec<String> = (0..n).map(|i| format!("{ns}/t-{i:05}")).collect();
    keys.sort();
    obs.wait("the fleet to be available", LONG, |s| s.len() == n && s.values().all(|v| v.rolled_out)).await;
    let batches: Vec<Vec<String>> = keys.chunks(b).map(<[String]>::to_vec).collect();
    let op = Operator::start(&ns, &["--lease-duration", "15s"], &[]);
    let api: Api<FleetRollout> = Api::namespaced(client.clone(), &ns);

    let (mut fleetroll_times, mut bare_times) = (Vec::new(), Vec::new());
    let (mut transitions, mut bare_transitions) = (Vec::new(), Vec::new());
    let (mut writes_per_target, mut status_writes_per_batch, mut idle_writes) = (0.0, 0.0, 0.0);
    for r in 0..sizes.overhead_runs {
        // fleetroll.
        let image = format!("example.invalid/bench:fleetroll-{r}");
        let before = testkit::bench::apiserver_requests(client).await;
        let t0 = Instant::now();
        api.create(
            &PostParams::default(),
            &rollout(&format!("run-{r}"), &image, json!({"fleet": "bench"}), json!(b)),
        )
        .await
        .unwrap();
        wait_succeeded(&api, &format!("run-{r}")).await;
        fleetroll_times.push(t0.elapsed().as_secs_f64());
        let after = testkit::bench::apiserver_requests(client).await;
        obs.wait("every target on the new image", LONG, |s| testkit::bench::all_on(s, &keys, &image)).await;
        let spans = batch_spans(&obs, &batches, &image, t0);
        transitions.extend(transitions_of(&spans));
        // Server-side apply is counted under the verb APPLY (PUTs are the Deployment controller's own).
        let target_writes = testkit::bench::delta(&before, &after, "APPLY", "deployments", "")
            + testkit::bench::delta(&before, &after, "PATCH", "deployments", "");
        writes_per_target = target_writes / n as f64;
        status_writes_per_batch =
            testkit::bench::delta(&before, &after, "PUT", "fleetrollouts", "status") / batches.len() as f64;
        if r == 0 {
            report.timeline.push(("fleetroll".into(), spans));
        }
        // Idle: the rollout is done and nothing changes. The sleep is the measurement window itself.
        let idle_before = testkit::bench::apiserver_requests(client).await;
        tokio::time::sleep(Duration::from_secs(if sizes.name == "full" { 15 } else { 3 })).await;
        let idle_after = testkit::bench::apiserver_requests(client).await;
        idle_writes = testkit::bench::delta(&idle_before, &idle_after, "PUT", "fleetrollouts", "status")
            + testkit::bench::delta(&idle_before, &idle_after, "APPLY", "deployments", "")
            + testkit::bench::delta(&idle_before, &idle_after, "PATCH", "deployments", "")
            + testkit::bench::delta(&idle_before, &idle_after, "PATCH", "fleetrollouts", "");

        // The floor: the same patches, batch by batch, waiting for readiness the same way, no checkpoints.
        let image = format!("example.invalid/bench:bare-{r}");
        let t0 = Instant::now();
        for batch in &batches {
            testkit::bench::patch_images(client, batch, &image, 16).await;
            obs.wait("the batch to roll out", LONG, |s| testkit::bench::all_on(s, batch, &image)).await;
        }
        bare_times.push(t0.elapsed().as_secs_f64());
        let spans = batch_spans(&obs, &batches, &image, t0);
        bare_transitions.extend(transitions_of(&spans));
        if r == 0 {
            report.timeline.push(("bare client".into(), spans));
        }
    }
    // Exactly once: each run changed each target once (generation +1 per run, 2 runs per round).
    let expected = 1 + 2 * sizes.overhead_runs as i64;
    let state = obs.state.lock().unwrap().clone();
    let changed_twice = state.values().filter(|v| v.generation != expected).count();
    assert_eq!(changed_twice, 0, "targets whose generation is not {expected}");
    let max_in_flight = obs
        .max_in_flight
        .lock()
        .unwrap()
        .iter()
        .filter(|(i, _)| i.contains("fleetroll"))
        .map(|(_, n)| *n)
        .max()
        .unwrap_or(0);
    assert!(max_in_flight <= b, "{max_in_flight} targets in flight with batches of {b}");
    // The operator's own round trips of its status writes in this run: what a transition adds to the bare
    // client's gap at the least (it persists the next batch's intent before changing any target).
    let operator_metrics = op.metrics().await;
    let write = |q| {
        testkit::bench::histogram_quantile(
            &operator_metrics,
            "fleetroll_status_write_duration_seconds",
            r#"write="intent""#,
            q,
        )
    };
    let (write_p50, writes) = write(0.5).unwrap_or((f64::NAN, 0.0));
    let write_p99 = write(0.99).map_or(f64::NAN, |(v, _)| v);
    let (inside_p50, _) =
        testkit::bench::histogram_quantile(&operator_metrics, "fleetroll_batch_transition_seconds", "", 0.5)
            .unwrap_or((f64::NAN, 0.0));
    let mean =
        |name, label| testkit::bench::histogram_mean(&operator_metrics, name, label).unwrap_or(f64::NAN);
    let inside_mean = mean("fleetroll_batch_transition_seconds", "");
    let write_mean = mean("fleetroll_status_write_duration_seconds", r#"write="intent""#);
    drop(op);

    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (f, bare) = (median(&mut fleetroll_times), median(&mut bare_times));
    let ratio = f / bare;
    report.rows.push(row(
        format!(
            "overhead vs the floor: fleetroll / bare client ({n} Deployments, batch {b}, median of {})",
            sizes.overhead_runs
        ),
        format!("{ratio:.3} ({f:.1} s vs {bare:.1} s)"),
        "≤ 1.10",
        Some(ratio <= 1.10),
    ));
    // Judged against the floor measured beside it: the bare client's own gap between the same batches, plus
    // the one status write a transition must make (absolute times on these machines swing run to run).
    transitions.sort_by(f64::total_cmp);
    bare_transitions.sort_by(f64::total_cmp);
    let p = testkit::bench::percentile;
    let within = p(&transitions, 50.0) <= p(&bare_transitions, 50.0) + write_p50
        && p(&transitions, 99.0) <= p(&bare_transitions, 99.0);
    report.rows.push(row(
        format!("batch transition, {} transitions of {b}-target batches: p50 / p99", transitions.len()),
        format!(
            "{}; p50 {:+.1} ms over the bare client's",
            testkit::bench::p50_p99_ms(&transitions),
            (p(&transitions, 50.0) - p(&bare_transitions, 50.0)) * 1e3
        ),
        "p50 ≤ bare p50 + one status write; p99 ≤ bare p99",
        Some(within),
    ));
    report.rows.push(row(
        format!(
            "bare client's gap between the same batches ({} transitions): p50 / p99",
            bare_transitions.len()
        ),
        testkit::bench::p50_p99_ms(&bare_transitions),
        "",
        None,
    ));
    report.rows.push(row(
        format!(
            "one status write's round trip, the operator's own in the same run ({writes} writes): p50 / p99"
        ),
        format!("{:.1} ms / {:.1} ms", write_p50 * 1e3, write_p99 * 1e3),
        "",
        None,
    ));
    // Where a transition goes: inside the operator (from the reconcile that saw the batch settle to the next
    // batch's changes sent, the intent write included); the rest is the watch that tells it, the scheduler's
    // tick, and the first patch, as for the bare client.
    // The means are exact; the p50s are read from buckets a quarter apart, too coarse for the difference.
    report.rows.push(row(
        "where a transition goes: inside the operator, the status write included / the status write: \
         mean (p50)",
        format!(
            "{:.1} ms / {:.1} ms ({:.1} ms / {:.1} ms)",
            inside_mean * 1e3,
            write_mean * 1e3,
            inside_p50 * 1e3,
            write_p50 * 1e3
        ),
        "",
        None,
    ));
    report.rows.push(row(
        "API cost: Deployment writes per target",
        format!("{writes_per_target:.2}"),
        "1",
        Some((writes_per_target - 1.0).abs() < 0.01),
    ));
    report.rows.push(row(
        "API cost: status writes per batch",
        format!("{status_writes_per_batch:.2}"),
        "≤ 3",
        Some(status_writes_per_batch <= 3.0),
    ));
    report.rows.push(row(
        "API cost: writes while idle",
        format!("{idle_writes}"),
        "0",
        Some(idle_writes == 0.0),
    ));
    report.rows.push(row(
        "max targets in flight (watched)",
        format!("{max_in_flight}"),
        format!("≤ {b}"),
        Some(max_in_flight <= b),
    ));
}

async fn transitions(client: &Client, sizes: &Sizes, report: &mut Report, namespaces: &mut Vec<String>) {
    let n = sizes.transition_targets;
    eprintln!("transitions: {n} Deployments with 0 replicas, batch 1");
    let ns = testkit::create_namespace(client, "bench-transition", &[]).await;
    namespaces.push(ns.clone());
    let obs = Observer::start(client, vec![ns.clone()]);
    testkit::bench::fleet(client, &ns, n, 0, n).await;
    obs.wait("the fleet to be observed", LONG, |s| s.len() == n && s.values().all(|v| v.rolled_out)).await;
    let mut keys: Vec<String> = (0..n).map(|i| format!("{ns}/t-{i:05}")).collect();
    keys.sort();
    let _op = Operator::start(&ns, &[], &[]);
    let api: Api<FleetRollout> = Api::namespaced(client.clone(), &ns);
    let image = "example.invalid/bench:transitions";
    let t0 = Instant::now();
    api.create(&PostParams::default(), &rollout("steps", image, json!({"fleet": "bench"}), json!(1)))
        .await
        .unwrap();
    wait_succeeded(&api, "steps").await;
    obs.wait("every target on the new image", LONG, |s| testkit::bench::all_on(s, &keys, image)).await;
    let batches: Vec<Vec<String>> = keys.iter().map(|k| vec![k.clone()]).collect();
    let mut t = transitions_of(&batch_spans(&obs, &batches, image, t0));
    t.sort_by(f64::total_cmp);
    report.rows.push(row(
        format!("batch transition, {} transitions of 1-target batches (0 replicas): p50 / p99", t.len()),
        testkit::bench::p50_p99_ms(&t),
        "p99 ≤ 100 ms",
        Some(testkit::bench::percentile(&t, 99.0) <= 0.1),
    ));
}

async fn scale(client: &Client, sizes: &Sizes, report: &mut Report, namespaces: &mut Vec<String>) {
    let n = sizes.scale_targets;
    assert_eq!(n, sizes.concurrent_rollouts * sizes.concurrent_targets, "the groups cover the fleet");
    eprintln!("scale: {n} Deployments (0 replicas: the operator's cost, not kwok's pod churn)");
    let ns = testkit::create_namespace(client, "bench-scale", &[]).await;
    namespaces.push(ns.clone());
    testkit::bench::fleet(client, &ns, n, 0, sizes.concurrent_targets).await;
    let obs = Observer::start(client, vec![ns.clone()]);
    obs.wait("the fleet to be observed", LONG, |s| s.len() == n && s.values().all(|v| v.rolled_out)).await;
    let api: Api<FleetRollout> = Api::namespaced(client.clone(), &ns);

    // One rollout of the whole fleet, with a fresh operator so its memory is this scenario's alone.
    let op = Operator::start(&ns, &[], &[]);
    let t0 = Instant::now();
    api.create(
        &PostParams::default(),
        &rollout("all", "example.invalid/bench:scale", json!({"fleet": "bench"}), json!(sizes.scale_batch)),
    )
    .await
    .unwrap();
    let fr = wait_succeeded(&api, "all").await;
    let took = t0.elapsed().as_secs_f64();
    let status_bytes = serde_json::to_vec(&fr.status).unwrap().len();
    let (rss, cpu) = testkit::operator::process_usage(op.pid());
    drop(op);
    let mib = rss as f64 / (1024.0 * 1024.0);
    report.rows.push(row(
        format!("scale: one rollout of {n} Deployments (batch {})", sizes.scale_batch),
        format!("{took:.1} s, operator peak RSS {mib:.1} MiB, {cpu:.1} CPU s"),
        "RSS ≤ 100 MiB",
        Some(mib <= 100.0),
    ));
    report.rows.push(row(
        format!("scale: status size at {n} targets"),
        format!("{:.1} KiB", status_bytes as f64 / 1024.0),
        "≤ 64 KiB",
        Some(status_bytes <= 64 * 1024),
    ));

    // Many rollouts at once, each over its own group.
    let (r, t) = (sizes.concurrent_rollouts, sizes.concurrent_targets);
    let op = Operator::start(&ns, &[], &[]);
    let t0 = Instant::now();
    stream::iter(0..r)
        .map(|g| {
            let api = api.clone();
            async move {
                let fr = rollout(
                    &format!("group-{g}"),
                    "example.invalid/bench:groups",
                    json!({"group": format!("g{g}")}),
                    json!("25%"),
                );
                api.create(&PostParams::default(), &fr).await.unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    for g in 0..r {
        wait_succeeded(&api, &format!("group-{g}")).await;
    }
    let took = t0.elapsed().as_secs_f64();
    let (rss, cpu) = testkit::operator::process_usage(op.pid());
    let mib = rss as f64 / (1024.0 * 1024.0);
    report.rows.push(row(
        format!("scale: {r} concurrent rollouts of {t} targets"),
        format!("all {r} succeeded in {took:.1} s, operator peak RSS {mib:.1} MiB, {cpu:.1} CPU s"),
        "all complete",
        Some(true),
    ));
    let state = obs.state.lock().unwrap().clone();
    let twice = state.values().filter(|v| v.generation != 3).count();
    assert_eq!(twice, 0, "scale: targets not changed exactly once per rollout");
}

async fn mcp(client: &Client, sizes: &Sizes, report: &mut Report, namespaces: &mut Vec<String>) {
    eprintln!("mcp: {} clients, {} tasks/get", sizes.mcp_clients, sizes.mcp_requests);
    let ns = testkit::create_namespace(client, "bench-mcp", &[]).await;
    namespaces.push(ns.clone());
    let op = Operator::start(&ns, &[], &[]);
    op.ready().await;
    let url = op.mcp_url();
    let http = reqwest::Client::builder().pool_max_idle_per_host(256).build().unwrap();
    let post = move |method: &'static str, name: String, params: serde_json::Value| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let tasks = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
            let r = testkit::mcp::post(&http, &url, None, method, &name, params, tasks).await;
            let value: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
            assert!(value.get("result").is_some(), "{method}: {value}");
            value["result"].clone()
        }
    };

    // rollout_fleet until the task handle returns (paused, over no targets: only the MCP path is timed).
    let mut starts = Vec::new();
    let mut task_id = String::new();
    for i in 0..sizes.mcp_starts {
        let args = json!({"name": "rollout_fleet", "arguments": {"namespace": ns, "name": format!("r-{i}"), "image": "example.invalid/x:1",
            "paused": true, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"none": "none"}}}}});
        let t0 = Instant::now();
        let result = post("tools/call", "rollout_fleet".into(), args).await;
        starts.push(t0.elapsed().as_secs_f64());
        task_id = result["taskId"].as_str().unwrap().to_string();
    }
    starts.sort_by(f64::total_cmp);
    report.rows.push(row(
        format!("MCP rollout_fleet until the task handle returns ({} calls): p50 / p99", starts.len()),
        testkit::bench::p50_p99_ms(&starts),
        "",
        None,
    ));

    // tasks/get against a raw GET of the same FleetRollout, same concurrency, side by side.
    let name = task_id.split('/').nth(1).unwrap().to_string();
    let per_client = sizes.mcp_requests / sizes.mcp_clients;
    let get_task = {
        let (post, task_id) = (post.clone(), task_id.clone());
        move |_| {
            let f = post("tasks/get", task_id.clone(), json!({"taskId": task_id}));
            async move {
                let r = f.await;
                assert_eq!(r["resultType"], "complete");
            }
        }
    };
    let (tasks_latency, tasks_wall) = load(sizes.mcp_clients, per_client, get_task).await;
    let api: Api<FleetRollout> = Api::namespaced(client.clone(), &ns);
    let (raw_latency, raw_wall) = load(sizes.mcp_clients, per_client, move |_| {
        let (api, name) = (api.clone(), name.clone());
        async move {
            api.get(&name).await.unwrap();
        }
    })
    .await;
    let total = (per_client * sizes.mcp_clients) as f64;
    let (p99, r99) =
        (testkit::bench::percentile(&tasks_latency, 99.0), testkit::bench::percentile(&raw_latency, 99.0));
    report.rows.push(row(
        format!("MCP tasks/get, {} concurrent clients: p50 / p99, throughput", sizes.mcp_clients),
        format!("{}, {:.0} req/s", testkit::bench::p50_p99_ms(&tasks_latency), total / tasks_wall),
        "p99 ≤ 20 ms",
        Some(p99 <= 0.020),
    ));
    report.rows.push(row(
        "raw GET of the same FleetRollout from the API server, same concurrency",
        format!("{}, {:.0} req/s", testkit::bench::p50_p99_ms(&raw_latency), total / raw_wall),
        "",
        None,
    ));
    report.rows.push(row(
        "tasks/get p99 / raw GET p99",
        format!("{:.2}", p99 / r99),
        "≤ 1.5",
        Some(p99 / r99 <= 1.5),
    ));
}

/// Runs `per_client` calls on each of `clients` concurrent loops; sorted latencies (s) and wall time (s).
async fn load<F, Fut>(clients: usize, per_client: usize, call: F) -> (Vec<f64>, f64)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let t0 = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let call = call.clone();
            tokio::spawn(async move {
                let mut samples = Vec::with_capacity(per_client);
                for i in 0..per_client {
                    let t = Instant::now();
                    call(c * per_client + i).await;
                    samples.push(t.elapsed().as_secs_f64());
                }
                samples
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.unwrap());
    }
    let wall = t0.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    (all, wall)
}

/// The batch timeline as a PNG; false when it could not be drawn.
fn plot(series: &[(String, Vec<(f64, f64)>)], path: &std::path::Path) -> bool {
    use plotters::prelude::*;
    let font = ["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/dejavu/DejaVuSans.ttf"]
        .iter()
        .find_map(|p| std::fs::read(p).ok());
    let Some(font) = font else { return false };
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    if plotters::style::register_font("sans-serif", FontStyle::Normal, font).is_err() {
        return false;
    }
    let max_t = series.iter().flat_map(|(_, s)| s.iter().map(|(_, e)| *e)).fold(1.0, f64::max);
    let rows: usize = series.iter().map(|(_, s)| s.len()).sum::<usize>() + series.len();
    let root = BitMapBackend::new(path, (1200, 120 + 14 * rows as u32)).into_drawing_area();
    if root.fill(&WHITE).is_err() {
        return false;
    }
    let Ok(mut chart) = ChartBuilder::on(&root)
        .caption("batch timeline: first target changed → last target rolled out", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(120)
        .build_cartesian_2d(0.0..max_t * 1.02, 0.0..rows as f64)
    else {
        return false;
    };
    let labels: Vec<(f64, String)> = {
        let mut y = 0.0;
        series
            .iter()
            .flat_map(|(name, s)| {
                let out: Vec<(f64, String)> =
                    (0..s.len()).map(|i| (y + i as f64 + 0.5, format!("{name} #{}", i + 1))).collect();
                y += s.len() as f64 + 1.0;
                out
            })
            .collect()
    };
    let label_of: HashMap<i64, String> = labels.iter().map(|(y, l)| ((y * 10.0) as i64, l.clone())).collect();
    let _ = chart
        .configure_mesh()
        .x_desc("seconds")
        .y_labels(rows)
        .y_label_formatter(&|y| label_of.get(&((y * 10.0) as i64)).cloned().unwrap_or_default())
        .draw();
    let colors = [RGBColor(31, 119, 180), RGBColor(255, 127, 14)];
    let mut y = 0.0;
    for (i, (name, spans)) in series.iter().enumerate() {
        let color = colors[i % colors.len()];
        let bars = spans.iter().enumerate().map(|(j, (s, e))| {
            let top = y + j as f64 + 0.15;
            Rectangle::new([(*s, top), (*e, top + 0.7)], color.filled())
        });
        if let Ok(a) = chart.draw_series(bars) {
            a.label(name.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
        }
        y += spans.len() as f64 + 1.0;
    }
    let _ = chart.configure_series_labels().background_style(WHITE).border_style(BLACK).draw();
    root.present().is_ok()
}
