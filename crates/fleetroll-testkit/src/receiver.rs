//! An HTTP receiver a test controls: the target of Alertmanager's webhook and of the operator's own webhook
//! and CloudEvents sinks. It records every request and answers as the test says ([`Mode`]), switchable at any
//! time from the test.
//!
//! ```ignore
//! let receiver = Receiver::start();
//! receiver.set_mode(Mode::Fail(503)); // refuse deliveries for a while
//! // ... configure a sink with receiver.url("hook") ...
//! receiver.set_mode(Mode::Ok);
//! let got = receiver.wait_for(Duration::from_secs(10), |r| !r.is_empty()).await;
//! ```

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{Router, body::Body, extract::State, http::StatusCode, response::IntoResponse};
use serde_json::Value;
use tokio::sync::watch;

const POLL: Duration = Duration::from_millis(50);
/// The largest body the receiver reads; a bigger one is answered 413 (and counted as an attempt only).
const MAX_BODY: usize = 64 * 1024 * 1024;

/// How the receiver answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// 200, and the request is delivered ([`Receiver::requests`]).
    Ok,
    /// This status (a 2xx one counts as delivered, anything else does not).
    Fail(u16),
    /// No answer at all while the mode stays `Hang`: the client waits until its own timeout. When the mode
    /// changes (or the receiver stops) a hung request is released with 503 (or a closed connection) and is
    /// never delivered, whatever the new mode: its client may have given up on it long before.
    Hang,
}

/// One request the receiver answered with a 2xx status.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    /// The path, without the query (`/hook`).
    pub path: String,
    /// The query string, without the `?` (empty when there is none).
    pub query: String,
    /// Every header, by lowercased name, with its values in the order they came.
    pub headers: BTreeMap<String, Vec<String>>,
    pub body: Vec<u8>,
    /// The body parsed as JSON, when it is JSON.
    pub json: Option<Value>,
    /// When it arrived.
    pub at: Instant,
}

impl Request {
    /// The first value of header `name` (any case), as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase())?.first().map(String::as_str)
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

#[derive(Clone)]
struct Shared {
    mode: watch::Receiver<Mode>,
    delivered: Arc<Mutex<Vec<Request>>>,
    attempts: Arc<AtomicUsize>,
}

/// An HTTP server on 127.0.0.1 (any path, any method) on a thread and runtime of its own, so it answers
/// whatever the test's runtime is doing. Dropping it stops the server and closes every connection, hung
/// ones included.
pub struct Receiver {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    delivered: Arc<Mutex<Vec<Request>>>,
    attempts: Arc<AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// Starts a receiver in [`Mode::Ok`] on a free port.
    pub fn start() -> Receiver {
        let (mode, mode_rx) = watch::channel(Mode::Ok);
        let shared =
            Shared { mode: mode_rx, delivered: Arc::default(), attempts: Arc::new(AtomicUsize::new(0)) };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a receiver on 127.0.0.1:0");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().fallback(receive).with_state(shared.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("test-receiver".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                // Dropping the runtime when told to stop drops the connections' tasks: hung requests end.
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                    tokio::select! {
                        served = axum::serve(listener, app) => served.expect("the receiver's server"),
                        _ = stopped => {}
                    }
                });
            })
            .expect("start the receiver's thread");
        let Shared { delivered, attempts, .. } = shared;
        Receiver { addr, mode, delivered, attempts, stop: Some(stop), thread: Some(thread) }
    }

    /// `host:port`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/<path>` (a leading `/` of `path` is allowed).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{}", self.addr, path.trim_start_matches('/'))
    }

    /// How requests are answered from now on (requests hung so far are released, see [`Mode::Hang`]).
    pub fn set_mode(&self, mode: Mode) {
        if let Mode::Fail(code) = mode {
            assert!(StatusCode::from_u16(code).is_ok(), "Mode::Fail({code}): not an HTTP status");
        }
        self.mode.send_replace(mode);
    }

    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }

    /// The requests answered with a 2xx status, in order of arrival.
    pub fn requests(&self) -> Vec<Request> {
        self.delivered.lock().unwrap().clone()
    }

    /// Every request received, whatever its answer (hung ones included).
    pub fn attempts(&self) -> usize {
        self.attempts.load(Ordering::SeqCst)
    }

    /// Polls [`Self::requests`] every 50 ms until `pred` holds of them, and returns them; panics with what
    /// came (and how many attempts) when `deadline` passes first.
    pub async fn wait_for(&self, deadline: Duration, pred: impl Fn(&[Request]) -> bool) -> Vec<Request> {
        self.wait_until(deadline, pred).await.unwrap_or_else(|requests| {
            panic!(
                "receiver {}: the condition did not hold within {deadline:?} ({} attempts, mode {:?}); \
                 delivered:\n{}",
                self.addr,
                self.attempts(),
                self.mode(),
                describe(&requests)
            )
        })
    }

    /// [`Self::wait_for`] for a test that judges a miss itself: what came by the deadline, as the error.
    pub async fn wait_until(
        &self,
        deadline: Duration,
        pred: impl Fn(&[Request]) -> bool,
    ) -> Result<Vec<Request>, Vec<Request>> {
        let until = Instant::now() + deadline;
        loop {
            let requests = self.requests();
            if pred(&requests) {
                return Ok(requests);
            }
            if Instant::now() > until {
                return Err(requests);
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The requests, one a line: method, path, the first 300 characters of the body.
pub fn describe(requests: &[Request]) -> String {
    let mut out = String::new();
    for (i, r) in requests.iter().enumerate() {
        let text = r.text();
        let cut: String = text.chars().take(300).collect();
        let more = if cut.len() < text.len() { "..." } else { "" };
        let _ = writeln!(out, "  {i}: {} {} {cut}{more}", r.method, r.path);
    }
    if out.is_empty() { "  (none)".into() } else { out }
}

async fn receive(State(shared): State<Shared>, request: axum::extract::Request) -> axum::response::Response {
    let at = Instant::now();
    shared.attempts.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    let mut mode = shared.mode.clone();
    let current = *mode.borrow_and_update();
    let status = match current {
        Mode::Ok => StatusCode::OK,
        Mode::Fail(code) => StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        Mode::Hang => {
            // Until the mode changes; the sender lives as long as the receiver, whose drop ends this task.
            let _ = mode.wait_for(|m| *m != Mode::Hang).await;
            return (StatusCode::SERVICE_UNAVAILABLE, Body::from("released from Mode::Hang")).into_response();
        }
    };
    if status.is_success() {
        let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, value) in &parts.headers {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            headers.entry(name.as_str().to_ascii_lowercase()).or_default().push(value);
        }
        let request = Request {
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or_default().to_string(),
            headers,
            json: serde_json::from_slice(&body).ok(),
            body: body.to_vec(),
            at,
        };
        shared.delivered.lock().unwrap().push(request);
    }
    status.into_response()
}
