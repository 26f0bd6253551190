//! Reads across tenants: what a rollout makes the operator write where its reader sees it.

use testkit::fleet::{condition, phase};

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
    // Probes by name and by label: one matching the hidden namespace, one matching nothing that exists.
    let never = format!("{secret}-none");
    let by_name = |name: &str| json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": [name]}]});
    let by_label = |value: &str| json!({"matchLabels": {"kubernetes.io/metadata.name": value}});
    let probes = [
        ("by-name", by_name(&secret), "by-name-none", by_name(&never)),
        ("by-label", by_label(&secret), "by-label-none", by_label(&never)),
    ];
    let env_fleet = Fleet { client: env.admin.clone(), ns: fleet.clone(), tenants: vec![] };
    let answer = |name: &'static str, selector: Value| {
        let (admin, fleet, env_fleet) = (&admin, &fleet, &env_fleet);
        async move {
            let mut spec = deployments_spec();
            spec["targets"]["namespaceSelector"] = selector;
            create_as(admin, fleet, name, spec).await;
            let fr = env_fleet
                .wait_rollout(name, "the plan to be judged", Duration::from_secs(120), |f| {
                    condition(f, "Degraded").is_some_and(|c| c.status == "True") || phase(f) != Phase::Pending
                })
                .await;
            let status = fr.status.unwrap_or_default();
            (status.reason.unwrap_or_default(), status.message.unwrap_or_default())
        }
    };
    let mut differ = Vec::new();
    let mut outcome = String::new();
    for (hidden, hidden_selector, none, none_selector) in probes {
        let (seen, unseen) = futures::join!(answer(hidden, hidden_selector), answer(none, none_selector));
        // The message repeats the selector the probe wrote; beyond that, the two must be the same.
        if (seen.0.clone(), seen.1.replace(&secret, &never)) != unseen {
            differ.push(hidden);
        }
        outcome = format!("{}: {}", seen.0, seen.1);
    }
    let listed = admin.kubectl(&["get", "namespaces"]).await;
    let alive = serving(&mut op).await;
    Row {
        attack: "tells a namespace that never opted in from none at all, by name and by label selectors"
            .into(),
        who: format!(
            "{} (fleet-admin + edit in its fleet namespace, no list namespaces)",
            short_user(&admin)
        ),
        expected: "the same answer for a selector matching a hidden namespace as for one matching nothing"
            .into(),
        outcome: format!("probes answered differently: {differ:?}; last answer: {outcome}"),
        contained: differ.is_empty() && listed.code != 0 && alive,
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
