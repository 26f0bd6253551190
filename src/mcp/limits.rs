//! What keeps a flood of requests from costing this server memory or the API server requests: bounded
//! caches of review answers, a budget for TokenReviews of tokens never seen before, and a cap on the
//! `/mcp` requests in flight, each with a deadline.
//!
//! The numbers are constants, chosen so that normal use never meets them and the worst case is stated:
//! whatever anyone sends, this server makes at most [`REVIEW_BURST`] + [`REVIEWS_PER_SECOND`] × t
//! TokenReviews for unknown tokens in t seconds, at most [`REVIEWS_IN_FLIGHT`] at a time.

use std::{
    hash::Hash,
    num::NonZeroUsize,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::Response,
};
use lru::LruCache;
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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

/// `/mcp` requests in flight at once; beyond, 503. Far above the benchmark's 64 concurrent pollers, and
/// low enough that a flood cannot pile up unbounded work (each request holds at most 1 MiB of body).
pub(crate) const REQUESTS_IN_FLIGHT: usize = 256;
/// The longest a `/mcp` request may take, everything included (TokenReview, API writes); beyond, 504.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A value as a cache holds it: fresh, or known but due for another look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Cached<V> {
    Fresh(V),
    Stale(V),
}

/// A least-recently-used map of bounded size whose entries go stale after a TTL. Stale entries are kept
/// (until evicted) so that a caller can tell "seen before, look again" from "never seen".
pub(crate) struct TtlLru<K: Hash + Eq, V> {
    ttl: Duration,
    entries: Mutex<LruCache<K, (V, Instant)>>,
}

impl<K: Hash + Eq, V: Clone> TtlLru<K, V> {
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        Self { ttl, entries: Mutex::new(LruCache::new(capacity)) }
    }

    pub fn get(&self, key: &K) -> Option<Cached<V>> {
        self.get_at(key, Instant::now())
    }

    fn get_at(&self, key: &K, now: Instant) -> Option<Cached<V>> {
        let mut entries = self.entries.lock().ok()?;
        let (value, at) = entries.get(key)?;
        let fresh = now.saturating_duration_since(*at) < self.ttl;
        Some(if fresh { Cached::Fresh(value.clone()) } else { Cached::Stale(value.clone()) })
    }

    pub fn insert(&self, key: K, value: V) {
        self.insert_at(key, value, Instant::now());
    }

    fn insert_at(&self, key: K, value: V, now: Instant) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.put(key, (value, now));
        }
    }

    pub fn remove(&self, key: &K) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.pop(key);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().map_or(0, |e| e.len())
    }
}

/// A token bucket: `rate` tokens a second, at most `burst` saved up.
pub(crate) struct TokenBucket {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    pub fn new(rate: f64, burst: f64) -> Self {
        Self::new_at(rate, burst, Instant::now())
    }

    fn new_at(rate: f64, burst: f64, now: Instant) -> Self {
        Self { rate, burst, state: Mutex::new((burst, now)) }
    }

    /// Takes a token, or says how long until one is there.
    pub fn take(&self) -> Result<(), Duration> {
        self.take_at(Instant::now())
    }

    fn take_at(&self, now: Instant) -> Result<(), Duration> {
        let Ok(mut state) = self.state.lock() else { return Err(Duration::from_secs(1)) };
        let (tokens, last) = *state;
        let tokens = (tokens + now.saturating_duration_since(last).as_secs_f64() * self.rate).min(self.burst);
        if tokens >= 1.0 {
            *state = (tokens - 1.0, now);
            Ok(())
        } else {
            *state = (tokens, now);
            Err(Duration::from_secs_f64((1.0 - tokens) / self.rate))
        }
    }
}

/// The budget for TokenReviews of tokens not in the cache.
pub(crate) struct ReviewBudget {
    rate: TokenBucket,
    slots: Arc<Semaphore>,
}

impl Default for ReviewBudget {
    fn default() -> Self {
        Self::new(REVIEWS_PER_SECOND, REVIEW_BURST, REVIEWS_IN_FLIGHT)
    }
}

impl ReviewBudget {
    pub fn new(rate: f64, burst: f64, in_flight: usize) -> Self {
        Self { rate: TokenBucket::new(rate, burst), slots: Arc::new(Semaphore::new(in_flight)) }
    }

    /// A permit for one TokenReview (held while it runs), or how long to wait before trying again.
    pub async fn admit(&self) -> Result<OwnedSemaphorePermit, Duration> {
        self.rate.take()?;
        match tokio::time::timeout(REVIEW_QUEUE_WAIT, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(Duration::from_secs(1)),
        }
    }
}

/// `Retry-After` in whole seconds, at least one.
pub(crate) fn retry_after(wait: Duration) -> HeaderValue {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    HeaderValue::from(seconds.max(1))
}

/// The cap on `/mcp` requests in flight.
#[derive(Clone)]
pub(crate) struct InFlight(Arc<Semaphore>);

impl Default for InFlight {
    fn default() -> Self {
        Self::new(REQUESTS_IN_FLIGHT)
    }
}

impl InFlight {
    pub fn new(limit: usize) -> Self {
        Self(Arc::new(Semaphore::new(limit)))
    }
}

/// Middleware: at most [`REQUESTS_IN_FLIGHT`] requests at once (503 beyond, at once: queueing would only
/// hold connections open), each answered within [`REQUEST_TIMEOUT`] (504).
pub(crate) async fn bound(State(in_flight): State<InFlight>, request: Request, next: Next) -> Response {
    bound_with(in_flight, REQUEST_TIMEOUT, request, next).await
}

async fn bound_with(in_flight: InFlight, timeout: Duration, request: Request, next: Next) -> Response {
    let Ok(_permit) = in_flight.0.try_acquire_owned() else {
        let mut response = super::auth::rpc_error(
            StatusCode::SERVICE_UNAVAILABLE,
            &Value::Null,
            -32000,
            "the server is busy: too many requests in flight",
        );
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(1u64));
        return response;
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_holds_a_bounded_number_of_entries_and_evicts_the_least_recently_used() {
        let cache = TtlLru::new(2, Duration::from_secs(30));
        cache.insert("a", 1);
        cache.insert("b", 2);
        assert_eq!(cache.get(&"a"), Some(Cached::Fresh(1)), "a is now the most recently used");
        cache.insert("c", 3);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(&"b"), None, "b was the least recently used");
        assert_eq!(cache.get(&"a"), Some(Cached::Fresh(1)));
        assert_eq!(cache.get(&"c"), Some(Cached::Fresh(3)));
        cache.remove(&"a");
        assert_eq!(cache.get(&"a"), None);
    }

    #[test]
    fn entries_go_stale_after_the_ttl_but_are_still_known() {
        let cache = TtlLru::new(8, Duration::from_secs(30));
        let t0 = Instant::now();
        cache.insert_at("k", 7, t0);
        assert_eq!(cache.get_at(&"k", t0 + Duration::from_secs(29)), Some(Cached::Fresh(7)));
        assert_eq!(cache.get_at(&"k", t0 + Duration::from_secs(30)), Some(Cached::Stale(7)));
        cache.insert_at("k", 8, t0 + Duration::from_secs(31));
        assert_eq!(cache.get_at(&"k", t0 + Duration::from_secs(32)), Some(Cached::Fresh(8)));
    }

    #[test]
    fn the_bucket_allows_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let bucket = TokenBucket::new_at(20.0, 40.0, t0);
        for i in 0..40 {
            assert_eq!(bucket.take_at(t0), Ok(()), "burst token {i}");
        }
        let wait = bucket.take_at(t0).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_millis(50), "{wait:?}");
        // One second later: exactly the rate's worth, not more.
        let t1 = t0 + Duration::from_secs(1);
        let allowed = (0..100).filter(|_| bucket.take_at(t1).is_ok()).count();
        assert_eq!(allowed, 20);
        // A long pause saves up no more than the burst.
        let t2 = t1 + Duration::from_secs(3600);
        let allowed = (0..100).filter(|_| bucket.take_at(t2).is_ok()).count();
        assert_eq!(allowed, 40);
    }

    #[test]
    fn over_a_flood_the_bucket_admits_burst_plus_rate_times_time() {
        let t0 = Instant::now();
        let bucket = TokenBucket::new_at(REVIEWS_PER_SECOND, REVIEW_BURST, t0);
        // 10,000 attempts spread over 5 s.
        let admitted = (0..10_000u64)
            .filter(|i| bucket.take_at(t0 + Duration::from_micros(i * 500)).is_ok())
            .count() as f64;
        let bound = REVIEW_BURST + REVIEWS_PER_SECOND * 5.0;
        assert!(admitted <= bound && admitted >= bound - 1.0, "{admitted} admitted, bound {bound}");
    }

    #[tokio::test]
    async fn the_review_budget_caps_concurrency_and_rate() {
        let budget = ReviewBudget::new(1000.0, 3.0, 2);
        let a = budget.admit().await.unwrap();
        let _b = budget.admit().await.unwrap();
        // Both slots are taken: the third waits REVIEW_QUEUE_WAIT (1 s), then is told to retry.
        assert_eq!(budget.admit().await.unwrap_err(), Duration::from_secs(1));
        drop(a);
        assert!(budget.admit().await.is_ok(), "a freed slot is taken again");
        // The rate: with the bucket empty, a request is refused at once, slots or not.
        let budget = ReviewBudget::new(0.001, 1.0, 8);
        let _ok = budget.admit().await.unwrap();
        let refused = budget.admit().await.unwrap_err();
        assert!(refused > Duration::from_secs(900), "{refused:?}: the wait until the next token");
    }

    /// A router whose handler waits until told to answer.
    fn gated(limit: usize, timeout: Duration, gate: Arc<tokio::sync::Semaphore>) -> (axum::Router, InFlight) {
        let in_flight = InFlight::new(limit);
        let slots = in_flight.clone();
        let app = axum::Router::new()
            .route(
                "/mcp",
                axum::routing::post(move || {
                    let gate = gate.clone();
                    async move {
                        let _ = gate.acquire().await;
                        "ok"
                    }
                }),
            )
            .layer(axum::middleware::from_fn(move |request, next| {
                bound_with(in_flight.clone(), timeout, request, next)
            }));
        (app, slots)
    }

    fn post() -> Request {
        Request::post("/mcp").body(axum::body::Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn requests_beyond_the_cap_get_503_with_retry_after_and_slow_ones_504() {
        use tower::ServiceExt;
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let (app, slots) = gated(2, Duration::from_secs(3600), gate.clone());
        let first = tokio::spawn(app.clone().oneshot(post()));
        let second = tokio::spawn(app.clone().oneshot(post()));
        // Wait (on the condition, not a clock) until both hold their slot.
        while slots.0.available_permits() > 0 {
            tokio::task::yield_now().await;
        }
        let busy = app.clone().oneshot(post()).await.unwrap();
        assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(busy.headers()[header::RETRY_AFTER], "1");
        gate.add_permits(2);
        assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
        assert_eq!(second.await.unwrap().unwrap().status(), StatusCode::OK);
        gate.add_permits(1);
        assert_eq!(app.oneshot(post()).await.unwrap().status(), StatusCode::OK, "slots are given back");

        let never = Arc::new(tokio::sync::Semaphore::new(0));
        let slow = gated(2, Duration::from_millis(50), never).0.oneshot(post()).await.unwrap();
        assert_eq!(slow.status(), StatusCode::GATEWAY_TIMEOUT);
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after(Duration::from_millis(1)), HeaderValue::from(1u64));
        assert_eq!(retry_after(Duration::from_millis(1500)), HeaderValue::from(2u64));
        assert_eq!(retry_after(Duration::ZERO), HeaderValue::from(1u64));
    }
}
