//! Bad input: specs the API server must reject (with a message a person understands), and valid specs the
//! operator cannot act on (Degraded with a reason, no target changed, nothing panics).

use std::time::Duration;

use fleetroll::api::{FleetRollout, OPT_IN_LABEL, Phase};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Namespace};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use testkit::{
    cli::kubectl,
    fleet::{READY_IMAGE, condition, ensure_crd, image_of, phase, with_fleet},
    operator::Operator,
    with_namespace,
};

const DEADLINE: Duration = Duration::from_secs(120);

fn valid_spec() -> Value {
    json!({
        "image": "registry.example.com/web:v2",
        "targets": {"kind": "Deployment", "selector": {"matchLabels": {"app": "web"}}},
    })
}

/// An analysis of one metric: a valid one with `overrides`.
fn analysis(overrides: Value) -> Value {
    let mut metric =
        json!({"name": "error-rate", "query": "sum(x{d=~\"{{targets}}\"})", "thresholdRange": {"max": 0.01}});
    for (k, v) in overrides.as_object().unwrap() {
        metric[k] = v.clone();
    }
    json!({"metrics": [metric]})
}

/// A valid analysis whose Prometheus provider is `prometheus`.
fn provider(prometheus: Value) -> Value {
    let mut a = analysis(json!({}));
    a["provider"] = json!({ "prometheus": prometheus });
    a
}

/// A valid rollout across member clusters, in waves.
fn across_clusters() -> Value {
    json!({
        "image": "registry.example.com/web:v2",
        "targets": {"kind": "Deployment", "selector": {"matchLabels": {"app": "web"}},
            "namespaceSelector": {"matchLabels": {"team": "a"}}, "clusters": {"selector": {"matchLabels": {"env": "prod"}}}},
        "strategy": {"waves": [{"name": "canary", "clusterSelector": {"matchLabels": {"ring": "0"}}, "maxConcurrency": 1}]},
    })
}

/// Sets `path` (dot-separated) in `v`.
fn set(v: &mut Value, path: &str, value: Value) {
    let mut node = v;
    let parts: Vec<&str> = path.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        node = node.as_object_mut().unwrap().entry(p.to_string()).or_insert_with(|| json!({}));
    }
    node.as_object_mut().unwrap().insert(parts[parts.len() - 1].to_string(), value);
}

#[tokio::test]
async fn the_api_server_rejects_nonsense_with_a_clear_message() {
    let client = testkit::client().await;
    ensure_crd(&client).await;
    with_namespace("schema", |client: Client, ns: String| async move {
        let ar = ApiResource::erase::<FleetRollout>(&());
        let api: Api<DynamicObject> = Api::namespaced_with(client, &ns, &ar);
        let cases: Vec<(&str, Value, &str)> = vec![
            ("image", json!(""), "image must be a non-empty image reference without spaces"),
            ("image", json!("web v2"), "image must be a non-empty image reference without spaces"),
            ("strategy.batchSize", json!(0), "batchSize must be a positive integer or a percentage from 1% to 100%"),
            ("strategy.batchSize", json!("0%"), "batchSize must be a positive integer or a percentage from 1% to 100%"),
            ("strategy.batchSize", json!("101%"), "batchSize must be a positive integer or a percentage from 1% to 100%"),
            ("strategy.steps", json!([1, "200%"]), "every step must be a positive integer or a percentage"),
            ("strategy.maxFailures", json!(-1), "maxFailures must be an integer of 0 or more, or a percentage"),
            ("strategy.maxFailures", json!("150%"), "maxFailures must be an integer of 0 or more, or a percentage"),
            ("strategy.pauseBetweenBatches", json!("5 minutes"), "pauseBetweenBatches must be a duration"),
            ("strategy.approval", json!("Sometimes"), "Unsupported value: \"Sometimes\": supported values: \"None\", \"FirstBatch\", \"EveryBatch\""),
            ("strategy.onFailure", json!("Explode"), "Unsupported value: \"Explode\": supported values: \"Pause\", \"Rollback\", \"Abort\""),
            ("health.timeout", json!("10 minutes"), "timeout must be a duration of at most 720h (30 days), such as 90s, 10m or 1h"),
            ("health.soak", json!("-1s"), "soak must be a duration of at most 720h (30 days), such as 0s, 30s or 5m"),
            // Durations beyond 30 days, in every duration field: they once crashed the operator.
            ("health.timeout", json!("99999999h"), "timeout must be a duration of at most 720h (30 days)"),
            ("health.timeout", json!("721h"), "timeout must be a duration of at most 720h (30 days)"),
            ("health.soak", json!("999999h999999m"), "soak must be a duration of at most 720h (30 days)"),
            ("strategy.pauseBetweenBatches", json!("43201m"), "pauseBetweenBatches must be a duration of at most 720h (30 days)"),
            ("ttlSecondsAfterFinished", json!(2_592_001), "should be less than or equal to 2592000"),
            // Change windows: the shape is judged here, the schedule and zone in full by the operator.
            ("strategy.windows", json!([{"schedule": "every night", "duration": "4h"}]), "schedule must be a cron schedule of five fields"),
            ("strategy.windows", json!([{"schedule": "0 22 * *", "duration": "4h"}]), "schedule must be a cron schedule of five fields"),
            ("strategy.windows", json!([{"schedule": "0 22 * * *", "duration": "a while"}]), "duration must be a duration of at most 720h"),
            ("strategy.windows", json!([{"schedule": "0 22 * * *", "duration": "4h", "timeZone": "Berlin time"}]), "timeZone must be an IANA time zone name"),
            ("strategy.windows", json!([{"schedule": "0 22 * * *", "duration": "4h", "kind": "Maybe"}]), "Unsupported value: \"Maybe\": supported values: \"Allow\", \"Deny\""),
            ("health.http", json!({"url": "ftp://web"}), "http.url must be an http:// or https:// URL"),
            ("health.http", json!({"url": "http://web", "expectStatus": 99}), "should be greater than or equal to 100"),
            ("health.http", json!({"url": "http://{name}.{namespace}@evil.example.com/"}), "http.url must not carry user information"),
            ("health.http", json!({"url": "http://169.254.169.254/latest/meta-data/"}), "http.url must not name a link-local address"),
            ("health.http", json!({"url": "http://[fe80::1]:80/"}), "http.url must not name a link-local address"),
            ("targets.kind", json!("Pod"), "Unsupported value: \"Pod\": supported values: \"Deployment\", \"StatefulSet\", \"DaemonSet\", \"Node\""),
            ("targets.selector", json!({}), "targets.selector must not be empty"),
            ("targets.kind", json!("Node"), "targets.daemonSet is required when targets.kind is Node"),
            ("targets.daemonSet", json!("edge-agent"), "targets.daemonSet and targets.nodeSelector apply only to kind Node"),
            ("targets.nodeSelector", json!({"matchLabels": {"pool": "edge"}}), "targets.daemonSet and targets.nodeSelector apply only to kind Node"),
            // Metric analysis: an unknown placeholder, an unparseable or empty or inverted range, a
            // dry-run-only analysis, a backend URL with user information.
            ("analysis", analysis(json!({"query": "up{d=\"{{name}}\"}"})), "a Batch metric's query may use only the placeholders {{targets}}, {{namespaces}}, {{clusters}} and {{interval}}"),
            ("analysis", analysis(json!({"scope": "Target", "query": "up{d=~\"{{targets}}\"}"})), "a Target metric's query may use only the placeholders {{name}}, {{namespace}}, {{cluster}} and {{interval}}"),
            ("analysis", analysis(json!({"thresholdRange": {"max": "1%"}})), "thresholdRange.max in body must be of type number"),
            ("analysis", analysis(json!({"thresholdRange": {}})), "thresholdRange needs min, max or both"),
            ("analysis", analysis(json!({"thresholdRange": {"min": 2, "max": 1}})), "thresholdRange.min must not be greater than thresholdRange.max"),
            ("analysis", analysis(json!({"dryRun": true})), "analysis needs at least one metric without dryRun"),
            ("analysis", analysis(json!({"interval": "0s"})), "interval must be a duration from 1s to 720h"),
            ("analysis", analysis(json!({"name": "Error_Rate"})), "metric names must be DNS labels"),
            ("analysis", provider(json!({"address": "http://me@prometheus:9090"})), "prometheus.address must be an http:// or https:// base URL without user information"),
            ("analysis", provider(json!({"timeout": "1m"})), "prometheus.timeout must be a duration from 1ms to 30s"),
            ("analysis", provider(json!({"secretRef": {"name": "?labelSelector=x"}})), "secretRef.name must be a Secret's name"),
        ];
        for (i, (path, value, expected)) in cases.iter().enumerate() {
            let mut spec = valid_spec();
            set(&mut spec, path, value.clone());
            let obj: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "fleetroll.dev/v1alpha1",
                "kind": "FleetRollout",
                "metadata": {"name": format!("bad-{i}")},
                "spec": spec,
            }))
            .unwrap();
            match api.create(&PostParams::default(), &obj).await {
                Ok(_) => panic!("{path} = {value} was accepted"),
                Err(kube::Error::Api(s)) => {
                    assert_eq!(s.code, 422, "{path} = {value}: {s:?}");
                    assert!(s.message.contains(expected), "{path} = {value}: message {:?} lacks {expected:?}", s.message);
                }
                Err(e) => panic!("{path} = {value}: unexpected error {e}"),
            }
        }
        // A missing image is a required field.
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": "no-image"},
            "spec": {"targets": valid_spec()["targets"].clone()},
        }))
        .unwrap();
        let err = api.create(&PostParams::default(), &obj).await.unwrap_err();
        assert!(err.to_string().contains("spec.image: Required value"), "{err}");
        // The longest durations are accepted, in the forms Go and CEL both read.
        let mut longest = valid_spec();
        set(&mut longest, "health.timeout", json!("720h"));
        set(&mut longest, "health.soak", json!("719h59m59s999ms"));
        set(&mut longest, "strategy.pauseBetweenBatches", json!("1h30m"));
        let windows = json!([
            {"name": "weeknights", "schedule": "0 22 * * Mon-Fri", "duration": "4h", "timeZone": "Europe/Berlin"},
            {"kind": "Deny", "schedule": "30 0 9 24 12 *", "duration": "720h", "timeZone": "America/Argentina/Buenos_Aires"},
            {"schedule": "@daily", "duration": "1m"},
        ]);
        set(&mut longest, "strategy.windows", windows);
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": "longest"}, "spec": longest,
        }))
        .unwrap();
        api.create(&PostParams::default(), &obj).await.unwrap();
        // And the valid spec is accepted, with the documented defaults filled in.
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": "good"}, "spec": valid_spec(),
        }))
        .unwrap();
        let created = api.create(&PostParams::default(), &obj).await.unwrap();
        let strategy = &created.data["spec"]["strategy"];
        assert_eq!(strategy["batchSize"], json!("25%"));
        assert_eq!(strategy["onFailure"], json!("Pause"));
        assert_eq!(created.data["spec"]["health"]["timeout"], json!("10m"));
    })
    .await;
}

#[tokio::test]
async fn member_cluster_specs_are_checked_at_admission() {
    let client = testkit::client().await;
    ensure_crd(&client).await;
    with_namespace("schema-clusters", |client: Client, ns: String| async move {
        let ar = ApiResource::erase::<FleetRollout>(&());
        let api: Api<DynamicObject> = Api::namespaced_with(client, &ns, &ar);
        let node_at_home = json!({"kind": "Node", "daemonSet": "agent", "namespaceSelector": {"matchLabels": {"team": "a"}}});
        let no_namespaces = json!({"kind": "Deployment", "selector": {"matchLabels": {"app": "web"}}, "clusters": {}});
        let cases: Vec<(Value, &str, Value, &str)> = vec![
            (valid_spec(), "strategy.waves", json!([{"name": "canary"}]), "strategy.waves orders member clusters: it needs targets.clusters"),
            (valid_spec(), "targets", node_at_home, "targets.namespaceSelector applies to kind Node only with targets.clusters"),
            (valid_spec(), "targets", no_namespaces, "targets.clusters needs targets.namespaceSelector"),
            (across_clusters(), "health.http", json!({"url": "http://{name}.{namespace}.svc/"}), "health.http does not apply to targets.clusters"),
            (across_clusters(), "strategy.waves", json!([{"name": "Canary"}]), "a wave name must be a DNS label"),
            (across_clusters(), "strategy.waves", json!([{"name": "a", "maxConcurrency": 0}]), "should be greater than or equal to 1"),
            (across_clusters(), "strategy.waves", json!([{"name": "a"}, {"name": "a"}]), "Duplicate value"),
        ];
        for (i, (mut spec, path, value, expected)) in cases.into_iter().enumerate() {
            set(&mut spec, path, value.clone());
            let obj: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": format!("bad-{i}")}, "spec": spec,
            }))
            .unwrap();
            match api.create(&PostParams::default(), &obj).await {
                Ok(_) => panic!("{path} = {value} was accepted"),
                Err(kube::Error::Api(s)) => {
                    assert_eq!(s.code, 422, "{path} = {value}: {s:?}");
                    assert!(s.message.contains(expected), "{path} = {value}: message {:?} lacks {expected:?}", s.message);
                }
                Err(e) => panic!("{path} = {value}: unexpected error {e}"),
            }
        }
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": "good"}, "spec": across_clusters(),
        }))
        .unwrap();
        let created = api.create(&PostParams::default(), &obj).await.unwrap();
        assert_eq!(created.data["spec"]["strategy"]["waves"][0]["maxConcurrency"], json!(1));
        // Node rollouts across members: the namespaceSelector picks the DaemonSet's namespaces there.
        let mut nodes = across_clusters();
        set(&mut nodes, "targets", json!({"kind": "Node", "daemonSet": "agent",
            "namespaceSelector": {"matchLabels": {"team": "a"}}, "clusters": {"selector": {"matchLabels": {"env": "prod"}}}}));
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": "nodes"}, "spec": nodes,
        }))
        .unwrap();
        api.create(&PostParams::default(), &obj).await.unwrap();
    })
    .await;
}

/// The description the generated CRD gives a field (`properties` path from the schema's root).
fn description_of(path: &[&str]) -> String {
    let crd = serde_json::to_value(fleetroll::api::crd()).unwrap();
    let mut node = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    for p in path {
        node = &node["properties"][p];
    }
    node["description"].as_str().unwrap_or_else(|| panic!("{path:?} has no description")).to_string()
}

fn words(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[tokio::test]
async fn kubectl_explain_shows_the_field_descriptions() {
    let client = testkit::client().await;
    ensure_crd(&client).await;
    // An int-or-string field (its description survives the schema adjustments) and a Time field (its own
    // doc comment, not the generic one of the Time type).
    for path in [["spec", "strategy", "batchSize"], ["status", "rollback", "startedAt"]] {
        let expected = words(&description_of(&path));
        let field = format!("fleetrollouts.{}", path.join("."));
        // The API server publishes a CRD's OpenAPI a moment after it is established; nothing to watch.
        testkit::poll_until(&format!("kubectl explain {field} to show {expected:?}"), DEADLINE, || {
            let (field, expected) = (field.clone(), expected.clone());
            async move { words(&kubectl(&["explain", &field]).await.stdout).contains(&expected) }
        })
        .await;
    }
}

async fn wait_degraded(fleet: &testkit::fleet::Fleet, name: &str, reason: &str) -> FleetRollout {
    let fr = fleet
        .wait_rollout(name, &format!("Degraded={reason}"), DEADLINE, |f| {
            condition(f, "Degraded").is_some_and(|c| c.status == "True" && c.reason == reason)
        })
        .await;
    assert_eq!(phase(&fr), Phase::Pending);
    fr
}

#[tokio::test]
async fn specs_the_operator_cannot_act_on_are_degraded_with_a_reason_and_touch_nothing() {
    with_fleet("degraded", 1, |fleet| async move {
        fleet.deployments(&fleet.ns, 2, READY_IMAGE).await;
        // One target with two containers.
        let api: Api<Deployment> = Api::namespaced(fleet.client.clone(), &fleet.ns);
        let mut two = testkit::fleet::deployment("two", READY_IMAGE, &[("fleet", "pair")]);
        let pod = two.spec.template.spec.as_mut().unwrap();
        let mut sidecar = pod.containers[0].clone();
        sidecar.name = "sidecar".into();
        pod.containers.push(sidecar);
        api.create(&PostParams::default(), &two).await.unwrap();

        let mut op = Operator::start(&fleet.ns, &[], &[]);
        let spec = |selector: Value| json!({"image": "registry.k8s.io/pause:3.9", "targets": {"kind": "Deployment", "selector": selector}});

        fleet.rollout("nothing", spec(json!({"matchLabels": {"fleet": "nope"}}))).await;
        let fr = wait_degraded(&fleet, "nothing", "NoTargets").await;
        assert!(fr.status.unwrap().message.unwrap().contains("no Deployment matches selector"));

        let no_daemonset = json!({"image": "registry.k8s.io/pause:3.9", "targets": {"kind": "Node", "daemonSet": "nope"}});
        fleet.rollout("no-daemonset", no_daemonset).await;
        let fr = wait_degraded(&fleet, "no-daemonset", "DaemonSetNotFound").await;
        assert!(condition(&fr, "Degraded").unwrap().message.contains("DaemonSet"), "{:?}", fr.status);

        let mut wrong = spec(json!({"matchLabels": {"fleet": "web"}}));
        wrong["container"] = json!("api");
        fleet.rollout("wrong-container", wrong).await;
        let fr = wait_degraded(&fleet, "wrong-container", "ContainerNotFound").await;
        assert!(condition(&fr, "Degraded").unwrap().message.contains("has no container named \"api\" (it has: web)"));

        fleet.rollout("ambiguous", spec(json!({"matchLabels": {"fleet": "pair"}}))).await;
        wait_degraded(&fleet, "ambiguous", "ContainerAmbiguous").await;

        // A tenant namespace that matches but has not opted in.
        let namespaces: Api<Namespace> = Api::all(fleet.client.clone());
        let tenant = fleet.tenants[0].clone();
        namespaces
            .patch(&tenant, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {OPT_IN_LABEL: null}}})))
            .await
            .unwrap();
        fleet.deployments(&tenant, 1, READY_IMAGE).await;
        let mut cross = spec(json!({"matchLabels": {"fleet": "web"}}));
        cross["targets"]["namespaceSelector"] = json!({"matchLabels": {"fleetroll.dev/test-fleet": fleet.ns}});
        fleet.rollout("not-opted-in", cross.clone()).await;
        let fr = wait_degraded(&fleet, "not-opted-in", "NoNamespacesMatch").await;
        // As if it did not exist: the reader may not be allowed to list namespaces.
        let message = condition(&fr, "Degraded").unwrap().message.clone();
        assert!(message.starts_with("no namespace labelled fleetroll.dev/rollouts=enabled matches"), "{message}");
        assert!(!message.contains(&tenant), "{message}");

        // Nothing changed anywhere, and the operator is still up.
        for ns in [&fleet.ns, &tenant] {
            let api: Api<Deployment> = Api::namespaced(fleet.client.clone(), ns);
            for d in api.list(&Default::default()).await.unwrap() {
                assert_eq!(image_of(&d), READY_IMAGE);
                assert_eq!(d.metadata.generation, Some(1));
            }
        }
        assert!(op.is_running());

        // Fixing the spec is all it takes: the same rollout then proceeds.
        fleet.patch_spec("wrong-container", json!({"container": "web"})).await;
        fleet.wait_rollout("wrong-container", "the fixed rollout to succeed", DEADLINE, |f| phase(f) == Phase::Succeeded).await;
        assert!(!std::fs::read_to_string(&op.log).unwrap().contains("panicked"));
    })
    .await;
}

#[tokio::test]
async fn cross_namespace_rollouts_outside_the_fleet_namespace_are_refused() {
    with_fleet("crossns", 1, |fleet| async move {
        fleet.deployments(&fleet.tenants[0], 1, READY_IMAGE).await;
        // This operator's fleet namespace is another one.
        let _op = Operator::start(&fleet.ns, &["--fleet-namespace", "fleetroll-system"], &[]);
        fleet
            .rollout(
                "cross",
                json!({
                    "image": "registry.k8s.io/pause:3.9",
                    "targets": {
                        "kind": "Deployment",
                        "selector": {"matchLabels": {"fleet": "web"}},
                        "namespaceSelector": {"matchLabels": {"fleetroll.dev/test-fleet": fleet.ns}},
                    },
                }),
            )
            .await;
        let fr = wait_degraded(&fleet, "cross", "CrossNamespaceNotAllowed").await;
        assert!(condition(&fr, "Degraded").unwrap().message.contains("fleetroll-system"));
        let api: Api<Deployment> = Api::namespaced(fleet.client.clone(), &fleet.tenants[0]);
        assert_eq!(api.get("web-00").await.unwrap().metadata.generation, Some(1));
        fleet.wait_events("cross", &["CrossNamespaceNotAllowed"], Duration::from_secs(30)).await;
    })
    .await;
}
