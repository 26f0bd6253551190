//! Rollouts as the operator leaves them, made without one: a FleetRollout with a frozen plan (stored as the
//! operator stores plans, inline while small and in ConfigMaps beyond) and a status written on top. The
//! dashboard's tests and bench read them exactly as they read an operator's, at sizes (10,000 targets, 100
//! rollouts) no test could wait for an operator to reach.

use fleetroll::{
    api::{FleetRollout, PlannedTarget, RevisionInputs},
    core::plan::{Plan, short_hash},
    edge::plans::PlanStore,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};

/// A rollout no operator serves, with a frozen plan of `batches` (stored as the operator stores plans:
/// inline while small, in ConfigMaps beyond) and a status written as `status` says on top of it: the
/// dashboard reads both exactly as it reads an operator's.
pub async fn frozen(
    client: &Client,
    ns: &str,
    name: &str,
    batches: Vec<Vec<PlannedTarget>>,
    status: Value,
) -> FleetRollout {
    let api: Api<FleetRollout> = Api::namespaced(client.clone(), ns);
    let fr: FleetRollout = serde_json::from_value(json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": name},
        "spec": {"image": crate::fleet::NEXT_IMAGE, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
                 "strategy": {"batchSize": batches.first().map_or(1, Vec::len)}},
    }))
    .unwrap();
    let fr = api.create(&Default::default(), &fr).await.unwrap();
    let spec_hash = "dashboard-fixture";
    let plan = Plan { hash: short_hash(&(spec_hash, &batches)), batches };
    let plan_ref = PlanStore::default().store(client, &fr, &plan).await.unwrap().unwrap();
    let mut written = json!({
        "phase": "Progressing",
        "revision": {"number": 1, "specHash": spec_hash, "inputs": RevisionInputs::of(&fr.spec),
                     "startedAt": k8s_openapi::jiff::Timestamp::now().to_string()},
        "plan": plan_ref,
    });
    json_merge(&mut written, status);
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(json!({"status": written}))).await.unwrap()
}

/// `from` merged into `into`, as a JSON merge patch would (objects key by key, anything else replaced).
pub fn json_merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                json_merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

/// The namespace for a fixture's planned targets, which are never made. It is not the rollout's own, which
/// is where the dashboard watches the targets of a rollout without a namespaceSelector: their cells then
/// follow the status alone, as a member cluster's do, rather than show as deleted since planning (skipped).
pub fn unwatched(ns: &str) -> String {
    format!("{ns}-targets")
}

/// `n` planned targets `<ns>/<prefix>-NNNNN`, each with `previous` as its image before.
pub fn planned(ns: &str, prefix: &str, n: usize, previous: &str) -> Vec<PlannedTarget> {
    (0..n)
        .map(|i| PlannedTarget {
            cluster: String::new(),
            namespace: ns.into(),
            name: format!("{prefix}-{i:05}"),
            previous_image: previous.into(),
        })
        .collect()
}
