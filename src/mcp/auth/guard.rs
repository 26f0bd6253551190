//! The middleware in front of `/mcp`. Its answers are HTTP statuses: 403 for a foreign `Origin`, 401
//! with a `WWW-Authenticate` challenge and Protected Resource Metadata, 429 when unknown tokens arrive
//! faster than they may be reviewed (or a caller asks for more permission checks than its budget), 503 when
//! the caller's share of requests in flight is taken, 408 for a body too slow and 413 for one over the
//! limit, 403 for an operation RBAC does not allow. What passes reaches the MCP handler with the caller's
//! identity and exactly what it was granted.
//!
//! The order is what keeps one caller from refusing another: nothing is held for a request before its
//! headers have said who sends it, and from then on it is charged to that caller (see `limits`). A request
//! refused before its body is read is answered with `Connection: close`, so that an unauthenticated
//! connection lasts one request.

use std::{sync::Arc, time::Duration};

use axum::{
    body::{Body, Bytes},
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header, request::Parts},
    middleware::Next,
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};
use tracing::{debug, warn};

use super::{
    Access, Authenticator, Granted, Identity, Mode, required_access,
    review::{Decision, Reviewed},
};
use crate::mcp::{
    MAX_BODY_BYTES, MAX_BODY_VALUES, invalid_params,
    limits::{Caller, Connection, InFlight, body_allowance, retry_after},
};

/// What the middleware needs: who callers are and what they may do, and their shares of requests in flight.
#[derive(Clone)]
pub struct Guard {
    pub auth: Authenticator,
    pub in_flight: InFlight,
}

/// The middleware: authenticate from the headers, charge the caller a slot and its connection, read the
/// body, authorize the operation, and hand the identity and the grant to the MCP handler.
pub async fn guard(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    let auth = &guard.auth;
    if let Some(refused) = foreign_origin(auth, request.headers()) {
        return closing(refused);
    }
    // Authenticate first: an anonymous caller holds nothing and learns nothing, not even whether its body
    // parses.
    let identity = match authenticate(auth, request.headers()).await {
        Ok(identity) => identity,
        Err(refused) => return closing(*refused),
    };
    let caller = identity.as_ref().map(|i| Caller::of(&i.username));
    let Some(_slot) = guard.in_flight.take(caller.as_ref()) else {
        let mut response = rpc_error(
            StatusCode::SERVICE_UNAVAILABLE,
            &Value::Null,
            -32000,
            "the server is busy: too many requests in flight for this caller",
        );
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(1u64));
        return closing(response);
    };
    // A connection beyond the caller's share serves this request and closes. Under `--auth none` there is
    // no caller to charge: the connection stays open, still charged to its (loopback) address.
    let keep = match (request.extensions().get::<Arc<Connection>>(), &caller) {
        (Some(connection), Some(caller)) => connection.bind(caller),
        (Some(connection), None) => {
            connection.keep();
            true
        }
        (None, _) => true,
    };
    let response = admitted(auth, identity, request, next).await;
    if keep { response } else { closing(response) }
}

/// The request once its caller holds a slot: its body, the operation's authorization, the handler.
async fn admitted(
    auth: &Authenticator,
    identity: Option<Identity>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    // Only POSTs carry operations; other methods are the MCP service's to answer (405).
    if parts.method != Method::POST {
        let granted = if identity.is_some() { Granted::Only(None) } else { Granted::All };
        return pass(next, parts, body, identity.unwrap_or_else(Identity::anonymous), granted).await;
    }
    let (bytes, message) = match read_message(body).await {
        Ok(read) => read,
        Err(refused) => return *refused,
    };
    let Some(identity) = identity else {
        return pass(next, parts, Body::from(bytes), Identity::anonymous(), Granted::All).await;
    };
    let method = message.get("method").and_then(Value::as_str).unwrap_or("");
    let access = required_access(method, message.get("params").unwrap_or(&Value::Null));
    if let Some(access) = &access {
        match auth.authorize(&identity, access).await {
            Ok(Decision::Allowed) => {}
            Ok(Decision::Denied) => return forbidden(auth, &identity, access, message.get("id")),
            Ok(Decision::Limited(wait)) => {
                return too_many(wait, "too many permission checks for this caller right now; retry later");
            }
            Err(e) => {
                warn!(error = %e, "SubjectAccessReview failed");
                return unavailable("cannot review the permission right now");
            }
        }
    }
    debug!(user = %identity.username, %method, ?access, "authorized");
    pass(next, parts, Body::from(bytes), identity, Granted::Only(access)).await
}

/// `response`, and the connection it goes out on closes after it.
fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// 429 with `Retry-After`.
fn too_many(wait: Duration, message: &str) -> Response {
    let mut response = rpc_error(StatusCode::TOO_MANY_REQUESTS, &Value::Null, -32000, message);
    response.headers_mut().insert(header::RETRY_AFTER, retry_after(wait));
    response
}

/// Hands the request on, with who is calling and what they were granted.
async fn pass(next: Next, mut parts: Parts, body: Body, identity: Identity, granted: Granted) -> Response {
    parts.extensions.insert(identity);
    parts.extensions.insert(granted);
    next.run(Request::from_parts(parts, body)).await
}

/// A browser page from elsewhere is refused before anything costs the API server a request.
fn foreign_origin(auth: &Authenticator, headers: &HeaderMap) -> Option<Response> {
    let origin = headers.get(header::ORIGIN)?;
    if origin.to_str().is_ok_and(|o| auth.origins.allows(o)) {
        return None;
    }
    // debug, not warn: a flood of such requests must not become a flood of log lines.
    debug!(origin = ?origin, "refused a request from a foreign Origin (possible DNS rebinding)");
    Some(rpc_error(StatusCode::FORBIDDEN, &Value::Null, -32600, "Forbidden: Origin is not allowed"))
}

/// The caller a bearer token stands for (None under `--auth none`), or the answer refusing it.
async fn authenticate(auth: &Authenticator, headers: &HeaderMap) -> Result<Option<Identity>, Box<Response>> {
    let Mode::ServiceAccount { audience } = &auth.mode else { return Ok(None) };
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let Some(token) = token else { return Err(Box::new(unauthorized(auth, None))) };
    match auth.authenticate(token, audience).await {
        Ok(Reviewed::Valid(identity)) => Ok(Some(identity)),
        Ok(Reviewed::Invalid) => {
            Err(Box::new(unauthorized(auth, Some("the token is invalid, expired, or not for this audience"))))
        }
        Ok(Reviewed::Limited(wait)) => {
            Err(Box::new(too_many(wait, "too many new tokens to review right now; retry later")))
        }
        Err(e) => {
            warn!(error = %e, "TokenReview failed");
            Err(Box::new(unavailable("cannot review the token right now")))
        }
    }
}

/// The body, read within the limit, and the JSON-RPC message in it, with params of the right shape.
async fn read_message(body: Body) -> Result<(Bytes, Value), Box<Response>> {
    let refuse = |status, code, message: &str| Box::new(rpc_error(status, &Value::Null, code, message));
    let bytes = match read_body(body, MAX_BODY_BYTES).await {
        ReadBody::Complete(bytes) => bytes,
        ReadBody::Broken => {
            return Err(refuse(StatusCode::BAD_REQUEST, -32600, "the request body could not be read"));
        }
        ReadBody::TooSlow => {
            let message = "the request body arrived too slowly";
            return Err(Box::new(closing(*refuse(StatusCode::REQUEST_TIMEOUT, -32600, message))));
        }
        too_large => {
            let message = format!("request body larger than {MAX_BODY_BYTES} bytes");
            let mut response = refuse(StatusCode::PAYLOAD_TOO_LARGE, -32600, &message);
            if matches!(too_large, ReadBody::TooLargeUnread) {
                response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            return Err(response);
        }
    };
    if !crate::edge::answers::Bound::document(MAX_BODY_BYTES, MAX_BODY_VALUES).holds(&bytes) {
        let message = format!("the request holds more than {MAX_BODY_VALUES} JSON values");
        return Err(refuse(StatusCode::PAYLOAD_TOO_LARGE, -32600, &message));
    }
    let message: Value = serde_json::from_slice(&bytes)
        .map_err(|e| refuse(StatusCode::BAD_REQUEST, -32700, &format!("Parse error: {e}")))?;
    let method = message.get("method").and_then(Value::as_str).unwrap_or("");
    if let Some(problem) = invalid_params(method, message.get("params")) {
        let id = message.get("id").unwrap_or(&Value::Null);
        return Err(Box::new(rpc_error(StatusCode::BAD_REQUEST, id, -32602, &problem)));
    }
    Ok((bytes, message))
}

/// The outcome of reading a request body under a limit.
enum ReadBody {
    Complete(Bytes),
    /// Over the limit, and read to its end: the connection stays usable for the next request.
    TooLargeDrained,
    /// Far over the limit: not read to its end, so the connection must close.
    TooLargeUnread,
    /// The client broke off.
    Broken,
    /// Slower than [`body_allowance`]: not read to its end, so the connection must close.
    TooSlow,
}

/// How much of an oversized body is read and thrown away, so that the client gets its 413 on a connection
/// still in step (closing mid-upload makes clients see a reset instead of the answer).
const DRAIN_BYTES: usize = 16 * 1024 * 1024;

/// Reads a body within `limit` bytes and [`body_allowance`], which grows with what has arrived: a few
/// seconds, plus time at a minimum rate.
async fn read_body(body: Body, limit: usize) -> ReadBody {
    read_body_within(body, limit, body_allowance).await
}

/// [`read_body`], with the time allowed for `n` bytes received given by `allowance(n)`.
async fn read_body_within(body: Body, limit: usize, allowance: impl Fn(usize) -> Duration) -> ReadBody {
    use futures::StreamExt;
    let started = tokio::time::Instant::now();
    let mut stream = body.into_data_stream();
    let mut kept = Vec::new();
    let mut seen = 0usize;
    loop {
        let next = tokio::time::timeout_at(started + allowance(seen), stream.next()).await;
        let chunk = match next {
            Err(_) => return ReadBody::TooSlow,
            Ok(None) => break,
            Ok(Some(chunk)) => chunk,
        };
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
pub fn rpc_error(status: StatusCode, id: &Value, code: i64, message: &str) -> Response {
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
mod tests;
