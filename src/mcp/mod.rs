//! The MCP server: Streamable HTTP (protocol 2026-07-28, and 2025-11-25 for legacy clients), stateless, with
//! the Tasks extension. A rollout started over MCP is a FleetRollout, and its task is read from that
//! resource on every `tasks/get`: any replica, after any restart, gives the same answer.

pub mod auth;
mod cache;
mod fixtures;
pub mod impersonate;
pub mod limits;
pub mod task;
pub mod tools;

use std::{sync::Arc, time::Duration};

use axum::{Json, Router, extract::State, middleware, routing::get};
use kube::Client;
use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CancelTaskParams, CreateTaskResult, GetTaskParams,
        GetTaskResult, Implementation, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
        ServerConfig, UpdateTaskParams,
    },
    service::RequestContext,
    transport::{
        StreamableHttpServerConfig, StreamableHttpService,
        streamable_http_server::session::never::NeverSessionManager,
    },
};
use serde_json::{Value, json};
use tracing::{info, warn};

use self::{
    auth::{Authenticator, Granted, Identity, Origins},
    impersonate::Writer,
    limits::InFlight,
    task::TaskId,
    tools::{ApproveArgs, ListArgs, Ops, PreviewArgs, RolloutFleetArgs, RolloutRef},
};

/// Largest request body accepted (413 beyond).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// How the MCP endpoint is set up.
#[derive(Clone, Debug)]
pub struct Options {
    pub auth: auth::Mode,
    /// Expose only the read-only tools.
    pub read_only: bool,
    /// Cross-namespace rollouts are honoured only in this namespace (for previews).
    pub fleet_namespace: String,
    /// How long a finished MCP-started rollout (and so its task) is kept.
    pub retention: Duration,
    /// Accepted `Host` headers (rmcp rejects others with 403).
    pub allowed_hosts: Vec<String>,
    /// Accepted `Origin` headers besides localhost and the origin of `resource` (the guard rejects others
    /// with 403; requests without an `Origin` pass).
    pub allowed_origins: Vec<String>,
    /// The Protected Resource Metadata document's `resource` (the canonical MCP URL) and its OAuth
    /// authorization servers.
    pub resource: String,
    pub authorization_servers: Vec<String>,
    /// Also serve the conformance suite's fixture tools (tests only).
    pub conformance_fixtures: bool,
}

/// The MCP handler. Cheap to clone; one per request in stateless mode.
#[derive(Clone)]
pub struct FleetMcp {
    ops: Ops,
    read_only: bool,
    /// `--auth none`: there are no identities, and every caller may do everything.
    auth_off: bool,
    fixtures: Option<fixtures::Fixtures>,
}

impl FleetMcp {
    /// `client` is the server's own; `config` is what it was built from, from which writes made for an
    /// authenticated caller derive a client that impersonates them.
    pub fn new(client: Client, config: kube::Config, opts: &Options) -> Self {
        let auth_off = matches!(opts.auth, auth::Mode::None);
        let writer = if auth_off { Writer::Server(client.clone()) } else { Writer::Caller(Arc::new(config)) };
        let ops = Ops {
            rollouts: cache::Rollouts::watch(client.clone()),
            writer,
            client,
            fleet_namespace: opts.fleet_namespace.clone(),
            retention_seconds: i64::try_from(opts.retention.as_secs()).unwrap_or(i64::MAX),
        };
        Self {
            ops,
            read_only: opts.read_only,
            auth_off,
            fixtures: opts.conformance_fixtures.then(fixtures::Fixtures::default),
        }
    }
}

/// The identity and grant the auth middleware attached to the HTTP request. Without them (a request that
/// did not come through the middleware: in-process, or a routing mistake) the caller is refused, unless the
/// server runs with `--auth none`, where every caller is the anonymous one with every permission.
fn caller(cx: &RequestContext<RoleServer>, auth_off: bool) -> Result<(Identity, Granted), McpError> {
    caller_of(cx.extensions.get::<axum::http::request::Parts>(), auth_off)
}

fn caller_of(
    parts: Option<&axum::http::request::Parts>,
    auth_off: bool,
) -> Result<(Identity, Granted), McpError> {
    let identity = parts.and_then(|p| p.extensions.get::<Identity>()).cloned();
    let granted = parts.and_then(|p| p.extensions.get::<Granted>()).cloned();
    match (identity, granted) {
        (Some(i), Some(g)) => Ok((i, g)),
        _ if auth_off => Ok((Identity::anonymous(), Granted::All)),
        _ => Err(McpError::invalid_request("no authenticated caller: this request was not authorized", None)),
    }
}

fn not_found() -> McpError {
    McpError::invalid_params("Failed to retrieve task: Task not found", None)
}

fn forbidden() -> McpError {
    McpError::invalid_request("this operation was not authorized for this request", None)
}

fn internal(e: impl std::fmt::Display) -> McpError {
    McpError::internal_error(format!("Kubernetes API: {e}"), None)
}

/// A write the API server (or impersonation) refused, with its reason.
fn refused(e: String) -> McpError {
    McpError::invalid_request(e, None)
}

impl ServerHandler for FleetMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tasks().build())
            .with_server_info(Implementation::new("fleetroll", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "fleetroll rolls container images across fleets of Kubernetes workloads in health-checked batches. \
                 Start with preview_rollout to see the plan, then rollout_fleet. With the Tasks extension, poll the \
                 returned task; otherwise poll get_rollout. Approvals, pauses and aborts are tools too.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut tools = tools::all(self.read_only);
        if self.fixtures.is_some() {
            tools.extend(fixtures::tools());
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if let Some(f) = &self.fixtures
            && fixtures::is_fixture(&request.name)
        {
            return f.call(request, cx).await;
        }
        let name = request.name.to_string();
        let args = request.arguments.clone().unwrap_or_default();
        if self.read_only && !tools::is_read_only(&name) {
            return Ok(tools::error(format!("{name} is not available: this server is read-only")).into());
        }
        let (who, granted) = caller(&cx, self.auth_off)?;
        // The middleware authorized exactly this operation: make sure it is the one about to run.
        if let Some(access) = auth::tool_access(&name, &Value::Object(args.clone()))
            && !granted.allows(&access)
        {
            return Err(forbidden());
        }
        let tasks = cx.client_capabilities().is_some_and(|c| c.supports_tasks());
        let result = match name.as_str() {
            "rollout_fleet" => {
                let args: RolloutFleetArgs = match tools::parse(&args) {
                    Ok(a) => a,
                    Err(e) => return Ok(tools::error(e).into()),
                };
                let started = match self.ops.start(&args, &who).await {
                    Ok(started) => started,
                    Err(e) => return Ok(tools::error(e).into()),
                };
                let fr = &started.rollout;
                info!(rollout = %format!("{}/{}", args.namespace, fr.metadata.name.clone().unwrap_or_default()), user = %who.username, replayed = started.replayed, "rollout_fleet");
                if tasks && let Some(id) = started.task() {
                    // The FleetRollout is in etcd: tasks/get on any replica finds it from now on.
                    let detailed = task::detailed(fr, &id, false, tools::now());
                    return Ok(CallToolResponse::Task(CreateTaskResult::new(detailed.task)));
                }
                tools::started_result(fr, started.replayed)
            }
            "preview_rollout" => match tools::parse::<PreviewArgs>(&args) {
                Ok(a) => self.ops.preview(&a, &who).await.unwrap_or_else(tools::error),
                Err(e) => tools::error(e),
            },
            "get_rollout" => match tools::parse::<RolloutRef>(&args) {
                Ok(r) => {
                    self.ops.get(&r).await.map(|fr| tools::summary_result(&fr)).unwrap_or_else(tools::error)
                }
                Err(e) => tools::error(e),
            },
            "list_rollouts" => match tools::parse::<ListArgs>(&args) {
                Ok(a) => self.ops.list(&a).await.unwrap_or_else(tools::error),
                Err(e) => tools::error(e),
            },
            "pause_rollout" | "resume_rollout" | "abort_rollout" | "rollback_rollout" => {
                let spec = match name.as_str() {
                    "pause_rollout" => json!({"paused": true}),
                    "resume_rollout" => json!({"paused": false}),
                    "abort_rollout" => json!({"abort": true}),
                    _ => json!({"rollback": true}),
                };
                match tools::parse::<RolloutRef>(&args) {
                    Ok(r) => self
                        .ops
                        .set(&r, spec, &who)
                        .await
                        .map(|fr| tools::summary_result(&fr))
                        .unwrap_or_else(tools::error),
                    Err(e) => tools::error(e),
                }
            }
            "approve_batch" => match tools::parse::<ApproveArgs>(&args) {
                Ok(a) => self
                    .ops
                    .approve(&a, &who)
                    .await
                    .map(|fr| tools::summary_result(&fr))
                    .unwrap_or_else(tools::error),
                Err(e) => tools::error(e),
            },
            other => return Err(McpError::invalid_params(format!("unknown tool: {other}"), None)),
        };
        Ok(result.into())
    }

    async fn get_task(
        &self,
        p: GetTaskParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        if let Some(f) = &self.fixtures
            && let Some(t) = f.get(&p.task_id)
        {
            return t;
        }
        let id = TaskId::parse(&p.task_id).ok_or_else(not_found)?;
        let (who, granted) = caller(&cx, self.auth_off)?;
        let access =
            auth::required_access("tasks/get", &json!({"taskId": p.task_id})).ok_or_else(not_found)?;
        if !granted.allows(&access) {
            return Err(forbidden());
        }
        let fr = self.ops.task_rollout(&id, &who).await.map_err(internal)?.ok_or_else(not_found)?;
        let elicitation = cx.client_capabilities().is_some_and(|c| c.elicitation.is_some());
        Ok(GetTaskResult::new(task::detailed(&fr, &id, elicitation, tools::now())))
    }

    async fn update_task(&self, p: UpdateTaskParams, cx: RequestContext<RoleServer>) -> Result<(), McpError> {
        if let Some(f) = &self.fixtures
            && let Some(r) = f.update(&p)
        {
            return r;
        }
        let id = TaskId::parse(&p.task_id).ok_or_else(not_found)?;
        let (who, granted) = caller(&cx, self.auth_off)?;
        let access =
            auth::required_access("tasks/update", &json!({"taskId": p.task_id})).ok_or_else(not_found)?;
        if !granted.allows(&access) || self.read_only {
            return Err(forbidden());
        }
        let fr = self.ops.task_rollout(&id, &who).await.map_err(internal)?.ok_or_else(not_found)?;
        let status = fr.status.clone().unwrap_or_default();
        let pending = status.pending_approval.as_ref();
        let revision = status.revision.as_ref().map_or(0, |r| r.number);
        for (key, answer) in &p.input_responses {
            // Keys that are not outstanding (answered, superseded, unknown) are ignored, as the extension asks.
            let Some((rev, batch, hash)) = task::parse_approval_key(key) else { continue };
            let outstanding =
                pending.is_some_and(|p| p.batch == batch && p.plan_hash == hash) && rev == revision;
            let accepted = answer.get("action").and_then(Value::as_str) == Some("accept")
                && answer.pointer("/content/approve").and_then(Value::as_bool) == Some(true);
            if !outstanding {
                continue;
            }
            if !accepted {
                info!(task = %p.task_id, user = %who.username, "approval declined; the rollout keeps waiting");
                continue;
            }
            let args = ApproveArgs {
                namespace: id.namespace.clone(),
                name: id.name.clone(),
                batch: Some(batch),
                plan_hash: Some(hash),
            };
            if let Err(e) = self.ops.approve(&args, &who).await {
                warn!(error = %e, user = %who.username, "approval through tasks/update failed");
                return Err(refused(e));
            }
        }
        Ok(())
    }

    async fn cancel_task(&self, p: CancelTaskParams, cx: RequestContext<RoleServer>) -> Result<(), McpError> {
        if let Some(f) = &self.fixtures
            && let Some(r) = f.cancel(&p)
        {
            return r;
        }
        let id = TaskId::parse(&p.task_id).ok_or_else(not_found)?;
        let (who, granted) = caller(&cx, self.auth_off)?;
        let access =
            auth::required_access("tasks/cancel", &json!({"taskId": p.task_id})).ok_or_else(not_found)?;
        if !granted.allows(&access) || self.read_only {
            return Err(forbidden());
        }
        let fr = self.ops.task_rollout(&id, &who).await.map_err(internal)?.ok_or_else(not_found)?;
        // Idempotent: a finished rollout, or one already asked to abort, needs nothing more.
        let terminal = fr.status.as_ref().is_some_and(|s| s.phase.is_terminal());
        if !terminal && !fr.spec.abort {
            let r = RolloutRef { namespace: id.namespace.clone(), name: id.name.clone() };
            self.ops.set(&r, json!({"abort": true}), &who).await.map_err(refused)?;
            info!(task = %p.task_id, user = %who.username, "cancel requested: abort");
        }
        Ok(())
    }
}

#[derive(Clone)]
struct Metadata {
    resource: String,
    authorization_servers: Vec<String>,
}

async fn protected_resource(State(m): State<Metadata>) -> Json<Value> {
    Json(json!({
        "resource": m.resource,
        "authorization_servers": m.authorization_servers,
        "bearer_methods_supported": ["header"],
        "resource_name": "fleetroll",
        "resource_documentation": "https://github.com/fleetroll/fleetroll#mcp",
    }))
}

/// `/mcp` (behind the request bounds and the auth middleware) and the Protected Resource Metadata
/// documents. `config` is what `client` was built from (see [`FleetMcp::new`]).
pub fn router(client: Client, config: kube::Config, opts: &Options) -> Router {
    let handler = FleetMcp::new(client.clone(), config, opts);
    let mut http = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_allowed_hosts(opts.allowed_hosts.clone());
    // Origin is checked by our guard (auth::Origins), which knows the localhost and audience rules.
    http.max_request_body_bytes = MAX_BODY_BYTES;
    let service = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(NeverSessionManager::default()),
        http,
    );
    let metadata_url = format!("{}/.well-known/oauth-protected-resource/mcp", origin(&opts.resource));
    let origins = Origins::new(&opts.allowed_origins, &opts.resource);
    let authenticator = Authenticator::new(client, opts.auth.clone(), metadata_url, origins);
    let metadata = Metadata {
        resource: opts.resource.clone(),
        authorization_servers: opts.authorization_servers.clone(),
    };
    let wellknown = Router::new()
        .route("/.well-known/oauth-protected-resource", get(protected_resource))
        .route("/.well-known/oauth-protected-resource/mcp", get(protected_resource))
        .with_state(metadata);
    Router::new()
        .nest_service("/mcp", service)
        .layer(middleware::from_fn_with_state(authenticator, auth::guard))
        .layer(middleware::from_fn_with_state(InFlight::default(), limits::bound))
        .merge(wellknown)
}

/// Why the params of a known method have the wrong shape, if they do. rmcp reads such a request as an
/// unknown method (404); the protocol wants invalid params (400, -32602), so the guard answers it first.
pub(crate) fn invalid_params(method: &str, params: Option<&Value>) -> Option<String> {
    fn check<T: serde::de::DeserializeOwned>(params: Option<&Value>) -> Option<String> {
        let params = params.cloned().unwrap_or(Value::Null);
        serde_json::from_value::<T>(params).err().map(|e| format!("Invalid params: {e}"))
    }
    match method {
        "tools/call" => check::<CallToolRequestParams>(params),
        "tasks/get" => check::<GetTaskParams>(params),
        "tasks/update" => check::<UpdateTaskParams>(params),
        "tasks/cancel" => check::<CancelTaskParams>(params),
        "tools/list" => params.and_then(|p| check::<PaginatedRequestParams>(Some(p))),
        _ => None,
    }
}

/// `scheme://host[:port]` of a URL.
fn origin(url: &str) -> String {
    match url.find("://") {
        Some(i) => {
            let rest = &url[i + 3..];
            let end = rest.find('/').unwrap_or(rest.len());
            format!("{}{}", &url[..i + 3], &rest[..end])
        }
        None => url.trim_end_matches('/').to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn params_of_the_wrong_shape_are_invalid_params() {
        let bad = json!({"name": 42, "arguments": "x"});
        assert!(super::invalid_params("tools/call", Some(&bad)).is_some());
        assert!(super::invalid_params("tasks/get", Some(&json!({"taskId": 7}))).is_some());
        assert!(super::invalid_params("tools/call", None).is_some());
        let good = json!({"name": "list_rollouts", "arguments": {}});
        assert_eq!(super::invalid_params("tools/call", Some(&good)), None);
        assert_eq!(super::invalid_params("tasks/get", Some(&json!({"taskId": "ns/r/u"}))), None);
        assert_eq!(super::invalid_params("tools/list", None), None);
        assert_eq!(super::invalid_params("x/unknown", Some(&bad)), None);
    }

    #[test]
    fn a_request_without_an_identity_is_refused_unless_authentication_is_off() {
        use super::{Granted, Identity, caller_of};
        assert!(caller_of(None, false).is_err(), "no HTTP request at all");
        let (bare, ()) = axum::http::Request::new(()).into_parts();
        assert!(caller_of(Some(&bare), false).is_err(), "an HTTP request the middleware did not see");
        let (mut only_identity, ()) = axum::http::Request::new(()).into_parts();
        only_identity.extensions.insert(Identity::anonymous());
        assert!(caller_of(Some(&only_identity), false).is_err(), "an identity without a grant");

        let (who, granted) = caller_of(None, true).unwrap();
        assert_eq!((who, granted), (Identity::anonymous(), Granted::All), "--auth none");

        let mut authorized = bare;
        let alice = Identity { username: "alice".into(), ..Identity::anonymous() };
        authorized.extensions.insert(alice.clone());
        authorized.extensions.insert(Granted::Only(None));
        assert_eq!(caller_of(Some(&authorized), false).unwrap(), (alice.clone(), Granted::Only(None)));
        assert_eq!(caller_of(Some(&authorized), true).unwrap().0, alice, "what the middleware found wins");
    }

    #[test]
    fn the_origin_of_a_url() {
        assert_eq!(super::origin("http://127.0.0.1:8080/mcp"), "http://127.0.0.1:8080");
        assert_eq!(super::origin("https://fleet.example.com/mcp"), "https://fleet.example.com");
        assert_eq!(super::origin("https://fleet.example.com"), "https://fleet.example.com");
    }
}
