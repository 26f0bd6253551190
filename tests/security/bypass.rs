//! Writes that are not spec changes but change what the operator or the MCP server does: dropping the
//! operator's finalizer, owner references (a deletion the garbage collector makes later), deleting a
//! rollout that still runs, unmaking a fleet administrator's rollout from another spec, and the
//! annotations MCP tasks rest on. Each is judged by the admission policy like a spec change.

use testkit::fleet::phase;

use super::*;

/// May get, patch and delete FleetRollouts in `ns`, nothing else.
async fn patcher(env: &Env, ns: &str, name: &str) -> Tenant {
    let rights = [Grant::rules(vec![rule("fleetroll.dev", &["fleetrollouts"], &["get", "patch", "delete"])])];
    Tenant::create(&env.admin, ns, name, &rights).await
}

/// A rollout created by the cluster admin from `object` (metadata and spec).
async fn admin_creates(env: &Env, ns: &str, object: Value) -> FleetRollout {
    let fr: FleetRollout = serde_json::from_value(object).unwrap();
    Api::<FleetRollout>::namespaced(env.admin.clone(), ns).create(&PostParams::default(), &fr).await.unwrap()
}

/// A node rollout holding its DaemonSet (the operator's finalizer on it), as the operator leaves it
/// mid-rollout; no operator runs here, so nothing else touches it.
async fn held_node_rollout(env: &Env, ns: &str, name: &str) {
    admin_creates(env, ns, json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
        "metadata": {"name": name, "finalizers": ["fleetroll.dev/release-daemonset"]}, "spec": node_spec(),
    }))
    .await;
}

/// The rollout's finalizers taken off, as the admin (the clean-up of an attack).
async fn release(env: &Env, ns: &str, name: &str) {
    let patch = json!({"metadata": {"finalizers": null}});
    let api = Api::<FleetRollout>::namespaced(env.admin.clone(), ns);
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await.ok();
}

pub(super) async fn finalizer_stripped_from_a_held_node_rollout(env: &'static Env) -> Row {
    let ns = env.scratch_namespace("sec-strip", &[]).await;
    held_node_rollout(env, &ns, "held").await;
    let attacker = patcher(env, &ns, "stripper").await;
    let remove = r#"[{"op":"remove","path":"/metadata/finalizers"}]"#;
    let ran =
        attacker.kubectl(&["patch", "fleetrollout", "held", "-n", &ns, "--type=json", "-p", remove]).await;
    let still_held = Api::<FleetRollout>::namespaced(env.admin.clone(), &ns)
        .get("held")
        .await
        .is_ok_and(|fr| fr.finalizers().iter().any(|f| f == "fleetroll.dev/release-daemonset"));
    release(env, &ns, "held").await;
    let expect = Expect::Policy(format!("{} may not update daemonsets (edge-agent)", attacker.username));
    let mut r = row(
        "strips the finalizer of a node rollout holding its DaemonSet (then deletes it: the DaemonSet stays taken over)",
        who(&attacker, "get/patch/delete fleetrollouts"),
        expect,
        &ran,
    );
    r.contained &= still_held;
    r
}

pub(super) async fn owner_reference_makes_the_garbage_collector_delete_a_rollout(env: &'static Env) -> Row {
    let ns = env.scratch_namespace("sec-owner", &[]).await;
    held_node_rollout(env, &ns, "held").await;
    let attacker = patcher(env, &ns, "owner").await;
    let owner = json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
        "name": "never-there", "uid": "8d3c7a6e-0000-4000-8000-000000000000"}]}});
    let ran = attacker
        .kubectl(&["patch", "fleetrollout", "held", "-n", &ns, "--type=merge", "-p", &owner.to_string()])
        .await;
    release(env, &ns, "held").await;
    let expect = Expect::Policy(format!("{} may not update daemonsets (edge-agent)", attacker.username));
    row(
        "sets an owner reference to nothing, so that the garbage collector deletes the rollout with its own rights",
        who(&attacker, "get/patch/delete fleetrollouts"),
        expect,
        &ran,
    )
}

pub(super) async fn deleting_a_rollout_that_still_runs(env: &'static Env) -> Row {
    admin_rollout(env, &env.t1, "running").await;
    let attacker = patcher(env, &env.t1, "deleter").await;
    let ran = attacker.kubectl(&["delete", "fleetrollout", "running", "-n", &env.t1, "--wait=false"]).await;
    let expect = Expect::Policy(may_not(&attacker, "patch deployments", &env.t1));
    row(
        "deletes a rollout that still runs (its batch or rollback abandoned half-way)",
        who(&attacker, "get/patch/delete fleetrollouts"),
        expect,
        &ran,
    )
}

pub(super) async fn deleting_a_finished_rollout(env: &'static Env) -> Row {
    admin_rollout(env, &env.t1, "finished").await;
    let api = Api::<FleetRollout>::namespaced(env.admin.clone(), &env.t1);
    let status = json!({"status": {"phase": "Succeeded"}});
    api.patch_status("finished", &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
    let deleter = patcher(env, &env.t1, "cleaner").await;
    let ran = deleter.kubectl(&["delete", "fleetrollout", "finished", "-n", &env.t1, "--wait=false"]).await;
    row(
        "baseline: deletes a finished rollout (it changes nothing any more)",
        who(&deleter, "get/patch/delete fleetrollouts"),
        Expect::Allowed,
        &ran,
    )
}

pub(super) async fn fleet_namespace_editor_unmakes_a_cross_namespace_rollout(env: &'static Env) -> Row {
    let mut spec = deployments_spec();
    spec["targets"]["namespaceSelector"] = json!({"matchLabels": {"fleetroll.dev/rollouts": "enabled"}});
    admin_creates(
        env,
        &env.fleet,
        json!({"apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
        "metadata": {"name": "across"}, "spec": spec}),
    )
    .await;
    let editor = Tenant::create(&env.admin, &env.fleet, "editor", &[Grant::cluster_role("edit")]).await;
    let patch = r#"[{"op":"remove","path":"/spec/targets/namespaceSelector"}]"#;
    let ran = editor
        .kubectl(&["patch", "fleetrollout", "across", "-n", &env.fleet, "--type=json", "-p", patch])
        .await;
    let expect = Expect::Policy(may_not(&editor, "span-namespaces on fleetrollouts", &env.fleet));
    row(
        "turns a fleet administrator's cross-namespace rollout into one of its own namespace (abandoning the rest)",
        who(&editor, "edit in the fleet namespace, no span-namespaces"),
        expect,
        &ran,
    )
}

pub(super) async fn creator_annotation_names_someone_else(env: &'static Env) -> Row {
    let fr = json!({"apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
        "metadata": {"name": "forged-owner", "namespace": env.t1,
            "annotations": {"fleetroll.dev/created-by": "system:serviceaccount:t1:someone-else"}},
        "spec": deployments_spec()});
    let ran = env.dev1.kubectl(&["create", "-f", &file(&format!("{}-forged-owner", env.t1), &fr)]).await;
    let expect = Expect::Policy(format!(
        "the annotation fleetroll.dev/created-by must be {}, the user creating it",
        env.dev1.username
    ));
    row(
        "creates a rollout in someone else's name (the owner MCP tasks trust)",
        who(&env.dev1, "edit in t1"),
        expect,
        &ran,
    )
}

pub(super) async fn task_annotations_rewritten(env: &'static Env) -> Row {
    admin_creates(
        env,
        &env.t1,
        json!({"apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
        "metadata": {"name": "task", "annotations": {"fleetroll.dev/task-token-sha256": "0".repeat(64)}},
        "spec": deployments_spec()}),
    )
    .await;
    // The tenant points the task at itself and at a token it knows: it would own the admin's task.
    let patch = json!({"metadata": {"annotations": {"fleetroll.dev/created-by": env.dev1.username,
        "fleetroll.dev/task-token-sha256": "1".repeat(64)}}});
    let ran = env
        .dev1
        .kubectl(&["patch", "fleetrollout", "task", "-n", &env.t1, "--type=merge", "-p", &patch.to_string()])
        .await;
    let expect = Expect::Policy("are set when a rollout is created and never changed".into());
    row(
        "takes over another's MCP task by rewriting its owner and token hash",
        who(&env.dev1, "edit in t1"),
        expect,
        &ran,
    )
}

pub(super) async fn gates_loosened_after_a_persons_approval(env: &'static Env) -> Row {
    let ns = env.scratch_namespace("sec-gates", &[]).await;
    let fleet = Fleet { client: env.admin.clone(), ns: ns.clone(), tenants: vec![] };
    fleet.deployments(&ns, 4, READY_IMAGE).await;
    let mut op = Operator::start(&ns, &[], &[]);
    let agent = Tenant::create(&env.admin, &ns, "agent", &[Grant::cluster_role("edit")]).await;
    // The pause between batches keeps the second batch from starting on its own before the agent's patch
    // lands (with FirstBatch and unchanged gates it needs no approval); the approval gate comes first.
    let spec = json!({"image": testkit::fleet::NEXT_IMAGE,
        "strategy": {"batchSize": 2, "approval": "FirstBatch", "pauseBetweenBatches": "10m"},
        "health": {"timeout": "2m"}, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}}});
    create_as(&agent, &ns, "gated", spec).await;
    let waiting = |batch: u32| {
        move |f: &FleetRollout| {
            f.status.as_ref().and_then(|s| s.pending_approval.as_ref()).is_some_and(|p| p.batch == batch)
        }
    };
    let fr = fleet.wait_rollout("gated", "the first approval", Duration::from_secs(120), waiting(0)).await;
    // A person approves the first batch, as the plan and gates stood.
    let hash = fr.status.and_then(|s| s.plan).map(|p| p.hash).unwrap();
    fleet.approve("gated", &[0], &hash).await;
    let recorded = |f: &FleetRollout| f.status.as_ref().is_some_and(|s| !s.approvals.is_empty());
    fleet
        .wait_rollout("gated", "the approval to release the first batch", Duration::from_secs(120), recorded)
        .await;
    // Then the agent loosens the gates: a day to be healthy, and every failure tolerated.
    let loosen = json!({"spec": {"health": {"timeout": "24h"}, "strategy": {"maxFailures": "100%"}}});
    let ran = agent
        .kubectl(&["patch", "fleetrollout", "gated", "-n", &ns, "--type=merge", "-p", &loosen.to_string()])
        .await;
    let fr =
        fleet.wait_rollout("gated", "the second batch to wait", Duration::from_secs(120), waiting(1)).await;
    let s = fr.status.clone().unwrap_or_default();
    let changed = s.batches.iter().map(|b| b.size).sum::<u32>();
    let alive = serving(&mut op).await;
    Row {
        attack: "loosens the health timeout and failure budget after a person approved the first batch (FirstBatch)".into(),
        who: format!("{} (edit in its namespace)", short_user(&agent)),
        expected: "the next batch waits for another approval of the new gates".into(),
        outcome: format!(
            "patch {}; {}: batch 2 waits for gates {} (approved {}), {changed} targets changed",
            if ran.code == 0 { "allowed" } else { "refused" },
            phase(&fr),
            s.pending_approval.as_ref().map(|p| p.gates_hash.as_str()).unwrap_or(""),
            s.approvals.last().map(|a| a.gates_hash.as_str()).unwrap_or(""),
        ),
        contained: ran.code == 0
            && phase(&fr) == Phase::WaitingForApproval
            && changed == 2
            && s.pending_approval.as_ref().map(|p| &p.gates_hash) != s.approvals.last().map(|a| &a.gates_hash)
            && alive,
    }
}
