//! `kubectl fleetroll dashboard` as a user runs it: the plugin binary under test, serving the page on a port
//! of its own until it is dropped (then SIGKILLed).
//!
//! ```ignore
//! let dashboard = Dashboard::start(&cluster.kubeconfig, &[]).await;
//! browser.goto(&dashboard.url).await;
//! ```

use std::{
    fs,
    io::{BufRead, BufReader, Write as _},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

/// What the command prints, once, before the address.
const BANNER: &str = "fleetroll dashboard: ";
/// How long it may take to print it (it builds a client from the kubeconfig and binds a port first).
const START_DEADLINE: Duration = Duration::from_secs(60);

static SERIAL: AtomicUsize = AtomicUsize::new(0);

/// A running `kubectl fleetroll dashboard --no-open`. Killed (SIGKILL) when dropped.
pub struct Dashboard {
    child: Child,
    /// The address it printed, token fragment included: `http://127.0.0.1:PORT/#token=TOKEN`.
    pub url: String,
    /// `http://127.0.0.1:PORT`: what the page's requests carry as their `Origin`.
    pub origin: String,
    /// The bearer token of its API (64 hex characters).
    pub token: String,
    /// Its stderr, and its stdout after the address (`target/test-logs/dashboard-<n>.log`).
    pub log: PathBuf,
}

impl Dashboard {
    /// Starts `kubectl-fleetroll --kubeconfig <kubeconfig> dashboard --no-open <extra_args...>` and waits
    /// until it prints its address; panics (with its log) if it exits or does not within a minute.
    pub async fn start(kubeconfig: &Path, extra_args: &[&str]) -> Dashboard {
        let n = SERIAL.fetch_add(1, Ordering::Relaxed);
        let dir = crate::repo_root().join("target/test-logs");
        fs::create_dir_all(&dir).expect("target/test-logs");
        let log = dir.join(format!("dashboard-{n}.log"));
        let file = fs::File::create(&log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
        let stderr = file.try_clone().expect("the log file's handle");
        // The binary under test, run as the plugin: it is the kubectl plugin when invoked as kubectl-fleetroll.
        let mut child = Command::new(crate::fleetroll_bin())
            .arg0("kubectl-fleetroll")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["dashboard", "--no-open"])
            .args(extra_args)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn kubectl-fleetroll dashboard: {e}"));
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = tokio::sync::oneshot::channel();
        // Reads until the address, hands it over, then keeps draining stdout into the log (a full pipe would
        // block the dashboard).
        std::thread::spawn(move || {
            let mut file = file;
            let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
            let mut tx = Some(tx);
            for line in lines.by_ref() {
                let _ = writeln!(file, "{line}");
                if let Some(url) = line.strip_prefix(BANNER)
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let url = match tokio::time::timeout(START_DEADLINE, rx).await {
            Ok(Ok(url)) => url,
            Ok(Err(_)) => {
                let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
                let text = fs::read_to_string(&log).unwrap_or_default();
                panic!(
                    "the dashboard ended ({status}) before printing its address; {}:\n{text}",
                    log.display()
                )
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let text = fs::read_to_string(&log).unwrap_or_default();
                panic!(
                    "the dashboard printed no address within {START_DEADLINE:?}; {}:\n{text}",
                    log.display()
                )
            }
        };
        let (origin, token) = parse(&url);
        Dashboard { child, url, origin, token, log }
    }

    /// The address of `path` on it (`path` starts with `/`), for requests made without the browser.
    pub fn api(&self, path: &str) -> String {
        format!("{}{path}", self.origin)
    }

    /// The page's address with `route` (`#/r/<ns>/<name>`) instead of the token: for a browser that has the
    /// token already (the page keeps it in sessionStorage).
    pub fn route(&self, route: &str) -> String {
        format!("{}/{route}", self.origin)
    }

    /// Its process id (to signal it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asks the page in `browser` for `route` and, once `done` (a script's expression) holds, says how long it
/// took to render: from its data arriving in the page, and from the view being asked for (ms, the page's
/// clock: `window.fleetrollDashboard`'s stamps).
pub async fn render_time(
    browser: &crate::browser::Browser,
    route: &str,
    done: &str,
    deadline: Duration,
) -> (f64, f64) {
    let asked = browser
        .js(
            "window.fleetrollDashboard.renderedAt = 0; const t = Date.now(); location.hash = arguments[0]; return t",
            vec![serde_json::Value::from(route)],
        )
        .await;
    let ready = format!("return window.fleetrollDashboard.renderedAt > 0 && ({done})");
    browser.wait_js("the view to render", &ready, deadline).await;
    let stamps =
        browser.js("const d = window.fleetrollDashboard; return [d.receivedAt, d.renderedAt]", vec![]).await;
    let at = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    (at(&stamps[1]) - at(&stamps[0]), at(&stamps[1]) - at(&asked))
}

/// `http://127.0.0.1:PORT/#token=TOKEN` → (`http://127.0.0.1:PORT`, `TOKEN`).
fn parse(url: &str) -> (String, String) {
    let (page, fragment) = url.split_once("/#").unwrap_or_else(|| panic!("no fragment in {url:?}"));
    let token = fragment.strip_prefix("token=").unwrap_or_else(|| panic!("no token in {url:?}"));
    assert!(
        token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "the token is not 64 hex characters: {url:?}"
    );
    (page.to_string(), token.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_address_splits_into_origin_and_token() {
        let token = "0123456789abcdef".repeat(4);
        let (origin, got) = super::parse(&format!("http://127.0.0.1:4321/#token={token}"));
        assert_eq!((origin.as_str(), got.as_str()), ("http://127.0.0.1:4321", token.as_str()));
    }
}
