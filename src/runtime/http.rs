//! The operator's HTTP endpoints: `/healthz`, `/readyz`, `/metrics` (and `/mcp` when the MCP server is
//! mounted on the same listener). With `--metrics-listen`, `/metrics` moves to a listener of its own.
//! [`serve`] serves them, with bounds on connections that axum's own server does not have.

use std::{
    io,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{
    Router, body::Body, extract::State, http::Request, http::StatusCode, response::IntoResponse, routing::get,
};
use hyper::{body::Incoming, server::conn::http1};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error};

use crate::{
    mcp::limits::{Accepted, Connections, HEADER_READ_TIMEOUT, MAX_HEADER_BYTES},
    metrics::Metrics,
};

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

/// Connections the kernel completes and queues before the server accepts them. std's and tokio's 128
/// overflow under a burst of a few hundred (a flood, or agents starting at once): the kernel then drops
/// handshakes and everyone's new connection waits a second for a retransmission, while the accept loop
/// would have closed the excess at once. (The kernel caps it at `net.core.somaxconn`.)
const LISTEN_BACKLOG: u32 = 1024;

/// A listener on `addr`.
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    // As std and tokio do: a restarted server can bind while old connections linger in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Serves `app` on `listener` (HTTP/1.1, as axum's server did here) until `stop`, then lets open
/// connections finish. Every connection is charged as `mcp::limits::Connections` says (to its address
/// until a request authenticates on it, then to that caller; read when its address's turn comes), and
/// must send a request's headers within
/// [`HEADER_READ_TIMEOUT`] of opening or of its previous answer: a client that sends nothing, or headers a
/// byte at a time, is cut off, and so is an idle keep-alive connection.
pub async fn serve(listener: TcpListener, app: Router, stop: CancellationToken) -> io::Result<()> {
    let connections = Connections::default();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
        .keep_alive(true);
    loop {
        let (stream, peer): (TcpStream, SocketAddr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        // Over a cap, closed at once: left unaccepted, it would only wait in the backlog for the same answer.
        let Some(accepted) = connections.accept(peer.ip()) else {
            debug!(%peer, open = connections.open_now(), "closed a connection over the cap");
            continue;
        };
        // Answers are small and whole: sending each at once saves a round trip's delay.
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve_connection(http.clone(), stream, app.clone(), accepted, stop.clone()));
    }
    connections.all_closed().await;
    Ok(())
}

/// One connection, once its turn to be read has come, each of its requests carrying the `Connection`
/// (for the MCP guard to charge it).
async fn serve_connection(
    http: http1::Builder,
    stream: TcpStream,
    app: Router,
    accepted: Accepted,
    stop: CancellationToken,
) {
    let Some(connection) = accepted.admitted().await else {
        debug!("closed a connection whose turn did not come");
        return;
    };
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let mut request = request.map(Body::new);
        request.extensions_mut().insert(connection.clone());
        // A Router is always ready: no poll_ready needed.
        tower::Service::call(&mut app.clone(), request)
    });
    let served = http.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(served);
    let ended = tokio::select! {
        ended = served.as_mut() => ended,
        () = stop.cancelled() => {
            served.as_mut().graceful_shutdown();
            served.await
        }
    };
    if let Err(e) = ended {
        // Timeouts and clients going away are routine: debug, so a flood is not a flood of log lines.
        debug!(error = %e, "connection ended");
    }
}

/// Errors of one connection (it went away before it was accepted) are skipped; others (out of file
/// descriptors) are waited out, as a loop retrying at once would spin.
async fn accept_failed(e: io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if !matches!(e.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset) {
        error!(error = %e, "cannot accept connections");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
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

    /// On paused time: the runtime jumps to the next timer whenever it has nothing else to do, so the
    /// header timeout fires as soon as the silent client is all that is left, and its time is exact.
    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_cut_off_at_the_header_timeout_and_requests_carry_their_connection() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = listen(([127, 0, 0, 1], 0).into()).unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route(
            "/who",
            get(|c: Option<axum::Extension<Arc<crate::mcp::limits::Connection>>>| async move {
                if c.is_some() { "charged" } else { "-" }
            }),
        );
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(listener, app, stop.clone()));

        let mut silent = TcpStream::connect(addr).await.unwrap();
        let opened = tokio::time::Instant::now();
        let mut read = Vec::new();
        let _ = silent.read_to_end(&mut read).await;
        let after = opened.elapsed();
        assert!(
            after >= HEADER_READ_TIMEOUT && after < HEADER_READ_TIMEOUT + Duration::from_secs(1),
            "{after:?}"
        );

        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(b"GET /who HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("charged"), "{answer}");

        stop.cancel();
        server.await.unwrap().unwrap();
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
