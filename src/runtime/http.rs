//! The operator's HTTP endpoints: `/healthz`, `/readyz`, `/metrics` (and `/mcp` when the MCP server is
//! mounted on the same listener). With `--metrics-listen`, `/metrics` moves to a listener of its own.
//! [`serve`] serves them, with bounds on connections that axum's own server does not have.

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    Router,
    body::Body,
    extract::State,
    http::{HeaderValue, Request, StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use hyper::{body::Incoming, server::conn::http1};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustix::net::RecvFlags;
use tokio::{
    io::{AsyncRead, AsyncWrite, Interest, ReadBuf},
    net::{TcpListener, TcpSocket, TcpStream},
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error};

use crate::{
    mcp::limits::{Accepted, Caps, Connections, HEADER_READ_TIMEOUT, MAX_HEADER_BYTES, Serving},
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
/// must send a request's headers within [`HEADER_READ_TIMEOUT`] of opening (its wait for a turn included)
/// or of its previous answer: a client that sends nothing, or headers a byte at a time, is cut off, and so
/// is an idle keep-alive connection. A connection no caller has authenticated on (a probe, a scrape, a refusal) is answered once
/// and closed, and one whose answers are not read is cut off after [`WRITE_STALL_TIMEOUT`] without
/// progress. Every listener the operator and the plugin open is served here.
pub async fn serve(listener: TcpListener, app: Router, stop: CancellationToken) -> io::Result<()> {
    let connections = Connections::new(Caps { all: connection_cap(), ..Caps::default() });
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

/// Raises the process's soft limit of file descriptors to its hard one, once, at start (as Go does for
/// every program): a container runtime's soft limit is often a small one. Listeners size their caps from
/// whatever limit holds, so a refusal changes only those caps.
pub fn raise_descriptor_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    if let Rlimit { current: Some(current), maximum: Some(maximum) } = getrlimit(Resource::Nofile)
        && current < maximum
    {
        let _kept_as_it_was =
            setrlimit(Resource::Nofile, Rlimit { current: Some(maximum), maximum: Some(maximum) });
    }
}

/// The connections a listener may hold: as many as the process's file descriptors allow
/// ([`crate::mcp::limits::connections_for`]).
fn connection_cap() -> usize {
    let descriptors = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    crate::mcp::limits::connections_for(descriptors.unwrap_or(u64::MAX))
}

/// One connection, once its turn to be read has come, each of its requests carrying the `Connection`
/// (for the MCP guard to charge it), and marking it as serving until its answer is sent.
async fn serve_connection(
    mut http: http1::Builder,
    stream: TcpStream,
    app: Router,
    accepted: Accepted,
    stop: CancellationToken,
) {
    let opened = tokio::time::Instant::now();
    let Some((connection, turn)) = accepted.admitted(head_arrived(&stream)).await else {
        debug!("closed a connection whose turn did not come");
        return;
    };
    debug!(?turn, "reading a connection");
    // The headers are due within the timeout of opening, the wait for a turn included.
    http.header_read_timeout(HEADER_READ_TIMEOUT.saturating_sub(opened.elapsed()).max(HEAD_AT_LEAST));
    let closed = connection.closed().clone();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let mut request = request.map(Body::new);
        request.extensions_mut().insert(connection.clone());
        let serving = connection.serving();
        // A Router is always ready: no poll_ready needed.
        let answered = tower::Service::call(&mut app.clone(), request);
        let connection = connection.clone();
        async move {
            let mut response = answered.await?;
            // No caller has shown a token on it (nor did `--auth none` keep it): answered once and closed
            // (hyper reads no further request), so a probe, a refusal or a client pipelining requests it
            // never reads holds no place.
            if !connection.stays_open() {
                response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            // Until the body is sent (a stream's included), the connection is not idle.
            Ok::<_, std::convert::Infallible>(
                response.map(|inner| Body::new(Sending { inner, _serving: serving })),
            )
        }
    });
    let served = http.serve_connection(TokioIo::new(Progressing::new(stream)), service);
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

/// The least time a connection read after waiting its turn has left for its headers (the wait ends before
/// the header timeout does).
const HEAD_AT_LEAST: Duration = Duration::from_millis(100);

/// How long a connection's writes may make no progress: a peer that stops reading (pipelining requests
/// and never reading the answers, say) would otherwise hold its connection, marked as serving and never
/// closed for a newer one, for ever.
const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A stream whose writes must make progress within [`WRITE_STALL_TIMEOUT`], or fail (and hyper closes the
/// connection). Reads are the stream's own: the header read timeout bounds those.
struct Progressing<S> {
    inner: S,
    /// Armed when a write first waits, disarmed when one goes through.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> Progressing<S> {
    fn new(inner: S) -> Self {
        Self { inner, stalled: None }
    }

    /// What a write that went `polled` returns: its result once through, an error once stalled too long.
    fn progress<T>(&mut self, polled: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_STALL_TIMEOUT)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => {
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "the peer stopped reading")))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Progressing<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Progressing<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progress(polled, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progress(polled, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.progress(polled, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.progress(polled, cx)
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
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
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
mod tests;
