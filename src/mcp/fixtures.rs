//! The fixture tools the official MCP conformance suite calls (`greet`, `slow_compute`, `failing_job`, …),
//! built only with the `conformance` feature and served only with `--conformance-fixtures`. Their tasks are
//! in-memory (rmcp's TaskManager): they exist to exercise the protocol surface, not rollouts. Behaviour
//! follows the suite's expectations, scenario by scenario (`tests/mcp/conformance.sh` runs them;
//! `tests/it/mcp_conformance.rs` checks they pass).
// The logging fixture uses the (deprecated) logging notification on purpose.
#![allow(deprecated)]

use std::time::Duration;

use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities,
        ContentBlock, CreateTaskResult, GetTaskParams, GetTaskResult, InputRequest, InputRequests,
        InputRequiredResult, JsonObject, ListToolsResult, LoggingLevel, LoggingMessageNotificationParam,
        PaginatedRequestParams, ServerConfig, Task, Tool, UpdateTaskParams,
    },
    service::RequestContext,
    task_manager::{TaskContext, TaskExit, TaskManager, TaskOptions},
};
use serde_json::{Value, json};

use super::{FleetMcp, task::TaskId};

const NAMES: [&str; 10] = [
    "greet",
    "slow_compute",
    "failing_job",
    "protocol_error_job",
    "confirm_delete",
    "multi_input",
    "test_tool_with_task",
    "test_missing_capability",
    "test_streaming_elicitation",
    "test_logging_tool",
];

fn is_fixture(name: &str) -> bool {
    NAMES.contains(&name)
}

#[derive(Clone, Default)]
struct Fixtures {
    tasks: TaskManager,
}

fn object(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    }
}

fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(s.into())])
}

fn capabilities(v: Value) -> ClientCapabilities {
    serde_json::from_value(v).unwrap_or_default()
}

fn needs(v: Value) -> McpError {
    McpError::missing_required_client_capability(capabilities(v))
}

fn elicit(message: &str, properties: Value, required: &[&str]) -> Option<InputRequest> {
    serde_json::from_value(json!({
        "method": "elicitation/create",
        "params": {"mode": "form", "message": message,
                   "requestedSchema": {"type": "object", "properties": properties, "required": required}}
    }))
    .ok()
}

fn options() -> TaskOptions {
    TaskOptions::new().with_ttl_ms(Some(600_000)).with_poll_interval_ms(200)
}

async fn sleep_unless_cancelled(ctx: &TaskContext, secs: f64) -> Result<(), TaskExit> {
    tokio::select! {
        _ = ctx.cancelled() => Err(TaskExit::Cancelled),
        _ = tokio::time::sleep(Duration::from_secs_f64(secs.clamp(0.0, 600.0))) => Ok(()),
    }
}

fn tools() -> Vec<Tool> {
    let t = |name: &'static str, desc: &'static str, schema: Value| Tool::new(name, desc, object(schema));
    let empty = json!({"type": "object", "properties": {}});
    vec![
        t(
            "greet",
            "Conformance fixture: says hello.",
            json!({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}),
        ),
        t(
            "slow_compute",
            "Conformance fixture: a cancellable task.",
            json!({"type": "object", "properties": {"seconds": {"type": "number"}, "label": {"type": "string"}}, "required": ["seconds"]}),
        ),
        t("failing_job", "Conformance fixture: a task ending with isError.", empty.clone()),
        t("protocol_error_job", "Conformance fixture: a task ending failed.", empty.clone()),
        t(
            "confirm_delete",
            "Conformance fixture: a task asking for input.",
            json!({"type": "object", "properties": {"filename": {"type": "string"}}, "required": ["filename"]}),
        ),
        t("multi_input", "Conformance fixture: a task asking two questions.", empty.clone()),
        t("test_tool_with_task", "Conformance fixture: input first, then a task.", empty.clone()),
        t("test_missing_capability", "Conformance fixture: needs sampling.", empty.clone()),
        t("test_streaming_elicitation", "Conformance fixture: asks for input.", empty.clone()),
        t("test_logging_tool", "Conformance fixture: logs only when asked to.", empty),
    ]
}

/// The fleetroll handler with the fixtures in front: a call to a fixture tool, or about a fixture's task,
/// is the fixtures'; everything else is fleetroll's.
#[derive(Clone)]
pub struct WithFixtures {
    inner: FleetMcp,
    fixtures: Fixtures,
}

impl WithFixtures {
    pub fn new(inner: FleetMcp) -> Self {
        Self { inner, fixtures: Fixtures::default() }
    }
}

impl ServerHandler for WithFixtures {
    fn get_info(&self) -> ServerConfig {
        self.inner.get_info()
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut listed = self.inner.list_tools(request, cx).await?;
        listed.tools.extend(tools());
        Ok(listed)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if is_fixture(&request.name) {
            return self.fixtures.call(request, cx).await;
        }
        self.inner.call_tool(request, cx).await
    }

    async fn get_task(
        &self,
        p: GetTaskParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        match self.fixtures.get(&p.task_id) {
            Some(answer) => answer,
            None => self.inner.get_task(p, cx).await,
        }
    }

    async fn update_task(&self, p: UpdateTaskParams, cx: RequestContext<RoleServer>) -> Result<(), McpError> {
        match self.fixtures.update(&p) {
            Some(answer) => answer,
            None => self.inner.update_task(p, cx).await,
        }
    }

    async fn cancel_task(&self, p: CancelTaskParams, cx: RequestContext<RoleServer>) -> Result<(), McpError> {
        match self.fixtures.cancel(&p) {
            Some(answer) => answer,
            None => self.inner.cancel_task(p, cx).await,
        }
    }
}

/// A fixture's task body.
type Job = std::pin::Pin<Box<dyn std::future::Future<Output = Result<CallToolResult, TaskExit>> + Send>>;

fn need_tasks() -> McpError {
    needs(json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}))
}

impl Fixtures {
    fn spawn(
        &self,
        make: impl FnOnce(TaskContext) -> Job + Send + 'static,
    ) -> Result<CallToolResponse, McpError> {
        let task: Task = self.tasks.spawn(options(), make);
        Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
    }

    async fn call(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let client = cx.client_capabilities().unwrap_or_default();
        let tasks = client.supports_tasks();
        let args = request.arguments.clone().unwrap_or_default();
        let s = |k: &str| args.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        match request.name.as_ref() {
            "greet" => Ok(text(format!("Hello, {}!", s("name"))).into()),
            "slow_compute" => {
                let secs = args.get("seconds").and_then(Value::as_f64).unwrap_or(0.0);
                self.slow_compute(secs, s("label"), tasks).await
            }
            "failing_job" | "protocol_error_job" | "confirm_delete" | "multi_input" if !tasks => {
                Err(need_tasks())
            }
            "failing_job" => self.spawn(|ctx| {
                Box::pin(async move {
                    sleep_unless_cancelled(&ctx, 1.0).await?;
                    Ok(CallToolResult::error(vec![ContentBlock::text("failing_job always fails")]))
                })
            }),
            "protocol_error_job" => self.spawn(|ctx| {
                Box::pin(async move {
                    sleep_unless_cancelled(&ctx, 0.2).await?;
                    Err(TaskExit::Error(McpError::internal_error("protocol_error_job failed", None)))
                })
            }),
            "confirm_delete" => {
                let filename = s("filename");
                self.spawn(move |ctx| confirm_delete(ctx, filename))
            }
            "multi_input" => self.spawn(multi_input),
            "test_tool_with_task" => self.tool_with_task(&request, &client),
            "test_missing_capability" => match client.sampling {
                Some(_) => Ok(text("sampling declared").into()),
                None => Err(needs(json!({"sampling": {}}))),
            },
            "test_streaming_elicitation" => streaming_elicitation(&request, &client),
            "test_logging_tool" => {
                if cx.meta.log_level().is_some() {
                    let message = LoggingMessageNotificationParam::new(LoggingLevel::Info, json!("log line"));
                    let _ = cx.peer.notify_logging_message(message).await;
                }
                Ok(text("logging tool done").into())
            }
            other => Err(McpError::invalid_params(format!("unknown tool: {other}"), None)),
        }
    }

    /// A computation that takes `secs`: a task when the client can hold one, else a plain (slow) answer.
    async fn slow_compute(
        &self,
        secs: f64,
        label: String,
        tasks: bool,
    ) -> Result<CallToolResponse, McpError> {
        if !tasks {
            tokio::time::sleep(Duration::from_secs_f64(secs.clamp(0.0, 30.0))).await;
            return Ok(text(format!("computed {label} in {secs}s")).into());
        }
        self.spawn(move |ctx| {
            Box::pin(async move {
                sleep_unless_cancelled(&ctx, secs).await?;
                Ok(text(format!("computed {label} in {secs}s")))
            })
        })
    }

    /// Asks for a name first (multi-round-trip input), then runs a task with the answer.
    fn tool_with_task(
        &self,
        request: &CallToolRequestParams,
        client: &ClientCapabilities,
    ) -> Result<CallToolResponse, McpError> {
        if !client.supports_tasks() {
            return Err(need_tasks());
        }
        let answer = request.input_responses.as_ref().and_then(|r| r.get("user_name")).cloned();
        let Some(answer) = answer else {
            if client.elicitation.is_none() {
                return Err(needs(json!({"elicitation": {}})));
            }
            let question = elicit("What is your name?", json!({"name": {"type": "string"}}), &["name"])
                .ok_or_else(|| McpError::internal_error("fixture", None))?;
            let requests = InputRequests::from([("user_name".to_string(), question)]);
            return Ok(InputRequiredResult::new(Some(requests), Some("round-1".into())).into());
        };
        let name = answer["content"]["name"].as_str().unwrap_or("anonymous").to_string();
        self.spawn(move |ctx| {
            Box::pin(async move {
                sleep_unless_cancelled(&ctx, 0.3).await?;
                Ok(text(format!("Hello, {name}!")))
            })
        })
    }

    /// Fixture task ids are the manager's; rollout task ids have the `ns/name/token` shape.
    fn owns(id: &str) -> bool {
        TaskId::parse(id).is_none()
    }

    fn get(&self, id: &str) -> Option<Result<GetTaskResult, McpError>> {
        Self::owns(id).then(|| self.tasks.get_task(id).map(GetTaskResult::new))
    }

    fn update(&self, p: &UpdateTaskParams) -> Option<Result<(), McpError>> {
        Self::owns(&p.task_id).then(|| self.tasks.update_task(&p.task_id, p.input_responses.clone()))
    }

    fn cancel(&self, p: &CancelTaskParams) -> Option<Result<(), McpError>> {
        Self::owns(&p.task_id).then(|| self.tasks.cancel_task(&p.task_id))
    }
}

/// A task that asks whether to delete `filename`.
fn confirm_delete(ctx: TaskContext, filename: String) -> Job {
    Box::pin(async move {
        let question =
            elicit(&format!("Delete {filename}?"), json!({"confirm": {"type": "boolean"}}), &["confirm"])
                .ok_or(TaskExit::Cancelled)?;
        let answer = ctx.request_input("confirm", question).await?;
        let yes = answer["action"] == "accept" && answer["content"]["confirm"] == true;
        Ok(text(if yes { format!("deleted {filename}") } else { format!("kept {filename}") }))
    })
}

/// A task that asks two questions at once.
fn multi_input(ctx: TaskContext) -> Job {
    Box::pin(async move {
        let a = elicit("Your name?", json!({"name": {"type": "string"}}), &["name"])
            .ok_or(TaskExit::Cancelled)?;
        let b = elicit("Confirm?", json!({"confirm": {"type": "boolean"}}), &["confirm"])
            .ok_or(TaskExit::Cancelled)?;
        let (ra, rb) = tokio::join!(ctx.request_input("name", a), ctx.request_input("confirm", b));
        let (ra, rb) = (ra?, rb?);
        Ok(text(format!("name={} confirm={}", ra["content"]["name"], rb["content"]["confirm"])))
    })
}

/// Asks for input within the call (no task), then answers with what was said.
fn streaming_elicitation(
    request: &CallToolRequestParams,
    client: &ClientCapabilities,
) -> Result<CallToolResponse, McpError> {
    if client.elicitation.is_none() {
        return Err(needs(json!({"elicitation": {}})));
    }
    if let Some(r) = request.input_responses.as_ref().and_then(|r| r.get("answer")) {
        return Ok(text(format!("answer: {r}")).into());
    }
    let question = elicit("Say something", json!({"text": {"type": "string"}}), &["text"])
        .ok_or_else(|| McpError::internal_error("fixture", None))?;
    Ok(InputRequiredResult::from_input_requests(InputRequests::from([("answer".to_string(), question)]))
        .into())
}
