//! The MCP server: Streamable HTTP (protocol 2026-07-28, and 2025-11-25 for legacy clients), stateless, with
//! the Tasks extension. A rollout started over MCP is a FleetRollout, and its task is read from that
//! resource on every `tasks/get`: any replica, after any restart, gives the same answer.
//!
//! - `handler`: the MCP methods; `tools` names the tools, `args` types their arguments, `ops` does what
//!   they ask (`preview`: what a preview may read, and as whom); `task` wraps a rollout's task ([`crate::core::task`]) for the Tasks extension;
//! - `auth`: who is calling and what they may do; `impersonate`: writes made as the caller;
//! - `cache`: FleetRollouts as a watch shows them; `limits`: what bounds a flood; `endpoint`: the URLs.

mod args;
pub mod auth;
mod cache;
mod endpoint;
#[cfg(feature = "conformance")]
mod fixtures;
mod handler;
mod impersonate;
pub mod limits;
mod ops;
mod preview;
mod task;
mod tools;

/// What member Secrets' exec credential plugins may be (for [`Options`]).
pub use crate::edge::members::ExecPolicy;

use std::{sync::Arc, time::Duration};

use axum::{Json, Router, extract::State, middleware, routing::get};
use kube::Client;
use rmcp::{
    ServerHandler,
    model::{
        CallToolRequestParams, CancelTaskParams, GetTaskParams, PaginatedRequestParams, UpdateTaskParams,
    },
    transport::{
        StreamableHttpServerConfig, StreamableHttpService,
        streamable_http_server::session::never::NeverSessionManager,
    },
};
use serde_json::{Value, json};

pub(crate) use self::endpoint::allowed_hosts;
use self::{
    auth::{Authenticator, Guard, Origins},
    impersonate::Writer,
    limits::InFlight,
    ops::Ops,
};
use crate::edge::{members::Members, plans::PlanStore};

/// Largest request body accepted (413 beyond).
pub(crate) const MAX_BODY_BYTES: usize = 256 * 1024;
/// The most JSON values one request may hold (a rollout_fleet call holds a few dozen): the body is parsed
/// into values for its checks, each tens of bytes, so a body of small numbers would otherwise cost twenty
/// times its size.
pub(crate) const MAX_BODY_VALUES: usize = 4096;

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
    /// People's ID tokens accepted besides tokens for `resource`: those whose `aud` is one of these (client
    /// IDs of an OpenID Connect issuer the API server trusts), vouched for by the API server.
    pub id_token_audiences: Vec<String>,
    /// What member Secrets' exec credential plugins may be.
    pub member_exec: ExecPolicy,
    /// Also serve the conformance suite's fixture tools (tests only).
    #[cfg(feature = "conformance")]
    pub conformance_fixtures: bool,
}

/// The MCP handler. Cheap to clone; one per request in stateless mode.
#[derive(Clone)]
pub struct FleetMcp {
    ops: Ops,
    read_only: bool,
    /// `--auth none`: there are no identities, and every caller may do everything.
    auth_off: bool,
    /// What the auth middleware checks with: the handler asks it too, whether a caller may approve.
    auth: Authenticator,
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
            client: client.clone(),
            plans: Arc::new(PlanStore::default()),
            members: Members::new(client.clone(), opts.fleet_namespace.clone())
                .with_exec(opts.member_exec.clone()),
            fleet_namespace: opts.fleet_namespace.clone(),
            retention_seconds: i64::try_from(opts.retention.as_secs()).unwrap_or(i64::MAX),
        };
        let metadata_url =
            format!("{}/.well-known/oauth-protected-resource/mcp", endpoint::origin_of(&opts.resource));
        let origins = Origins::new(&opts.allowed_origins, &opts.resource);
        let auth = Authenticator::new(client, opts.auth.clone(), metadata_url, origins)
            .accepting_people(opts.id_token_audiences.clone());
        Self { ops, read_only: opts.read_only, auth_off, auth }
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

/// `/mcp` (behind the request deadline and the auth middleware, which charges each request to its caller) and the Protected Resource Metadata
/// documents. `config` is what `client` was built from (see [`FleetMcp::new`]).
pub(crate) fn router(client: Client, config: kube::Config, opts: &Options) -> Router {
    let handler = FleetMcp::new(client, config, opts);
    let auth = handler.auth.clone();
    #[cfg(feature = "conformance")]
    if opts.conformance_fixtures {
        return routes(fixtures::WithFixtures::new(handler), auth, opts);
    }
    routes(handler, auth, opts)
}

fn routes<H: ServerHandler + Clone + Send + Sync + 'static>(
    handler: H,
    auth: Authenticator,
    opts: &Options,
) -> Router {
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
    let guard = Guard { auth, in_flight: InFlight::default() };
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
        .layer(middleware::from_fn_with_state(guard, auth::guard))
        .layer(middleware::from_fn(limits::deadline))
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
}
