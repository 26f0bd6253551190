//! Who may use the dashboard: it acts with the user's own credentials, so anything else on the machine
//! (another user, a web page in any browser tab) must not reach it. Every request must name this server
//! in its Host (a DNS-rebinding page names its own), every API call must carry the session token printed
//! at start, and every change must come from the dashboard's own page (its Origin). Every answer carries
//! the headers that keep the page itself from running anything but its own scripts.

use axum::{
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use sha2::{Digest, Sha256};

use super::{ApiError, Dash};

/// Nothing runs but the page's own scripts; it talks only to this server and cannot be framed.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The Host values a request to this server may carry: the loopback names with its port, and the address
/// it listens on when that was asked for.
pub fn allowed_hosts(listening: std::net::SocketAddr) -> Vec<String> {
    let port = listening.port();
    let mut hosts = vec![format!("127.0.0.1:{port}"), format!("localhost:{port}"), format!("[::1]:{port}")];
    let own = listening.to_string();
    if !hosts.contains(&own) {
        hosts.push(own);
    }
    hosts
}

fn host(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::HOST).and_then(|h| h.to_str().ok())
}

/// Whether the request's Host is one of `allowed` (any, when None: listening beyond loopback was asked for).
pub fn host_allowed(headers: &HeaderMap, allowed: Option<&[String]>) -> bool {
    host(headers).is_some_and(|h| allowed.is_none_or(|allowed| allowed.iter().any(|a| a == h)))
}

/// Whether `Authorization: Bearer <token>` names the session's token (compared as digests, so the time
/// taken says nothing about how much of it matched).
pub fn token_matches(headers: &HeaderMap, token: &str) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    Sha256::digest(given.as_bytes()) == Sha256::digest(token.as_bytes())
}

/// Whether a change comes from the dashboard's own page: its Origin is `http://<the Host it was sent to>`,
/// an allowed one. A request with no Origin is refused too; browsers send one with every POST a script makes.
pub fn same_origin(headers: &HeaderMap, allowed: Option<&[String]>) -> bool {
    let origin =
        headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()).and_then(|o| o.strip_prefix("http://"));
    origin.is_some_and(|o| host(headers) == Some(o)) && host_allowed(headers, allowed)
}

/// The checks above, in front of every route, and the headers on every answer.
pub async fn guard(State(dash): State<Dash>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let hosts = dash.hosts.as_deref();
    let refused = if !host_allowed(headers, hosts) {
        Some(ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            "Forbidden",
            "this server answers to 127.0.0.1 only",
        ))
    } else if request.uri().path().starts_with("/api/") && !token_matches(headers, &dash.token) {
        Some(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "the session token is missing or wrong: open the address kubectl fleetroll dashboard printed",
        ))
    } else if request.method() != Method::GET && !same_origin(headers, hosts) {
        Some(ApiError::new(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "a change must come from the dashboard's own page",
        ))
    } else {
        None
    };
    if refused.is_none() && request.uri().path().starts_with("/api/") {
        bind_to_the_session(&request);
    }
    let mut response = match refused {
        Some(e) => e.into_response(),
        None => next.run(request).await,
    };
    let h = response.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Who the connections the session's token was shown on are charged to.
const SESSION: &str = "fleetroll-dashboard-session";

/// A connection the session's token was shown on is the session's: kept open for its next calls and its
/// live stream, and never closed to make room for a connection no one has shown a token on (the session's
/// own share, 32 connections, bounds it).
fn bind_to_the_session(request: &Request) {
    if let Some(connection) = request.extensions().get::<std::sync::Arc<crate::mcp::limits::Connection>>() {
        connection.bind(&crate::mcp::limits::Caller::of(SESSION));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (k.clone(), HeaderValue::from_str(v).expect("a header value"))).collect()
    }

    #[test]
    fn only_this_servers_own_names_are_answered() {
        let hosts = allowed_hosts("127.0.0.1:8123".parse().expect("an address"));
        let hosts = Some(&hosts[..]);
        assert!(host_allowed(&headers(&[(header::HOST, "127.0.0.1:8123")]), hosts));
        assert!(host_allowed(&headers(&[(header::HOST, "localhost:8123")]), hosts));
        // A DNS-rebinding page names its own host; another port is another server.
        assert!(!host_allowed(&headers(&[(header::HOST, "evil.example:8123")]), hosts));
        assert!(!host_allowed(&headers(&[(header::HOST, "127.0.0.1:8124")]), hosts));
        assert!(!host_allowed(&HeaderMap::new(), hosts));
        // Beyond loopback, when asked for: any name the person reaches it by.
        assert!(host_allowed(&headers(&[(header::HOST, "dash.internal:8123")]), None));
    }

    #[test]
    fn the_token_must_be_sent_whole_as_a_bearer_token() {
        let token = "a".repeat(64);
        assert!(token_matches(&headers(&[(header::AUTHORIZATION, &format!("Bearer {token}"))]), &token));
        assert!(!token_matches(
            &headers(&[(header::AUTHORIZATION, &format!("Bearer {}", &token[1..]))]),
            &token
        ));
        assert!(!token_matches(&headers(&[(header::AUTHORIZATION, &token)]), &token));
        assert!(!token_matches(&HeaderMap::new(), &token));
    }

    #[test]
    fn a_change_must_come_from_the_dashboards_own_origin() {
        let hosts = allowed_hosts("127.0.0.1:8123".parse().expect("an address"));
        let hosts = Some(&hosts[..]);
        let to = |origin: &str| headers(&[(header::HOST, "127.0.0.1:8123"), (header::ORIGIN, origin)]);
        assert!(same_origin(&to("http://127.0.0.1:8123"), hosts));
        assert!(!same_origin(&to("http://evil.example"), hosts));
        assert!(!same_origin(&to("https://127.0.0.1:8123"), hosts));
        assert!(
            !same_origin(&to("http://localhost:8123"), hosts),
            "another origin, though it names this server"
        );
        assert!(!same_origin(&to("null"), hosts));
        assert!(!same_origin(&headers(&[(header::HOST, "127.0.0.1:8123")]), hosts));
        let remote =
            headers(&[(header::HOST, "dash.internal:8123"), (header::ORIGIN, "http://dash.internal:8123")]);
        assert!(same_origin(&remote, None));
        let foreign =
            headers(&[(header::HOST, "dash.internal:8123"), (header::ORIGIN, "http://evil.example")]);
        assert!(!same_origin(&foreign, None));
    }
}
