//! The exporter a test controls, which its Prometheus scrapes: two counter families per
//! (namespace, deployment), growing at the rates the test sets.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Instant,
};

use axum::{Router, extract::State, http::header, routing::get};

/// The counter families the exporter serves, labelled `namespace` and `deployment`.
pub const REQUESTS: &str = "fleetroll_test_http_requests_total";
pub const ERRORS: &str = "fleetroll_test_http_errors_total";

/// A counter growing at `rate` per second from `base`, which it had at `since`: its value at a scrape
/// depends only on the time of the scrape, so `rate()` over it is `rate`.
#[derive(Clone, Copy)]
struct Counter {
    base: f64,
    rate: f64,
    since: Instant,
}

impl Counter {
    fn at(self, now: Instant) -> f64 {
        self.base + self.rate * now.duration_since(self.since).as_secs_f64()
    }
    /// The same counter growing at another rate from now on, without a jump (a jump down would be a reset).
    fn rerated(self, rate: f64, now: Instant) -> Counter {
        Counter { base: self.at(now), rate, since: now }
    }
}

#[derive(Clone, Copy)]
struct Series {
    requests: Counter,
    errors: Counter,
}

type Table = Arc<Mutex<BTreeMap<(String, String), Series>>>;

/// An HTTP server on 127.0.0.1 serving `/metrics` in Prometheus' text format, with a
/// [`REQUESTS`] and an [`ERRORS`] counter per (namespace, deployment) the test set. It runs on a thread
/// and runtime of its own, so it answers scrapes whatever the test's runtime is doing.
pub struct Exporter {
    addr: SocketAddr,
    series: Table,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Exporter {
    pub fn start() -> Exporter {
        let series = Table::default();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/metrics", get(metrics)).with_state(series.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("test-exporter".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                // Dropping the runtime when told to stop ends the open connections too.
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                    tokio::select! {
                        served = axum::serve(listener, app) => served.unwrap(),
                        _ = stopped => {}
                    }
                });
            })
            .unwrap();
        Exporter { addr, series, stop: Some(stop), thread: Some(thread) }
    }

    /// Where Prometheus scrapes it (`host:port`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From now on, `namespace/deployment` serves `requests_per_sec` requests of which `error_ratio` fail.
    /// A series already there keeps its value and only changes how fast it grows. A new one starts at 0 now,
    /// so `rate(...[w])` is below the set rate until `w` has passed (and a few scrapes have come in).
    pub fn set_rate(&self, namespace: &str, deployment: &str, requests_per_sec: f64, error_ratio: f64) {
        let now = Instant::now();
        let errors_per_sec = requests_per_sec * error_ratio;
        let mut table = self.series.lock().unwrap();
        let key = (namespace.to_string(), deployment.to_string());
        let series = match table.get(&key) {
            Some(s) => Series {
                requests: s.requests.rerated(requests_per_sec, now),
                errors: s.errors.rerated(errors_per_sec, now),
            },
            None => Series {
                requests: Counter { base: 0.0, rate: requests_per_sec, since: now },
                errors: Counter { base: 0.0, rate: errors_per_sec, since: now },
            },
        };
        table.insert(key, series);
    }

    /// Sets both counters of `namespace/deployment` to these values, which then stay (lower than before is
    /// a counter reset, as a restarted pod would show).
    pub fn set_counter(&self, namespace: &str, deployment: &str, requests: f64, errors: f64) {
        let now = Instant::now();
        let series = Series {
            requests: Counter { base: requests, rate: 0.0, since: now },
            errors: Counter { base: errors, rate: 0.0, since: now },
        };
        self.series.lock().unwrap().insert((namespace.to_string(), deployment.to_string()), series);
    }

    /// The series of `namespace/deployment` vanish from the next scrape on (Prometheus marks them stale:
    /// an instant query no longer finds them, `rate(...[w])` once `w` has passed).
    pub fn remove(&self, namespace: &str, deployment: &str) {
        self.series.lock().unwrap().remove(&(namespace.to_string(), deployment.to_string()));
    }

    /// What a scrape would see now.
    pub fn render(&self) -> String {
        render(&self.series.lock().unwrap(), Instant::now())
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn metrics(State(series): State<Table>) -> impl axum::response::IntoResponse {
    let body = render(&series.lock().unwrap(), Instant::now());
    // Prometheus 3 refuses a scrape without a content type it knows.
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body)
}

fn render(table: &BTreeMap<(String, String), Series>, now: Instant) -> String {
    type Pick = fn(&Series) -> Counter;
    let families: [(&str, &str, Pick); 2] = [
        (REQUESTS, "Requests served, at the rate the test set.", |s| s.requests),
        (ERRORS, "Requests that failed, at the rate and ratio the test set.", |s| s.errors),
    ];
    let escape = |v: &str| v.replace('\\', r"\\").replace('"', "\\\"").replace('\n', r"\n");
    let mut out = String::new();
    for (name, help, counter) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for ((namespace, deployment), series) in table {
            let (ns, dep, value) = (escape(namespace), escape(deployment), counter(series).at(now));
            let _ = writeln!(out, "{name}{{namespace=\"{ns}\",deployment=\"{dep}\"}} {value}");
        }
    }
    out
}
