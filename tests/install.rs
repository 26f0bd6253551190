//! The Helm chart: it lints, renders, every rendered object is accepted by the real API server, the
//! committed install manifest is its rendering, and its RBAC is both sufficient and minimal — proven by
//! running the operator with nothing but the chart's ServiceAccount.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{
    cli::{helm, kubectl, kubectl_as, repo_path},
    fleet::{NEXT_IMAGE, READY_IMAGE, image_of, phase, with_fleet},
    mcp::drive,
    operator::Operator,
    serviceaccount_kubeconfig, with_namespace,
};
use fleetroll::api::Phase;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use serde_json::json;

#[tokio::test]
async fn the_chart_lints_and_every_rendered_object_is_accepted() {
    let chart = repo_path("charts/fleetroll");
    helm(&["lint", &chart, "--strict"]).await.ok();
    helm(&[
        "lint",
        &chart,
        "--strict",
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "mcp.readOnly=true",
        "--set",
        "watchNamespace=team",
        "--set",
        "mcp.allowedHosts={fleet.example.com}",
        "--set",
        "crds.install=false",
    ])
    .await
    .ok();

    with_namespace("chart", |_client: Client, ns: String| async move {
        let rendered =
            helm(&["template", "fr", &repo_path("charts/fleetroll"), "--namespace", &ns]).await.ok().stdout;
        for expected in [
            "replicas: 2",
            "path: /healthz",
            "path: /readyz",
            "runAsNonRoot: true",
            "readOnlyRootFilesystem: true",
            "drop:\n              - ALL",
            "helm.sh/resource-policy: keep",
            "name: system:auth-delegator",
        ] {
            assert!(rendered.contains(expected), "the rendered chart lacks {expected:?}");
        }
        let file = std::env::temp_dir().join(format!("{ns}-rendered.yaml"));
        std::fs::write(&file, &rendered).unwrap();
        let applied = kubectl(&["apply", "--dry-run=server", "-f", &file.display().to_string()]).await.ok();
        for object in [
            "serviceaccount/fr-fleetroll",
            "clusterrole.rbac.authorization.k8s.io/fr-fleetroll",
            "deployment.apps/fr-fleetroll",
            "service/fr-fleetroll",
        ] {
            assert!(
                applied.stdout.contains(&format!("{object} created (server dry run)")),
                "{object}: {}",
                applied.stdout
            );
        }
        assert!(
            applied
                .stdout
                .contains("customresourcedefinition.apiextensions.k8s.io/fleetrollouts.fleetroll.dev")
        );
    })
    .await;

    // manifests/install.yaml is exactly the chart, rendered.
    let helm_path = std::env::var("HELM").unwrap_or_else(|_| repo_path("target/testenv/bin/helm"));
    let render = tokio::process::Command::new("bash")
        .arg(repo_path("tests/manifests/render.sh"))
        .env("HELM", helm_path)
        .output()
        .await
        .unwrap();
    assert!(render.status.success(), "{}", String::from_utf8_lossy(&render.stderr));
    let committed = std::fs::read_to_string(repo_path("manifests/install.yaml")).unwrap();
    assert!(
        committed == String::from_utf8_lossy(&render.stdout),
        "manifests/install.yaml is stale: run `make generate`"
    );
}

/// A kubeconfig for the chart's ServiceAccount: the test cluster's server and CA, and a token from the
/// TokenRequest API.
#[tokio::test]
async fn the_operator_runs_on_the_charts_rbac_and_nothing_more() {
    with_fleet("rbac", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        let release = ns.clone();
        let fullname = format!("{release}-fleetroll");
        helm(&[
            "install", &release, &repo_path("charts/fleetroll"), "--namespace", &ns, "--set", "crds.install=false",
            "--set", &format!("fleetNamespace={ns}"),
        ])
        .await
        .ok();

        // The operator, out of cluster, with only the chart's ServiceAccount.
        let kubeconfig = serviceaccount_kubeconfig(&fleet.client, &ns, &fullname).await;
        let kubeconfig_str = kubeconfig.display().to_string();
        let op = Operator::start(
            &ns,
            &["--lease-name", &fullname, "--auth", "serviceaccount", "--mcp-audience", "http://127.0.0.1:{port}/mcp"],
            &[("KUBECONFIG", &kubeconfig_str)],
        );

        // Sufficient: a rollout completes (watch, plan, patch targets, write status, events, lease).
        fleet.deployments(&ns, 4, READY_IMAGE).await;
        fleet
            .rollout(
                "web",
                json!({"image": NEXT_IMAGE, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}}, "strategy": {"batchSize": 2}}),
            )
            .await;
        let fr = fleet.wait_rollout("web", "the rollout to succeed", Duration::from_secs(180), |f| phase(f) == Phase::Succeeded).await;
        assert_eq!(fr.status.unwrap().counts.healthy, 4);
        assert!(fleet.all_deployments().await.iter().all(|d| image_of(d) == NEXT_IMAGE));
        let events = fleet.events("web").await;
        assert!(events.iter().any(|(r, _)| r == "Succeeded"), "events need the chart's grant: {events:?}");

        // A node rollout too (the DaemonSet taken over and handed back, pods deleted node by node).
        let (client, pool) = (fleet.client.clone(), ns.clone());
        common::nodes::with_pool(client.clone(), pool.clone(), 2, |_| async {
            common::nodes::daemonset(&client, &ns, &pool, READY_IMAGE, 2).await;
            let targets = json!({"kind": "Node", "daemonSet": common::nodes::DAEMONSET,
                "nodeSelector": {"matchLabels": {common::nodes::POOL_LABEL: pool}}});
            fleet.rollout("agents", json!({"image": NEXT_IMAGE, "targets": targets, "strategy": {"batchSize": 1}})).await;
            let fr = fleet.wait_rollout("agents", "the node rollout to succeed", Duration::from_secs(120), |f| phase(f) == Phase::Succeeded).await;
            assert_eq!(fr.status.unwrap().counts.healthy, 2);
        })
        .await;

        // ... and MCP authentication works with it too (TokenReview and SubjectAccessReview: auth-delegator).
        let sas: Api<ServiceAccount> = Api::namespaced(fleet.client.clone(), &ns);
        let agent = ServiceAccount { metadata: ObjectMeta { name: Some("agent".into()), ..Default::default() }, ..Default::default() };
        sas.create(&PostParams::default(), &agent).await.unwrap();
        kubectl(&["create", "role", "agent", "-n", &ns, "--verb=get,create,patch,list", "--resource=fleetrollouts.fleetroll.dev"]).await.ok();
        kubectl(&["create", "rolebinding", "agent", "-n", &ns, "--role=agent", &format!("--serviceaccount={ns}:agent")]).await.ok();
        let token = kubectl(&["create", "token", "agent", "-n", &ns, "--audience", &op.mcp_url()]).await.ok().stdout;
        let args = json!({"namespace": ns, "image": "registry.k8s.io/pause:3.8",
            "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}}});
        let created = drive(&["start", &op.mcp_url(), &args.to_string(), "--token", token.trim()]).await;
        let id = created["taskId"].as_str().unwrap_or_else(|| panic!("{created}")).to_string();
        let done = drive(&["wait", &op.mcp_url(), &id, "--token", token.trim()]).await;
        assert_eq!(done["status"], "completed", "{done}");

        // Minimal: what the operator never does, the chart does not allow.
        let sa = |args: &'static [&'static str]| {
            let kubeconfig = kubeconfig.clone();
            let ns = ns.clone();
            async move {
                let mut full: Vec<&str> = args.to_vec();
                full.extend(["-n", &ns]);
                kubectl_as(&kubeconfig, &full).await
            }
        };
        for denied in [&["get", "secrets"][..], &["delete", "deployment", "web-00"], &["get", "configmaps"]] {
            let ran = sa(denied).await;
            assert_ne!(ran.code, 0, "{denied:?} was allowed");
            assert!(ran.stderr.contains("forbidden"), "{denied:?}: {}", ran.stderr);
        }
        let can = sa(&["auth", "can-i", "create", "pods"]).await;
        assert_eq!(can.stdout.trim(), "no");
        let can = sa(&["auth", "can-i", "patch", "deployments.apps"]).await;
        assert_eq!(can.stdout.trim(), "yes", "the grant it needs is there");

        helm(&["uninstall", &release, "--namespace", &ns]).await.ok();
    })
    .await;
}
