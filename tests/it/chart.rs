//! The Helm chart as a platform team ships it: values checked by a schema, high availability, an optional
//! NetworkPolicy, metrics on their own port, a labelled CRD, and a README generated from the values.
//! (tests/it/install.rs proves the rendered objects are accepted and the RBAC is right.)

use serde_json::{Value, json};
use testkit::{
    chart::{object, render, template},
    cli::{helm, repo_path},
};

fn deployment(objects: &[Value]) -> &Value {
    object(objects, "Deployment", "fr-fleetroll").expect("the Deployment")
}

fn pod_spec(objects: &[Value]) -> &Value {
    &deployment(objects)["spec"]["template"]["spec"]
}

fn selector_labels() -> Value {
    json!({"app.kubernetes.io/name": "fleetroll", "app.kubernetes.io/instance": "fr"})
}

#[tokio::test]
async fn bad_values_are_refused_and_the_error_names_the_key() {
    let chart = repo_path("charts/fleetroll");
    for (set, expected) in [
        ("replicaCount=two", "at '/replicaCount': got string, want integer"),
        ("mcp.auth=bogus", "at '/mcp/auth': value must be 'serviceaccount'"),
        ("logFormat=xml", "at '/logFormat': value must be one of 'text', 'json'"),
        ("logLevel=3", "at '/logLevel': got number, want string"),
        ("logLevel=true", "at '/logLevel': got boolean, want string"),
        ("replicas=5", "additional properties 'replicas' not allowed"),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy'"),
        ("leaderElection.leaseDuration=15", "at '/leaderElection/leaseDuration'"),
        ("mcp.taskRetention=a day", "at '/mcp/taskRetention'"),
        ("podDisruptionBudget.maxUnavailable=0", "at '/podDisruptionBudget/maxUnavailable'"),
        ("networkPolicy.mcp.namespaceSelector.app=x", "at '/networkPolicy/mcp/namespaceSelector'"),
        ("networkPolicy.enable=true", "additional properties 'enable' not allowed"),
        ("metrics.port=70000", "at '/metrics/port'"),
        ("fleetNamespace=Fleet_NS", "at '/fleetNamespace'"),
        ("service.type=ExternalName", "at '/service/type'"),
        // Without a name the operator's rights would be bound to the namespace's `default` ServiceAccount.
        ("serviceAccount.create=false", "at '/serviceAccount/name'"),
        // Emptied with null, these would fail in the templates with a nil pointer instead.
        ("httpCheck=null", "missing property 'httpCheck'"),
        ("networkPolicy.mcp=null", "at '/networkPolicy': missing property 'mcp'"),
        ("analysis.allow={Team-A=prom}", "at '/analysis/allow/0'"),
        // Bound to no namespace, an entry would serve every tenant: `*=` says so.
        ("analysis.allow={prom-b.monitoring.svc:9090}", "at '/analysis/allow/0'"),
        (
            "analysis.prometheus.namespaceAddresses={team-a=prom:9090}",
            "at '/analysis/prometheus/namespaceAddresses/0'",
        ),
        ("analysis.namespaceHeader=X Tenant", "at '/analysis/namespaceHeader'"),
    ] {
        let rendered = template(&[set]).await;
        assert!(rendered.code != 0 && rendered.stderr.contains(expected), "{set}: {rendered:?}");
        let linted = helm(&["lint", &chart, "--strict", "--set", set]).await;
        assert!(linted.code != 0 && linted.stdout.contains(expected), "{set}: {linted:?}");
    }
    // What the schema cannot say: the two listeners need two ports.
    let same = template(&["metrics.port=8080"]).await;
    assert!(same.code != 0 && same.stderr.contains("metrics.port must differ from service.port"), "{same:?}");
    // null is how a user empties a list the chart defaults (protectedNamespaces=null protects none).
    render(&["protectedNamespaces=null"]).await;
}

#[tokio::test]
async fn the_new_values_lint_strictly() {
    let chart = repo_path("charts/fleetroll");
    for sets in [
        &["replicaCount=1"][..],
        &["networkPolicy.enabled=true", "podDisruptionBudget.maxUnavailable=50%", "metrics.port=9100"],
        &["crds.keep=false", "defaultTopologySpread=false", "podDisruptionBudget.enabled=false"],
    ] {
        let mut args = vec!["lint", chart.as_str(), "--strict"];
        for set in sets {
            args.extend(["--set", set]);
        }
        helm(&args).await.ok();
    }
}

#[tokio::test]
async fn with_more_than_one_replica_a_budget_and_a_soft_spread_keep_one_serving() {
    let objects = render(&[]).await;
    let pdb = object(&objects, "PodDisruptionBudget", "fr-fleetroll").expect("a PodDisruptionBudget");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
    assert_eq!(pdb["spec"]["selector"]["matchLabels"], selector_labels());
    assert_eq!(deployment(&objects)["spec"]["selector"]["matchLabels"], selector_labels());
    let spread = pod_spec(&objects)["topologySpreadConstraints"].as_array().expect("a default spread");
    let keys: Vec<&Value> = spread.iter().map(|c| &c["topologyKey"]).collect();
    assert_eq!(keys, ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]);
    for constraint in spread {
        assert_eq!(constraint["whenUnsatisfiable"], "ScheduleAnyway", "soft: {constraint}");
        assert_eq!(constraint["labelSelector"]["matchLabels"], selector_labels());
    }

    // One replica: a budget would block every drain, and there is nothing to spread.
    let single = render(&["replicaCount=1"]).await;
    assert!(object(&single, "PodDisruptionBudget", "fr-fleetroll").is_none());
    assert!(pod_spec(&single)["topologySpreadConstraints"].is_null());
    let off = render(&["podDisruptionBudget.enabled=false", "defaultTopologySpread=false"]).await;
    assert!(object(&off, "PodDisruptionBudget", "fr-fleetroll").is_none());
    assert!(pod_spec(&off)["topologySpreadConstraints"].is_null());
    let percent = render(&["podDisruptionBudget.maxUnavailable=50%", "replicaCount=4"]).await;
    assert_eq!(
        object(&percent, "PodDisruptionBudget", "fr-fleetroll").unwrap()["spec"]["maxUnavailable"],
        "50%"
    );

    // The user's placement wins: their affinity replaces the default spread...
    let anti = "affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]";
    let with_affinity = render(&[
        &format!("{anti}.weight=100"),
        &format!("{anti}.podAffinityTerm.topologyKey=kubernetes.io/hostname"),
    ])
    .await;
    assert!(pod_spec(&with_affinity)["topologySpreadConstraints"].is_null());
    let preferred = &pod_spec(&with_affinity)["affinity"]["podAntiAffinity"];
    assert_eq!(preferred["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"], 100);
    // A node affinity alone (pinning to infra nodes, say) keeps the spread.
    let pinned = render(&[
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=infra",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
    ])
    .await;
    assert_eq!(pod_spec(&pinned)["topologySpreadConstraints"].as_array().map(Vec::len), Some(2));
    // ... and their constraints replace it, selecting the chart's pods unless they say otherwise.
    let own = render(&[
        "topologySpreadConstraints[0].maxSkew=1",
        "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
        "topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule",
    ])
    .await;
    let constraints = pod_spec(&own)["topologySpreadConstraints"].as_array().unwrap();
    assert_eq!(constraints.len(), 1, "{constraints:?}");
    assert_eq!(constraints[0]["whenUnsatisfiable"], "DoNotSchedule");
    assert_eq!(constraints[0]["labelSelector"]["matchLabels"], selector_labels());
}

fn ingress_rule(policy: &Value, port: u16) -> &Value {
    policy["spec"]["ingress"]
        .as_array()
        .and_then(|rules| rules.iter().find(|r| r["ports"][0]["port"] == port))
        .unwrap_or_else(|| panic!("no rule for port {port}: {policy}"))
}

#[tokio::test]
async fn the_network_policy_admits_mcp_and_metrics_each_from_their_own_callers() {
    assert!(!render(&[]).await.iter().any(|o| o["kind"] == "NetworkPolicy"), "off by default");
    let objects = render(&["networkPolicy.enabled=true"]).await;
    let policy = object(&objects, "NetworkPolicy", "fr-fleetroll").expect("the NetworkPolicy");
    assert_eq!(policy["spec"]["podSelector"]["matchLabels"], selector_labels());
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]), "the operator must reach out freely");
    assert_eq!(policy["spec"]["ingress"].as_array().unwrap().len(), 2, "{policy}");
    let mcp = ingress_rule(policy, 8080);
    assert_eq!(mcp["from"], json!([{"namespaceSelector": {}, "podSelector": {}}]));
    let metrics = ingress_rule(policy, 9090);
    assert_eq!(
        metrics["from"],
        json!([{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {},
        }])
    );

    let objects = render(&[
        "networkPolicy.enabled=true",
        "networkPolicy.mcp.namespaceSelector.matchLabels.team=agents",
        "networkPolicy.mcp.podSelector.matchLabels.role=agent",
        "networkPolicy.metrics.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=prometheus",
        "networkPolicy.metrics.podSelector.matchLabels.app=prometheus",
        "networkPolicy.extraIngress[0].from[0].ipBlock.cidr=10.1.0.0/16",
        "networkPolicy.extraIngress[0].ports[0].port=8080",
        "metrics.port=9100",
    ])
    .await;
    let policy = object(&objects, "NetworkPolicy", "fr-fleetroll").unwrap();
    let mcp = ingress_rule(policy, 8080);
    assert_eq!(
        mcp["from"],
        json!([{
            "namespaceSelector": {"matchLabels": {"team": "agents"}},
            "podSelector": {"matchLabels": {"role": "agent"}},
        }])
    );
    let metrics = ingress_rule(policy, 9100);
    assert_eq!(
        metrics["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "prometheus"
    );
    assert_eq!(metrics["from"][0]["podSelector"]["matchLabels"]["app"], "prometheus");
    assert_eq!(policy["spec"]["ingress"][2]["from"][0]["ipBlock"]["cidr"], "10.1.0.0/16");
}

#[tokio::test]
async fn metrics_are_served_and_scraped_on_their_own_port() {
    for (sets, port) in [(&[][..], 9090), (&["metrics.port=9100"], 9100)] {
        let objects = render(&[&["serviceMonitor.enabled=true"][..], sets].concat()).await;
        let container = &pod_spec(&objects)["containers"][0];
        let args: Vec<String> = serde_json::from_value(container["args"].clone()).unwrap();
        assert!(args.contains(&format!("--metrics-listen=0.0.0.0:{port}")), "{args:?}");
        assert!(args.contains(&"--listen=0.0.0.0:8080".to_string()), "{args:?}");
        let ports = container["ports"].as_array().unwrap();
        assert!(
            ports.contains(&json!({"name": "metrics", "containerPort": port, "protocol": "TCP"})),
            "{ports:?}"
        );
        // Readiness stays on the MCP listener: it says whether that one serves. Liveness is on the metrics
        // listener, so that connections flooding MCP never get the operator restarted.
        assert_eq!(container["readinessProbe"]["httpGet"]["port"], "http");
        assert_eq!(container["livenessProbe"]["httpGet"]["port"], "metrics");
        let service = object(&objects, "Service", "fr-fleetroll").unwrap();
        let service_ports = service["spec"]["ports"].as_array().unwrap();
        assert!(
            service_ports.contains(
                &json!({"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"})
            ),
            "{service_ports:?}"
        );
        let monitor = object(&objects, "ServiceMonitor", "fr-fleetroll").expect("the ServiceMonitor");
        assert_eq!(
            monitor["spec"]["endpoints"],
            json!([{"port": "metrics", "path": "/metrics", "interval": "30s"}])
        );
    }
}

#[tokio::test]
async fn the_crd_carries_the_charts_labels_and_is_kept_unless_told_otherwise() {
    let crd_name = "fleetrollouts.fleetroll.dev";
    let objects = render(&[]).await;
    let crd = object(&objects, "CustomResourceDefinition", crd_name).expect("the CRD");
    let labels = &crd["metadata"]["labels"];
    assert_eq!(labels["app.kubernetes.io/instance"], "fr");
    assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm");
    assert_eq!(labels["helm.sh/chart"], "fleetroll-0.1.0");
    assert_eq!(crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep");
    let dropped = render(&["crds.keep=false"]).await;
    let crd = object(&dropped, "CustomResourceDefinition", crd_name).unwrap();
    assert!(crd["metadata"]["annotations"].is_null(), "{}", crd["metadata"]);
    assert_eq!(crd["metadata"]["labels"]["app.kubernetes.io/instance"], "fr");
    let none = render(&["crds.install=false"]).await;
    assert!(object(&none, "CustomResourceDefinition", crd_name).is_none());
}

#[tokio::test]
async fn the_charts_readme_is_generated_from_its_values() {
    let generated =
        tokio::process::Command::new("bash").arg(repo_path("hack/chart-readme.sh")).output().await.unwrap();
    assert!(generated.status.success(), "{}", String::from_utf8_lossy(&generated.stderr));
    let generated = String::from_utf8(generated.stdout).unwrap();
    let committed = std::fs::read_to_string(repo_path("charts/fleetroll/README.md")).unwrap();
    assert!(committed == generated, "charts/fleetroll/README.md is stale: run `make generate`");
    // Every value has a `# --` comment: helm-docs leaves the description cell of any other empty.
    let rows: Vec<&str> = generated.lines().filter(|l| l.starts_with("| ") && l.contains(" | `")).collect();
    assert!(rows.len() > 40, "the values table: {rows:?}");
    for row in rows {
        assert!(!row.trim_end().ends_with("|  |"), "a value without a description: {row}");
    }
}

/// What platforms set on every operator: a proxy for outbound checks, annotations for an internal load
/// balancer, a ServiceAccount of their own.
#[tokio::test]
async fn platform_settings_render_where_they_belong() {
    let objects = render(&[
        "extraEnv[0].name=HTTPS_PROXY",
        "extraEnv[0].value=http://proxy:3128",
        "service.annotations.networking\\.gke\\.io/load-balancer-type=Internal",
        "serviceAccount.create=false",
        "serviceAccount.name=ops",
    ])
    .await;
    let env = &pod_spec(&objects)["containers"][0]["env"];
    assert!(
        env.as_array()
            .unwrap()
            .iter()
            .any(|e| e == &json!({"name": "HTTPS_PROXY", "value": "http://proxy:3128"})),
        "{env}"
    );
    let service = object(&objects, "Service", "fr-fleetroll").expect("the Service");
    assert_eq!(service["metadata"]["annotations"]["networking.gke.io/load-balancer-type"], "Internal");
    assert_eq!(pod_spec(&objects)["serviceAccountName"], "ops");
    assert!(object(&objects, "ServiceAccount", "ops").is_none(), "not created");
}

/// Analysis backends bound to namespaces, and the namespace header, become the operator's flags.
#[tokio::test]
async fn analysis_backends_bound_to_namespaces_render_as_flags() {
    let objects = render(&[
        "analysis.prometheus.address=http://prometheus.monitoring:9090",
        "analysis.prometheus.namespaceAddresses={team-a=http://prom-a.monitoring.svc:9090}",
        "analysis.allow={team-*=10.0.5.0/24,*=thanos.example.com}",
        "analysis.namespaceHeader=X-Scope-OrgID",
    ])
    .await;
    let args = &pod_spec(&objects)["containers"][0]["args"];
    for flag in [
        "--analysis-prometheus-address=http://prometheus.monitoring:9090",
        "--analysis-prometheus-address=team-a=http://prom-a.monitoring.svc:9090",
        "--analysis-allow=team-*=10.0.5.0/24",
        "--analysis-allow=*=thanos.example.com",
        "--analysis-namespace-header=X-Scope-OrgID",
    ] {
        assert!(args.as_array().unwrap().iter().any(|a| a == flag), "{flag} not in {args}");
    }
}

/// The chart's exec plugin arguments and variables are the binary's defaults, rendered one flag per entry;
/// none at all renders as the flag that allows none (the binary's defaults would apply otherwise).
#[tokio::test]
async fn exec_plugin_arguments_and_variables_render_as_the_binarys_defaults_or_as_none() {
    let rendered = |objects: &[Value], flag: &str| -> Vec<String> {
        let args = pod_spec(objects)["containers"][0]["args"].as_array().unwrap().clone();
        let strip = |a: &Value| a.as_str()?.strip_prefix(flag).map(str::to_string);
        args.iter().filter_map(strip).collect()
    };
    let defaults = render(&[]).await;
    assert_eq!(rendered(&defaults, "--member-exec-args="), fleetroll::core::exec::DEFAULT_ARGS, "execArgs");
    assert_eq!(rendered(&defaults, "--member-exec-env="), fleetroll::core::exec::DEFAULT_ENV, "execEnv");
    let none = render(&["--set-json=members.execArgs=[]", "--set-json=members.execEnv=[]"]).await;
    assert_eq!(rendered(&none, "--member-exec-args="), [""]);
    assert_eq!(rendered(&none, "--member-exec-env="), [""]);
}
