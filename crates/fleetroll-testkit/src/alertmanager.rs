//! A real Alertmanager for the notification sink's tests: `target/testenv/bin/alertmanager` (built by
//! `tests/testenv/build.sh`), sending every alert group to one webhook, typically a
//! [`Receiver`](crate::receiver::Receiver) the test controls. No cluster needed.
//!
//! ```ignore
//! let receiver = Receiver::start();
//! let alertmanager = Alertmanager::start(&receiver.url("hook")).await;
//! alertmanager.post_alerts(&json!([{"labels": {"alertname": "Test"}}])).await;
//! receiver.wait_for(Duration::from_secs(10), |r| !r.is_empty()).await;
//! ```
//!
//! The route does not aggregate (`group_by: ['...']`: one alert per group, so one alert per webhook message),
//! waits 1 s before a group's first message and between messages of a group, and repeats a firing alert
//! only after an hour: within a test, an alert (a label set) reaches the webhook once, however often it is
//! POSTed. Alerts live in memory only: a [`stop`](Alertmanager::stop) forgets them.

use std::{
    fs,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use serde_json::Value;

/// How long Alertmanager may take to become ready.
const DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

/// An Alertmanager process of its own, with its data, config and log in a scratch directory, which is
/// removed when it is dropped (and kept, with its path printed, when the test panicked).
pub struct Alertmanager {
    dir: PathBuf,
    /// 0 until the first start has bound a port (the kernel picks it: `--web.listen-address=127.0.0.1:0`).
    port: u16,
    http: reqwest::Client,
    child: Option<Child>,
}

impl Alertmanager {
    /// Starts Alertmanager sending to `webhook_url` and waits until it is ready.
    pub async fn start(webhook_url: &str) -> Alertmanager {
        let dir = scratch_dir();
        fs::write(dir.join("alertmanager.yml"), config(webhook_url)).expect("write alertmanager.yml");
        let mut alertmanager = Alertmanager { dir, port: 0, http: client(), child: None };
        alertmanager.spawn();
        if let Err(why) = alertmanager.wait_ready().await {
            alertmanager.fail(&why);
        }
        alertmanager
    }

    /// `http://127.0.0.1:PORT`: what a sink is configured with.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Alertmanager's log (every start of it).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("alertmanager.log")
    }

    /// A client without a connection pool (see [`client`]).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// POSTs `alerts` (a JSON array of postable alerts) to `/api/v2/alerts`, as Prometheus does, and returns
    /// the answer (200, or 400 naming what is wrong); panics when Alertmanager cannot be reached.
    pub async fn post_alerts(&self, alerts: &Value) -> reqwest::Response {
        self.try_post_alerts(alerts).await.unwrap_or_else(|e| self.fail(&format!("POST /api/v2/alerts: {e}")))
    }

    /// [`Self::post_alerts`], with the error when it cannot be reached (`e.is_connect()` when it is stopped).
    pub async fn try_post_alerts(&self, alerts: &Value) -> reqwest::Result<reqwest::Response> {
        self.http
            .post(format!("{}/api/v2/alerts", self.url()))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(alerts.to_string())
            .send()
            .await
    }

    /// The alerts it holds (`GET /api/v2/alerts`), one per label set.
    pub async fn alerts(&self) -> Vec<Value> {
        let response = self.http.get(format!("{}/api/v2/alerts", self.url())).send().await;
        let response = response.unwrap_or_else(|e| self.fail(&format!("GET /api/v2/alerts: {e}")));
        let status = response.status();
        let body = response.text().await.unwrap_or_else(|e| self.fail(&format!("GET /api/v2/alerts: {e}")));
        match serde_json::from_str(&body) {
            Ok(Value::Array(alerts)) if status.is_success() => alerts,
            _ => self.fail(&format!("GET /api/v2/alerts answered {status}: {body}")),
        }
    }

    /// How often, since the last start, the dispatcher has flushed a group (run the notification pipeline
    /// for it: send, or find it already sent) holding a label with value `label_value`, by its debug log. A
    /// flush blocks its group until the webhook has answered, so once this count has grown by 2, a flush that
    /// began after the count was first read has ended, and what it sent has arrived: the way to know that
    /// something was *not* sent.
    pub fn flushes(&self, label_value: &str) -> usize {
        let value = format!("=\\\"{label_value}\\\"");
        self.last_start_log().lines().filter(|l| l.contains(" msg=flushing ") && l.contains(&value)).count()
    }

    /// Kills Alertmanager (an outage; the alerts and notification log it held are lost), keeping its
    /// config, data directory and port for [`Self::start_again`].
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again after [`Self::stop`], on the same port with the same config and data directory, and
    /// waits until it is ready.
    pub async fn start_again(&mut self) {
        assert!(self.child.is_none(), "start_again: Alertmanager is running; stop it first");
        self.spawn();
        if let Err(why) = self.wait_ready().await {
            self.fail(&why);
        }
    }

    fn spawn(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap_or_else(|e| panic!("open {}: {e}", self.log_path().display()));
        let child = Command::new(binary())
            .arg(format!("--config.file={}", self.dir.join("alertmanager.yml").display()))
            .arg(format!("--storage.path={}", self.dir.join("data").display()))
            // Port 0 at the first start: the kernel picks a free one, which the log says (no race).
            .arg(format!("--web.listen-address=127.0.0.1:{}", self.port))
            // No high availability: no gossip port, and notifications do not wait for peers.
            .arg("--cluster.listen-address=")
            .arg("--log.level=debug")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log file"))
            .stderr(log)
            .spawn();
        self.child = Some(child.unwrap_or_else(|e| panic!("start {}: {e}", binary().display())));
    }

    /// Learns the port from the log if it is not known yet, then polls `/-/ready` until it answers 200, the
    /// process exits, or the deadline passes.
    async fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                let mut why = format!("alertmanager exited ({status}) before it was ready");
                if self.last_start_log().contains("address already in use") {
                    why += &format!(": port {} was taken while it was down", self.port);
                }
                return Err(why);
            }
            if self.port == 0 {
                self.port = listening_port(&self.last_start_log()).unwrap_or(0);
            }
            if self.port != 0 {
                let ready = self.http.get(format!("{}/-/ready", self.url())).send().await;
                if ready.is_ok_and(|r| r.status().is_success()) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!("not ready after {DEADLINE:?}"));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The log since the last start.
    fn last_start_log(&self) -> String {
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        log.rsplit("msg=\"Starting Alertmanager\"").next().unwrap_or_default().to_string()
    }

    /// Panics with `why` and the end of Alertmanager's log.
    fn fail(&self, why: &str) -> ! {
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect();
        panic!(
            "alertmanager on port {}: {why}\nlog ({}):\n{}",
            self.port,
            self.log_path().display(),
            tail.join("\n")
        )
    }
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("alertmanager: data, config and log kept in {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// The port of exporter-toolkit's `msg="Listening on" address=127.0.0.1:PORT` line.
fn listening_port(log: &str) -> Option<u16> {
    log.lines()
        .filter(|l| l.contains("msg=\"Listening on\""))
        .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("address=127.0.0.1:")))
        .and_then(|port| port.parse().ok())
}

/// One route to one webhook, without aggregation and without repeats within a test (see the module's doc).
fn config(webhook_url: &str) -> String {
    format!(
        "route:\n  receiver: hook\n  group_by: ['...']\n  group_wait: 1s\n  group_interval: 1s\n  \
         repeat_interval: 1h\nreceivers:\n  - name: hook\n    webhook_configs:\n      - url: '{}'\n        \
         send_resolved: false\n",
        webhook_url.replace('\'', "''")
    )
}

fn binary() -> PathBuf {
    let path = crate::repo_root().join("target/testenv/bin/alertmanager");
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
    let dir = std::env::temp_dir().join(format!("fleetroll-alertmanager-{}-{n}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

/// No connection pool: a connection kept from before a stop would fail in its own way (an incomplete message)
/// where a test expects what a client of a stopped Alertmanager sees, a refused connection.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(0)
        .build()
        .expect("an HTTP client")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_port_is_read_from_the_listening_line() {
        let log = "time=x level=INFO source=app.go:191 msg=\"Starting Alertmanager\" version=0.35.0\n\
                   time=x level=INFO source=tls_config.go:395 msg=\"Listening on\" address=127.0.0.1:43055\n\
                   time=x level=INFO source=tls_config.go:398 msg=\"TLS is disabled.\" address=127.0.0.1:1\n";
        assert_eq!(super::listening_port(log), Some(43055));
        assert_eq!(super::listening_port("msg=\"Starting Alertmanager\"\n"), None);
    }
}
