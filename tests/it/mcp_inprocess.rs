//! The MCP handler in-process, over an in-memory duplex stream with rmcp's own client: the tool
//! catalogue and argument validation, which need no cluster (invalid calls never reach the API server).

use std::time::Duration;

use fleetroll::mcp::{FleetMcp, Options, auth::Mode};
use rmcp::{
    ServiceExt,
    model::{CallToolRequestParams, JsonObject},
};
use serde_json::{Value, json};

fn options() -> Options {
    Options {
        auth: Mode::None,
        read_only: false,
        fleet_namespace: "fleetroll-system".into(),
        retention: Duration::from_secs(3600),
        allowed_hosts: vec!["localhost".into()],
        allowed_origins: vec![],
        resource: "http://localhost/mcp".into(),
        authorization_servers: vec![],
        id_token_audiences: vec![],
        member_exec: fleetroll::mcp::ExecPolicy::never("is not run in these tests"),
        #[cfg(feature = "conformance")]
        conformance_fixtures: false,
    }
}

async fn connect() -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
    // Nothing listens here: a test that reached the API server would fail loudly.
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    let server = FleetMcp::new(kube::Client::try_from(config.clone()).unwrap(), config, &options());
    let (server_io, client_io) = tokio::io::duplex(1 << 20);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    ().serve(client_io).await.unwrap()
}

fn object(v: Value) -> JsonObject {
    v.as_object().cloned().unwrap()
}

#[tokio::test]
async fn tools_are_typed_and_annotated() {
    let client = connect().await;
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(
        names,
        [
            "rollout_fleet",
            "preview_rollout",
            "get_rollout",
            "list_rollouts",
            "pause_rollout",
            "resume_rollout",
            "approve_batch",
            "abort_rollout",
            "rollback_rollout"
        ]
    );
    for t in &tools {
        let schema = Value::Object((*t.input_schema).clone());
        assert_eq!(schema["type"], "object", "{}", t.name);
        let annotations = t.annotations.clone().unwrap();
        let read_only = matches!(t.name.as_ref(), "preview_rollout" | "get_rollout" | "list_rollouts");
        assert_eq!(annotations.read_only_hint, Some(read_only), "{}", t.name);
        assert!(t.description.as_ref().is_some_and(|d| d.len() > 20), "{}", t.name);
    }
    let rollout = Value::Object((*tools[0].input_schema).clone());
    let required: Vec<&str> =
        rollout["required"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(required, ["namespace", "image", "targets"]);
    assert!(rollout["properties"]["idempotencyKey"]["description"].as_str().unwrap().contains("same key"));
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn bad_arguments_are_tool_errors_the_caller_can_fix() {
    let client = connect().await;
    let call =
        |name: &'static str, args: Value| CallToolRequestParams::new(name).with_arguments(object(args));
    let cases = [
        (call("rollout_fleet", json!({"namespace": "team"})), "missing field `image`"),
        (
            call(
                "rollout_fleet",
                json!({"namespace": "team", "image": "web:v2", "targets": {"kind": "Pod", "selector": {}}}),
            ),
            "unknown variant `Pod`",
        ),
        (call("rollout_fleet", json!({"namespace": 7, "image": "web:v2"})), "invalid type: integer `7`"),
        (call("get_rollout", json!({"namespace": "team"})), "missing field `name`"),
        (
            call("approve_batch", json!({"namespace": "team", "name": "web", "batch": -1})),
            "invalid value: integer `-1`",
        ),
        (call("list_rollouts", json!({"namespaces": ["a"]})), "unknown field `namespaces`"),
    ];
    for (params, expected) in cases {
        let name = params.name.clone();
        let result = client.call_tool(params).await.unwrap();
        assert_eq!(result.is_error, Some(true), "{name}");
        let text = serde_json::to_value(&result.content[0]).unwrap()["text"].as_str().unwrap().to_string();
        assert!(text.starts_with("invalid arguments:") && text.contains(expected), "{name}: {text}");
    }
    let unknown = client.call_tool(CallToolRequestParams::new("drop_tables")).await;
    assert!(unknown.is_err(), "an unknown tool is a protocol error");
    client.cancel().await.unwrap();
}
