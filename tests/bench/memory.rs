//! The operator's memory against what tenants write into their objects: its peak RSS through a small
//! rollout on a clean cluster, then again (a fresh process, so its first list includes them) with
//! Deployments of near-maximal size in another tenant's namespace (images, labels and annotations as large
//! as the API server takes), side by side.

use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api, Client,
    api::{PostParams, ResourceExt},
};
use serde_json::{Value, json};

use crate::{Report, Sizes, rollout, row, wait_succeeded};
use fleetroll::api::FleetRollout;
use testkit::operator::Operator;

/// A Deployment as large as a tenant can make one: a 900 KB image reference, 1,000 labels of the longest
/// value, and 200 KB of annotations (about 1.2 MB in all; etcd takes 1.5 MiB). Paused, with no replicas:
/// it costs the cluster nothing but what it weighs.
fn heavy(name: &str) -> Deployment {
    let labels: serde_json::Map<String, Value> =
        (0..1000).map(|i| (format!("tenant.example/label-{i:04}"), json!("v".repeat(63)))).collect();
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels, "annotations": {"tenant.example/notes": "n".repeat(200_000)}},
        "spec": {"replicas": 0, "paused": true, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "web", "image": format!("registry.example/{}:v1", "x".repeat(900_000))}]}}},
    }))
    .unwrap()
}

/// Peak RSS (MiB) of a fresh operator through a rollout of `fleet`'s small Deployments.
async fn peak_through_a_rollout(client: &Client, ns: &str, name: &str) -> f64 {
    let op = Operator::start(ns, &[], &[]);
    let api: Api<FleetRollout> = Api::namespaced(client.clone(), ns);
    api.create(
        &PostParams::default(),
        &rollout(name, "example.invalid/bench:memory", json!({"fleet": "bench"}), json!("50%")),
    )
    .await
    .unwrap();
    wait_succeeded(&api, name).await;
    let (rss, _) = testkit::operator::process_usage(op.pid());
    rss as f64 / (1024.0 * 1024.0)
}

pub async fn tenant_sized(client: &Client, sizes: &Sizes, report: &mut Report, namespaces: &mut Vec<String>) {
    let n = sizes.heavy_deployments;
    eprintln!("memory: peak RSS clean, then beside {n} Deployments of near-maximal size");
    let ns = testkit::create_namespace(client, "bench-memory", &[]).await;
    namespaces.push(ns.clone());
    testkit::bench::fleet(client, &ns, 10, 0, 10).await;
    let clean = peak_through_a_rollout(client, &ns, "clean").await;

    let tenant = testkit::create_namespace(client, "bench-heavy", &[]).await;
    namespaces.push(tenant.clone());
    let api: Api<Deployment> = Api::namespaced(client.clone(), &tenant);
    stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &heavy(&format!("heavy-{i:03}")))
                    .await
                    .map(|d| d.name_any())
            }
        })
        .buffer_unordered(4)
        .for_each(|created| async move {
            created.unwrap();
        })
        .await;
    let heavy_mib = peak_through_a_rollout(client, &ns, "beside-heavy").await;
    let extra = heavy_mib - clean;
    report.rows.push(row(
        format!(
            "memory: operator peak RSS through a rollout, clean / beside {n} tenant Deployments of ~1.2 MB"
        ),
        format!("{clean:.1} MiB / {heavy_mib:.1} MiB (+{extra:.1} MiB)"),
        "+≤ 10 MiB",
        Some(extra <= 10.0),
    ));
    testkit::bench::cleanup_and_wait(client, namespaces).await;
}
