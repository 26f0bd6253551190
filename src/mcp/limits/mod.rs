//! What keeps a flood of requests from costing this server memory or the API server requests, or from
//! refusing callers who are not part of it: bounded caches of review answers, budgets for reviews, and fair
//! shares of requests in flight and of connections, each with a deadline.
//!
//! A request is authenticated from its headers alone, before anything else is held for it. Then it is
//! charged to its caller: a slot in flight (at most [`REQUESTS_PER_CALLER`] per caller,
//! [`REQUESTS_PER_TENANT`] per tenant, [`REQUESTS_IN_FLIGHT`] in all), its connection (at most
//! [`CONNECTIONS_PER_CALLER`] per caller), its SubjectAccessReviews ([`ACCESS_REVIEWS_PER_CALLER`]); and only
//! then is its body read, within [`body_allowance`]. What no caller can be charged for is bounded apart:
//! TokenReviews of unknown tokens (at most [`REVIEW_BURST`] + [`REVIEWS_PER_SECOND`] × t in t seconds,
//! [`REVIEWS_IN_FLIGHT`] at a time), and connections that have not yet shown a token (read at once:
//! [`UNBOUND_CONNECTIONS_PER_PEER`] per address, an IPv6 /64 counted as one, [`UNBOUND_CONNECTIONS`] in all; each closed after
//! [`HEADER_READ_TIMEOUT`] without a request, or after its one request when that request is refused; an
//! address's others wait, [`UNBOUND_WAITING_PER_PEER`] of them for [`UNBOUND_WAIT`] at most).
//!
//! The numbers are constants, chosen so that normal use never meets them and the worst case is stated.

mod budget;
mod cache;
mod connections;
mod shares;

use std::time::Duration;

use axum::{
    extract::Request,
    http::{HeaderValue, StatusCode},
    middleware::Next,
    response::Response,
};
use serde_json::Value;

pub use self::budget::Rate;
pub(crate) use self::{
    budget::{CallerBudgets, ReviewBudget},
    cache::{Cached, TtlLru},
    connections::{Accepted, Caps, Connection, Connections, Serving},
    shares::{Caller, InFlight},
};

/// TokenReviews of unknown tokens at once. A review takes the API server a millisecond or two, so four
/// keep up with well over a hundred new callers a second; more would only let a flood reach it faster.
pub const REVIEWS_IN_FLIGHT: usize = 4;
/// TokenReviews of unknown tokens per second, sustained. A caller is reviewed once per token and then
/// cached, so twenty new tokens a second is far beyond what a fleet of agents needs, and small next to
/// what an API server serves (its default max-requests-inflight alone is 400).
pub const REVIEWS_PER_SECOND: f64 = 20.0;
/// Unknown tokens reviewed back to back before the rate applies: room for a burst of agents starting at once.
pub const REVIEW_BURST: f64 = 40.0;
/// How long a request waits for one of the [`REVIEWS_IN_FLIGHT`] slots before it is told to come back.
pub(crate) const REVIEW_QUEUE_WAIT: Duration = Duration::from_secs(1);

/// Identities kept (each a few hundred bytes): room for thousands of agents, and a hard bound on memory.
pub(crate) const IDENTITIES_CACHED: usize = 4096;
/// How long a TokenReview answer is trusted before the token is reviewed again (a revoked token stops
/// working within this time).
pub(crate) const IDENTITY_TTL: Duration = Duration::from_secs(30);
/// SubjectAccessReview answers kept, and for how long (an RBAC change applies within this time).
pub(crate) const DECISIONS_CACHED: usize = 8192;
pub(crate) const DECISION_TTL: Duration = Duration::from_secs(10);
/// SubjectAccessReviews one caller may cause (answers are cached for [`DECISION_TTL`], so this is a
/// caller asking about 200 distinct rollouts every 10 s); beyond, 429 with `Retry-After`.
pub const ACCESS_REVIEWS_PER_CALLER: Rate = Rate { per_second: 20.0, burst: 50.0 };
/// ... and the callers of one tenant together (see `Caller`).
pub const ACCESS_REVIEWS_PER_TENANT: Rate = Rate { per_second: 40.0, burst: 100.0 };

/// `/mcp` requests in flight at once, all callers together; beyond, 503. Far above the benchmark's 64
/// concurrent pollers, and low enough that a flood cannot pile up unbounded work (each request holds at
/// most 1 MiB of body).
pub const REQUESTS_IN_FLIGHT: usize = 256;
/// ... of one caller: an agent polls its tasks one or a few at a time; sixteen is room to spare.
pub const REQUESTS_PER_CALLER: usize = 16;
/// ... of one tenant's callers together: it takes eight tenants to fill [`REQUESTS_IN_FLIGHT`].
pub const REQUESTS_PER_TENANT: usize = 32;
/// The longest a `/mcp` request may take, everything included (TokenReview, API writes); beyond, 504.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a connection may take to send a request's headers, counted from when it opened or its previous
/// answer was sent: so also how long an idle keep-alive connection is kept.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The most a request's headers may take (431 beyond), and so the most a connection buffers before a
/// request is read (a ServiceAccount token is about a kilobyte).
pub const MAX_HEADER_BYTES: usize = 32 * 1024;
/// How long a body may take: this, plus one second per [`BODY_MIN_BYTES_PER_SECOND`] received (408
/// beyond). A body dribbled a byte at a time is cut after about five seconds; 1 MiB sent at a modest
/// 100 KiB/s arrives well within its allowance.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(5);
pub const BODY_MIN_BYTES_PER_SECOND: usize = 64 * 1024;

/// Connections open at once on a listener, at most ([`connections_for`] fewer when the process has
/// fewer file descriptors); beyond, a new one closes the oldest idle one, or is closed. Each costs a file
/// descriptor and at most [`MAX_HEADER_BYTES`] of buffer before its request is read: room for a flood
/// to be held whole (each of its connections read or waiting until cut off) rather than turned over, each
/// newcomer closing another that reconnects at once.
pub const CONNECTIONS: usize = 4096;
/// The fewest connections a listener holds, however few file descriptors the process has.
const CONNECTIONS_AT_LEAST: usize = 128;
/// File descriptors kept for what is not a listener's connection (API server clients, watches, outbound
/// requests), and the listeners a process serves (MCP, and health and metrics).
const DESCRIPTORS_KEPT: u64 = 1024;
const LISTENERS: u64 = 2;
/// Connections read at once while not yet tied to a caller (no request has authenticated on them; under
/// `--auth none`, none ever is), from all addresses...
pub const UNBOUND_CONNECTIONS: usize = 512;
/// ... and from one address: an agent needs one or a few, a flood from one address is held to this.
pub const UNBOUND_CONNECTIONS_PER_PEER: usize = 128;
/// An address's connections beyond its share wait their turn to be read, this many at most (beyond, a new
/// one is closed at once) and for this long (then closed).
pub const UNBOUND_WAITING_PER_PEER: usize = 128;
pub const UNBOUND_WAIT: Duration = HEADER_READ_TIMEOUT;
/// Connections tied to one caller (at least [`REQUESTS_PER_CALLER`], one per request in flight, with room
/// for idle ones), and to one tenant's callers together; beyond, a connection is closed after its answer.
pub const CONNECTIONS_PER_CALLER: usize = 32;
pub const CONNECTIONS_PER_TENANT: usize = 64;

/// How long a body that has so far sent `received` bytes may take in all.
pub fn body_allowance(received: usize) -> Duration {
    let per_rate = received as f64 / BODY_MIN_BYTES_PER_SECOND as f64;
    BODY_TIMEOUT + Duration::try_from_secs_f64(per_rate).unwrap_or(REQUEST_TIMEOUT)
}

/// `Retry-After` in whole seconds, at least one.
pub(crate) fn retry_after(wait: Duration) -> HeaderValue {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    HeaderValue::from(seconds.max(1))
}

/// Middleware: every `/mcp` request is answered within [`REQUEST_TIMEOUT`] (504).
pub(crate) async fn deadline(request: Request, next: Next) -> Response {
    deadline_with(REQUEST_TIMEOUT, request, next).await
}

async fn deadline_with(timeout: Duration, request: Request, next: Next) -> Response {
    match tokio::time::timeout(timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => super::auth::rpc_error(
            StatusCode::GATEWAY_TIMEOUT,
            &Value::Null,
            -32000,
            &format!("the request did not finish within {}s", timeout.as_secs()),
        ),
    }
}

/// The connections each listener may hold when the process may open `descriptors` file descriptors.
pub fn connections_for(descriptors: u64) -> usize {
    let share = descriptors.saturating_sub(DESCRIPTORS_KEPT) / LISTENERS;
    usize::try_from(share).unwrap_or(usize::MAX).clamp(CONNECTIONS_AT_LEAST, CONNECTIONS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slow_requests_get_504() {
        use tower::ServiceExt;
        let app = axum::Router::new()
            .route("/mcp", axum::routing::post(std::future::pending::<&'static str>))
            .layer(axum::middleware::from_fn(|request, next| {
                deadline_with(Duration::from_millis(50), request, next)
            }));
        let post = Request::post("/mcp").body(axum::body::Body::empty()).unwrap();
        assert_eq!(app.oneshot(post).await.unwrap().status(), StatusCode::GATEWAY_TIMEOUT);
    }

    #[test]
    fn a_body_may_take_a_few_seconds_plus_its_size_at_the_minimum_rate() {
        assert_eq!(body_allowance(0), BODY_TIMEOUT);
        assert_eq!(body_allowance(64 * 1024), BODY_TIMEOUT + Duration::from_secs(1));
        // 1 MiB at 100 KiB/s takes 10.24 s: well within the 21 s it is allowed.
        assert_eq!(body_allowance(1024 * 1024), BODY_TIMEOUT + Duration::from_secs(16));
        assert!(body_allowance(1024 * 1024) < REQUEST_TIMEOUT, "the request's deadline is the outer bound");
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after(Duration::from_millis(1)), HeaderValue::from(1u64));
        assert_eq!(retry_after(Duration::from_millis(1500)), HeaderValue::from(2u64));
        assert_eq!(retry_after(Duration::ZERO), HeaderValue::from(1u64));
    }

    #[test]
    fn a_listener_holds_what_the_processs_descriptors_allow() {
        assert_eq!(connections_for(1_048_576), CONNECTIONS);
        assert_eq!(connections_for(20_000), CONNECTIONS);
        assert_eq!(connections_for(4_096), 1_536, "a quarter kept, the rest shared by two listeners");
        assert_eq!(connections_for(1_024), CONNECTIONS_AT_LEAST);
        assert_eq!(connections_for(0), CONNECTIONS_AT_LEAST);
    }
}
