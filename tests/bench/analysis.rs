//! The cost of metric analysis per batch: the same rollout with and without an analysis of two metrics (one
//! query for the batch, one per target), side by side, against a real Prometheus scraping a test exporter.
//! Reported: queries per batch (Prometheus' own count of /api/v1/query requests) and the batch transition
//! (last target of a batch rolled out → first target of the next changed), which now holds a measurement.

use std::time::Instant;

use fleetroll::api::FleetRollout;
use kube::{Api, Client, api::PostParams};
use serde_json::{Value, json};

use crate::{LONG, Report, Sizes, batch_spans, row, transitions_of, wait_succeeded};
use testkit::{
    bench::Observer,
    operator::{Operator, metric},
    prometheus::{Exporter, Options, Prometheus, REQUESTS, error_ratio_query},
};

const BATCH: usize = 5;

fn analysis() -> Value {
    json!({"metrics": [
        {"name": "error-rate", "query": error_ratio_query(), "thresholdRange": {"max": 0.01}},
        {"name": "traffic", "scope": "Target", "thresholdRange": {"min": 1},
         "query": format!("sum(rate({REQUESTS}{{namespace=\"{{{{namespace}}}}\", deployment=\"{{{{name}}}}\"}}[5s]))")},
    ]})
}

/// One rollout of `n` 0-replica Deployments in batches of [`BATCH`], with `analysis` or without; returns
/// the transitions (seconds, sorted) and the number of batches.
async fn run(client: &Client, ns: &str, n: usize, prometheus: &Prometheus, with: bool) -> (Vec<f64>, usize) {
    let obs = Observer::start(client, vec![ns.to_string()]);
    obs.wait("the fleet to be observed", LONG, |s| s.len() == n && s.values().all(|v| v.rolled_out)).await;
    let mut keys: Vec<String> = (0..n).map(|i| format!("{ns}/t-{i:05}")).collect();
    keys.sort();
    let address = format!("--analysis-prometheus-address={}", prometheus.address());
    let _op = Operator::start(ns, &[&address], &[]);
    let api: Api<FleetRollout> = Api::namespaced(client.clone(), ns);
    let image = "example.invalid/bench:analysis";
    let mut spec = json!({
        "image": image, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "bench"}}},
        "strategy": {"batchSize": BATCH}, "health": {"timeout": "30m"},
    });
    if with {
        spec["analysis"] = analysis();
    }
    let fr: FleetRollout = serde_json::from_value(json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": "analysed"}, "spec": spec,
    }))
    .unwrap();
    let t0 = Instant::now();
    api.create(&PostParams::default(), &fr).await.unwrap();
    wait_succeeded(&api, "analysed").await;
    obs.wait("every target on the new image", LONG, |s| testkit::bench::all_on(s, &keys, image)).await;
    let batches: Vec<Vec<String>> = keys.chunks(BATCH).map(<[String]>::to_vec).collect();
    let mut t = transitions_of(&batch_spans(&obs, &batches, image, t0));
    t.sort_by(f64::total_cmp);
    (t, batches.len())
}

/// Prometheus' count of instant queries answered so far.
async fn queries(prometheus: &Prometheus) -> f64 {
    let text =
        prometheus.request(reqwest::Method::GET, "/metrics").send().await.unwrap().text().await.unwrap();
    metric(&text, "prometheus_http_requests_total{code=\"200\",handler=\"/api/v1/query\"}").unwrap_or(0.0)
}

pub async fn cost(client: &Client, sizes: &Sizes, report: &mut Report, namespaces: &mut Vec<String>) {
    let n = sizes.analysis_targets;
    eprintln!("analysis: {n} Deployments with 0 replicas, batch {BATCH}, with and without analysis");
    let exporter = Exporter::start();
    let (plain, analysed) = (
        testkit::create_namespace(client, "bench-plain", &[]).await,
        testkit::create_namespace(client, "bench-analysis", &[]).await,
    );
    namespaces.extend([plain.clone(), analysed.clone()]);
    for i in 0..n {
        exporter.set_rate(&analysed, &format!("t-{i:05}"), 50.0, 0.0);
    }
    let prometheus = Prometheus::start(&exporter, Options::default()).await;
    prometheus.wait_for_series(&format!("min(count_over_time({REQUESTS}[1h])) >= 7")).await;
    testkit::bench::fleet(client, &plain, n, 0, n).await;
    testkit::bench::fleet(client, &analysed, n, 0, n).await;

    let (without, _) = run(client, &plain, n, &prometheus, false).await;
    let before = queries(&prometheus).await;
    let (with, batches) = run(client, &analysed, n, &prometheus, true).await;
    let per_batch = (queries(&prometheus).await - before) / batches as f64;
    report.rows.push(row(
        format!(
            "analysis: queries per batch of {BATCH} (a Batch metric and a Target metric, 1 measurement each)"
        ),
        format!("{per_batch:.1}"),
        format!("{}", 1 + BATCH),
        Some((per_batch - (1 + BATCH) as f64).abs() < 0.01),
    ));
    report.rows.push(row(
        format!("analysis: batch transition with analysis ({} transitions): p50 / p99", with.len()),
        testkit::bench::p50_p99_ms(&with),
        "",
        None,
    ));
    let added = testkit::bench::percentile(&with, 50.0) - testkit::bench::percentile(&without, 50.0);
    report.rows.push(row(
        format!("analysis: the same rollout without analysis ({} transitions): p50 / p99", without.len()),
        format!("{}; added p50 {:+.1} ms", testkit::bench::p50_p99_ms(&without), added * 1000.0),
        "",
        None,
    ));
}
