//! Reads across tenants: what a rollout makes the operator write where its reader sees it.

use testkit::fleet::phase;

use super::*;

pub(super) async fn fleet_admin_probes_namespaces_that_never_opted_in(env: &'static Env) -> Row {
    // A fleet namespace of the attack's own, with its operator; the namespace probed never opted in.
    let fleet = env.scratch_namespace("sec-probe-fleet", &[]).await;
    let secret = env.scratch_namespace("sec-probe-hidden", &[]).await;
    let admin = Tenant::create(
        &env.admin,
        &fleet,
        "platform",
        &[Grant::cluster_role(FLEET_ADMIN_ROLE), Grant::cluster_role("edit")],
    )
    .await;
    let mut op = Operator::start(&fleet, &[], &[]);
    let mut spec = deployments_spec();
    spec["targets"]["namespaceSelector"] = json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": [secret]}]});
    create_as(&admin, &fleet, "probe", spec).await;
    let fr = Fleet { client: env.admin.clone(), ns: fleet.clone(), tenants: vec![] }
        .wait_rollout("probe", "the plan to be refused", Duration::from_secs(120), |f| {
            f.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("NamespaceNotOptedIn")
        })
        .await;
    let listed = admin.kubectl(&["get", "namespaces"]).await;
    let message = fr.status.as_ref().and_then(|s| s.message.clone()).unwrap_or_default();
    let named = message.contains(&secret);
    let alive = serving(&mut op).await;
    Row {
        attack: "reads the names of namespaces that never opted in, one selector at a time, from the refusal"
            .into(),
        who: format!(
            "{} (fleet-admin + edit in its fleet namespace, no list namespaces)",
            short_user(&admin)
        ),
        expected: "the refusal counts them and names none".into(),
        outcome: format!("{}: {message}", phase(&fr)),
        contained: !named && listed.code != 0 && message.starts_with("1 namespace(s) match") && alive,
    }
}

pub(super) async fn fleet_admin_reads_member_credentials(env: &'static Env) -> Row {
    // A member cluster's Secret in the fleet namespace, as Argo CD writes them: its token reaches every
    // namespace of the member, opted in or not.
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "cluster-prod", "labels": {"argocd.argoproj.io/secret-type": "cluster"}},
        "stringData": {"name": "prod", "server": "https://prod.example:6443",
            "config": json!({"bearerToken": "member-token"}).to_string()}});
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(secret).unwrap();
    Api::namespaced(env.admin.clone(), &env.fleet).create(&PostParams::default(), &secret).await.unwrap();
    let ran =
        env.fleet_admin.kubectl(&["get", "secret", "cluster-prod", "-n", &env.fleet, "-o", "yaml"]).await;
    let expect =
        Expect::Rbac(format!("User \"{}\" cannot get resource \"secrets\"", env.fleet_admin.username));
    row(
        "reads a member cluster's credentials from the fleet namespace",
        who(&env.fleet_admin, "fleet-admin in the fleet namespace, as the chart's notes bind it"),
        expect,
        &ran,
    )
}
