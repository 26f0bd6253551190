//! The operator's HTTP endpoints: `/healthz`, `/readyz`, `/metrics` (and `/mcp` when the MCP server is
//! mounted on the same listener). With `--metrics-listen`, `/metrics` moves to a listener of its own.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};

use crate::runtime::metrics::Metrics;

/// What the HTTP endpoints report on.
#[derive(Clone, Debug)]
pub struct Health {
    pub metrics: Arc<Metrics>,
    /// Set once the process can serve: connected to the API server and the CRD is installed.
    pub ready: Arc<AtomicBool>,
}

/// `/healthz`, `/readyz` and `/metrics`.
pub fn router(health: Health) -> Router {
    probes(health.clone()).merge(Router::new().route("/metrics", get(metrics)).with_state(health))
}

/// `/healthz` and `/readyz` only: the main listener when `/metrics` is served on a listener of its own.
pub fn probes(health: Health) -> Router {
    Router::new().route("/healthz", get(|| async { "ok" })).route("/readyz", get(readyz)).with_state(health)
}

async fn readyz(State(h): State<Health>) -> impl IntoResponse {
    if h.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

async fn metrics(State(h): State<Health>) -> impl IntoResponse {
    ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], h.metrics.render())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::{body::Body, http::Request};
    use tower::ServiceExt;

    #[tokio::test]
    async fn readiness_follows_the_flag_and_metrics_render() {
        let health =
            Health { metrics: Arc::new(Metrics::default()), ready: Arc::new(AtomicBool::new(false)) };
        let app = router(health.clone());
        let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
        assert_eq!(app.clone().oneshot(get("/healthz")).await.unwrap().status(), StatusCode::OK);
        assert_eq!(
            app.clone().oneshot(get("/readyz")).await.unwrap().status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        health.ready.store(true, Ordering::Relaxed);
        assert_eq!(app.clone().oneshot(get("/readyz")).await.unwrap().status(), StatusCode::OK);
        health.metrics.status_writes.inc();
        let res = app.oneshot(get("/metrics")).await.unwrap();
        let body = axum::body::to_bytes(res.into_body(), 1 << 20).await.unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(text.contains("fleetroll_status_writes_total 1"), "{text}");
    }

    #[tokio::test]
    async fn the_probes_alone_serve_no_metrics() {
        let health = Health { metrics: Arc::new(Metrics::default()), ready: Arc::new(AtomicBool::new(true)) };
        let app = probes(health);
        let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
        assert_eq!(app.clone().oneshot(get("/healthz")).await.unwrap().status(), StatusCode::OK);
        assert_eq!(app.clone().oneshot(get("/readyz")).await.unwrap().status(), StatusCode::OK);
        assert_eq!(app.oneshot(get("/metrics")).await.unwrap().status(), StatusCode::NOT_FOUND);
    }
}
