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

use super::guard;
use crate::mcp::auth::{Authenticator, Mode, Origins};

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
    let auth =
        Authenticator::new(client, mode, "http://localhost/.well-known".into(), Origins::new(&[], AUDIENCE));
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
