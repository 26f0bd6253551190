//! Who is calling, and may they? Bearer tokens are checked with a TokenReview for the MCP audience, then
//! every operation with a SubjectAccessReview for the FleetRollout verb and namespace it needs, so
//! Kubernetes RBAC decides what an agent may do (and `kubectl auth can-i` predicts it).
//!
//! The check runs as axum middleware in front of the MCP service, because its answers are HTTP statuses
//! (401 with a `WWW-Authenticate` challenge and Protected Resource Metadata, 403); the handler checks
//! again that the operation it performs is the one that was authorized.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    body::Body,
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{Api, Client, api::PostParams};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tracing::{debug, warn};

use super::task::TaskId;

/// The caller, as the API server vouched for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub username: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
}

impl Identity {
    /// The caller under `--auth none`.
    pub fn anonymous() -> Self {
        Identity {
            username: "system:anonymous".into(),
            uid: None,
            groups: vec!["system:unauthenticated".into()],
        }
    }
}

/// A FleetRollout permission an operation needs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Access {
    pub verb: &'static str,
    /// None: all namespaces.
    pub namespace: Option<String>,
    pub name: Option<String>,
}

/// What the request was authorized for; put in the request's extensions by the middleware.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Granted {
    /// `--auth none`: everything.
    All,
    /// Exactly this permission (or nothing, when the operation needs none).
    Only(Option<Access>),
}

impl Granted {
    pub fn allows(&self, access: &Access) -> bool {
        match self {
            Granted::All => true,
            Granted::Only(Some(granted)) => granted == access,
            Granted::Only(None) => false,
        }
    }
}

/// Which tools read, and which change.
pub fn tool_access(tool: &str, args: &Value) -> Option<Access> {
    let s = |k: &str| args.get(k).and_then(Value::as_str).map(String::from);
    let verb = match tool {
        "rollout_fleet" | "preview_rollout" => "create",
        "get_rollout" => "get",
        "list_rollouts" => "list",
        "pause_rollout" | "resume_rollout" | "approve_batch" | "abort_rollout" | "rollback_rollout" => {
            "patch"
        }
        _ => return None,
    };
    let name = match verb {
        "create" | "list" => None,
        _ => s("name"),
    };
    Some(Access { verb, namespace: s("namespace"), name })
}

/// The permission a JSON-RPC request needs, from its method and params. None: being authenticated is
/// enough (discovery, listing tools, notifications).
pub fn required_access(method: &str, params: &Value) -> Option<Access> {
    match method {
        "tools/call" => {
            let tool = params.get("name").and_then(Value::as_str)?;
            tool_access(tool, params.get("arguments").unwrap_or(&Value::Null))
        }
        "tasks/get" | "tasks/update" | "tasks/cancel" => {
            let id = TaskId::parse(params.get("taskId").and_then(Value::as_str)?)?;
            let verb = if method == "tasks/get" { "get" } else { "patch" };
            Some(Access { verb, namespace: Some(id.namespace), name: Some(id.name) })
        }
        _ => None,
    }
}

/// How the MCP endpoint authenticates callers.
#[derive(Clone, Debug)]
pub enum Mode {
    /// No authentication (local demos): every caller is `system:anonymous` and may do everything.
    None,
    /// Kubernetes ServiceAccount (or any API-server-accepted) tokens for `audience`.
    ServiceAccount { audience: String },
}

/// A bounded map whose entries expire: review answers are reused for a few seconds, not forever.
struct TtlCache<K, V> {
    ttl: Duration,
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: std::hash::Hash + Eq, V: Clone> TtlCache<K, V> {
    const LIMIT: usize = 10_000;

    fn new(ttl: Duration) -> Self {
        Self { ttl, entries: Mutex::new(HashMap::new()) }
    }

    fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.lock().ok()?;
        entries.get(key).filter(|(_, at)| at.elapsed() < self.ttl).map(|(v, _)| v.clone())
    }

    fn insert(&self, key: K, value: V) {
        if let Ok(mut entries) = self.entries.lock() {
            if entries.len() >= Self::LIMIT {
                entries.clear();
            }
            entries.insert(key, (value, Instant::now()));
        }
    }
}

/// Checks tokens and permissions against the API server, with short-lived caches.
#[derive(Clone)]
pub struct Authenticator {
    client: Client,
    pub mode: Mode,
    /// Where the Protected Resource Metadata document is served.
    pub metadata_url: String,
    tokens: Arc<TtlCache<[u8; 32], Option<Identity>>>,
    reviews: Arc<TtlCache<(String, Access), bool>>,
}

impl Authenticator {
    pub fn new(client: Client, mode: Mode, metadata_url: String) -> Self {
        let tokens = Arc::new(TtlCache::new(Duration::from_secs(30)));
        let reviews = Arc::new(TtlCache::new(Duration::from_secs(10)));
        Self { client, mode, metadata_url, tokens, reviews }
    }

    /// The identity a token stands for, or None if the API server does not vouch for it for our audience.
    async fn authenticate(&self, token: &str, audience: &str) -> Result<Option<Identity>, kube::Error> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(identity) = self.tokens.get(&digest) {
            return Ok(identity);
        }
        let review = TokenReview {
            spec: TokenReviewSpec { token: token.into(), audiences: Some(vec![audience.into()]) },
            ..Default::default()
        };
        let reviewed =
            Api::<TokenReview>::all(self.client.clone()).create(&PostParams::default(), &review).await?;
        let identity = reviewed.status.and_then(|s| {
            let for_us = s.audiences.as_ref().is_some_and(|a| a.iter().any(|x| x == audience));
            if s.authenticated != Some(true) || !for_us {
                return None;
            }
            let user = s.user?;
            Some(Identity {
                username: user.username?,
                uid: user.uid,
                groups: user.groups.unwrap_or_default(),
            })
        });
        self.tokens.insert(digest, identity.clone());
        Ok(identity)
    }

    /// Whether RBAC allows `who` the `access`.
    async fn authorize(&self, who: &Identity, access: &Access) -> Result<bool, kube::Error> {
        let key = (format!("{}|{}", who.username, who.groups.join(",")), access.clone());
        if let Some(allowed) = self.reviews.get(&key) {
            return Ok(allowed);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(who.username.clone()),
                uid: who.uid.clone(),
                groups: Some(who.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some("fleetroll.dev".into()),
                    resource: Some("fleetrollouts".into()),
                    verb: Some(access.verb.into()),
                    namespace: access.namespace.clone(),
                    name: access.name.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let reviewed = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let allowed = reviewed.status.is_some_and(|s| s.allowed);
        self.reviews.insert(key, allowed);
        Ok(allowed)
    }
}

/// The middleware: authenticate, find what the request needs, authorize it, and hand the identity and
/// the grant to the MCP handler.
pub async fn guard(State(auth): State<Authenticator>, request: Request, next: Next) -> Response {
    // Authenticate first: an anonymous caller learns nothing, not even whether its body parses.
    let identity = match &auth.mode {
        Mode::None => None,
        Mode::ServiceAccount { audience } => {
            let token = request
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(String::from);
            let Some(token) = token else { return unauthorized(&auth, None) };
            match auth.authenticate(&token, audience).await {
                Ok(Some(identity)) => Some(identity),
                Ok(None) => {
                    return unauthorized(
                        &auth,
                        Some("the token is invalid, expired, or not for this audience"),
                    );
                }
                Err(e) => {
                    warn!(error = %e, "TokenReview failed");
                    return unavailable("cannot review the token right now");
                }
            }
        }
    };
    let (mut parts, body) = request.into_parts();
    // Only POSTs carry operations; other methods are the MCP service's to answer (405).
    if parts.method != axum::http::Method::POST {
        parts.extensions.insert(identity.clone().unwrap_or_else(Identity::anonymous));
        parts.extensions.insert(if identity.is_some() { Granted::Only(None) } else { Granted::All });
        return next.run(Request::from_parts(parts, body)).await;
    }
    let limit = super::MAX_BODY_BYTES;
    let bytes = match read_body(body, limit).await {
        ReadBody::Complete(bytes) => bytes,
        ReadBody::Broken => {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                &Value::Null,
                -32600,
                "the request body could not be read",
            );
        }
        too_large => {
            let mut response = rpc_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &Value::Null,
                -32600,
                &format!("request body larger than {limit} bytes"),
            );
            if matches!(too_large, ReadBody::TooLargeUnread) {
                response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            return response;
        }
    };
    let message: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            return rpc_error(StatusCode::BAD_REQUEST, &Value::Null, -32700, &format!("Parse error: {e}"));
        }
    };
    let method = message.get("method").and_then(Value::as_str).unwrap_or("");
    if let Some(problem) = super::invalid_params(method, message.get("params")) {
        let id = message.get("id").unwrap_or(&Value::Null);
        return rpc_error(StatusCode::BAD_REQUEST, id, -32602, &problem);
    }
    let Some(identity) = identity else {
        parts.extensions.insert(Identity::anonymous());
        parts.extensions.insert(Granted::All);
        return next.run(Request::from_parts(parts, Body::from(bytes))).await;
    };
    let access = required_access(method, message.get("params").unwrap_or(&Value::Null));
    if let Some(access) = &access {
        match auth.authorize(&identity, access).await {
            Ok(true) => {}
            Ok(false) => return forbidden(&auth, &identity, access, message.get("id")),
            Err(e) => {
                warn!(error = %e, "SubjectAccessReview failed");
                return unavailable("cannot review the permission right now");
            }
        }
    }
    debug!(user = %identity.username, %method, ?access, "authorized");
    parts.extensions.insert(identity);
    parts.extensions.insert(Granted::Only(access));
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// The outcome of reading a request body under a limit.
enum ReadBody {
    Complete(axum::body::Bytes),
    /// Over the limit, and read to its end: the connection stays usable for the next request.
    TooLargeDrained,
    /// Far over the limit: not read to its end, so the connection must close.
    TooLargeUnread,
    /// The client broke off.
    Broken,
}

/// How much of an oversized body is read and thrown away, so that the client gets its 413 on a connection
/// still in step (closing mid-upload makes clients see a reset instead of the answer).
const DRAIN_BYTES: usize = 16 * 1024 * 1024;

async fn read_body(body: Body, limit: usize) -> ReadBody {
    use futures::StreamExt;
    let mut stream = body.into_data_stream();
    let mut kept = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else { return ReadBody::Broken };
        seen = seen.saturating_add(chunk.len());
        if seen > DRAIN_BYTES {
            return ReadBody::TooLargeUnread;
        }
        if seen <= limit {
            kept.extend_from_slice(&chunk);
        }
    }
    if seen > limit { ReadBody::TooLargeDrained } else { ReadBody::Complete(kept.into()) }
}

/// A JSON-RPC error response with an HTTP status.
fn rpc_error(status: StatusCode, id: &Value, code: i64, message: &str) -> Response {
    let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    (status, axum::Json(body)).into_response()
}

fn challenge(auth: &Authenticator, error: Option<&str>) -> HeaderValue {
    let mut value = format!("Bearer resource_metadata=\"{}\"", auth.metadata_url);
    if let Some(e) = error {
        value.push_str(&format!(", error=\"invalid_token\", error_description=\"{e}\""));
    }
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
}

fn unauthorized(auth: &Authenticator, error: Option<&str>) -> Response {
    let body =
        json!({"error": "unauthorized", "error_description": error.unwrap_or("a bearer token is required")});
    let mut response = (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
    response.headers_mut().insert(header::WWW_AUTHENTICATE, challenge(auth, error));
    response
}

fn forbidden(auth: &Authenticator, who: &Identity, access: &Access, id: Option<&Value>) -> Response {
    let scope = match (&access.namespace, &access.name) {
        (Some(ns), Some(name)) => format!("fleetrollout {ns}/{name}"),
        (Some(ns), None) => format!("fleetrollouts in namespace {ns}"),
        _ => "fleetrollouts in all namespaces".to_string(),
    };
    let message = format!("forbidden: {} may not {} {scope}", who.username, access.verb);
    let mut response = rpc_error(StatusCode::FORBIDDEN, id.unwrap_or(&Value::Null), -32600, &message);
    let value = format!("Bearer error=\"insufficient_scope\", resource_metadata=\"{}\"", auth.metadata_url);
    if let Ok(v) = HeaderValue::from_str(&value) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    response
}

fn unavailable(why: &str) -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"error": why}))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tool_needs_the_verb_it_uses() {
        let args = json!({"namespace": "team", "name": "web"});
        let access = |tool| tool_access(tool, &args).unwrap();
        assert_eq!(
            access("rollout_fleet"),
            Access { verb: "create", namespace: Some("team".into()), name: None }
        );
        assert_eq!(access("preview_rollout").verb, "create");
        assert_eq!(
            access("get_rollout"),
            Access { verb: "get", namespace: Some("team".into()), name: Some("web".into()) }
        );
        assert_eq!(
            access("list_rollouts"),
            Access { verb: "list", namespace: Some("team".into()), name: None }
        );
        for tool in ["pause_rollout", "resume_rollout", "approve_batch", "abort_rollout", "rollback_rollout"]
        {
            assert_eq!(
                access(tool),
                Access { verb: "patch", namespace: Some("team".into()), name: Some("web".into()) }
            );
        }
        assert_eq!(tool_access("greet", &args), None);
        assert_eq!(tool_access("list_rollouts", &json!({})).unwrap().namespace, None, "all namespaces");
    }

    #[test]
    fn task_methods_need_access_to_the_rollout_they_name() {
        let id = "team/web/0123456789abcdef0123456789abcdef";
        let get = required_access("tasks/get", &json!({"taskId": id})).unwrap();
        assert_eq!(get, Access { verb: "get", namespace: Some("team".into()), name: Some("web".into()) });
        assert_eq!(required_access("tasks/cancel", &json!({"taskId": id})).unwrap().verb, "patch");
        assert_eq!(required_access("tasks/update", &json!({"taskId": id})).unwrap().verb, "patch");
        assert_eq!(required_access("tasks/get", &json!({"taskId": "nonsense"})), None);
        assert_eq!(required_access("tools/list", &json!({})), None);
        assert_eq!(required_access("server/discover", &Value::Null), None);
    }

    #[test]
    fn a_grant_covers_exactly_what_was_reviewed() {
        let a = Access { verb: "get", namespace: Some("team".into()), name: Some("web".into()) };
        let b = Access { verb: "patch", ..a.clone() };
        assert!(Granted::All.allows(&b));
        assert!(Granted::Only(Some(a.clone())).allows(&a));
        assert!(!Granted::Only(Some(a)).allows(&b));
        assert!(!Granted::Only(None).allows(&b));
    }
}
