//! The Helm chart: it lints, renders, every rendered object is accepted by the real API server, the
//! committed install manifest is its rendering, and its RBAC is both sufficient and minimal — proven by
//! running the operator with nothing but the chart's ServiceAccount.

use std::{future::Future, time::Duration};

use fleetroll::api::{FleetRollout, Phase};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use testkit::{
    chart::{object, render},
    cli::{helm, kubectl, kubectl_as, repo_path},
    fleet::{Fleet, NEXT_IMAGE, READY_IMAGE, image_of, phase, with_fleet},
    mcp::drive,
    operator::Operator,
    tenant::{Grant, Tenant, client_from, rule, serviceaccount_kubeconfig},
    with_namespace,
};

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
        "--set",
        "nodeRollouts.enabled=true",
        "--set",
        "httpCheck.allow={10.0.0.0/8,status.example.com}",
        "--set",
        "protectedNamespaces={kube-system,platform}",
    ])
    .await
    .ok();
    helm(&[
        "lint",
        &chart,
        "--strict",
        "--set",
        "mcp.impersonation=legacy",
        "--set",
        "admissionPolicy.enabled=false",
        "--set",
        "actAs=operator",
        "--set",
        "protectedNamespaces=null",
    ])
    .await
    .ok();
    // MCP without authentication is for local demos on loopback, never for an installation: the schema
    // refuses it, and the template too when the schema is skipped.
    let unauthenticated = helm(&["template", "fr", &chart, "--set", "mcp.auth=none"]).await;
    assert!(
        unauthenticated.code != 0
            && unauthenticated.stderr.contains("at '/mcp/auth': value must be 'serviceaccount'"),
        "{unauthenticated:?}"
    );
    let unchecked =
        helm(&["template", "fr", &chart, "--skip-schema-validation", "--set", "mcp.auth=none"]).await;
    assert!(
        unchecked.code != 0 && unchecked.stderr.contains("mcp.auth must be serviceaccount"),
        "{unchecked:?}"
    );

    with_namespace("chart", |client: Client, ns: String| async move {
        // The CRDs first: a test beside this one installing them between apply's read and its create would
        // make the dry run fail with AlreadyExists.
        testkit::fleet::ensure_crd(&client).await;
        // The NetworkPolicy too (off by default), so that the API server judges it as well.
        let chart = repo_path("charts/fleetroll");
        let sets = ["--namespace", &ns, "--set", "networkPolicy.enabled=true"];
        let rendered = helm(&[&["template", "fr", &chart][..], &sets].concat()).await.ok().stdout;
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
            "clusterrole.rbac.authorization.k8s.io/fr-fleetroll-impersonate",
            "clusterrole.rbac.authorization.k8s.io/fr-fleetroll-fleet-admin",
            "poddisruptionbudget.policy/fr-fleetroll",
            "networkpolicy.networking.k8s.io/fr-fleetroll",
            "validatingadmissionpolicy.admissionregistration.k8s.io/fr-fleetroll-creator-rights",
            "validatingadmissionpolicybinding.admissionregistration.k8s.io/fr-fleetroll-creator-rights",
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
        .arg(repo_path("hack/render-manifests.sh"))
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

/// Whether a ClusterRole or Role grants `verb` on `resource` (which may be `res/sub`) in API group `group`.
fn grants(role: &Value, group: &str, resource: &str, verb: &str) -> bool {
    let has =
        |list: &Value, want: &str| list.as_array().is_some_and(|l| l.iter().any(|x| x == want || x == "*"));
    role["rules"].as_array().is_some_and(|rules| {
        rules
            .iter()
            .any(|r| has(&r["apiGroups"], group) && has(&r["resources"], resource) && has(&r["verbs"], verb))
    })
}

fn args(objects: &[Value]) -> Vec<String> {
    let deployment = object(objects, "Deployment", "fr-fleetroll").expect("the Deployment");
    serde_json::from_value(deployment["spec"]["template"]["spec"]["containers"][0]["args"].clone()).unwrap()
}

#[tokio::test]
async fn the_charts_rbac_follows_its_values() {
    // Defaults: no node rights, the admission policy, constrained impersonation, the operator's flags.
    let objects = render(&[]).await;
    let role = object(&objects, "ClusterRole", "fr-fleetroll").expect("the operator's ClusterRole");
    assert!(
        !grants(role, "", "pods", "delete") && !grants(role, "", "pods", "list"),
        "pod rights by default: {role}"
    );
    assert!(!grants(role, "apps", "daemonsets", "update"), "DaemonSet update by default");
    assert!(!grants(role, "", "nodes", "list"), "node rights by default");
    // actAs: creator by default: targets change as their rollout's creator, never with the operator's rights.
    assert!(!grants(role, "apps", "deployments", "patch"), "the operator may patch workloads: {role}");
    assert!(args(&objects).contains(&"--act-as=creator".to_string()));
    assert!(grants(role, "", "services", "get"), "to refuse ExternalName Services as health-check hosts");
    assert!(!grants(role, "fleetroll.dev", "fleetrollouts", "create"), "MCP creates rollouts as its caller");
    let endpoints =
        object(&objects, "Role", "fr-fleetroll-apiserver-endpoints").expect("the API server's endpoints");
    assert_eq!(endpoints["metadata"]["namespace"], "default");
    assert_eq!(endpoints["rules"][0]["resourceNames"], json!(["kubernetes"]));
    assert!(
        args(&objects).contains(&"--fleet-namespace=".to_string()),
        "no cross-namespace rollouts by default"
    );
    assert!(grants(role, "", "configmaps", "create") && grants(role, "", "configmaps", "get"));
    for verb in ["list", "update", "patch", "delete", "watch"] {
        assert!(!grants(role, "", "configmaps", verb), "configmaps {verb}");
    }
    let policy =
        object(&objects, "ValidatingAdmissionPolicy", "fr-fleetroll-creator-rights").expect("the policy");
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    assert_eq!(policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"], json!(["fleetrollouts"]));
    let validations = policy["spec"]["validations"].as_array().unwrap();
    assert!(validations.iter().all(|v| v["reason"] == "Forbidden" && v["messageExpression"].is_string()));
    let binding =
        object(&objects, "ValidatingAdmissionPolicyBinding", "fr-fleetroll-creator-rights").expect("binding");
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert_eq!(binding["spec"]["policyName"], "fr-fleetroll-creator-rights");
    let impersonate =
        object(&objects, "ClusterRole", "fr-fleetroll-impersonate").expect("impersonation rights");
    assert!(grants(impersonate, "authentication.k8s.io", "serviceaccounts", "impersonate:serviceaccount"));
    assert!(grants(impersonate, "fleetroll.dev", "fleetrollouts", "impersonate-on:serviceaccount:create"));
    assert!(!grants(impersonate, "fleetroll.dev", "fleetrollouts", "impersonate-on:serviceaccount:delete"));
    for mode in ["serviceaccount", "user-info"] {
        let verb = |v: &str| format!("impersonate-on:{mode}:{v}");
        assert!(grants(impersonate, "apps", "statefulsets", &verb("patch")), "{impersonate}");
        assert!(!grants(impersonate, "apps", "deployments", &verb("delete")), "{impersonate}");
        assert!(!grants(impersonate, "", "pods", &verb("delete")), "pods without node rollouts");
    }
    assert!(
        !grants(impersonate, "", "serviceaccounts", "impersonate")
            && !grants(impersonate, "", "users", "impersonate")
    );
    for (view, verbs) in [
        ("fr-fleetroll-view", &["get", "list", "watch"][..]),
        ("fr-fleetroll-edit", &["create", "patch", "delete"]),
    ] {
        let people = object(&objects, "ClusterRole", view).expect(view);
        assert!(verbs.iter().all(|v| grants(people, "fleetroll.dev", "fleetrollouts", v)), "{people}");
        assert!(
            !grants(people, "fleetroll.dev", "fleetrollouts", "span-namespaces"),
            "{view} spans namespaces"
        );
        assert!(!grants(people, "fleetroll.dev", "fleetrollouts/status", "update"), "{view} writes status");
    }
    let fleet_admin = object(&objects, "ClusterRole", "fr-fleetroll-fleet-admin").unwrap();
    assert!(grants(fleet_admin, "fleetroll.dev", "fleetrollouts", "span-namespaces"));
    assert!(
        !objects
            .iter()
            .any(|o| o["kind"] == "ClusterRoleBinding" && o["roleRef"]["name"] == "fr-fleetroll-fleet-admin")
    );
    let flags = args(&objects);
    for flag in [
        "--node-rollouts=false",
        "--protected-namespaces=kube-system",
        "--self-workload=Deployment/ns/fr-fleetroll",
    ] {
        assert!(flags.iter().any(|f| f == flag), "{flag} missing from {flags:?}");
    }
    assert!(!flags.iter().any(|f| f.starts_with("--http-check-allow")), "{flags:?}");

    // Node rollouts on: exactly their rights, and the flag.
    let objects =
        render(&["nodeRollouts.enabled=true", "httpCheck.allow={10.0.0.0/8,status.example.com}"]).await;
    let role = object(&objects, "ClusterRole", "fr-fleetroll").unwrap();
    assert!(!grants(role, "", "pods", "delete") && grants(role, "", "pods", "list"));
    assert!(!grants(role, "apps", "daemonsets", "update") && grants(role, "", "nodes", "list"));
    assert!(!grants(role, "", "pods", "create") && !grants(role, "apps", "deployments", "update"));
    let impersonate = object(&objects, "ClusterRole", "fr-fleetroll-impersonate").unwrap();
    assert!(grants(impersonate, "", "pods", "impersonate-on:user-info:delete"));
    assert!(grants(impersonate, "apps", "daemonsets", "impersonate-on:serviceaccount:update"));
    // actAs: operator: the operator's own rights, and no impersonation for targets.
    let objects = render(&["nodeRollouts.enabled=true", "actAs=operator"]).await;
    let role = object(&objects, "ClusterRole", "fr-fleetroll").unwrap();
    assert!(grants(role, "", "pods", "delete") && grants(role, "apps", "daemonsets", "update"));
    assert!(grants(role, "apps", "deployments", "patch"));
    let impersonate = object(&objects, "ClusterRole", "fr-fleetroll-impersonate").unwrap();
    assert!(!grants(impersonate, "apps", "deployments", "impersonate-on:serviceaccount:patch"));
    assert!(args(&objects).contains(&"--act-as=operator".to_string()));
    let objects =
        render(&["nodeRollouts.enabled=true", "httpCheck.allow={10.0.0.0/8,status.example.com}"]).await;
    let flags = args(&objects);
    for flag in
        ["--node-rollouts=true", "--http-check-allow=10.0.0.0/8", "--http-check-allow=status.example.com"]
    {
        assert!(flags.iter().any(|f| f == flag), "{flag} missing from {flags:?}");
    }

    // watchNamespace: rollouts, plans and events are written only there.
    let objects = render(&["watchNamespace=team"]).await;
    let role = object(&objects, "ClusterRole", "fr-fleetroll").unwrap();
    assert!(
        !grants(role, "", "configmaps", "create")
            && !grants(role, "fleetroll.dev", "fleetrollouts/status", "update")
    );
    assert!(
        !grants(role, "fleetroll.dev", "fleetrollouts", "create")
            && !grants(role, "events.k8s.io", "events", "create")
    );
    let scoped = object(&objects, "Role", "fr-fleetroll").expect("a Role in the watched namespace");
    assert_eq!(scoped["metadata"]["namespace"], "team");
    assert!(
        grants(scoped, "", "configmaps", "create")
            && grants(scoped, "fleetroll.dev", "fleetrollouts/status", "update")
    );
    let bound = object(&objects, "RoleBinding", "fr-fleetroll").unwrap();
    assert_eq!(bound["metadata"]["namespace"], "team");

    // Off switches, legacy impersonation, and nonsense.
    let objects =
        render(&["admissionPolicy.enabled=false", "actAs=operator", "mcp.impersonation=legacy"]).await;
    assert!(!objects.iter().any(|o| o["kind"] == "ValidatingAdmissionPolicy"));
    let impersonate = object(&objects, "ClusterRole", "fr-fleetroll-impersonate").unwrap();
    assert!(
        grants(impersonate, "", "serviceaccounts", "impersonate")
            && grants(impersonate, "", "users", "impersonate")
    );
    let chart = repo_path("charts/fleetroll");
    // Acting as creators trusts spec.creator, which only the admission policies record.
    let trusting = helm(&["template", "fr", &chart, "--set", "admissionPolicy.enabled=false"]).await;
    assert!(
        trusting.code != 0 && trusting.stderr.contains("actAs: creator needs admissionPolicy.enabled"),
        "{trusting:?}"
    );
    // The fleet namespace is never the operator's own: edit there would be the operator's rights.
    let own = helm(&["template", "fr", &chart, "--namespace", "ops", "--set", "fleetNamespace=ops"]).await;
    assert!(
        own.code != 0 && own.stderr.contains("fleetNamespace must not be the release namespace"),
        "{own:?}"
    );
    let apart = render(&["fleetNamespace=fleet"]).await;
    assert!(args(&apart).contains(&"--fleet-namespace=fleet".to_string()));
    let bad = helm(&["template", "fr", &chart, "--set", "mcp.impersonation=sometimes"]).await;
    assert!(
        bad.code != 0
            && bad.stderr.contains("at '/mcp/impersonation': value must be one of 'constrained', 'legacy'"),
        "{bad:?}"
    );
    let unchecked =
        helm(&["template", "fr", &chart, "--skip-schema-validation", "--set", "mcp.impersonation=sometimes"])
            .await;
    assert!(
        unchecked.code != 0 && unchecked.stderr.contains("mcp.impersonation must be constrained or legacy"),
        "{unchecked:?}"
    );
}

/// Runs `body` with the chart installed as release `<fleet namespace>` with `sets` (`{ns}` stands for that
/// namespace), then uninstalls it whether the body passed or not: the release's cluster-scoped objects
/// (ClusterRoles, the admission policy) outlive its namespace.
async fn with_chart<F, Fut>(prefix: &str, sets: &'static [&'static str], body: F)
where
    F: FnOnce(Fleet, String) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    with_fleet(prefix, 0, move |fleet| async move {
        let ns = fleet.ns.clone();
        let fullname = format!("{ns}-fleetroll");
        let chart = repo_path("charts/fleetroll");
        let sets: Vec<String> = sets.iter().map(|s| s.replace("{ns}", &ns)).collect();
        let mut args = vec!["install", &ns, &chart, "--namespace", &ns, "--set", "crds.install=false"];
        for set in &sets {
            args.extend(["--set", set]);
        }
        helm(&args).await.ok();
        let outcome = tokio::spawn(body(fleet, fullname)).await;
        helm(&["uninstall", &ns, "--namespace", &ns]).await.ok();
        if let Err(e) = outcome {
            std::panic::resume_unwind(e.into_panic());
        }
    })
    .await;
}

#[tokio::test]
async fn the_operator_runs_on_the_charts_rbac_and_nothing_more() {
    with_chart("rbac", &["nodeRollouts.enabled=true"], operator_on_the_charts_rbac).await;
}

#[tokio::test]
async fn with_watch_namespace_the_operator_writes_only_there() {
    with_chart("scoped", &["watchNamespace={ns}"], |fleet, fullname| async move {
        let ns = fleet.ns.clone();
        let kubeconfig = serviceaccount_kubeconfig(&fleet.client, &ns, &fullname).await;
        let kubeconfig_str = kubeconfig.display().to_string();
        // Plans in ConfigMaps (two targets each), so every write the Role grants is exercised.
        let _op = Operator::start(
            &ns,
            &["--lease-name", &fullname, "--plan-inline-max-bytes", "0", "--plan-shard-targets", "2"],
            &[("KUBECONFIG", &kubeconfig_str)],
        );
        fleet.deployments(&ns, 4, READY_IMAGE).await;
        let spec = json!({"image": NEXT_IMAGE, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}}, "strategy": {"batchSize": 2}});
        fleet.rollout("web", spec).await;
        let fr = fleet
            .wait_rollout("web", "the rollout to succeed", Duration::from_secs(180), |f| phase(f) == Phase::Succeeded)
            .await;
        assert_eq!(fr.status.unwrap().plan.unwrap().shards.len(), 2, "the plan is in ConfigMaps");
        assert!(fleet.all_deployments().await.iter().all(|d| image_of(d) == NEXT_IMAGE));
        for (verb, resource, allowed) in [
            ("create", "configmaps", "yes"),
            ("update", "fleetrollouts.fleetroll.dev --subresource=status", "yes"),
            ("create", "events.events.k8s.io", "yes"),
            ("create", "configmaps", "no"),
            ("update", "fleetrollouts.fleetroll.dev --subresource=status", "no"),
            ("create", "events.events.k8s.io", "no"),
            ("create", "fleetrollouts.fleetroll.dev", "no"),
        ] {
            // The first three in the watched namespace, the rest anywhere else.
            let where_ = if allowed == "yes" { ns.as_str() } else { "default" };
            let mut args = vec!["auth", "can-i", verb, "-n", where_];
            args.extend(resource.split(' '));
            let can = kubectl_as(&kubeconfig, &args).await;
            assert_eq!(can.stdout.trim(), allowed, "{verb} {resource} in {where_}: {can:?}");
        }
    })
    .await;
}

async fn operator_on_the_charts_rbac(fleet: Fleet, fullname: String) {
    let ns = fleet.ns.clone();
    // The operator, out of cluster, with only the chart's ServiceAccount.
    let kubeconfig = serviceaccount_kubeconfig(&fleet.client, &ns, &fullname).await;
    let kubeconfig_str = kubeconfig.display().to_string();
    let op = Operator::start(
        &ns,
        &[
            "--lease-name",
            &fullname,
            "--auth",
            "serviceaccount",
            "--mcp-audience",
            "http://127.0.0.1:{port}/mcp",
        ],
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
    let fr = fleet
        .wait_rollout("web", "the rollout to succeed", Duration::from_secs(180), |f| {
            phase(f) == Phase::Succeeded
        })
        .await;
    assert_eq!(fr.status.unwrap().counts.healthy, 4);
    assert!(fleet.all_deployments().await.iter().all(|d| image_of(d) == NEXT_IMAGE));
    // Events need the chart's grant.
    fleet.wait_events("web", &["Succeeded"], Duration::from_secs(60)).await;

    // A node rollout too (the DaemonSet taken over and handed back, pods deleted node by node).
    let (client, pool) = (fleet.client.clone(), ns.clone());
    testkit::nodes::with_pool(client.clone(), pool.clone(), 2, |_| async {
        testkit::nodes::daemonset(&client, &ns, &pool, READY_IMAGE, 2).await;
        let targets = json!({"kind": "Node", "daemonSet": testkit::nodes::DAEMONSET,
                "nodeSelector": {"matchLabels": {testkit::nodes::POOL_LABEL: pool}}});
        fleet
            .rollout("agents", json!({"image": NEXT_IMAGE, "targets": targets, "strategy": {"batchSize": 1}}))
            .await;
        let fr = fleet
            .wait_rollout("agents", "the node rollout to succeed", Duration::from_secs(120), |f| {
                phase(f) == Phase::Succeeded
            })
            .await;
        assert_eq!(fr.status.unwrap().counts.healthy, 2);
    })
    .await;

    // ... and MCP authentication works with it too (TokenReview and SubjectAccessReview: auth-delegator).
    // The agent may change the namespace's workloads (edit), so the admission policy admits its rollouts
    // whether the MCP server writes as itself or as its caller.
    let agent = Tenant::create(&fleet.client, &ns, "agent", &[Grant::cluster_role("edit")]).await;
    let token =
        kubectl(&["create", "token", &agent.name, "-n", &ns, "--audience", &op.mcp_url()]).await.ok().stdout;
    let args = json!({"namespace": ns, "image": "registry.k8s.io/pause:3.8",
            "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}}});
    let created = drive(&["start", &op.mcp_url(), &args.to_string(), "--token", token.trim()]).await;
    let id = created["taskId"].as_str().unwrap_or_else(|| panic!("{created}")).to_string();
    let done = drive(&["wait", &op.mcp_url(), &id, "--token", token.trim()]).await;
    assert_eq!(done["status"], "completed", "{done}");

    // Constrained impersonation: with the chart's token, a request as a caller is judged as that caller
    // (RBAC and the admission policy), and the operator may impersonate for nothing but FleetRollouts.
    let creator = Tenant::create(
        &fleet.client,
        &ns,
        "creator",
        &[Grant::rules(vec![rule("fleetroll.dev", &["fleetrollouts"], &["create", "get"])])],
    )
    .await;
    let rollout: FleetRollout = serde_json::from_value(json!({
            "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": "as-caller"},
            "spec": {"image": NEXT_IMAGE, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "none"}}}},
        })).unwrap();
    let as_agent: Api<FleetRollout> =
        Api::namespaced(client_from(&kubeconfig, Some(&agent.username)).await, &ns);
    as_agent.create(&PostParams::default(), &rollout).await.expect("created as the agent");
    // ... read and controlled (pause) the same way, as the MCP server's tools do.
    as_agent.get("as-caller").await.expect("read as the agent");
    let pause = json!({"spec": {"paused": true}});
    as_agent
        .patch("as-caller", &PatchParams::default(), &Patch::Merge(&pause))
        .await
        .expect("paused as the agent");
    let as_creator: Api<FleetRollout> =
        Api::namespaced(client_from(&kubeconfig, Some(&creator.username)).await, &ns);
    match as_creator.create(&PostParams::default(), &rollout).await {
        Err(kube::Error::Api(e)) => assert!(
            e.code == 403
                && e.message
                    .contains(&format!("{} may not patch deployments in namespace {ns}", creator.username)),
            "not judged as the impersonated caller: {e:?}"
        ),
        other => panic!(
            "a caller without rights over the targets created a rollout through impersonation: {other:?}"
        ),
    }
    // A dry-run create, as a preview across member clusters makes, passes as the agent and is refused to
    // the creator in the same way: the grant to impersonate for `create` covers it, and it is judged.
    let mut probe = rollout.clone();
    (probe.metadata.name, probe.metadata.generate_name) = (None, Some("preview-".into()));
    let dry_run = PostParams { dry_run: true, ..Default::default() };
    as_agent.create(&dry_run, &probe).await.expect("a dry run as the agent");
    let refused = as_creator.create(&dry_run, &probe).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("may not patch deployments")),
        "a dry run as the creator: {refused:?}"
    );
    let operator_as = |who: String, args: &'static [&'static str]| {
        let (kubeconfig, ns) = (kubeconfig.clone(), ns.clone());
        async move {
            let mut full = vec![format!("--as={who}"), "-n".into(), ns];
            full.extend(args.iter().map(|a| a.to_string()));
            kubectl_as(&kubeconfig, &full.iter().map(String::as_str).collect::<Vec<_>>()).await
        }
    };
    for (who, args) in [
        (agent.username.clone(), &["get", "secrets"][..]),
        (agent.username.clone(), &["delete", "fleetrollout", "as-caller"]),
        ("jane".to_string(), &["get", "configmaps", "x"]),
        ("jane".to_string(), &["--as-group=system:masters", "get", "fleetrollout", "as-caller"]),
        ("system:node:n1".to_string(), &["get", "fleetrollout", "as-caller"]),
    ] {
        let ran = operator_as(who.clone(), args).await;
        assert!(
            ran.code != 0
                && ran
                    .stderr
                    .contains(&format!("User \"system:serviceaccount:{ns}:{fullname}\" cannot impersonate")),
            "the chart's ServiceAccount impersonated {who} for {args:?}: {ran:?}"
        );
    }
    // A user with an extra (as OIDC users have) is impersonated, and judged as that user.
    let ran = operator_as(
        "jane".into(),
        &["--as-user-extra=acme.com/project=x", "get", "fleetrollout", "as-caller"],
    )
    .await;
    assert!(ran.stderr.contains("User \"jane\" cannot get resource \"fleetrollouts\""), "{ran:?}");

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
    // Targets change as their creator: the operator itself may not.
    let can = sa(&["auth", "can-i", "patch", "deployments.apps"]).await;
    assert_eq!(can.stdout.trim(), "no", "the operator may patch workloads itself");

    a_creator_who_loses_its_rights_stops_its_rollout(&fleet, &fullname).await;
}

/// The operator, with the chart's rights only, changes targets as each rollout's creator: once the
/// creator's RoleBinding is gone, the next batch changes nothing, the rollout halts saying why (within its
/// failure budget), and the targets already changed stay as they are. The audit log names the creator
/// behind every change.
async fn a_creator_who_loses_its_rights_stops_its_rollout(fleet: &Fleet, fullname: &str) {
    let ns = fleet.ns.clone();
    let creator = Tenant::create(&fleet.client, &ns, "revoked", &[Grant::cluster_role("edit")]).await;
    let spec = json!({"image": READY_IMAGE, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
                      "strategy": {"batchSize": 1, "approval": "EveryBatch", "maxFailures": 2}});
    let rollout: FleetRollout = serde_json::from_value(json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": "revoked"}, "spec": spec,
    }))
    .unwrap();
    Api::<FleetRollout>::namespaced(creator.client.clone(), &ns)
        .create(&PostParams::default(), &rollout)
        .await
        .expect("created by the tenant");
    let waiting_for = |batch: u32| {
        move |f: &FleetRollout| {
            f.status.as_ref().and_then(|s| s.pending_approval.as_ref()).is_some_and(|p| p.batch == batch)
        }
    };
    let plan_hash = |f: FleetRollout| f.status.unwrap().pending_approval.unwrap().plan_hash;
    let fr = fleet.wait_rollout("revoked", "batch 1 to wait", Duration::from_secs(60), waiting_for(0)).await;
    fleet.approve("revoked", &[0], &plan_hash(fr)).await;
    let fr = fleet.wait_rollout("revoked", "batch 2 to wait", Duration::from_secs(120), waiting_for(1)).await;
    let images = |d: &[k8s_openapi::api::apps::v1::Deployment]| {
        let mut all: Vec<String> = d.iter().map(image_of).collect();
        all.sort();
        all
    };
    let before = images(&fleet.all_deployments().await);
    assert_eq!(before.iter().filter(|i| *i == READY_IMAGE).count(), 1, "batch 1 changed: {before:?}");

    // The creator's rights go; a person approves the next batch all the same.
    kubectl(&["delete", "rolebinding", "revoked-0", "-n", &ns]).await.ok();
    // As the API server sees the ServiceAccount when the operator impersonates it: with its groups.
    let sa_groups = format!("--as-group=system:serviceaccounts:{ns}");
    let as_creator =
        ["--as", creator.username.as_str(), "--as-group=system:serviceaccounts", sa_groups.as_str()];
    let args = [&as_creator[..], &["auth", "can-i", "patch", "deployments", "-n", &ns]].concat();
    let what = "the RoleBinding's removal to reach the authorizer";
    testkit::poll_until(what, Duration::from_secs(10), || async {
        kubectl(&args).await.stdout.trim() == "no"
    })
    .await;
    fleet.approve("revoked", &[0, 1], &plan_hash(fr)).await;
    let fr = fleet
        .wait_rollout("revoked", "the rollout to halt", Duration::from_secs(120), |f| {
            phase(f) == Phase::Paused
        })
        .await;
    // Within its failure budget, and halted all the same: the creator's rights are gone.
    let status = fr.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("CreatorLacksRights"), "{status:?}");
    assert_eq!(status.rights_hold.as_ref().map(|h| h.batch), Some(1), "{status:?}");
    let denied = &status.failures;
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert!(
        denied.iter().all(|f| f.reason == "ChangeDenied"
            && f.message
                .contains(&format!("User \"{}\" cannot patch resource \"deployments\"", creator.username))),
        "{denied:?}"
    );
    assert_eq!(images(&fleet.all_deployments().await), before, "a target changed after the rights went");

    // Every change was made by the operator's ServiceAccount, as the creator.
    let operator = format!("system:serviceaccount:{ns}:{fullname}");
    let by_creator = |c: &testkit::audit::Change| c.as_user.as_deref() == Some(creator.username.as_str());
    let seen = |c: &[testkit::audit::Change]| c.iter().filter(|c| by_creator(c)).count() >= 2;
    if let Some(changes) = testkit::audit::changes(&ns, Duration::from_secs(30), seen).await {
        let mine: Vec<_> = changes.iter().filter(|c| by_creator(c)).collect();
        assert!(mine.iter().all(|c| c.user == operator && c.verb == "patch"), "{mine:#?}");
        assert_eq!(mine.iter().filter(|c| c.code == 200).count(), 1, "{mine:#?}");
        assert!(mine.iter().any(|c| c.code == 403), "{mine:#?}");
    }
}
