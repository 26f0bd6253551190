//! Who is calling, and may they? Bearer tokens are checked with a TokenReview for the MCP audience, then
//! every operation with a SubjectAccessReview for the FleetRollout verb and namespace it needs, so
//! Kubernetes RBAC decides what an agent may do (and `kubectl auth can-i` predicts it).
//!
//! The check runs as axum middleware in front of the MCP service, because its answers are HTTP statuses
//! (403 for a foreign `Origin`, 401 with a `WWW-Authenticate` challenge and Protected Resource Metadata,
//! 429 when unknown tokens arrive faster than they may be reviewed, 403); the handler checks again that
//! the operation it performs is the one that was authorized.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

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

use super::{
    limits::{
        Cached, DECISION_TTL, DECISIONS_CACHED, IDENTITIES_CACHED, IDENTITY_TTL, ReviewBudget, TtlLru,
        retry_after,
    },
    task::TaskId,
};

/// The caller, as the API server vouched for it (TokenReview `status.user`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    pub username: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Identity {
    /// The caller under `--auth none`.
    pub fn anonymous() -> Self {
        Identity {
            username: "system:anonymous".into(),
            uid: None,
            groups: vec!["system:unauthenticated".into()],
            extra: BTreeMap::new(),
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

/// `Origin` values `/mcp` accepts. Browsers send `Origin`; a page on another site reaching a server on
/// localhost or an intranet (DNS rebinding) must be refused, so any request with a foreign `Origin` is,
/// whatever else it carries. Requests without one (agents, CLIs) pass.
#[derive(Clone, Debug, Default)]
pub struct Origins {
    allowed: Vec<OriginRule>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct OriginRule {
    scheme: String,
    host: String,
    /// None: any port.
    port: Option<u16>,
}

/// (scheme, host, port) of an origin such as `https://example.com:8443` or `http://[::1]`, lowercased, with
/// the scheme's default port filled in; `*` as the port parses as None (any).
fn parse_origin(value: &str) -> Option<OriginRule> {
    let (scheme, authority) = value.trim().trim_end_matches('/').split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return None;
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && !p.contains(']') => (h, Some(p)),
        _ => (authority, None),
    };
    if host.starts_with('[') != host.ends_with(']') {
        return None;
    }
    let default = match scheme.as_str() {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    };
    let port = match port {
        Some("*") => None,
        Some(p) => Some(p.parse().ok()?),
        None => Some(default?),
    };
    Some(OriginRule { scheme, host: host.to_ascii_lowercase(), port })
}

impl Origins {
    /// The configured origins, the origin of the MCP endpoint itself, and localhost on any port.
    pub fn new(configured: &[String], resource: &str) -> Self {
        let mut allowed = Vec::new();
        for host in ["localhost", "127.0.0.1", "[::1]"] {
            for scheme in ["http", "https"] {
                allowed.push(OriginRule { scheme: scheme.into(), host: host.into(), port: None });
            }
        }
        allowed.extend(parse_origin(&super::origin(resource)));
        for value in configured {
            match parse_origin(value) {
                Some(rule) => allowed.push(rule),
                None => {
                    warn!(origin = %value, "ignoring an allowed origin that is not scheme://host[:port|:*]")
                }
            }
        }
        Self { allowed }
    }

    pub fn allows(&self, origin: &str) -> bool {
        let Some(o) = parse_origin(origin).filter(|o| o.port.is_some()) else { return false };
        self.allowed
            .iter()
            .any(|a| a.scheme == o.scheme && a.host == o.host && (a.port.is_none() || a.port == o.port))
    }
}

/// What a token turned out to be.
enum Reviewed {
    Valid(Identity),
    Invalid,
    /// Not reviewed: unknown tokens arrive faster than the budget allows; come back after this long.
    Limited(Duration),
}

/// Checks tokens and permissions against the API server, with bounded caches and a budget for reviews.
#[derive(Clone)]
pub struct Authenticator {
    client: Client,
    pub mode: Mode,
    /// Where the Protected Resource Metadata document is served.
    pub metadata_url: String,
    origins: Arc<Origins>,
    /// Only tokens the API server vouched for: invalid ones can neither grow nor evict it.
    tokens: Arc<TtlLru<[u8; 32], Identity>>,
    decisions: Arc<TtlLru<(Identity, Access), bool>>,
    budget: Arc<ReviewBudget>,
}

impl Authenticator {
    pub fn new(client: Client, mode: Mode, metadata_url: String, origins: Origins) -> Self {
        Self {
            client,
            mode,
            metadata_url,
            origins: Arc::new(origins),
            tokens: Arc::new(TtlLru::new(IDENTITIES_CACHED, IDENTITY_TTL)),
            decisions: Arc::new(TtlLru::new(DECISIONS_CACHED, DECISION_TTL)),
            budget: Arc::new(ReviewBudget::default()),
        }
    }

    /// The identity a token stands for. A token never vouched for costs a TokenReview from the budget; one
    /// vouched for before is looked at again when its answer is stale, outside the budget (only valid
    /// tokens get there, and the cache bounds how many), so a flood of bad tokens cannot lock out callers
    /// the server already knows.
    async fn authenticate(&self, token: &str, audience: &str) -> Result<Reviewed, kube::Error> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let _permit = match self.tokens.get(&digest) {
            Some(Cached::Fresh(identity)) => return Ok(Reviewed::Valid(identity)),
            Some(Cached::Stale(_)) => None,
            None => match self.budget.admit().await {
                Ok(permit) => Some(permit),
                Err(wait) => return Ok(Reviewed::Limited(wait)),
            },
        };
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
                extra: user.extra.unwrap_or_default(),
            })
        });
        Ok(match identity {
            Some(identity) => {
                self.tokens.insert(digest, identity.clone());
                Reviewed::Valid(identity)
            }
            None => {
                self.tokens.remove(&digest);
                Reviewed::Invalid
            }
        })
    }

    /// Whether RBAC allows `who` the `access`.
    async fn authorize(&self, who: &Identity, access: &Access) -> Result<bool, kube::Error> {
        let key = (who.clone(), access.clone());
        if let Some(Cached::Fresh(allowed)) = self.decisions.get(&key) {
            return Ok(allowed);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(who.username.clone()),
                uid: who.uid.clone(),
                groups: Some(who.groups.clone()),
                extra: (!who.extra.is_empty()).then(|| who.extra.clone()),
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
        self.decisions.insert(key, allowed);
        Ok(allowed)
    }
}

/// The middleware: authenticate, find what the request needs, authorize it, and hand the identity and
/// the grant to the MCP handler.
pub async fn guard(State(auth): State<Authenticator>, request: Request, next: Next) -> Response {
    // A browser page from elsewhere is refused before anything costs the API server a request.
    if let Some(origin) = request.headers().get(header::ORIGIN)
        && !origin.to_str().is_ok_and(|o| auth.origins.allows(o))
    {
        // debug, not warn: a flood of such requests must not become a flood of log lines.
        debug!(origin = ?origin, "refused a request from a foreign Origin (possible DNS rebinding)");
        return rpc_error(StatusCode::FORBIDDEN, &Value::Null, -32600, "Forbidden: Origin is not allowed");
    }
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
                Ok(Reviewed::Valid(identity)) => Some(identity),
                Ok(Reviewed::Invalid) => {
                    return unauthorized(
                        &auth,
                        Some("the token is invalid, expired, or not for this audience"),
                    );
                }
                Ok(Reviewed::Limited(wait)) => {
                    let mut response = rpc_error(
                        StatusCode::TOO_MANY_REQUESTS,
                        &Value::Null,
                        -32000,
                        "too many new tokens to review right now; retry later",
                    );
                    response.headers_mut().insert(header::RETRY_AFTER, retry_after(wait));
                    return response;
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
pub(crate) fn rpc_error(status: StatusCode, id: &Value, code: i64, message: &str) -> Response {
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

    #[test]
    fn localhost_the_endpoint_and_configured_origins_are_allowed_and_nothing_else() {
        let configured =
            ["https://app.example.com".into(), "http://dev.example.com:*".into(), "bogus".into()];
        let origins = Origins::new(&configured, "https://fleet.example.com/mcp");
        for ok in [
            "http://localhost:3000",
            "https://127.0.0.1",
            "http://[::1]:8080",
            "HTTP://LocalHost:1",
            "https://fleet.example.com",
            "https://fleet.example.com:443",
            "https://app.example.com",
            "http://dev.example.com:9999",
            "http://dev.example.com",
        ] {
            assert!(origins.allows(ok), "{ok} should be allowed");
        }
        for bad in [
            "https://evil.example.com",
            "null",
            "",
            "https://fleet.example.com:8443",
            "http://fleet.example.com",
            "https://app.example.com:444",
            "http://localhost.evil.com",
            "https://localhost@evil.com",
            "http://127.0.0.1.evil.com:80",
            "https://app.example.com/path",
            "http://[::1",
            "http://localhost:*",
            "http://localhost:99999",
        ] {
            assert!(!origins.allows(bad), "{bad} should be refused");
        }
        let audience_on_a_port = Origins::new(&[], "http://127.0.0.1:8080/mcp");
        assert!(!audience_on_a_port.allows("https://evil.example.com"));
    }

    /// A stand-in API server for TokenReviews ("good" is valid) and SubjectAccessReviews (always allowed),
    /// counting them and keeping the last SubjectAccessReview asked.
    #[derive(Clone, Default)]
    struct FakeApi {
        token_reviews: Arc<std::sync::atomic::AtomicUsize>,
        last_sar: Arc<std::sync::Mutex<Option<Value>>>,
    }

    const AUDIENCE: &str = "http://localhost/mcp";

    impl FakeApi {
        async fn start(&self) -> Client {
            use axum::routing::post;
            let reviews = self.token_reviews.clone();
            let last_sar = self.last_sar.clone();
            let app = axum::Router::new()
                .route(
                    "/apis/authentication.k8s.io/v1/tokenreviews",
                    post(move |axum::Json(review): axum::Json<Value>| {
                        reviews.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let good = review.pointer("/spec/token") == Some(&json!("good"));
                        let status = if good {
                            json!({"authenticated": true, "audiences": [AUDIENCE], "user": {
                                "username": "alice", "uid": "u-1", "groups": ["devs", "system:authenticated"],
                                "extra": {"example.com/team": ["blue"]}}})
                        } else {
                            json!({"authenticated": false, "error": "invalid token"})
                        };
                        async move {
                            (
                                StatusCode::CREATED,
                                axum::Json(json!({
                                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                                "metadata": {}, "spec": review["spec"], "status": status})),
                            )
                        }
                    }),
                )
                .route(
                    "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                    post(move |axum::Json(review): axum::Json<Value>| {
                        *last_sar.lock().unwrap() = Some(review.clone());
                        async move {
                            (
                                StatusCode::CREATED,
                                axum::Json(json!({
                                "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                                "metadata": {}, "spec": review["spec"], "status": {"allowed": true}})),
                            )
                        }
                    }),
                );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            tokio::spawn(async move { axum::serve(listener, app).await });
            Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap()
        }

        fn reviews(&self) -> usize {
            self.token_reviews.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    fn guarded(client: Client, mode: Mode) -> axum::Router {
        let auth = Authenticator::new(
            client,
            mode,
            "http://localhost/.well-known".into(),
            Origins::new(&[], AUDIENCE),
        );
        axum::Router::new()
            .route("/mcp", axum::routing::post(|| async { "ok" }))
            .layer(axum::middleware::from_fn_with_state(auth, guard))
    }

    fn call(token: Option<&str>, origin: Option<&str>) -> Request {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "get_rollout", "arguments": {"namespace": "team", "name": "web"}}});
        let mut r = Request::post("/mcp").header(header::CONTENT_TYPE, "application/json");
        if let Some(t) = token {
            r = r.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        if let Some(o) = origin {
            r = r.header(header::ORIGIN, o);
        }
        r.body(Body::from(body.to_string())).unwrap()
    }

    async fn send(app: &axum::Router, request: Request) -> Response {
        use tower::ServiceExt;
        app.clone().oneshot(request).await.unwrap()
    }

    async fn body_json(response: Response) -> Value {
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn a_foreign_origin_is_refused_before_anything_else_in_every_mode() {
        let api = FakeApi::default();
        let client = api.start().await;
        let sa = guarded(client.clone(), Mode::ServiceAccount { audience: AUDIENCE.into() });
        let open = guarded(client, Mode::None);
        for app in [&sa, &open] {
            let refused = send(app, call(Some("good"), Some("https://evil.example.com"))).await;
            assert_eq!(refused.status(), StatusCode::FORBIDDEN);
            let body = body_json(refused).await;
            assert_eq!(body["jsonrpc"], "2.0");
            assert!(body["error"]["message"].as_str().unwrap().contains("Origin"), "{body}");
        }
        assert_eq!(api.reviews(), 0, "a refused Origin costs the API server nothing");
        assert_eq!(send(&open, call(None, Some("http://localhost:5173"))).await.status(), StatusCode::OK);
        assert_eq!(send(&open, call(None, None)).await.status(), StatusCode::OK, "no Origin: not a browser");
        assert_eq!(send(&sa, call(Some("good"), Some("http://localhost"))).await.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn only_valid_tokens_are_cached_and_reviews_carry_uid_and_extra() {
        let api = FakeApi::default();
        let app = guarded(api.start().await, Mode::ServiceAccount { audience: AUDIENCE.into() });
        assert_eq!(send(&app, call(Some("good"), None)).await.status(), StatusCode::OK);
        assert_eq!(send(&app, call(Some("good"), None)).await.status(), StatusCode::OK);
        assert_eq!(api.reviews(), 1, "a valid token is reviewed once, then cached");
        let sar = api.last_sar.lock().unwrap().clone().unwrap();
        assert_eq!(sar["spec"]["uid"], "u-1");
        assert_eq!(sar["spec"]["extra"], json!({"example.com/team": ["blue"]}));
        assert_eq!(sar["spec"]["groups"], json!(["devs", "system:authenticated"]));
        for _ in 0..2 {
            assert_eq!(send(&app, call(Some("bad"), None)).await.status(), StatusCode::UNAUTHORIZED);
        }
        assert_eq!(api.reviews(), 3, "an invalid token is never cached: each try is a review");
    }

    #[tokio::test]
    async fn a_flood_of_unknown_tokens_gets_429_within_the_budget_and_known_callers_are_still_served() {
        use crate::mcp::limits::{REVIEW_BURST, REVIEWS_PER_SECOND};
        let api = FakeApi::default();
        let app = guarded(api.start().await, Mode::ServiceAccount { audience: AUDIENCE.into() });
        assert_eq!(send(&app, call(Some("good"), None)).await.status(), StatusCode::OK);
        let start = std::time::Instant::now();
        let (mut unauthorized, mut limited, mut served) = (0, 0, 0);
        for i in 0..1000 {
            let r = send(&app, call(Some(&format!("random-{i}")), None)).await;
            match r.status() {
                StatusCode::UNAUTHORIZED => unauthorized += 1,
                StatusCode::TOO_MANY_REQUESTS => {
                    assert!(r.headers().contains_key(header::RETRY_AFTER));
                    limited += 1;
                }
                other => panic!("unexpected {other}"),
            }
            if i % 10 == 0 {
                assert_eq!(send(&app, call(Some("good"), None)).await.status(), StatusCode::OK);
                served += 1;
            }
        }
        let elapsed = start.elapsed().as_secs_f64();
        let reviews = api.reviews() - 1;
        let bound = REVIEW_BURST + REVIEWS_PER_SECOND * elapsed + 1.0;
        assert_eq!(reviews, unauthorized, "every 401 was a review, and no 429 was");
        assert!((reviews as f64) <= bound, "{reviews} reviews in {elapsed:.2}s, bound {bound:.0}");
        assert!(limited > 0 && served == 100, "{limited} limited, {served} served");
    }
}
