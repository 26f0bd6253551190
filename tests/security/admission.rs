//! Attacks on the admission boundary: who may create or change which FleetRollout, judged by RBAC, the
//! admission policy and the schema, as tenants with real tokens through `kubectl`.

use super::*;

pub(super) async fn edit_tenant_rolls_its_own_deployments(env: &'static Env) -> Row {
    let ran = create_as(&env.dev1, &env.t1, "own", deployments_spec()).await;
    row(
        "baseline: a tenant rolls its own namespace's Deployments",
        who(&env.dev1, "edit in t1"),
        Expect::Allowed,
        &ran,
    )
}

pub(super) async fn create_only_caller_rolls_deployments(env: &'static Env) -> Row {
    let ran = create_as(&env.creator, &env.t1, "creator", deployments_spec()).await;
    let expect = Expect::Policy(format!(
        "{}; a FleetRollout may change only what its creator could change",
        may_not(&env.creator, "patch deployments", &env.t1)
    ));
    row(
        "rolls Deployments it may not patch, through a FleetRollout",
        who(&env.creator, "create/get fleetrollouts in t1"),
        expect,
        &ran,
    )
}

fn with_credentials(secret: &str) -> Value {
    let mut spec = deployments_spec();
    spec["analysis"] = json!({
        "provider": {"prometheus": {"secretRef": {"name": secret}}},
        "metrics": [{"name": "errors", "query": "sum(x{d=~\"{{targets}}\"})", "thresholdRange": {"max": 0}}],
    });
    spec
}

pub(super) async fn analysis_sends_a_secret_its_creator_may_not_read(env: &'static Env) -> Row {
    let ran = create_as(&env.deployer, &env.t1, "exfiltrate", with_credentials("registry-credentials")).await;
    let expect = Expect::Policy(format!(
        "{}; a FleetRollout may use only credentials its creator could read",
        may_not(&env.deployer, "get secrets (registry-credentials)", &env.t1)
    ));
    row(
        "sends a Secret it may not read to a metrics backend, as analysis credentials",
        who(&env.deployer, "create fleetrollouts, patch deployments in t1"),
        expect,
        &ran,
    )
}

pub(super) async fn edit_tenant_uses_its_own_analysis_credentials(env: &'static Env) -> Row {
    let ran = create_as(&env.dev1, &env.t1, "with-credentials", with_credentials("prom-auth")).await;
    row(
        "baseline: a tenant's analysis uses credentials it may read",
        who(&env.dev1, "edit in t1"),
        Expect::Allowed,
        &ran,
    )
}

pub(super) async fn edit_tenant_rolls_across_namespaces(env: &'static Env) -> Row {
    let mut spec = deployments_spec();
    spec["targets"]["namespaceSelector"] = json!({"matchLabels": {"fleetroll.dev/rollouts": "enabled"}});
    let ran = create_as(&env.dev1, &env.t1, "span", spec).await;
    let expect = Expect::Policy(may_not(&env.dev1, "span-namespaces on fleetrollouts", &env.t1));
    row(
        "rolls across every opted-in namespace (namespaceSelector)",
        who(&env.dev1, "edit in t1"),
        expect,
        &ran,
    )
}

pub(super) async fn fleet_admin_rolls_across_namespaces(env: &'static Env) -> Row {
    let mut spec = deployments_spec();
    spec["targets"]["namespaceSelector"] = json!({"matchLabels": {"fleetroll.dev/rollouts": "enabled"}});
    let ran = create_as(&env.fleet_admin, &env.fleet, "span", spec).await;
    row(
        "baseline: a fleet admin rolls across opted-in namespaces",
        who(&env.fleet_admin, "fleet-admin + edit in fleet"),
        Expect::Allowed,
        &ran,
    )
}

pub(super) async fn tenant_of_t2_creates_a_rollout_in_t1(env: &'static Env) -> Row {
    let ran = create_as(&env.dev2, &env.t1, "from-t2", deployments_spec()).await;
    let expect =
        Expect::Rbac(format!("User \"{}\" cannot create resource \"fleetrollouts\"", env.dev2.username));
    row("creates a FleetRollout in another tenant's namespace", who(&env.dev2, "edit in t2"), expect, &ran)
}

pub(super) async fn edit_tenant_changes_an_admins_rollout(env: &'static Env) -> Row {
    admin_rollout(env, &env.t1, "admins").await;
    let ran = env
        .dev1
        .kubectl(&[
            "patch",
            "fleetrollout",
            "admins",
            "-n",
            &env.t1,
            "--type=merge",
            "-p",
            r#"{"spec":{"image":"registry.k8s.io/pause:3.8","paused":true}}"#,
        ])
        .await;
    row(
        "baseline: a tenant changes (image, pause) a rollout an admin created in its namespace",
        who(&env.dev1, "edit in t1"),
        Expect::Allowed,
        &ran,
    )
}

pub(super) async fn create_only_caller_changes_a_rollouts_spec(env: &'static Env) -> Row {
    admin_rollout(env, &env.t1, "admins-2").await;
    let ran = env
        .creator
        .kubectl(&[
            "patch",
            "fleetrollout",
            "admins-2",
            "-n",
            &env.t1,
            "--type=merge",
            "-p",
            r#"{"spec":{"image":"registry.example.com/evil:1"}}"#,
        ])
        .await;
    let expect =
        Expect::Rbac(format!("User \"{}\" cannot patch resource \"fleetrollouts\"", env.creator.username));
    row(
        "changes the image of an existing rollout",
        who(&env.creator, "create/get fleetrollouts in t1"),
        expect,
        &ran,
    )
}

pub(super) async fn rollouts_only_caller_pauses_a_rollout(env: &'static Env) -> Row {
    admin_rollout(env, &env.t1, "admins-3").await;
    let ran = env
        .rollouts_only
        .kubectl(&[
            "patch",
            "fleetrollout",
            "admins-3",
            "-n",
            &env.t1,
            "--type=merge",
            "-p",
            r#"{"spec":{"paused":true}}"#,
        ])
        .await;
    let expect = Expect::Policy(may_not(&env.rollouts_only, "patch deployments", &env.t1));
    row(
        "pauses a rollout of Deployments it may not patch (any spec change needs the target rights)",
        who(&env.rollouts_only, "all verbs on fleetrollouts in t1, nothing else"),
        expect,
        &ran,
    )
}

pub(super) async fn rollouts_only_caller_applies_server_side(env: &'static Env) -> Row {
    admin_rollout(env, &env.t1, "admins-6").await;
    // As a GitOps tool of its own would: server-side apply under another field manager, taking the fields.
    let applied = json!({"apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
        "metadata": {"name": "admins-6"}, "spec": {"image": "registry.example.com/evil:1", "paused": true}});
    let path = file(&format!("{}-admins-6-apply", env.t1), &applied);
    let ran = env
        .rollouts_only
        .kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=other-gitops",
            "-n",
            &env.t1,
            "-f",
            &path,
        ])
        .await;
    let expect = Expect::Policy(may_not(&env.rollouts_only, "patch deployments", &env.t1));
    row(
        "takes a rollout's image over by server-side apply under another field manager (forced)",
        who(&env.rollouts_only, "all verbs on fleetrollouts in t1, nothing else"),
        expect,
        &ran,
    )
}

pub(super) async fn rollouts_only_caller_labels_a_rollout(env: &'static Env) -> Row {
    admin_rollout(env, &env.t1, "admins-4").await;
    let ran =
        env.rollouts_only.kubectl(&["label", "fleetrollout", "admins-4", "-n", &env.t1, "team=web"]).await;
    row(
        "baseline: labels a rollout (metadata only: changes nothing it could not change)",
        who(&env.rollouts_only, "all verbs on fleetrollouts in t1, nothing else"),
        Expect::Allowed,
        &ran,
    )
}

pub(super) async fn edit_tenant_writes_rollout_status(env: &'static Env) -> Row {
    admin_rollout(env, &env.t1, "admins-5").await;
    // A PUT of the whole status with the current resourceVersion: it would succeed if RBAC allowed it.
    let mut fr = Api::<FleetRollout>::namespaced(env.admin.clone(), &env.t1).get("admins-5").await.unwrap();
    fr.metadata.managed_fields = None;
    let mut forged = serde_json::to_value(&fr).unwrap();
    forged["status"] = json!({"phase": "Succeeded", "message": "forged"});
    let path = file(&format!("{}-admins-5-status", env.t1), &forged);
    let ran = env.dev1.kubectl(&["replace", "--subresource=status", "-n", &env.t1, "-f", &path]).await;
    let expect = Expect::Rbac(format!(
        "User \"{}\" cannot update resource \"fleetrollouts/status\"",
        env.dev1.username
    ));
    row("forges a rollout's status (the operator's checkpoint)", who(&env.dev1, "edit in t1"), expect, &ran)
}

pub(super) async fn edit_tenant_rolls_a_daemonset_node_by_node(env: &'static Env) -> Row {
    let ran = create_as(&env.dev1, &env.t1, "nodes", node_spec()).await;
    row(
        "baseline: a tenant rolls its DaemonSet node by node (edit may update it and delete its pods)",
        who(&env.dev1, "edit in t1"),
        Expect::Allowed,
        &ran,
    )
}

pub(super) async fn caller_without_pod_delete_rolls_nodes(env: &'static Env) -> Row {
    let ran = create_as(&env.no_pod_delete, &env.t1, "nodes-2", node_spec()).await;
    let expect = Expect::Policy(may_not(&env.no_pod_delete, "delete pods", &env.t1));
    row(
        "has pods deleted node by node without the right to delete pods",
        who(&env.no_pod_delete, "create fleetrollouts, update daemonsets in t1"),
        expect,
        &ran,
    )
}

pub(super) async fn oversized_health_timeout(env: &'static Env) -> Row {
    oversized(env, "timeout", "spec.health.timeout", json!({"health": {"timeout": "99999999h"}})).await
}

pub(super) async fn oversized_health_soak(env: &'static Env) -> Row {
    oversized(env, "soak", "spec.health.soak", json!({"health": {"soak": "99999999h"}})).await
}

pub(super) async fn oversized_pause_between_batches(env: &'static Env) -> Row {
    oversized(
        env,
        "pause",
        "spec.strategy.pauseBetweenBatches",
        json!({"strategy": {"pauseBetweenBatches": "99999999h"}}),
    )
    .await
}

/// A duration of 11,000 years in one field: the schema refuses it (at most 30 days) with a message. (How the
/// operator treats such a value stored before the limit existed is a unit test of the rollout state
/// machine.)
async fn oversized(env: &'static Env, name: &str, field: &str, overrides: Value) -> Row {
    let mut spec = deployments_spec();
    merge(&mut spec, &overrides);
    let ran = create_as(&env.dev1, &env.t1, &format!("huge-{name}"), spec).await;
    row(
        &format!("{field}: 99999999h (11,000 years)"),
        who(&env.dev1, "edit in t1"),
        Expect::Schema(field.into()),
        &ran,
    )
}

pub(super) fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b.clone(),
    }
}

pub(super) async fn node_rollout_switches_its_daemonset(env: &'static Env) -> Row {
    let created = create_as(&env.dev1, &env.t1, "switch", node_spec()).await;
    let patch = json!({"spec": {"targets": {"daemonSet": "another-agent"}}});
    let ran = env
        .dev1
        .kubectl(&[
            "patch",
            "fleetrollout",
            "switch",
            "-n",
            &env.t1,
            "--type=merge",
            "-p",
            &patch.to_string(),
        ])
        .await;
    let mut r = row(
        "moves a node rollout to another DaemonSet, leaving the first held",
        who(&env.dev1, "edit in t1"),
        Expect::Schema("spec.targets".into()),
        &ran,
    );
    r.contained &= created.code == 0;
    r
}
