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
use rustix::net::RecvFlags;
use tokio::{
    io::Interest,
    net::{TcpListener, TcpSocket, TcpStream},
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error};

use crate::{
    mcp::limits::{Accepted, Connections, HEADER_READ_TIMEOUT, MAX_HEADER_BYTES, Serving},
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
/// until a request authenticates on it, then to that caller; read at once when its request head has
/// arrived whole, else when its address's turn comes; at the cap, in place of the oldest idle one), and
/// must send a request's headers within [`HEADER_READ_TIMEOUT`] of opening or of its previous answer: a
/// client that sends nothing, or headers a byte at a time, is cut off, and so is an idle keep-alive
/// connection. Every listener the operator and the plugin open is served here.
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
/// (for the MCP guard to charge it), and marking it as serving until its answer is sent.
async fn serve_connection(
    http: http1::Builder,
    stream: TcpStream,
    app: Router,
    accepted: Accepted,
    stop: CancellationToken,
) {
    let Some((connection, turn)) = accepted.admitted(head_arrived(&stream)).await else {
        debug!("closed a connection whose turn did not come");
        return;
    };
    debug!(?turn, "reading a connection");
    let closed = connection.closed().clone();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let mut request = request.map(Body::new);
        request.extensions_mut().insert(connection.clone());
        let serving = connection.serving();
        // A Router is always ready: no poll_ready needed.
        let answered = tower::Service::call(&mut app.clone(), request);
        async move {
            let response = answered.await?;
            // Until the body is sent (a stream's included), the connection is not idle.
            Ok::<_, std::convert::Infallible>(
                response.map(|inner| Body::new(Sending { inner, _serving: serving })),
            )
        }
    });
    let served = http.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(served);
    let ended = tokio::select! {
        ended = served.as_mut() => ended,
        () = stop.cancelled() => {
            served.as_mut().graceful_shutdown();
            served.await
        }
        () = closed.cancelled() => {
            debug!("closed an idle connection for a newer one");
            return;
        }
    };
    if let Err(e) = ended {
        // Timeouts and clients going away are routine: debug, so a flood is not a flood of log lines.
        debug!(error = %e, "connection ended");
    }
}

/// A response body that keeps its connection marked as serving until it is sent or dropped; all else is
/// the body's own (its size above all, so a whole answer keeps its Content-Length).
struct Sending {
    inner: Body,
    _serving: Serving,
}

impl http_body::Body for Sending {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// As much of a request head as is looked at before it is read: all that hyper would take
/// ([`MAX_HEADER_BYTES`]), so that a person's OIDC token of 10 KiB is read at once like a ServiceAccount's.
const PEEK_BYTES: usize = MAX_HEADER_BYTES;

/// True once the connection's first request head has arrived (left in the socket for hyper to read), or
/// once hyper would refuse what came (not HTTP/1, too long): either way hyper answers it at once. False
/// when the peer closes first.
async fn head_arrived(stream: &TcpStream) -> bool {
    loop {
        let Ok(ready) = stream.ready(Interest::READABLE).await else { return false };
        // WouldBlock from the closure clears the readiness: the next wait is for bytes not yet seen. A peer
        // that has closed stays readable: its head will never be whole, and waiting again would spin.
        let peeked = stream.try_io(Interest::READABLE, || {
            let mut buf = vec![0u8; PEEK_BYTES];
            let (n, _) = rustix::net::recv(stream, &mut buf[..], RecvFlags::PEEK)?;
            match head_state(&buf[..n], n == buf.len()) {
                Head::Incomplete => Err(io::ErrorKind::WouldBlock.into()),
                state => Ok(state),
            }
        });
        match peeked {
            Ok(Head::Whole) => return true,
            Ok(Head::Closed) => return false,
            Ok(Head::Incomplete) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && !ready.is_read_closed() => {}
            Err(_) => return false,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Head {
    /// A head hyper can read at once: whole, or one it refuses at once (malformed, or longer than it takes).
    Whole,
    Incomplete,
    /// Nothing came before the peer closed.
    Closed,
}

/// What the bytes received so far hold of a request head (`full`: they filled the buffer), judged by
/// httparse, the parser hyper reads it with (blank lines before the request line are no head; a bare LF
/// ends a line).
fn head_state(bytes: &[u8], full: bool) -> Head {
    if bytes.is_empty() {
        return Head::Closed;
    }
    let mut headers = [httparse::EMPTY_HEADER; 128];
    match httparse::Request::new(&mut headers).parse(bytes) {
        Ok(httparse::Status::Partial) if !full => Head::Incomplete,
        _ => Head::Whole,
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

    /// A peer that closes with half a head stays readable for ever: waiting for the rest would spin.
    #[tokio::test]
    async fn a_head_is_looked_for_until_it_is_whole_or_the_peer_has_closed() {
        use tokio::io::AsyncWriteExt;
        let listener = listen(([127, 0, 0, 1], 0).into()).unwrap();
        let addr = listener.local_addr().unwrap();
        let within = Duration::from_secs(5);

        let mut whole = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        whole.write_all(b"GET / HTTP/1.1\r\nHost: x").await.unwrap();
        let arrived = tokio::spawn(async move { head_arrived(&server).await });
        whole.write_all(b"\r\n\r\n").await.unwrap();
        assert!(tokio::time::timeout(within, arrived).await.unwrap().unwrap(), "whole once the rest came");

        let mut half = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        half.write_all(b"POST /mcp HTTP/1.1\r\nX-Padding: a").await.unwrap();
        half.shutdown().await.unwrap();
        let arrived = tokio::time::timeout(within, head_arrived(&server)).await;
        assert_eq!(arrived.ok(), Some(false), "given up as soon as the peer closed");
    }

    #[test]
    fn a_head_is_whole_at_its_blank_line_not_before() {
        assert_eq!(head_state(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", false), Head::Whole);
        assert_eq!(head_state(b"POST /mcp HTTP/1.1\r\nHost: x\r\n\r\n{\"jsonrpc\"", false), Head::Whole);
        assert_eq!(head_state(b"GET / HTTP/1.1\r\nHost: x\r\n", false), Head::Incomplete);
        assert_eq!(head_state(b"\r\n\r\n\r\nGET", false), Head::Incomplete, "blank lines first are no head");
        assert_eq!(
            head_state(b"GET / HTTP/1.1\nHost: x\n\n", false),
            Head::Whole,
            "bare LFs, as httparse reads"
        );
        assert_eq!(
            head_state(b"GET / HTTP/1.1\r\nX: aaaa", true),
            Head::Whole,
            "too long: hyper refuses it at once"
        );
        assert_eq!(
            head_state(b"\x16\x03\x01\x02\x00", false),
            Head::Whole,
            "not HTTP: hyper refuses it at once"
        );
        assert_eq!(head_state(b"", false), Head::Closed);
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
