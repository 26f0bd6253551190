//! The MCP server, driven by clients no one here wrote (the Python `mcp` SDK; the official conformance
//! suite), against the real control plane and a running operator.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{
    fleet::{Fleet, NEXT_IMAGE, READY_IMAGE, image_of, phase, with_fleet},
    mcp::drive,
    operator::Operator,
};
use fleetroll::api::Phase;
use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    core::v1::ServiceAccount,
    rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject},
};
use kube::{
    Api,
    api::{ObjectMeta, PostParams},
};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(180);

fn rollout_args(ns: &str, extra: Value) -> String {
    let mut args = json!({
        "namespace": ns,
        "image": NEXT_IMAGE,
        "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
    });
    if let (Some(a), Some(e)) = (args.as_object_mut(), extra.as_object()) {
        a.extend(e.clone());
    }
    args.to_string()
}

fn task_id(created: &Value) -> String {
    assert_eq!(created["resultType"], "task", "not a task: {created}");
    created["taskId"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn an_agent_rolls_forty_deployments_through_an_mcp_task() {
    with_fleet("mcp-forty", 4, |fleet| async move {
        fleet.tenant_deployments(10).await;
        let op = Operator::start(&fleet.ns, &[], &[]);
        let url = op.mcp_url();
        let args = rollout_args(
            &fleet.ns,
            json!({
                "targets": {
                    "kind": "Deployment",
                    "selector": {"matchLabels": {"fleet": "web"}},
                    "namespaceSelector": {"matchLabels": {"fleetroll.dev/test-fleet": fleet.ns}},
                },
                "strategy": {"batchSize": 10},
            }),
        );
        let created = drive(&["start", &url, &args]).await;
        let id = task_id(&created);
        assert_eq!(created["status"], "working");
        assert!(created["ttlMs"].as_u64().unwrap() >= 24 * 3600 * 1000, "covers the retention: {created}");
        // Durable before the handle was returned: tasks/get answers at once.
        let first = drive(&["get", &url, &id]).await;
        assert_eq!(first["resultType"], "complete");
        assert!(first["status"] == "working" || first["status"] == "completed", "{first}");

        let done = drive(&["wait", &url, &id]).await;
        assert_eq!(done["status"], "completed", "{done}");
        assert_eq!(done["result"]["isError"], false, "{done}");
        assert_eq!(done["result"]["resultType"], "complete");
        assert_eq!(done["result"]["structuredContent"]["counts"]["healthy"], 40);
        assert!(done["result"]["content"][0]["text"].as_str().unwrap().contains("Succeeded"));
        let deployments = fleet.all_deployments().await;
        assert_eq!(deployments.len(), 40);
        for d in deployments {
            assert_eq!(image_of(&d), NEXT_IMAGE);
            assert_eq!(d.metadata.generation, Some(2));
        }
    })
    .await;
}

#[tokio::test]
async fn an_agent_rolls_a_daemonset_node_by_node_through_an_mcp_task() {
    with_fleet("mcp-nodes", 0, |fleet| async move {
        let (client, ns) = (fleet.client.clone(), fleet.ns.clone());
        common::nodes::with_pool(client.clone(), ns.clone(), 10, |names| async move {
            common::nodes::daemonset(&client, &ns, &ns, READY_IMAGE, 10).await;
            let op = Operator::start(&ns, &[], &[]);
            let args = rollout_args(
                &ns,
                json!({
                    "targets": {"kind": "Node", "daemonSet": common::nodes::DAEMONSET,
                                "nodeSelector": {"matchLabels": {common::nodes::POOL_LABEL: ns}}},
                    "strategy": {"batchSize": 5},
                }),
            );
            let id = task_id(&drive(&["start", &op.mcp_url(), &args]).await);
            let done = drive(&["wait", &op.mcp_url(), &id]).await;
            assert_eq!(done["status"], "completed", "{done}");
            assert_eq!(done["result"]["structuredContent"]["counts"]["healthy"], 10, "{done}");
            let pods = common::nodes::pods_by_node(&client, &ns).await;
            for node in &names {
                assert_eq!(common::nodes::pod_image(&pods[node][0]), NEXT_IMAGE, "{node}");
            }
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn approvals_answer_input_requests_and_cancel_aborts() {
    with_fleet("mcp-gates", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 4, READY_IMAGE).await;
        let op = Operator::start(&fleet.ns, &[], &[]);
        let url = op.mcp_url();
        let args = rollout_args(
            &fleet.ns,
            json!({"name": "gated", "strategy": {"batchSize": 2, "approval": "EveryBatch"}}),
        );
        let id = task_id(&drive(&["start", &url, &args]).await);

        // input_required with an elicitation form; tasks/update approves batch 1.
        let approved = drive(&["approve", &url, &id]).await;
        assert_eq!(approved["ack"], json!({"resultType": "complete"}), "{approved}");
        let key = approved["answered"][0].as_str().unwrap();
        assert!(key.starts_with("approve-r1-b0-"), "{key}");
        assert_eq!(approved["asked"][key]["method"], "elicitation/create");

        // Batch 1 goes through, and batch 2 asks in turn, with a new key.
        let waiting = drive(&["wait", &url, &id, "--until", "input_required"]).await;
        let keys: Vec<&String> = waiting["inputRequests"].as_object().unwrap().keys().collect();
        assert!(keys[0].starts_with("approve-r1-b1-"), "{waiting}");
        let fr = fleet.rollouts().get("gated").await.unwrap();
        let s = fr.status.unwrap();
        assert_eq!(s.approvals[0].approved_by.as_deref(), Some("system:anonymous"));
        assert_eq!(s.counts.updated, 2);

        // tasks/cancel: acked, idempotent, and the task ends cancelled with nothing more changed.
        let cancelled = drive(&["cancel", &url, &id]).await;
        assert_eq!(cancelled["acks"], json!([{"resultType": "complete"}, {"resultType": "complete"}]));
        let done = drive(&["wait", &url, &id]).await;
        assert_eq!(done["status"], "cancelled", "{done}");
        let fr = fleet.rollouts().get("gated").await.unwrap();
        assert_eq!(
            (phase(&fr), fr.status.unwrap().reason.as_deref()),
            (Phase::Aborted, Some("AbortRequested"))
        );
        assert_eq!(fleet.all_deployments().await.iter().filter(|d| image_of(d) == NEXT_IMAGE).count(), 2);
        // Cancelling a finished task is still just an ack.
        assert_eq!(drive(&["cancel", &url, &id]).await["acks"][0], json!({"resultType": "complete"}));
    })
    .await;
}

#[tokio::test]
async fn tasks_outlive_the_server_and_resolve_on_any_replica() {
    with_fleet("mcp-durable", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 4, READY_IMAGE).await;
        let mut first = Operator::start(&fleet.ns, &[], &[]);
        let args = rollout_args(&fleet.ns, json!({"strategy": {"batchSize": 2, "approval": "FirstBatch"}}));
        let id = task_id(&drive(&["start", &first.mcp_url(), &args]).await);
        drive(&["wait", &first.mcp_url(), &id, "--until", "input_required"]).await;

        // The process that created the task, controller and MCP server both, dies without warning.
        first.kill();
        let second = Operator::start(&fleet.ns, &[], &[]);
        let other = Operator::start_mcp(&fleet.ns, &[], &[]);
        let seen = drive(&["get", &second.mcp_url(), &id]).await;
        assert_eq!(seen["status"], "input_required", "{seen}");
        assert_eq!(drive(&["get", &other.mcp_url(), &id]).await["status"], "input_required");

        // Approved on the standalone MCP server, completed by the new operator, read back on the first one.
        drive(&["approve", &other.mcp_url(), &id]).await;
        let done = drive(&["wait", &second.mcp_url(), &id]).await;
        assert_eq!(
            (done["status"].as_str(), done["result"]["isError"].as_bool()),
            (Some("completed"), Some(false)),
            "{done}"
        );
        assert!(fleet.all_deployments().await.iter().all(|d| image_of(d) == NEXT_IMAGE));

        // A task created on one server is cancelled on the other.
        let args = rollout_args(
            &fleet.ns,
            json!({"image": "registry.k8s.io/pause:3.8", "strategy": {"approval": "FirstBatch"}}),
        );
        let id = task_id(&drive(&["start", &other.mcp_url(), &args]).await);
        drive(&["wait", &second.mcp_url(), &id, "--until", "input_required"]).await;
        drive(&["cancel", &second.mcp_url(), &id]).await;
        assert_eq!(drive(&["wait", &other.mcp_url(), &id]).await["status"], "cancelled");
    })
    .await;
}

#[tokio::test]
async fn the_same_idempotency_key_returns_the_same_task() {
    with_fleet("mcp-idem", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 2, READY_IMAGE).await;
        let op = Operator::start(&fleet.ns, &[], &[]);
        let url = op.mcp_url();
        let args = rollout_args(
            &fleet.ns,
            json!({"idempotencyKey": "deploy-42", "strategy": {"approval": "FirstBatch"}}),
        );
        let a = task_id(&drive(&["start", &url, &args]).await);
        let b = task_id(&drive(&["start", &url, &args]).await);
        assert_eq!(a, b, "a replay returns the same task");
        assert_eq!(
            fleet.rollouts().list(&Default::default()).await.unwrap().items.len(),
            1,
            "and creates nothing new"
        );

        let changed = rollout_args(
            &fleet.ns,
            json!({"idempotencyKey": "deploy-42", "image": "registry.k8s.io/pause:3.8"}),
        );
        let refused = drive(&["start", &url, &changed]).await;
        assert_eq!(refused["isError"], true, "{refused}");
        assert!(
            refused["content"][0]["text"].as_str().unwrap().contains("already used with different arguments"),
            "{refused}"
        );
        assert_eq!(fleet.rollouts().list(&Default::default()).await.unwrap().items.len(), 1);
    })
    .await;
}

#[tokio::test]
async fn clients_without_tasks_get_a_synchronous_answer() {
    with_fleet("mcp-sync", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 3, READY_IMAGE).await;
        let op = Operator::start(&fleet.ns, &[], &[]);
        let url = op.mcp_url();

        // preview_rollout: the exact plan, and nothing written.
        let preview_args = json!({"namespace": fleet.ns, "image": NEXT_IMAGE,
            "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}}, "strategy": {"batchSize": 2}});
        let preview = drive(&["call", &url, "preview_rollout", &preview_args.to_string(), "--no-tasks"]).await;
        assert_eq!(preview["isError"], false, "{preview}");
        let plan = &preview["structuredContent"];
        assert_eq!(plan["totalTargets"], 3);
        assert_eq!(plan["batches"][0]["targets"][0]["name"], "web-00");
        assert!(fleet.rollouts().list(&Default::default()).await.unwrap().items.is_empty());

        // A 2026-07-28 client that did not declare the extension: a synchronous result naming the rollout.
        let args = rollout_args(&fleet.ns, json!({"name": "sync", "strategy": {"batchSize": 2}}));
        let started = drive(&["call", &url, "rollout_fleet", &args, "--no-tasks"]).await;
        assert_eq!(started["resultType"], "complete");
        assert!(started["content"][0]["text"].as_str().unwrap().contains("poll get_rollout"), "{started}");
        assert_eq!(started["structuredContent"]["name"], "sync");
        let fr = fleet.wait_rollout("sync", "the rollout to succeed", DEADLINE, |f| phase(f) == Phase::Succeeded).await;
        assert_eq!(fr.status.unwrap().plan.unwrap().hash, plan["planHash"], "the preview showed the exact plan");

        // A legacy (2025-11-25, initialize-based) client is served too.
        let legacy = drive(&["legacy-call", &url, "get_rollout", &json!({"namespace": fleet.ns, "name": "sync"}).to_string()]).await;
        assert_eq!(legacy["structuredContent"]["phase"], "Succeeded", "{legacy}");
        let list = drive(&["call", &url, "list_rollouts", &json!({"namespace": fleet.ns}).to_string(), "--no-tasks"]).await;
        assert_eq!(list["structuredContent"]["rollouts"].as_array().unwrap().len(), 1);
        // Controls work synchronously as well.
        let paused = drive(&["call", &url, "pause_rollout", &json!({"namespace": fleet.ns, "name": "sync"}).to_string(), "--no-tasks"]).await;
        assert_eq!(paused["structuredContent"]["paused"], true, "{paused}");
    })
    .await;
}

#[tokio::test]
async fn a_read_only_server_exposes_only_reads() {
    with_fleet("mcp-ro", 0, |fleet| async move {
        let op = Operator::start(&fleet.ns, &["--read-only"], &[]);
        let tools = drive(&["tools", &op.mcp_url()]).await;
        assert_eq!(tools["tools"], json!(["preview_rollout", "get_rollout", "list_rollouts"]));
        let refused = drive(&[
            "call",
            &op.mcp_url(),
            "rollout_fleet",
            &rollout_args(&fleet.ns, json!({})),
            "--no-tasks",
        ])
        .await;
        assert_eq!(refused["isError"], true);
        assert!(fleet.rollouts().list(&Default::default()).await.unwrap().items.is_empty());
    })
    .await;
}

#[tokio::test]
async fn bad_requests_get_the_right_code_and_the_server_keeps_serving() {
    with_fleet("mcp-bad", 0, |fleet| async move {
        let op = Operator::start(&fleet.ns, &[], &[]);
        let url = op.mcp_url();
        let raw = |method: &'static str, params: Value, extra: Vec<&'static str>| {
            let url = url.clone();
            async move {
                let params = params.to_string();
                let mut args = vec!["raw", &url, method, &params];
                args.extend(extra);
                drive(&args).await
            }
        };
        let code = |r: &Value| r["body"]["error"]["code"].as_i64();

        let broken = drive(&[
            "raw",
            &url,
            "tools/list",
            "{}",
            "--body",
            "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\"",
        ])
        .await;
        assert_eq!((broken["status"].as_i64(), code(&broken)), (Some(400), Some(-32700)), "{broken}");
        let too_big = drive(&["raw", &url, "tools/list", "{}", "--pad", "2097152"]).await;
        assert_eq!(too_big["status"], 413, "{}", too_big["status"]);
        let mismatch = raw("tools/list", json!({}), vec!["--header", "Mcp-Method=tools/call"]).await;
        assert_eq!((mismatch["status"].as_i64(), code(&mismatch)), (Some(400), Some(-32020)), "{mismatch}");
        let unknown = raw("rollouts/launch", json!({}), vec![]).await;
        assert_eq!((unknown["status"].as_i64(), code(&unknown)), (Some(404), Some(-32601)), "{unknown}");
        let no_task =
            raw("tasks/get", json!({"taskId": "nope/nope/0123456789abcdef0123456789abcdef"}), vec![]).await;
        assert_eq!(code(&no_task), Some(-32602), "{no_task}");
        let rebinding = raw("tools/list", json!({}), vec!["--header", "Host=evil.example.com"]).await;
        assert_eq!(rebinding["status"], 403, "a Host outside the allow-list: {rebinding}");
        let removed = raw("tasks/result", json!({"taskId": "x"}), vec![]).await;
        assert_eq!(code(&removed), Some(-32601), "{removed}");
        let no_tasks_ext = drive(&["call", &url, "get_rollout", "{\"namespace\": 5}", "--no-tasks"]).await;
        assert_eq!(no_tasks_ext["isError"], true);
        assert!(
            no_tasks_ext["content"][0]["text"].as_str().unwrap().starts_with("invalid arguments"),
            "{no_tasks_ext}"
        );
        let unknown_field = drive(&[
            "call",
            &url,
            "rollout_fleet",
            &rollout_args(&fleet.ns, json!({"imagee": "x"})),
            "--no-tasks",
        ])
        .await;
        assert!(
            unknown_field["content"][0]["text"].as_str().unwrap().contains("unknown field `imagee`"),
            "{unknown_field}"
        );
        let invalid_spec = drive(&[
            "call",
            &url,
            "rollout_fleet",
            &rollout_args(&fleet.ns, json!({"strategy": {"batchSize": 0}})),
            "--no-tasks",
        ])
        .await;
        assert!(
            invalid_spec["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains("batchSize must be a positive integer"),
            "{invalid_spec}"
        );
        let unknown_tool = drive(&["call", &url, "format_disk", "{}", "--no-tasks"]).await;
        assert!(unknown_tool["error"].is_object(), "{unknown_tool}");

        // Still serving, and still sane.
        let tools = drive(&["tools", &url]).await;
        assert_eq!(tools["tools"].as_array().unwrap().len(), 9);
        assert!(op.metrics().await.contains("fleetroll_leader 1"));
    })
    .await;
}

#[tokio::test]
async fn the_official_conformance_suite_passes() {
    with_fleet("mcp-conformance", 0, |fleet| async move {
        let op = Operator::start(&fleet.ns, &["--conformance-fixtures"], &[]);
        let out = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-logs/conformance");
        let (passed, report) = common::mcp::conformance_suite(&op.mcp_url(), &out).await;
        eprintln!("{report}");
        assert!(passed, "conformance failures (details in {}):\n{report}", out.display());
        for scenario in
            ["server-stateless", "tasks-lifecycle", "tasks-mrtr-input", "tasks-dispatch-and-envelope"]
        {
            assert!(report.contains(&format!("{scenario:<32} exit=0")), "{scenario} did not pass:\n{report}");
        }
    })
    .await;
}

async fn token(fleet: &Fleet, sa: &str, audience: &str) -> String {
    let sas: Api<ServiceAccount> = Api::namespaced(fleet.client.clone(), &fleet.ns);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![audience.to_string()]),
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let issued: TokenRequest =
        sas.create_subresource("token", sa, &PostParams::default(), &request).await.unwrap();
    issued.status.and_then(|s| s.token).expect("a token")
}

async fn grant(fleet: &Fleet, sa: &str, verbs: &[&str]) {
    let roles: Api<Role> = Api::namespaced(fleet.client.clone(), &fleet.ns);
    let bindings: Api<RoleBinding> = Api::namespaced(fleet.client.clone(), &fleet.ns);
    let name = format!("{sa}-fleetrollouts");
    let role = Role {
        metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["fleetroll.dev".into()]),
            resources: Some(vec!["fleetrollouts".into()]),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            ..Default::default()
        }]),
    };
    roles.create(&PostParams::default(), &role).await.unwrap();
    let binding = RoleBinding {
        metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
        role_ref: RoleRef { api_group: Some("rbac.authorization.k8s.io".into()), kind: "Role".into(), name },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: sa.into(),
            namespace: Some(fleet.ns.clone()),
            ..Default::default()
        }]),
    };
    bindings.create(&PostParams::default(), &binding).await.unwrap();
}

#[tokio::test]
async fn serviceaccount_tokens_and_rbac_decide_what_an_agent_may_do() {
    with_fleet("mcp-auth", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 2, READY_IMAGE).await;
        let sas: Api<ServiceAccount> = Api::namespaced(fleet.client.clone(), &fleet.ns);
        for name in ["agent", "intruder"] {
            let sa = ServiceAccount {
                metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
                ..Default::default()
            };
            sas.create(&PostParams::default(), &sa).await.unwrap();
        }
        let op = Operator::start(
            &fleet.ns,
            &["--auth", "serviceaccount", "--mcp-audience", "http://127.0.0.1:{port}/mcp"],
            &[],
        );
        let url = op.mcp_url();
        let start = rollout_args(&fleet.ns, json!({"strategy": {"approval": "FirstBatch"}}));
        let start_params =
            json!({"name": "rollout_fleet", "arguments": serde_json::from_str::<Value>(&start).unwrap()})
                .to_string();

        // No token: 401, and a challenge that leads to the Protected Resource Metadata.
        let anonymous = drive(&["raw", &url, "tools/list", "{}"]).await;
        assert_eq!(anonymous["status"], 401, "{anonymous}");
        let challenge = anonymous["headers"]["www-authenticate"].as_str().unwrap();
        let metadata_url = format!("http://127.0.0.1:{}/.well-known/oauth-protected-resource/mcp", op.port);
        assert!(challenge.contains(&format!("resource_metadata=\"{metadata_url}\"")), "{challenge}");
        let metadata = http_get_json(&metadata_url).await;
        assert_eq!(metadata["resource"], url);
        assert!(!metadata["authorization_servers"].as_array().unwrap().is_empty());

        // A token for another audience is not accepted.
        let elsewhere = token(&fleet, "agent", "https://kubernetes.default.svc").await;
        assert_eq!(drive(&["raw", &url, "tools/list", "{}", "--token", &elsewhere]).await["status"], 401);

        // A valid token without RBAC: authenticated, but not allowed to start a rollout.
        let intruder = token(&fleet, "intruder", &url).await;
        let denied = drive(&["raw", &url, "tools/call", &start_params, "--token", &intruder]).await;
        assert_eq!(denied["status"], 403, "{denied}");
        assert!(
            denied["body"]["error"]["message"].as_str().unwrap().contains("may not create fleetrollouts"),
            "{denied}"
        );
        assert!(fleet.rollouts().list(&Default::default()).await.unwrap().items.is_empty());

        // With a Role that allows it, the same call works, and the approval records who gave it.
        grant(&fleet, "agent", &["create", "get", "list", "patch"]).await;
        let agent = token(&fleet, "agent", &url).await;
        let id = task_id(&drive(&["start", &url, &start, "--token", &agent]).await);
        drive(&["approve", &url, &id, "--token", &agent]).await;
        let done = drive(&["wait", &url, &id, "--token", &agent]).await;
        assert_eq!(done["status"], "completed", "{done}");
        let fr = fleet.rollouts().list(&Default::default()).await.unwrap().items.remove(0);
        let expected = format!("system:serviceaccount:{}:agent", fleet.ns);
        assert_eq!(fr.status.unwrap().approvals[0].approved_by.as_deref(), Some(expected.as_str()));

        // Another identity, even one allowed to read rollouts, does not see the agent's task.
        grant(&fleet, "intruder", &["get"]).await;
        let hidden = drive(&["get", &url, &id, "--token", &intruder]).await;
        assert_eq!(hidden["error"]["code"], -32602, "{hidden}");
        let hidden_cancel =
            drive(&["raw", &url, "tasks/cancel", &json!({"taskId": id}).to_string(), "--token", &intruder])
                .await;
        assert_eq!(hidden_cancel["status"], 403, "patch is not granted: {hidden_cancel}");
    })
    .await;
}

/// A plain GET of a JSON document (the metadata endpoint needs no MCP client).
async fn http_get_json(url: &str) -> Value {
    let out = tokio::process::Command::new("curl").args(["-fsS", url]).output().await.unwrap();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{url}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}
