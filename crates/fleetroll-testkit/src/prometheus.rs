//! A real Prometheus for the metric analysis gates: `target/testenv/bin/prometheus` (built by
//! `tests/testenv/build.sh`) scraping an [`Exporter`] the test controls, every second. No cluster needed.
//!
//! ```ignore
//! let exporter = Exporter::start();
//! exporter.set_rate("shop", "web", 100.0, 0.02); // 100 requests/s, 2% of them errors
//! let prometheus = Prometheus::start(&exporter, Options::default()).await;
//! prometheus.wait_for_series("fleetroll_test_http_requests_total").await;
//! ```

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use reqwest::Method;
use serde_json::Value;

mod exporter;
pub use exporter::{ERRORS, Exporter, REQUESTS};

/// The credentials of a Prometheus started with [`Options::basic_auth`].
pub const USER: &str = "fleetroll";
pub const PASSWORD: &str = "fleetroll-test-password";
/// bcrypt of PASSWORD, made once with golang.org/x/crypto/bcrypt (what Prometheus checks it with). The
/// minimum cost (4) keeps each authenticated request cheap.
const PASSWORD_BCRYPT: &str = "$2a$04$2kQrUvpFv7WmXJkcL0tbveQftfjKc6FrrOoeANEsdIBw9krI/B6Cy";

/// How long Prometheus may take to become ready, and a query to return data.
const DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

/// How a [`Prometheus`] guards its API.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Requires [`USER`] and [`PASSWORD`] (HTTP basic auth) on every endpoint.
    pub basic_auth: bool,
    /// Serves HTTPS with a certificate for 127.0.0.1 and localhost from a CA of its own
    /// ([`Prometheus::ca_pem`]).
    pub tls: bool,
}

/// Why a query got no answer.
#[derive(Debug)]
pub enum QueryError {
    /// No HTTP response: connection refused (`e.is_connect()`), TLS refused, timed out.
    Unreachable(reqwest::Error),
    /// An HTTP response that is not a successful query: a 401, a 400 for bad PromQL, ...
    Refused { status: u16, body: String },
}

/// A Prometheus process of its own, with its data, config and log in a scratch directory, which is removed
/// when it is dropped (and kept, with its path printed, when the test panicked).
pub struct Prometheus {
    dir: PathBuf,
    port: u16,
    options: Options,
    ca_pem: Option<String>,
    http: reqwest::Client,
    child: Option<Child>,
}

/// Why a start did not reach `/-/ready`.
enum NotReady {
    /// The port was taken between choosing it and Prometheus binding it: try another.
    PortTaken,
    Failed(String),
}

impl Prometheus {
    /// Starts Prometheus scraping `exporter` every second and waits until it is ready.
    pub async fn start(exporter: &Exporter, options: Options) -> Prometheus {
        let dir = scratch_dir();
        fs::write(
            dir.join("prometheus.yml"),
            format!(
                "global: {{scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}}\n\
                 scrape_configs:\n  - job_name: exporter\n    static_configs: [{{targets: [\"{}\"]}}]\n",
                exporter.addr()
            ),
        )
        .unwrap();
        let ca_pem = options.tls.then(|| make_tls(&dir));
        if options.basic_auth || options.tls {
            fs::write(dir.join("web.yml"), web_config(&dir, options)).unwrap();
        }
        let http = client(ca_pem.as_deref());
        let mut prometheus = Prometheus { dir, port: 0, options, ca_pem, http, child: None };
        for attempt in 1.. {
            prometheus.port = free_port();
            prometheus.spawn();
            match prometheus.wait_ready().await {
                Ok(()) => return prometheus,
                Err(NotReady::PortTaken) if attempt < 5 => continue,
                Err(NotReady::PortTaken) => prometheus.fail("could not bind a free port in 5 attempts"),
                Err(NotReady::Failed(why)) => prometheus.fail(&why),
            }
        }
        unreachable!()
    }

    /// `http://127.0.0.1:PORT`, or `https://` with [`Options::tls`].
    pub fn address(&self) -> String {
        let scheme = if self.options.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn options(&self) -> Options {
        self.options
    }

    /// The CA that signed the serving certificate (PEM), with [`Options::tls`]: what a Secret's `ca.crt`
    /// holds.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// Prometheus' log (both starts, when started again).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("prometheus.log")
    }

    /// A client that trusts [`Self::ca_pem`] and sends no credentials.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// A request to `path` (`/api/v1/query`), with the credentials when there is basic auth.
    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.address()));
        if self.options.basic_auth { request.basic_auth(USER, Some(PASSWORD)) } else { request }
    }

    /// An instant query, POSTed as a form as Prometheus' clients do: the `data.result` of the answer (the
    /// samples of a vector, the series of a matrix; a scalar as a single element).
    pub async fn query(&self, promql: &str) -> Result<Vec<Value>, QueryError> {
        let response = self
            .request(Method::POST, "/api/v1/query")
            .form(&[("query", promql)])
            .send()
            .await
            .map_err(QueryError::Unreachable)?;
        let status = response.status().as_u16();
        let body = response.text().await.map_err(QueryError::Unreachable)?;
        let parsed: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        if status != 200 || parsed["status"] != "success" {
            return Err(QueryError::Refused { status, body });
        }
        match &parsed["data"]["result"] {
            Value::Array(items) => Ok(items.clone()),
            other => Ok(vec![other.clone()]),
        }
    }

    /// How many instant queries (`/api/v1/query`) this Prometheus has answered, by its own
    /// `prometheus_http_requests_total`: what proves that a backend was never asked.
    pub async fn queries_served(&self) -> f64 {
        let text =
            self.request(Method::GET, "/metrics").send().await.expect("/metrics").text().await.unwrap();
        text.lines()
            .filter(|l| {
                l.starts_with("prometheus_http_requests_total{") && l.contains("handler=\"/api/v1/query\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Polls `promql` until it returns data, then returns it; panics after 30 s with the last outcome (used
    /// to know that scraping has started, or that a `rate()` window has filled).
    pub async fn wait_for_series(&self, promql: &str) -> Vec<Value> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let last = match self.query(promql).await {
                Ok(result) if !result.is_empty() => return result,
                outcome => outcome,
            };
            if Instant::now() > deadline {
                self.fail(&format!("no data for `{promql}` after {DEADLINE:?}; last: {last:?}"));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Kills Prometheus (an outage), keeping its data, config and port for [`Self::start_again`].
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again after [`Self::stop`], on the same port with the same data and config, and waits until
    /// it is ready.
    pub async fn start_again(&mut self) {
        assert!(self.child.is_none(), "start_again: Prometheus is running; stop it first");
        self.spawn();
        match self.wait_ready().await {
            Ok(()) => {}
            Err(NotReady::PortTaken) => self.fail(&format!("port {} was taken while it was down", self.port)),
            Err(NotReady::Failed(why)) => self.fail(&why),
        }
    }

    fn spawn(&mut self) {
        let log = fs::OpenOptions::new().create(true).append(true).open(self.log_path()).unwrap();
        let mut command = Command::new(binary());
        command
            .arg(format!("--config.file={}", self.dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", self.dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{}", self.port))
            // Targets reach the scrape loops at the next tick of this interval (5 s by default), the first
            // scrape comes within a scrape interval after: a few seconds of every test otherwise.
            .arg("--scrape.discovery-reload-interval=100ms")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if self.options.basic_auth || self.options.tls {
            command.arg(format!("--web.config.file={}", self.dir.join("web.yml").display()));
        }
        self.child = Some(command.spawn().unwrap_or_else(|e| panic!("start {}: {e}", binary().display())));
    }

    /// Polls `/-/ready` until it answers 200, the process exits, or the deadline passes.
    async fn wait_ready(&mut self) -> Result<(), NotReady> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                self.child = None;
                let log = fs::read_to_string(self.log_path()).unwrap_or_default();
                let last_start = log.rsplit("Starting Prometheus").next().unwrap_or_default();
                return Err(if last_start.contains("address already in use") {
                    NotReady::PortTaken
                } else {
                    NotReady::Failed(format!("prometheus exited ({status}) before it was ready"))
                });
            }
            let ready = self.request(Method::GET, "/-/ready").send().await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(NotReady::Failed(format!("not ready after {DEADLINE:?}")));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Panics with `why` and the end of Prometheus' log.
    fn fail(&self, why: &str) -> ! {
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect();
        panic!(
            "prometheus on port {}: {why}\nlog ({}):\n{}",
            self.port,
            self.log_path().display(),
            tail.join("\n")
        )
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("prometheus: data, config and log kept in {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

fn binary() -> PathBuf {
    let path = crate::repo_root().join("target/testenv/bin/prometheus");
    assert!(
        path.exists(),
        "{} not found: run `make testenv` (tests/testenv/build.sh builds it, cluster.sh tools links it; \
         `make cluster` does both)",
        path.display()
    );
    path
}

fn scratch_dir() -> PathBuf {
    static SERIAL: AtomicUsize = AtomicUsize::new(0);
    let n = SERIAL.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("fleetroll-prometheus-{}-{n}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// A port that was free a moment ago; Prometheus binding it can still lose a race, which `start` retries.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Prometheus' web configuration (`--web.config.file`): TLS and basic auth as `options` ask.
fn web_config(dir: &Path, options: Options) -> String {
    let mut yaml = String::new();
    if options.tls {
        let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
        let _ = writeln!(
            yaml,
            "tls_server_config:\n  cert_file: {}\n  key_file: {}",
            cert.display(),
            key.display()
        );
    }
    if options.basic_auth {
        let _ = writeln!(yaml, "basic_auth_users:\n  {USER}: '{PASSWORD_BCRYPT}'");
    }
    yaml
}

/// A CA and a serving certificate for 127.0.0.1 and localhost it signed, with the openssl CLI (which the
/// control plane's PKI needs anyway); returns the CA's PEM.
fn make_tls(dir: &Path) -> String {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap_or_else(|e| panic!("run openssl (the test environment needs it): {e}"));
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    // P-256 keys: RSA ones would take a noticeable share of a test's time to generate.
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let ca = [
        "req",
        "-x509",
        "-days",
        "2",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=fleetroll-test-ca",
    ];
    openssl(&[&ca[..], &ec[..]].concat());
    let csr = ["req", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"];
    openssl(&[&csr[..], &ec[..]].concat());
    fs::write(
        dir.join("server.ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n\
         subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "server.ext",
        "-out",
        "server.crt",
    ]);
    fs::read_to_string(dir.join("ca.crt")).unwrap()
}

/// No connection pool: a connection kept from before a stop would fail in its own way (an incomplete message)
/// where a test expects what a client of a stopped Prometheus sees, a refused connection.
fn client(ca_pem: Option<&str>) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(0);
    if let Some(pem) = ca_pem {
        builder = builder.add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).unwrap());
    }
    builder.build().unwrap()
}

/// The error ratio per deployment of the batch a metric measures, as an analysis query: every deployment's
/// own sample must be inside the range, and a failure names the deployment.
pub fn error_ratio_query() -> String {
    let rate = |family: &str| {
        format!(
            "sum by (deployment) (rate({family}{{namespace=~\"{{{{namespaces}}}}\", deployment=~\"{{{{targets}}}}\"}}[5s]))"
        )
    };
    format!("{} / {}", rate(ERRORS), rate(REQUESTS))
}

/// The value of one sample of an instant vector (`{"metric": {..}, "value": [time, "v"]}`).
pub fn sample_value(sample: &Value) -> f64 {
    let value = sample["value"][1].as_str().unwrap_or_else(|| panic!("not a sample: {sample}"));
    value.parse().unwrap_or_else(|e| panic!("sample value {value}: {e}"))
}

/// An instant vector as the value of `label` → the sample's value (`by_label(&result, "deployment")`).
pub fn by_label(result: &[Value], label: &str) -> BTreeMap<String, f64> {
    result
        .iter()
        .map(|s| (s["metric"][label].as_str().unwrap_or_default().to_string(), sample_value(s)))
        .collect()
}

/// The request rate the tests' workloads serve.
pub const REQUESTS_PER_SEC: f64 = 50.0;

/// Makes the error ratio of the Deployments `bad` (watched through `api`) rise to `ratio` once they run
/// [`NEXT_IMAGE`](super::fleet::NEXT_IMAGE), as a bad release would, in the exporter's series of
/// `namespace`; until the returned task is aborted.
pub fn errors_after_change(
    api: kube::Api<k8s_openapi::api::apps::v1::Deployment>,
    exporter: std::sync::Arc<Exporter>,
    namespace: &str,
    bad: &[&str],
    ratio: f64,
) -> tokio::task::JoinHandle<()> {
    use futures::StreamExt;
    use kube::{
        ResourceExt,
        runtime::{WatchStreamExt, watcher},
    };
    let (namespace, bad): (String, Vec<String>) =
        (namespace.to_string(), bad.iter().map(|s| s.to_string()).collect());
    tokio::spawn(async move {
        let changes = watcher(api, watcher::Config::default()).default_backoff().applied_objects();
        futures::pin_mut!(changes);
        while let Some(change) = changes.next().await {
            let Ok(d) = change else { continue };
            if bad.contains(&d.name_any()) && super::fleet::image_of(&d) == super::fleet::NEXT_IMAGE {
                exporter.set_rate(&namespace, &d.name_any(), REQUESTS_PER_SEC, ratio);
            }
        }
    })
}
