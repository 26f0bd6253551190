//! Attacks on the operator's availability by tenants who never touch fleetroll's own objects: objects as
//! large as the API server takes, and edits of their own workloads that name another tenant's rollout.

use std::time::Instant;

use k8s_openapi::api::apps::v1::Deployment;
use testkit::{
    fleet::{NEXT_IMAGE, phase},
    operator::{metric, process_usage},
};

use super::*;

/// A Deployment as large as a tenant can make one (about 1.2 MB: a 900 KB image reference, 1,000 labels,
/// 200 KB of annotations), paused with no replicas: it costs the cluster nothing but what it weighs.
fn heavy(name: &str) -> Value {
    let labels: serde_json::Map<String, Value> =
        (0..1000).map(|i| (format!("tenant.example/label-{i:04}"), json!("v".repeat(63)))).collect();
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels, "annotations": {"tenant.example/notes": "n".repeat(200_000)}},
        "spec": {"replicas": 0, "paused": true, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "web", "image": format!("registry.example/{}:v1", "x".repeat(900_000))}]}}},
    })
}

/// Peak RSS (MiB) of a fresh operator for `fleet` through a rollout of its one Deployment.
async fn peak_through_a_rollout(fleet: &Fleet, name: &str) -> f64 {
    let op = Operator::start(&fleet.ns, &[], &[]);
    let spec = json!({"image": format!("{NEXT_IMAGE}-{name}"), "targets": {"kind": "Deployment",
        "selector": {"matchLabels": {"fleet": "web"}}}});
    fleet.rollout(name, spec).await;
    fleet
        .wait_rollout(name, "the rollout to finish", Duration::from_secs(120), |f| phase(f).is_terminal())
        .await;
    process_usage(op.pid()).0 as f64 / (1024.0 * 1024.0)
}

/// A namespace of one Deployment, and the peak RSS (MiB) of an operator through a rollout of it while the
/// cluster is clean.
async fn measured_fleet(env: &'static Env, prefix: &str) -> (Fleet, f64) {
    let ns = env.scratch_namespace(prefix, &[]).await;
    let fleet = Fleet { client: env.admin.clone(), ns: ns.clone(), tenants: vec![] };
    fleet.deployments(&ns, 1, READY_IMAGE).await;
    let clean = peak_through_a_rollout(&fleet, "clean").await;
    (fleet, clean)
}

pub(super) async fn tenant_deployments_of_maximal_size(env: &'static Env) -> Row {
    const HEAVY: usize = 20;
    let (fleet, clean) = measured_fleet(env, "sec-weight").await;
    let tenant = env.scratch_namespace("sec-weight-tenant", &[]).await;
    let creator = [Grant::rules(vec![rule("apps", &["deployments"], &["create"])])];
    let attacker = Tenant::create(&env.admin, &tenant, "maker", &creator).await;
    let mut created = 0;
    for i in 0..HEAVY {
        let path = file(&format!("{tenant}-heavy-{i}"), &heavy(&format!("heavy-{i:02}")));
        created += usize::from(attacker.kubectl(&["create", "-n", &tenant, "-f", &path]).await.code == 0);
    }
    let beside = peak_through_a_rollout(&fleet, "beside").await;
    let extra = beside - clean;
    Row {
        attack: format!(
            "{HEAVY} Deployments of ~1.2 MB each (image, labels, annotations), then an operator restart"
        ),
        who: format!("{} (create deployments in its namespace, nothing else)", short_user(&attacker)),
        expected: "the operator's peak memory through a rollout grows by at most 10 MiB".into(),
        outcome: format!(
            "{created} created; peak RSS {clean:.1} MiB clean, {beside:.1} MiB beside them (+{extra:.1})"
        ),
        contained: created == HEAVY && extra <= 10.0,
    }
}

pub(super) async fn another_tenants_workload_wakes_a_rollout(env: &'static Env) -> Row {
    const EDITS: usize = 60;
    let ns = env.scratch_namespace("sec-wake", &[]).await;
    let fleet = Fleet { client: env.admin.clone(), ns: ns.clone(), tenants: vec![] };
    fleet.deployments(&ns, 1, READY_IMAGE).await;
    let op = Operator::start(&ns, &[], &[]);
    // The victim's rollout waits for an approval: nothing of its own wakes it meanwhile.
    let spec = json!({"image": NEXT_IMAGE, "strategy": {"approval": "FirstBatch"},
        "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}}});
    fleet.rollout("victim", spec).await;
    fleet
        .wait_rollout("victim", "approval", Duration::from_secs(60), |f| {
            phase(f) == Phase::WaitingForApproval
        })
        .await;
    // Another tenant names it from its own Deployment and edits that again and again.
    let tenant = env.scratch_namespace("sec-wake-tenant", &[]).await;
    let attacker = Tenant::create(&env.admin, &tenant, "editor", &[Grant::cluster_role("edit")]).await;
    let d: Deployment = testkit::fleet::deployment("decoy", READY_IMAGE, &[]);
    Api::<Deployment>::namespaced(attacker.client.clone(), &tenant)
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
    let reconciles = || async { metric(&op.metrics().await, "fleetroll_reconciles_total").unwrap_or(0.0) };
    let before = reconciles().await;
    let started = Instant::now();
    let api = Api::<Deployment>::namespaced(attacker.client.clone(), &tenant);
    for i in 0..EDITS {
        let edit = json!({"metadata": {"annotations": {"fleetroll.dev/rollout": format!("{ns}/victim"), "edit": i.to_string()}}});
        api.patch("decoy", &PatchParams::default(), &Patch::Merge(edit)).await.unwrap();
    }
    // The operator has seen every edit once it has seen a later change of a Deployment: a rollout whose
    // target is created after the edits succeeds only once its watch delivered that target's readiness.
    let marker = testkit::fleet::deployment("marker-0", READY_IMAGE, &[("fleet", "marker")]);
    Api::<Deployment>::namespaced(env.admin.clone(), &ns)
        .create(&PostParams::default(), &marker)
        .await
        .unwrap();
    fleet
        .rollout(
            "marker",
            json!({"image": NEXT_IMAGE,
        "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "marker"}}}}),
        )
        .await;
    fleet
        .wait_rollout("marker", "the marker to succeed", Duration::from_secs(120), |f| {
            phase(f) == Phase::Succeeded
        })
        .await;
    let during = reconciles().await - before;
    Row {
        attack: format!("{EDITS} edits of its own Deployment, annotated with another tenant's rollout"),
        who: format!("{} (edit in its own namespace)", short_user(&attacker)),
        expected: "no reconcile of the other tenant's rollout".into(),
        outcome: format!(
            "{during:.0} reconciles in {:.1} s, those of a marker rollout created after the edits",
            started.elapsed().as_secs_f64()
        ),
        // The marker rollout's own reconciles (its plan, its batch, the target's readiness: about ten);
        // before, each edit cost about two reconciles of the victim.
        contained: during <= 20.0,
    }
}

/// FleetRollouts as heavy as a namespace editor can make them: each selector as large as the API server
/// takes (refused: the CRD bounds selectors), and rollouts carrying a megabyte of finalizers of their
/// writer's (taken; the caches keep only the operator's own).
pub(super) async fn tenant_rollouts_of_maximal_size(env: &'static Env) -> Row {
    const HEAVY: usize = 8;
    let (fleet, clean) = measured_fleet(env, "sec-rweight").await;
    let tenant = env.scratch_namespace("sec-rweight-tenant", &[]).await;
    let attacker = Tenant::create(&env.admin, &tenant, "editor", &[Grant::cluster_role("edit")]).await;
    let rollout = |name: &str, selector: Value, finalizers: Vec<String>| {
        json!({"apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
            "metadata": {"name": name, "finalizers": finalizers},
            "spec": {"image": NEXT_IMAGE, "targets": {"kind": "Deployment", "selector": selector}}})
    };
    let labels: serde_json::Map<String, Value> =
        (0..10_000).map(|i| (format!("tenant.example/label-{i:05}"), json!("v".repeat(63)))).collect();
    let path =
        file(&format!("{tenant}-selector"), &rollout("selector", json!({"matchLabels": labels}), vec![]));
    let refused = attacker.kubectl(&["create", "-n", &tenant, "-f", &path]).await;
    let finalizers: Vec<String> =
        (0..20_000).map(|i| format!("tenant.example/keep-this-rollout-a-while-{i:05}")).collect();
    let mut created = 0;
    for i in 0..HEAVY {
        let object =
            rollout(&format!("held-{i}"), json!({"matchLabels": {"app": "none"}}), finalizers.clone());
        let path = file(&format!("{tenant}-held-{i}"), &object);
        created += usize::from(attacker.kubectl(&["create", "-n", &tenant, "-f", &path]).await.code == 0);
    }
    let beside = peak_through_a_rollout(&fleet, "beside").await;
    // The namespace goes at the end: its rollouts must not wait for finalizers no one will remove.
    let held = Api::<FleetRollout>::namespaced(env.admin.clone(), &tenant);
    for i in 0..HEAVY {
        let strip = json!({"metadata": {"finalizers": null}});
        let _ = held.patch(&format!("held-{i}"), &PatchParams::default(), &Patch::Merge(strip)).await;
    }
    let extra = beside - clean;
    let bound_named = refused.stderr.contains("16");
    Row {
        attack: format!(
            "a FleetRollout with a 1 MB selector, then {HEAVY} with 1 MB of finalizers each, then an operator restart"
        ),
        who: format!("{} (edit in its namespace)", short_user(&attacker)),
        expected: "the selector refused at admission, naming the bound; the operator's peak memory through \
                   a rollout grows by at most 10 MiB"
            .into(),
        outcome: format!(
            "selector: {}; {created} with finalizers created; peak RSS {clean:.1} MiB clean, {beside:.1} MiB \
             beside them (+{extra:.1})",
            if refused.code == 0 {
                "accepted".into()
            } else {
                refused.stderr.chars().take(240).collect::<String>()
            }
        ),
        contained: refused.code != 0 && bound_named && created == HEAVY && extra <= 10.0,
    }
}
