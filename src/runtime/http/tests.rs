use super::*;
use axum::{body::Body, http::Request};
use tower::ServiceExt;

#[tokio::test]
async fn readiness_follows_the_flag_and_metrics_render() {
    let health = Health { metrics: Arc::new(Metrics::default()), ready: Arc::new(AtomicBool::new(false)) };
    let app = router(health.clone());
    let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
    assert_eq!(app.clone().oneshot(get("/healthz")).await.unwrap().status(), StatusCode::OK);
    assert_eq!(app.clone().oneshot(get("/readyz")).await.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
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
    let app = Router::new()
        .route(
            "/who",
            get(|c: Option<axum::Extension<Arc<crate::mcp::limits::Connection>>>| async move {
                if c.is_some() { "charged" } else { "-" }
            }),
        )
        .route(
            "/kept",
            get(|axum::Extension(c): axum::Extension<Arc<crate::mcp::limits::Connection>>| async move {
                c.keep();
                "kept"
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

    // No caller authenticates on it: the first of two pipelined requests is answered, and the connection
    // closed (a client pipelining requests it never reads holds no connection).
    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(b"GET /who HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(2).as_slice()).await.unwrap();
    let mut answer = String::new();
    client.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("charged"), "{answer}");
    assert_eq!(answer.matches("HTTP/1.1").count(), 1, "{answer}");
    assert!(answer.to_ascii_lowercase().contains("connection: close"), "{answer}");

    // Kept (as the guard keeps a connection under `--auth none`): both are answered on it.
    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(b"GET /kept HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(2).as_slice()).await.unwrap();
    client.shutdown().await.unwrap();
    let mut answer = String::new();
    client.read_to_string(&mut answer).await.unwrap();
    assert_eq!(answer.matches("HTTP/1.1 200").count(), 2, "{answer}");
    assert!(!answer.to_ascii_lowercase().contains("connection: close"), "{answer}");

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
    assert_eq!(head_state(b"GET / HTTP/1.1\nHost: x\n\n", false), Head::Whole, "bare LFs, as httparse reads");
    assert_eq!(
        head_state(b"GET / HTTP/1.1\r\nX: aaaa", true),
        Head::Whole,
        "too long: hyper refuses it at once"
    );
    assert_eq!(head_state(b"\x16\x03\x01\x02\x00", false), Head::Whole, "not HTTP: hyper refuses it at once");
    assert_eq!(head_state(b"", false), Head::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_stops_reading_fails_the_writes_once_they_stall() {
    use tokio::io::AsyncWriteExt;
    let (near, _far) = tokio::io::duplex(1024);
    let mut stream = Progressing::new(near);
    // Writes that go through, however slowly, never fail.
    stream.write_all(&[0; 1000]).await.unwrap();
    let started = tokio::time::Instant::now();
    // The far end reads nothing: the buffer fills, the write waits, and fails once it has waited long.
    let stalled = tokio::time::timeout(2 * WRITE_STALL_TIMEOUT, stream.write_all(&[0; 4096]))
        .await
        .expect("the stalled write fails, not waits")
        .unwrap_err();
    assert_eq!(stalled.kind(), io::ErrorKind::TimedOut);
    assert_eq!(started.elapsed(), WRITE_STALL_TIMEOUT);
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
