//! The middleware against a stand-in API server: what each kind of request is answered, and what it costs
//! the API server.

use std::sync::Arc;

use axum::{
    body::Body,
    extract::Request,
    http::{StatusCode, header},
    response::Response,
};
use kube::Client;
use serde_json::{Value, json};

use super::{Guard, guard};
use crate::mcp::{
    auth::{Authenticator, Mode, Origins},
    limits::InFlight,
};

/// A stand-in API server for TokenReviews ("good" is alice, "sa:<namespace>:<name>" that ServiceAccount,
/// anything else invalid) and SubjectAccessReviews (always allowed), counting them and keeping the last
/// SubjectAccessReview asked.
#[derive(Clone, Default)]
struct FakeApi {
    token_reviews: Arc<std::sync::atomic::AtomicUsize>,
    access_reviews: Arc<std::sync::atomic::AtomicUsize>,
    last_sar: Arc<std::sync::Mutex<Option<Value>>>,
}

const AUDIENCE: &str = "http://localhost/mcp";

impl FakeApi {
    async fn start(&self) -> Client {
        use axum::routing::post;
        let reviews = self.token_reviews.clone();
        let last_sar = self.last_sar.clone();
        let access_reviews = self.access_reviews.clone();
        let app = axum::Router::new()
            .route(
                "/apis/authentication.k8s.io/v1/tokenreviews",
                post(move |axum::Json(review): axum::Json<Value>| {
                    reviews.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let token = review.pointer("/spec/token").and_then(Value::as_str).unwrap_or("");
                    let status = if token == "good" {
                        json!({"authenticated": true, "audiences": [AUDIENCE], "user": {
                            "username": "alice", "uid": "u-1", "groups": ["devs", "system:authenticated"],
                            "extra": {"example.com/team": ["blue"]}}})
                    } else if let Some(sa) = token.strip_prefix("sa:") {
                        json!({"authenticated": true, "audiences": [AUDIENCE], "user": {
                            "username": format!("system:serviceaccount:{sa}"), "uid": sa}})
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
                    access_reviews.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
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
    let auth =
        Authenticator::new(client, mode, "http://localhost/.well-known".into(), Origins::new(&[], AUDIENCE));
    let guard_state = Guard { auth, in_flight: InFlight::default() };
    axum::Router::new()
        .route("/mcp", axum::routing::post(|| async { "ok" }))
        .layer(axum::middleware::from_fn_with_state(guard_state, guard))
}

fn call(token: Option<&str>, origin: Option<&str>) -> Request {
    call_for(token, origin, "web")
}

/// `get_rollout` of `name` in namespace `team`.
fn call_for(token: Option<&str>, origin: Option<&str>, name: &str) -> Request {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "get_rollout", "arguments": {"namespace": "team", "name": name}}});
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

#[tokio::test]
async fn refusals_before_the_body_is_read_close_the_connection() {
    let api = FakeApi::default();
    let app = guarded(api.start().await, Mode::ServiceAccount { audience: AUDIENCE.into() });
    // A body that never ends: an unauthenticated caller is answered from its headers, the body unread.
    let (_sender, body) = body_channel();
    let mut request = call(Some("bad"), None);
    *request.body_mut() = body;
    let refused = send(&app, request).await;
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(refused.headers()[header::CONNECTION], "close");
    let foreign = send(&app, call(Some("good"), Some("https://evil.example.com"))).await;
    assert_eq!(foreign.headers()[header::CONNECTION], "close");
    let served = send(&app, call(Some("good"), None)).await;
    assert_eq!(served.status(), StatusCode::OK);
    assert!(!served.headers().contains_key(header::CONNECTION), "a served caller keeps its connection");
}

/// Under `--auth none` no caller binds a connection, yet a served one stays open (else every request of a
/// local agent would open a new one); a refused one does not, in either mode.
#[tokio::test]
async fn a_connection_served_without_a_caller_is_kept_and_a_refused_one_is_not() {
    use crate::mcp::limits::{Connection, Connections};
    let api = FakeApi::default();
    let client = api.start().await;
    let connections = Connections::default();
    let open = || async {
        let accepted = connections.accept([127, 0, 0, 1].into()).unwrap();
        accepted.admitted(async { true }).await.unwrap().0
    };
    let on = |connection: &Arc<Connection>, mut request: Request| {
        request.extensions_mut().insert(connection.clone());
        request
    };
    let none = guarded(client.clone(), Mode::None);
    let served = open().await;
    assert_eq!(send(&none, on(&served, call(None, None))).await.status(), StatusCode::OK);
    assert!(served.stays_open() && !served.is_bound(), "kept, charged to no caller");
    let foreign = open().await;
    let refused = send(&none, on(&foreign, call(None, Some("https://evil.example.com")))).await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert!(!foreign.stays_open(), "a refusal keeps nothing");
    let sa = guarded(client, Mode::ServiceAccount { audience: AUDIENCE.into() });
    let bad = open().await;
    assert_eq!(send(&sa, on(&bad, call(Some("bad"), None))).await.status(), StatusCode::UNAUTHORIZED);
    assert!(!bad.stays_open());
}

#[tokio::test]
async fn one_callers_requests_in_flight_never_refuse_another_caller() {
    use crate::mcp::{
        auth::Identity,
        limits::{REQUESTS_PER_CALLER, REQUESTS_PER_TENANT},
    };
    let api = FakeApi::default();
    let auth = Authenticator::new(
        api.start().await,
        Mode::ServiceAccount { audience: AUDIENCE.into() },
        "http://localhost/.well-known".into(),
        Origins::new(&[], AUDIENCE),
    );
    let in_flight = InFlight::default();
    // The attacker's requests are held in the handler until the gate opens; everyone else's answered.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let held = gate.clone();
    let app = axum::Router::new()
        .route(
            "/mcp",
            axum::routing::post(move |axum::Extension(who): axum::Extension<Identity>| async move {
                if who.username.ends_with(":attacker") {
                    let _ = held.acquire().await;
                }
                "ok"
            }),
        )
        .layer(axum::middleware::from_fn_with_state(Guard { auth, in_flight: in_flight.clone() }, guard));
    let flood: Vec<_> = (0..REQUESTS_PER_TENANT)
        .map(|_| tokio::spawn(send_owned(app.clone(), call(Some("sa:a:attacker"), None))))
        .collect();
    // Wait (on the condition, not a clock) until the attacker holds its share.
    while in_flight.held() < REQUESTS_PER_CALLER {
        tokio::task::yield_now().await;
    }
    let over = send(&app, call(Some("sa:a:attacker"), None)).await;
    assert_eq!(over.status(), StatusCode::SERVICE_UNAVAILABLE, "beyond its own share, the attacker waits");
    assert_eq!(over.headers()[header::RETRY_AFTER], "1");
    for caller in ["sa:b:known", "sa:a:neighbour", "good"] {
        assert_eq!(send(&app, call(Some(caller), None)).await.status(), StatusCode::OK, "{caller}");
    }
    gate.add_permits(REQUESTS_PER_TENANT);
    let mut statuses = Vec::new();
    for request in flood {
        statuses.push(request.await.unwrap().status());
    }
    let served = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(served, REQUESTS_PER_CALLER, "{statuses:?}");
    assert_eq!(in_flight.held(), 0, "every slot was given back");
}

/// A body whose chunks the test sends when it likes (or never).
fn body_channel() -> (futures::channel::mpsc::Sender<Result<bytes::Bytes, std::io::Error>>, Body) {
    let (sender, receiver) = futures::channel::mpsc::channel(16);
    (sender, Body::from_stream(receiver))
}

async fn send_owned(app: axum::Router, request: Request) -> Response {
    send(&app, request).await
}

#[tokio::test]
async fn a_callers_flood_of_permission_checks_spends_its_own_budget() {
    use crate::mcp::limits::ACCESS_REVIEWS_PER_CALLER;
    let api = FakeApi::default();
    let app = guarded(api.start().await, Mode::ServiceAccount { audience: AUDIENCE.into() });
    let start = std::time::Instant::now();
    let (mut served, mut limited) = (0, 0);
    // Every call names another rollout: none is answered from the cache.
    for i in 0..300 {
        let r = send(&app, call_for(Some("sa:a:attacker"), None, &format!("web-{i}"))).await;
        match r.status() {
            StatusCode::OK => served += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert!(r.headers().contains_key(header::RETRY_AFTER));
                limited += 1;
            }
            other => panic!("unexpected {other}"),
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let bound = ACCESS_REVIEWS_PER_CALLER.burst + ACCESS_REVIEWS_PER_CALLER.per_second * elapsed + 1.0;
    let reviews = api.access_reviews.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(reviews, served, "every call served was one review, and no refused one was");
    assert!(limited > 0 && (reviews as f64) <= bound, "{reviews} reviews in {elapsed:.2}s, bound {bound:.0}");
    // Another tenant's caller asks its own questions, at once.
    for i in 0..10 {
        let r = send(&app, call_for(Some("sa:b:known"), None, &format!("web-{i}"))).await;
        assert_eq!(r.status(), StatusCode::OK);
    }
}

#[tokio::test]
async fn a_body_slower_than_its_allowance_is_cut_off_and_a_steady_one_is_read() {
    use std::time::Duration;

    use super::{ReadBody, read_body_within};
    let allowance = |received: usize| Duration::from_millis(200) + Duration::from_millis(received as u64);
    // One byte, then nothing: cut off once the allowance for one byte has passed.
    use futures::SinkExt;
    let (mut sender, body) = body_channel();
    sender.send(Ok("{".into())).await.unwrap();
    let started = std::time::Instant::now();
    assert!(matches!(read_body_within(body, 1024, allowance).await, ReadBody::TooSlow));
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    // Ten chunks of 100 bytes, each well within the time its predecessors earned, then the end.
    let (mut sender, body) = body_channel();
    let steady = tokio::spawn(async move {
        for _ in 0..10 {
            sender.send(Ok(vec![b' '; 100].into())).await.unwrap();
            tokio::task::yield_now().await;
        }
    });
    assert!(
        matches!(read_body_within(body, 4096, allowance).await, ReadBody::Complete(b) if b.len() == 1000)
    );
    steady.await.unwrap();
}
