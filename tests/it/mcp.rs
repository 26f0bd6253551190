//! The MCP server, driven by clients no one here wrote (the Python `mcp` SDK; the official conformance
//! suite), against the real control plane and a running operator.

use std::time::Duration;

use fleetroll::api::{FleetRollout, Phase, PlanStorage};
use k8s_openapi::api::{
    admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
    authorization::v1::ResourceAttributes,
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use kube::{Client, ResourceExt, api::PostParams};
use serde_json::{Value, json};
use testkit::{
    create_owned,
    fleet::{Fleet, NEXT_IMAGE, READY_IMAGE, image_of, phase, with_fleet},
    mcp::drive,
    operator::{Operator, free_port, http_get, status},
    people::Person,
    tenant::{self, APPROVER_ROLE, Grant, Tenant, rule, serviceaccount_kubeconfig},
};

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
        testkit::nodes::with_pool(client.clone(), ns.clone(), 10, |names| async move {
            testkit::nodes::daemonset(&client, &ns, &ns, READY_IMAGE, 10).await;
            let op = Operator::start(&ns, &[], &[]);
            let args = rollout_args(
                &ns,
                json!({
                    "targets": {"kind": "Node", "daemonSet": testkit::nodes::DAEMONSET,
                                "nodeSelector": {"matchLabels": {testkit::nodes::POOL_LABEL: ns}}},
                    "strategy": {"batchSize": 5},
                }),
            );
            let id = task_id(&drive(&["start", &op.mcp_url(), &args]).await);
            let done = drive(&["wait", &op.mcp_url(), &id]).await;
            assert_eq!(done["status"], "completed", "{done}");
            assert_eq!(done["result"]["structuredContent"]["counts"]["healthy"], 10, "{done}");
            let pods = testkit::nodes::pods_by_node(&client, &ns).await;
            for node in &names {
                assert_eq!(testkit::nodes::pod_image(&pods[node][0]), NEXT_IMAGE, "{node}");
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
        let message = approved["asked"][key]["params"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("Targets: {ns}/web-00, {ns}/web-01", ns = fleet.ns)), "{message}");

        // Batch 1 goes through, and batch 2 asks in turn, with a new key.
        let waiting = drive(&["wait", &url, &id, "--until", "input_required"]).await;
        let keys: Vec<&String> = waiting["inputRequests"].as_object().unwrap().keys().collect();
        assert!(keys[0].starts_with("approve-r1-b1-"), "{waiting}");
        let fr = fleet.rollouts().get("gated").await.unwrap();
        let s = fr.status.unwrap();
        // Without authentication the server writes as itself, and admission names it as the approver (with
        // it, the approval names the caller).
        let server = fr.spec.creator.map(|c| c.username);
        assert!(server.is_some());
        assert_eq!(s.approvals[0].approved_by, server);
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

/// A plan over the inline limit lives in ConfigMaps, not in status: the approval form still names the
/// targets of the batch it asks about.
#[tokio::test]
async fn the_approval_form_names_the_batch_targets_when_the_plan_is_in_configmaps() {
    with_fleet("mcp-sharded-form", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 4, READY_IMAGE).await;
        let op = Operator::start(&fleet.ns, &["--plan-inline-max-bytes", "0"], &[]);
        let url = op.mcp_url();
        let args = rollout_args(
            &fleet.ns,
            json!({"name": "sharded", "strategy": {"batchSize": 2, "approval": "FirstBatch"}}),
        );
        let id = task_id(&drive(&["start", &url, &args]).await);
        let waiting = drive(&["wait", &url, &id, "--until", "input_required"]).await;
        assert_eq!(waiting["status"], "input_required", "{waiting}");
        let plan = fleet.rollouts().get("sharded").await.unwrap().status.unwrap().plan.unwrap();
        assert_eq!(plan.storage, PlanStorage::ConfigMaps, "the plan is not in status");
        let requests = waiting["inputRequests"].as_object().unwrap();
        let message = requests.values().next().unwrap()["params"]["message"].as_str().unwrap();
        let batch = format!("Targets: {ns}/web-00, {ns}/web-01", ns = fleet.ns);
        assert!(message.contains(&batch), "the form does not name batch 1's targets: {message}");
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
        // Its replacement (the same replica's identity, so the lease is taken again at once).
        let second = Operator::start(&fleet.ns, &["--identity", &first.identity], &[]);
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
        let rollouts = fleet.rollouts().list(&Default::default()).await.unwrap().items;
        assert_eq!(rollouts.len(), 1, "and creates nothing new");
        // Neither the task token nor the key is stored: only their hashes.
        assert_task_secret_not_stored(&rollouts[0], &a);
        let stored = rollouts[0].annotations();
        assert!(!stored.values().any(|v| v.contains("deploy-42")), "the key in plain text: {stored:?}");
        assert_eq!(stored["fleetroll.dev/idempotency-key-sha256"].len(), 64);

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
        assert!(list["structuredContent"]["rollouts"][0].get("taskId").is_none(), "{list}");
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
        // Small in bytes, but 5,000 values: refused before it is parsed (each would cost tens of bytes).
        let numbers = vec!["0"; 5000].join(",");
        let heavy = format!(
            r#"{{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {{"pad": [{numbers}]}}}}"#
        );
        let heavy = drive(&["raw", &url, "tools/list", "{}", "--body", &heavy]).await;
        assert_eq!(heavy["status"], 413, "{heavy}");
        let mismatch = raw("tools/list", json!({}), vec!["--header", "Mcp-Method=tools/call"]).await;
        assert_eq!((mismatch["status"].as_i64(), code(&mismatch)), (Some(400), Some(-32020)), "{mismatch}");
        let unknown = raw("rollouts/launch", json!({}), vec![]).await;
        assert_eq!((unknown["status"].as_i64(), code(&unknown)), (Some(404), Some(-32601)), "{unknown}");
        let no_task =
            raw("tasks/get", json!({"taskId": "nope/nope/0123456789abcdef0123456789abcdef"}), vec![]).await;
        assert_eq!(code(&no_task), Some(-32602), "{no_task}");
        let rebinding = raw("tools/list", json!({}), vec!["--header", "Host=evil.example.com"]).await;
        assert_eq!(rebinding["status"], 403, "a Host outside the allow-list: {rebinding}");
        // A page on another site, through the victim's browser (no --mcp-allowed-origin is set).
        let forged = raw("tools/list", json!({}), vec!["--header", "Origin=https://evil.example.com"]).await;
        assert_eq!(forged["status"], 403, "a foreign Origin: {forged}");
        assert_eq!(forged["body"]["jsonrpc"], "2.0", "a JSON-RPC error body: {forged}");
        assert!(forged["body"]["error"]["message"].as_str().unwrap().contains("Origin"), "{forged}");
        let local = raw("tools/list", json!({}), vec!["--header", "Origin=http://localhost:6274"]).await;
        assert_eq!(local["status"], 200, "a local tool such as the Inspector: {local}");
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

async fn token(fleet: &Fleet, sa: &str, audience: &str) -> String {
    tenant::token_for(&fleet.client, &fleet.ns, sa, Some(audience)).await
}

/// `verbs` on FleetRollouts, and the right to patch Deployments that a FleetRollout of Deployments needs of
/// whoever writes it (fleetroll's admission policy checks it).
fn rollout_rights(verbs: &[&str]) -> Grant {
    Grant::rules(vec![
        rule("fleetroll.dev", &["fleetrollouts"], verbs),
        rule("apps", &["deployments"], &["patch"]),
    ])
}

/// Whether RBAC lets ServiceAccount `user` of `ns` `verb` fleetrollouts there now.
async fn may(client: &Client, user: &str, verb: &str, ns: &str) -> bool {
    let attributes = ResourceAttributes {
        group: Some("fleetroll.dev".into()),
        resource: Some("fleetrollouts".into()),
        verb: Some(verb.into()),
        namespace: Some(ns.into()),
        ..Default::default()
    };
    tenant::allowed(client, user, &tenant::serviceaccount_groups(ns), &attributes).await
}

#[tokio::test]
async fn serviceaccount_tokens_and_rbac_decide_what_an_agent_may_do() {
    with_fleet("mcp-auth", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 2, READY_IMAGE).await;
        let account = |name: &'static str| Tenant::create(&fleet.client, &fleet.ns, name, &[]);
        let (agent_sa, intruder_sa, patcher_sa) = (account("agent").await, account("intruder").await, account("patcher").await);
        // People's ID tokens from the test control plane's OpenID Connect issuer are accepted too.
        let op = Operator::start(
            &fleet.ns,
            &[
                "--auth",
                "serviceaccount",
                "--mcp-audience",
                "http://127.0.0.1:{port}/mcp",
                "--mcp-id-token-audience",
                "fleetroll-testenv",
            ],
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

        // With a Role that allows it, the same call works. The agent holds the approve verb too, but it
        // created the rollout: it is not asked, is told who may approve, and its approvals are refused.
        // A platform policy says the agent's rollouts need a first-batch approval by the OpenID Connect
        // group approvers: one without is refused, naming it.
        agent_sa.grant(&fleet.client, &rollout_rights(&["create", "get", "list", "patch", "approve"])).await;
        let agent_name = format!("system:serviceaccount:{}:agent", fleet.ns);
        let policy = format!("{}-people-approve", fleet.ns);
        let rules = json!({"subjects": {"serviceAccounts": [{"namespace": fleet.ns, "name": "agent"}]},
                           "approval": "FirstBatch", "approvers": {"groups": ["oidc:approvers"]}});
        let probe = serde_json::from_str::<Value>(&rollout_args(&fleet.ns, json!({}))).unwrap();
        let probe = json!({"image": probe["image"], "targets": probe["targets"]});
        testkit::policy::govern(&fleet.client, &fleet.ns, &policy, rules, &agent_name, probe).await;
        let agent = token(&fleet, "agent", &url).await;
        let unapproved = rollout_args(&fleet.ns, json!({}));
        let refused = drive(&["call", &url, "rollout_fleet", &unapproved, "--no-tasks", "--token", &agent]).await;
        assert_eq!(refused["isError"], true, "{refused}");
        let named = format!("FleetRollout denied by FleetRolloutPolicy {policy} (approval)");
        assert!(refused.to_string().contains(&named), "{refused}");
        let id = task_id(&drive(&["start", &url, &start, "--token", &agent]).await);
        let told = format!(
            "by someone who holds the approve verb on this rollout and did not create it ({agent_name} did), and \
             is a member of group oidc:approvers (FleetRolloutPolicy {policy})"
        );
        let self_refused = |text: &str| {
            text.contains("created this rollout and may not approve it")
                || text.contains(&format!("FleetRolloutPolicy {policy} (approvers)"))
        };
        let working = drive(&["wait", &url, &id, "--token", &agent, "--until", "working", "--message", &told]).await;
        assert_eq!(working["status"], "working", "{working}");
        assert!(working["statusMessage"].as_str().unwrap_or_default().contains(&told), "{working}");
        let name = fleet.rollouts().list(&Default::default()).await.unwrap().items.remove(0).name_any();
        let approve_args = json!({"namespace": fleet.ns, "name": name}).to_string();
        let own = drive(&["call", &url, "approve_batch", &approve_args, "--no-tasks", "--token", &agent]).await;
        assert_eq!(own["isError"], true, "{own}");
        assert!(self_refused(&own.to_string()), "{own}");
        assert_eq!(own["structuredContent"]["error"]["reason"], "Forbidden", "{own}");
        let status = fleet.rollouts().get(&name).await.unwrap().status.unwrap();
        let pending = status.pending_approval.clone().unwrap();
        // The form's key, which the agent is never shown but can work out from the status.
        let key = format!(
            "approve-r{}-b{}-{}-{}",
            status.revision_number(),
            pending.batch,
            pending.plan_hash,
            pending.gates_hash
        );
        let answer = json!({"taskId": id, "inputResponses": {key: {"action": "accept", "content": {"approve": true}}}});
        let answered = drive(&["raw", &url, "tasks/update", &answer.to_string(), "--token", &agent]).await;
        assert!(self_refused(&answered.to_string()), "{answered}");
        let error = &answered["body"]["error"];
        assert_eq!((&error["code"], &error["data"]["reason"]), (&json!(-32600), &json!("Forbidden")), "{answered}");
        assert!(fleet.rollouts().get(&name).await.unwrap().spec.approvals.is_empty(), "nothing approved");

        // One who may patch the rollout but holds no approve verb is refused before anything is written.
        patcher_sa.grant(&fleet.client, &rollout_rights(&["get", "patch"])).await;
        let patcher = token(&fleet, "patcher", &url).await;
        let unapproved = drive(&["call", &url, "approve_batch", &approve_args, "--no-tasks", "--token", &patcher]).await;
        assert!(unapproved.to_string().contains("patcher may not approve fleetrollout"), "{unapproved}");

        // A person of the cluster's OpenID Connect issuer, in the group approvers (the chart's approver role,
        // no rights over the Deployments), with her own bearer token: the TokenReview vouches for her, the
        // server acts as her, and she is the one asked.
        let alice = Person::oidc(&format!("alice-{}", fleet.ns), &["approvers"]).await;
        tenant::bind(&fleet.client, &fleet.ns, "approvers", "Group", "oidc:approvers", APPROVER_ROLE).await;
        alice.wait_allowed(&fleet.client, &fleet.ns, "fleetroll.dev", "fleetrollouts", "approve").await;
        let reviewer = alice.token.clone().unwrap();
        // What waits for each one's approval: hers, not the agent's.
        let awaiting = json!({"namespace": fleet.ns, "awaitingMyApproval": true}).to_string();
        let names = |listed: &Value| -> Vec<String> {
            let rollouts = listed["structuredContent"]["rollouts"].as_array().cloned().unwrap_or_default();
            rollouts.iter().map(|r| r["name"].as_str().unwrap_or_default().to_string()).collect()
        };
        let theirs = drive(&["call", &url, "list_rollouts", &awaiting, "--no-tasks", "--token", &reviewer]).await;
        assert_eq!(names(&theirs), std::slice::from_ref(&name), "{theirs}");
        let own = drive(&["call", &url, "list_rollouts", &awaiting, "--no-tasks", "--token", &agent]).await;
        assert_eq!(own["isError"], false, "{own}");
        assert!(names(&own).is_empty(), "{own}");
        // The task asks her (input_required, an elicitation form), and her answer approves.
        let approved = drive(&["approve", &url, &id, "--token", &reviewer]).await;
        assert_eq!(approved["ack"], json!({"resultType": "complete"}), "{approved}");
        let asked = approved["answered"][0].as_str().unwrap_or_default();
        assert!(asked.starts_with("approve-r1-b0-"), "{approved}");
        assert_eq!(approved["asked"][asked]["method"], "elicitation/create", "{approved}");
        let done = drive(&["wait", &url, &id, "--token", &agent]).await;
        assert_eq!(done["status"], "completed", "{done}");
        let fr = fleet.rollouts().list(&Default::default()).await.unwrap().items.remove(0);
        let expected = alice.username.clone();
        assert_eq!(fr.status.clone().unwrap().approvals[0].approved_by.as_deref(), Some(expected.as_str()));
        assert_eq!(fr.spec.creator.as_ref().map(|c| c.username.as_str()), Some(agent_name.as_str()));
        assert_task_secret_not_stored(&fr, &id);
        let seen = drive(&[
            "call",
            &url,
            "get_rollout",
            &json!({"namespace": fleet.ns, "name": fr.name_any()}).to_string(),
            "--no-tasks",
            "--token",
            &agent,
        ])
        .await;
        assert_eq!(seen["isError"], false, "{seen}");
        assert!(
            !seen.to_string().contains(id.rsplit('/').next().unwrap()),
            "the task token in a summary: {seen}"
        );

        // Another identity, even one allowed to read rollouts, does not see the agent's task.
        intruder_sa.grant(&fleet.client, &rollout_rights(&["get"])).await;
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

/// The task id's secret part appears nowhere on the FleetRollout, which carries only its hash.
fn assert_task_secret_not_stored(fr: &FleetRollout, task_id: &str) {
    let token = task_id.rsplit('/').next().unwrap();
    let stored = serde_json::to_string(fr).unwrap();
    assert!(!stored.contains(token), "the task token is readable on the FleetRollout: {stored}");
    assert!(fr.annotations().get("fleetroll.dev/task-token").is_none());
    assert_eq!(fr.annotations()["fleetroll.dev/task-token-sha256"].len(), 64);
}

/// The MCP server's own account for `writes_through_mcp_are_made_as_the_caller`: it may review tokens and
/// permissions, read FleetRollouts and impersonate for them (the grants `src/mcp/impersonate.rs` lists),
/// but not create or patch FleetRollouts itself.
async fn mcp_server_account(client: &Client, ns: &str, sa: &str) {
    let role = format!("{ns}-mcp-server");
    let impersonate_on: Vec<String> = ["serviceaccount", "user-info"]
        .iter()
        .flat_map(|mode| ["get", "create", "patch"].map(|verb| format!("impersonate-on:{mode}:{verb}")))
        .collect();
    let impersonate_on: Vec<&str> = impersonate_on.iter().map(String::as_str).collect();
    let rules = [
        rule("fleetroll.dev", &["fleetrollouts"], &["get", "list", "watch"]),
        rule("authentication.k8s.io", &["serviceaccounts"], &["impersonate:serviceaccount"]),
        rule("authentication.k8s.io", &["*"], &["impersonate:user-info"]),
        rule("fleetroll.dev", &["fleetrollouts"], &impersonate_on),
    ];
    let _: ClusterRole = create_owned(client, ns, json!({"metadata": {"name": role}, "rules": rules})).await;
    for (binding, to) in
        [(role.clone(), role.clone()), (format!("{role}-auth"), "system:auth-delegator".into())]
    {
        let binding = json!({
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": to},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
        });
        let _: ClusterRoleBinding = create_owned(client, ns, binding).await;
    }
}

/// An admission policy that sees who really asked: in `ns` only `user` may create or change a
/// FleetRollout (as fleetroll's own policy checks the requesting user's rights). Returns once it applies.
async fn only_this_user_may_write(fleet: &Fleet, user: &str) {
    let (client, ns) = (&fleet.client, &fleet.ns);
    let name = format!("{ns}-only-{}", user.rsplit(':').next().unwrap());
    let rules = json!([{"apiGroups": ["fleetroll.dev"], "apiVersions": ["*"],
        "operations": ["CREATE", "UPDATE"], "resources": ["fleetrollouts"]}]);
    let validation = json!({
        "expression": format!("request.userInfo.username == '{user}'"),
        "messageExpression": format!("'only {user} may write here, not ' + request.userInfo.username"),
        "reason": "Forbidden",
    });
    let spec = json!({"failurePolicy": "Fail", "matchConstraints": {"resourceRules": rules},
        "validations": [validation]});
    let _: ValidatingAdmissionPolicy =
        create_owned(client, ns, json!({"metadata": {"name": name}, "spec": spec})).await;
    let only_ns = json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}});
    let spec = json!({"policyName": name, "validationActions": ["Deny"], "matchResources": only_ns});
    let _: ValidatingAdmissionPolicyBinding =
        create_owned(client, ns, json!({"metadata": {"name": name}, "spec": spec})).await;
    // It applies once the API server has loaded it; nothing to watch for that, so try a dry-run create
    // (as the admin, whom it refuses) until it is refused, up to a deadline.
    let targets = json!({"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}});
    let probe: FleetRollout = serde_json::from_value(json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": "probe"},
        "spec": {"image": NEXT_IMAGE, "targets": targets}}))
    .unwrap();
    let dry = PostParams { dry_run: true, ..Default::default() };
    testkit::poll_until("the policy to apply", Duration::from_secs(30), || async {
        matches!(fleet.rollouts().create(&dry, &probe).await, Err(kube::Error::Api(e)) if e.message.contains("may write here"))
    })
    .await;
}

#[tokio::test]
async fn writes_through_mcp_are_made_as_the_caller() {
    with_fleet("mcp-as-caller", 0, |fleet| async move {
        let (client, ns) = (fleet.client.clone(), fleet.ns.clone());
        Tenant::create(&client, &ns, "server", &[]).await;
        let user = |sa: &str| format!("system:serviceaccount:{ns}:{sa}");
        mcp_server_account(&client, &ns, "server").await;
        // Callers: create and get (the agent may also patch) in this namespace, nothing on Deployments.
        Tenant::create(&client, &ns, "agent", &[rollout_rights(&["create", "get", "patch"])]).await;
        Tenant::create(&client, &ns, "other", &[rollout_rights(&["create", "get"])]).await;
        // A write made with the server's own identity would be refused; one made as "other" would pass RBAC.
        assert!(!may(&client, &user("server"), "create", &ns).await, "the server itself cannot create");
        assert!(!may(&client, &user("server"), "patch", &ns).await, "nor patch");
        assert!(may(&client, &user("other"), "create", &ns).await, "RBAC lets the other caller create");
        only_this_user_may_write(&fleet, &user("agent")).await;

        let kubeconfig = serviceaccount_kubeconfig(&client, &ns, "server").await.display().to_string();
        let op = Operator::start_mcp(
            &ns,
            &["--auth", "serviceaccount", "--mcp-audience", "http://127.0.0.1:{port}/mcp"],
            &[("KUBECONFIG", &kubeconfig)],
        );
        op.ready().await;
        let url = op.mcp_url();
        let call = |tool: &'static str, args: Value, token: String| {
            let url = url.clone();
            async move {
                let args = args.to_string();
                drive(&["call", &url, tool, &args, "--no-tasks", "--token", &token]).await
            }
        };
        let start = |name: &str| {
            serde_json::from_str::<Value>(&rollout_args(&ns, json!({"name": name, "paused": true}))).unwrap()
        };

        // The agent starts a rollout: created by the server's MCP field manager, as the agent (the
        // server could not have, and the policy would have refused anyone else).
        let agent = token(&fleet, "agent", &url).await;
        let started = call("rollout_fleet", start("as-agent"), agent.clone()).await;
        assert_eq!(started["isError"], false, "{started}");
        let fr = fleet.rollouts().get("as-agent").await.unwrap();
        let managers: Vec<String> = fr.managed_fields().iter().filter_map(|m| m.manager.clone()).collect();
        assert_eq!(managers, ["fleetroll-mcp"], "the MCP server's field manager made it");
        assert_eq!(fr.annotations()["fleetroll.dev/created-by"], user("agent"));

        // Its controls are patches made as the agent too.
        let which = json!({"namespace": ns, "name": "as-agent"});
        let resumed = call("resume_rollout", which, agent.clone()).await;
        assert_eq!(resumed["isError"], false, "{resumed}");
        assert_eq!(resumed["structuredContent"]["paused"], false, "{resumed}");
        // So are a task's: started with the Tasks extension, then cancelled (spec.abort).
        let args = rollout_args(&ns, json!({"idempotencyKey": "as-agent-task", "paused": true}));
        let id = task_id(&drive(&["start", &url, &args, "--token", &agent]).await);
        let cancelled = drive(&["cancel", &url, &id, "--token", &agent]).await;
        assert_eq!(cancelled["acks"][0], json!({"resultType": "complete"}), "{cancelled}");
        let fr = fleet.rollouts().get(id.split('/').nth(1).unwrap()).await.unwrap();
        assert!(fr.spec.abort, "the cancel was written");
        assert_task_secret_not_stored(&fr, &id);

        // Another caller whom RBAC allows to create, but the policy does not: the API server refuses the
        // write it sees coming from that caller, and the tool error says what it said.
        let other = token(&fleet, "other", &url).await;
        let refused = call("rollout_fleet", start("as-other"), other).await;
        assert_eq!(refused["isError"], true, "{refused}");
        let text = refused["content"][0]["text"].as_str().unwrap();
        let said = format!("only {} may write here, not {}", user("agent"), user("other"));
        assert!(text.contains(&said), "{text}");
        assert!(fleet.rollouts().get_opt("as-other").await.unwrap().is_none(), "nothing was written");
    })
    .await;
}

/// With --metrics-listen (as the chart runs it), /metrics leaves the MCP listener for a listener of its own,
/// which serves no MCP; probes answer on both.
#[tokio::test]
async fn with_metrics_listen_metrics_are_served_apart_from_mcp() {
    with_fleet("metrics-port", 0, |fleet| async move {
        for subcommand in ["operator", "mcp"] {
            let metrics_port = free_port();
            let listen = format!("127.0.0.1:{metrics_port}");
            let extra = ["--metrics-listen", listen.as_str()];
            let op = match subcommand {
                "operator" => Operator::start(&fleet.ns, &extra, &[]),
                _ => Operator::start_mcp(&fleet.ns, &extra, &[]),
            };
            op.ready().await;
            let scraped = http_get(metrics_port, "/metrics").await;
            assert!(
                status(&scraped) == Some(200) && scraped.contains("fleetroll_leader "),
                "{subcommand}: {scraped}"
            );
            for (port, path, code) in [
                (op.port, "/metrics", 404),
                (metrics_port, "/mcp", 404),
                (metrics_port, "/readyz", 200),
                (metrics_port, "/healthz", 200),
                (op.port, "/healthz", 200),
            ] {
                let got = http_get(port, path).await;
                assert_eq!(status(&got), Some(code), "{subcommand}: GET {path} on port {port}: {got}");
            }
            assert_eq!(drive(&["tools", &op.mcp_url()]).await["tools"].as_array().unwrap().len(), 9);
        }
    })
    .await;
}

#[tokio::test]
async fn without_authentication_the_server_will_not_listen_beyond_loopback() {
    for subcommand in ["operator", "mcp"] {
        let listen = format!("0.0.0.0:{}", free_port());
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fleetroll"))
            .args([subcommand, "--auth", "none", "--listen", &listen, "--fleet-namespace", "default"])
            .env("KUBECONFIG", testkit::cluster().kubeconfig)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // Were it to start, it would serve until killed: the deadline is the failure.
        let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
            .await
            .unwrap_or_else(|_| panic!("{subcommand} --auth none --listen {listen} kept running"))
            .unwrap();
        let mut stderr = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr)
            .await
            .unwrap();
        assert!(!status.success(), "{subcommand}: {status}");
        assert!(
            stderr.contains("invalid configuration") && stderr.contains("--listen 127.0.0.1:"),
            "{stderr}"
        );
    }
}

/// The "Max open files" limits (soft, hard) of process `pid`.
fn open_files_limits(pid: &str) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap().to_string();
    let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    (numbers[0].to_string(), numbers[1].to_string())
}

/// A container runtime's soft limit of file descriptors is often small: the process raises it to the hard
/// one as it starts, before its listeners size their caps from it.
#[tokio::test]
async fn the_soft_limit_of_file_descriptors_is_raised_to_the_hard_one_at_start() {
    let (_, hard) = open_files_limits("self");
    assert!(hard.parse::<u64>().is_ok_and(|h| h > 512), "a hard limit above 512 to raise to: {hard}");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    // prlimit runs the operator in its own place: the child is the operator itself.
    let mut child = tokio::process::Command::new("prlimit")
        .arg(format!("--nofile=512:{hard}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_fleetroll"))
        .args(["mcp", "--auth", "none", "--listen", &listen, "--fleet-namespace", "default"])
        .env("KUBECONFIG", testkit::cluster().kubeconfig)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    testkit::poll_until("the MCP server to answer", Duration::from_secs(30), || async {
        status(&http_get(port, "/healthz").await) == Some(200)
    })
    .await;
    let pid = child.id().unwrap().to_string();
    assert_eq!(open_files_limits(&pid), (hard.clone(), hard));
    child.kill().await.unwrap();
}
