//! The cost of notifications per batch: the same rollout without a subscription, with a webhook that
//! answers, and with one that never answers (every delivery hangs until its 10 s timeout), side by side.
//! Then a platform's FleetRolloutPolicy subscription's latency, idle and beside a tenant's hanging ones.
//! Reported: status writes per batch (acknowledgements included) and the batch transition (last target of
//! a batch rolled out → first target of the next changed), which delivery must not lengthen.

use std::time::Instant;

use fleetroll::api::{FleetRollout, FleetRolloutPolicy, NOTIFY_SECRET_LABEL};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client, api::PostParams};
use serde_json::json;

use crate::{LONG, Report, Sizes, batch_spans, row, transitions_of, wait_succeeded};
use testkit::{
    bench::Observer,
    operator::{Operator, metric},
    receiver::{Mode, Receiver},
};

const BATCH: usize = 5;

/// How a run is told.
#[derive(Clone, Copy, PartialEq)]
enum Sink {
    None,
    Answering,
    Hanging,
}

/// What one run measured: transitions (seconds, sorted), status writes and acknowledgement writes per batch.
struct Measured {
    transitions: Vec<f64>,
    writes: f64,
    acks: f64,
}

async fn run(client: &Client, ns: &str, n: usize, receiver: &Receiver, sink: Sink) -> Measured {
    let obs = Observer::start(client, vec![ns.to_string()]);
    obs.wait("the fleet to be observed", LONG, |s| s.len() == n && s.values().all(|v| v.rolled_out)).await;
    let mut keys: Vec<String> = (0..n).map(|i| format!("{ns}/t-{i:05}")).collect();
    keys.sort();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "hook", "labels": {NOTIFY_SECRET_LABEL: "true"}},
        "stringData": {"url": receiver.url(ns), "hmacKey": "bench"},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), ns).create(&PostParams::default(), &secret).await.unwrap();
    receiver.set_mode(if sink == Sink::Hanging { Mode::Hang } else { Mode::Ok });
    let op = Operator::start(ns, &["--notify-allow=*=127.0.0.0/8"], &[]);
    let api: Api<FleetRollout> = Api::namespaced(client.clone(), ns);
    let image = "example.invalid/bench:notifications";
    let mut spec = json!({
        "image": image, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "bench"}}},
        "strategy": {"batchSize": BATCH}, "health": {"timeout": "30m"},
    });
    if sink != Sink::None {
        spec["notify"] = json!([{"name": "hook", "sink": "Webhook", "secretRef": {"name": "hook"}}]);
    }
    let fr: FleetRollout = serde_json::from_value(json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": "told"}, "spec": spec,
    }))
    .unwrap();
    let t0 = Instant::now();
    api.create(&PostParams::default(), &fr).await.unwrap();
    wait_succeeded(&api, "told").await;
    if sink == Sink::Answering {
        let empty = |f: &FleetRollout| {
            f.status.as_ref().and_then(|s| s.notifications.as_ref()).is_none_or(|o| o.pending.is_empty())
        };
        testkit::wait_for(&api, "told", "every notification delivered", LONG, empty).await;
    }
    obs.wait("every target on the new image", LONG, |s| testkit::bench::all_on(s, &keys, image)).await;
    let batches: Vec<Vec<String>> = keys.chunks(BATCH).map(<[String]>::to_vec).collect();
    let mut transitions = transitions_of(&batch_spans(&obs, &batches, image, t0));
    transitions.sort_by(f64::total_cmp);
    let text = op.metrics().await;
    let per_batch = |name: &str| metric(&text, name).unwrap_or(0.0) / batches.len() as f64;
    let measured = Measured {
        transitions,
        writes: per_batch("fleetroll_status_writes_total"),
        acks: per_batch("fleetroll_notification_ack_writes_total"),
    };
    receiver.set_mode(Mode::Ok);
    measured
}

pub async fn cost(client: &Client, sizes: &Sizes, report: &mut Report, namespaces: &mut Vec<String>) {
    let n = sizes.analysis_targets;
    eprintln!(
        "notifications: {n} Deployments with 0 replicas, batch {BATCH}: no sink, an answering and a hanging webhook"
    );
    let receiver = Receiver::start();
    let mut runs = Vec::new();
    for (label, sink) in [("none", Sink::None), ("answering", Sink::Answering), ("hanging", Sink::Hanging)] {
        let ns = testkit::create_namespace(client, &format!("bench-notify-{label}"), &[]).await;
        namespaces.push(ns.clone());
        testkit::bench::fleet(client, &ns, n, 0, n).await;
        runs.push(run(client, &ns, n, &receiver, sink).await);
    }
    let [none, answering, hanging] = &runs[..] else { unreachable!("three runs") };
    let p50 = |m: &Measured| testkit::bench::percentile(&m.transitions, 50.0) * 1000.0;
    report.rows.push(row(
        format!(
            "notifications: status writes per batch of {BATCH}, no sink / a webhook (acknowledgements of it)"
        ),
        format!("{:.2} / {:.2} ({:.2})", none.writes, answering.writes, answering.acks),
        "",
        None,
    ));
    report.rows.push(row(
        format!(
            "notifications: batch transition, no sink / answering / hanging webhook ({} transitions): p50 / p99",
            none.transitions.len()
        ),
        format!(
            "{} / {} / {}; hanging − none p50 {:+.1} ms",
            testkit::bench::p50_p99_ms(&none.transitions),
            testkit::bench::p50_p99_ms(&answering.transitions),
            testkit::bench::p50_p99_ms(&hanging.transitions),
            p50(hanging) - p50(none),
        ),
        "",
        None,
    ));
}

/// How long a platform's FleetRolloutPolicy subscription waits to hear of a tenant's rollouts (creation →
/// first delivery), idle and while the tenant's own 6 × 8 subscriptions hang: the platform's lanes are a
/// pool of their own, so the goal is within one send timeout (10 s) of the idle run.
pub async fn platform_latency(client: &Client, report: &mut Report, namespaces: &mut Vec<String>) {
    const ROLLOUTS: usize = 6;
    eprintln!(
        "notifications: a platform's subscription to {ROLLOUTS} rollouts, idle and beside 48 hanging ones"
    );
    let (platform, hung) = (Receiver::start(), Receiver::start());
    hung.set_mode(Mode::Hang);
    let mut runs = Vec::new();
    for (label, hanging) in [("idle", 0), ("hanging", fleetroll::api::SUBSCRIPTIONS_MAX)] {
        let ns = testkit::create_namespace(client, &format!("bench-audit-{label}"), &[]).await;
        let fleet_ns = testkit::create_namespace(client, &format!("bench-audit-fleet-{label}"), &[]).await;
        namespaces.extend([ns.clone(), fleet_ns.clone()]);
        let sink = |ns: &str, name: &str, url: String| {
            let secret: Secret = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {NOTIFY_SECRET_LABEL: "true"}}, "stringData": {"url": url},
            }))
            .unwrap();
            let api = Api::<Secret>::namespaced(client.clone(), ns);
            async move { api.create(&PostParams::default(), &secret).await.unwrap() }
        };
        sink(&fleet_ns, "audit", platform.url(&ns)).await;
        let edit = [testkit::tenant::Grant::cluster_role("edit")];
        let agent = testkit::tenant::Tenant::create(client, &ns, "agent", &edit).await;
        let policy: FleetRolloutPolicy = serde_json::from_value(json!({
            "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRolloutPolicy", "metadata": {"name": ns},
            "spec": {"subjects": {"serviceAccounts": [{"namespace": ns, "name": "agent"}]},
                     "notify": [{"name": "audit", "sink": "Webhook", "secretRef": {"name": "audit"}}]},
        }))
        .unwrap();
        let policies: Api<FleetRolloutPolicy> = Api::all(client.clone());
        policies.create(&PostParams::default(), &policy).await.unwrap();
        let mut subscriptions = Vec::new();
        for s in 0..hanging {
            sink(&ns, &format!("hang-{s}"), hung.url(&format!("{ns}/s{s}"))).await;
            subscriptions.push(json!({"name": format!("s{s}"), "sink": "Webhook", "secretRef": {"name": format!("hang-{s}")}}));
        }
        let op = Operator::start(&ns, &["--notify-allow=*=127.0.0.0/8", "--fleet-namespace", &fleet_ns], &[]);
        op.ready().await;
        let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(client.clone(), &ns);
        let rollouts: Api<FleetRollout> = Api::namespaced(agent.client.clone(), &ns);
        let mut created = Vec::new();
        for r in 0..ROLLOUTS {
            let name = format!("r{r}");
            let d = testkit::fleet::deployment(
                &format!("web-{r}"),
                testkit::fleet::READY_IMAGE,
                &[("fleet", &name)],
            );
            deployments.create(&PostParams::default(), &d).await.unwrap();
            let fr: FleetRollout = serde_json::from_value(json!({
                "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": name},
                "spec": {"image": testkit::fleet::NEXT_IMAGE, "notify": subscriptions,
                         "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": name}}}},
            }))
            .unwrap();
            created.push((name, Instant::now()));
            rollouts.create(&PostParams::default(), &fr).await.unwrap();
        }
        let heard = |requests: &[testkit::receiver::Request], name: &str| {
            let about = |r: &&testkit::receiver::Request| {
                r.path.starts_with(&format!("/{ns}"))
                    && r.json.as_ref().is_some_and(|j| j["rollout"]["name"] == name)
            };
            requests.iter().find(about).map(|r| r.at)
        };
        let requests =
            platform.wait_for(LONG, |rs| created.iter().all(|(name, _)| heard(rs, name).is_some())).await;
        let mut waits: Vec<f64> = created
            .iter()
            .filter_map(|(name, at)| heard(&requests, name).map(|h| h.duration_since(*at).as_secs_f64()))
            .collect();
        waits.sort_by(f64::total_cmp);
        runs.push(waits);
        let _gone = policies.delete(&ns, &Default::default()).await;
    }
    hung.set_mode(Mode::Ok);
    let [idle, hanging] = &runs[..] else { unreachable!("two runs") };
    let max = |w: &[f64]| w.last().copied().unwrap_or(f64::INFINITY);
    let p50 = |w: &[f64]| testkit::bench::percentile(w, 50.0);
    report.rows.push(row(
        format!(
            "notifications: a platform's subscription hears of {ROLLOUTS} rollouts (creation → first delivery), idle / beside the tenant's 48 hanging subscriptions: p50 / max"
        ),
        format!("{:.2} s / {:.2} s; {:.2} s / {:.2} s", p50(idle), max(idle), p50(hanging), max(hanging)),
        "hanging max ≤ idle max + 10 s (one send timeout)",
        Some(max(hanging) <= max(idle) + 10.0),
    ));
}
