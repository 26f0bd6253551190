//! A real browser for the dashboard's tests: headless Chromium driven over WebDriver, Debian's `chromium` and
//! `chromedriver` (which `.ci/run` installs; both packages come from one source, so their versions match).
//!
//! ```ignore
//! let browser = Browser::start().await;
//! browser.goto(&dashboard.url).await;
//! browser.wait_js("three rollouts listed", "return document.querySelectorAll('[data-rollout]').length === 3",
//!     Duration::from_secs(30)).await;
//! browser.click("#pause").await;
//! ```
//!
//! Each [`Browser`] is a chromedriver of its own (its own port, in a process group of its own) driving one
//! Chromium of its own (a fresh profile directory), so tests run side by side. Dropping it kills the whole
//! group: chromedriver does not take Chromium down when it is killed itself, and Chromium's crash handlers,
//! which leave the group, exit with the browser they watch.

use std::{
    fs,
    io::Write as _,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

pub use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator, elements::Element, wd::WebDriverCompatibleCommand};
use serde_json::{Value, json};

/// Debian's paths (the packages `chromium` and `chromium-driver`).
pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// How long chromedriver may take to answer, and Chromium to open a session (two cores shared with the
/// control plane and every other test).
const START_DEADLINE: Duration = Duration::from_secs(60);
/// How often [`Browser::wait_js`] asks again.
const POLL: Duration = Duration::from_millis(50);

static SERIAL: AtomicUsize = AtomicUsize::new(0);

/// A headless Chromium of its own, driven by a chromedriver of its own; both killed when dropped.
pub struct Browser {
    client: Client,
    /// chromedriver's log (`target/test-logs/chromedriver-<n>.log`).
    pub log: PathBuf,
    _driver: Driver,
}

/// A chromedriver process group and the profile directory of its Chromium: killed and removed when dropped,
/// including when a start fails half-way.
struct Driver {
    child: Child,
    /// Whether `child` was reaped already (its pid may be another process's by now).
    reaped: bool,
    profile: PathBuf,
}

/// Why a chromedriver did not come up.
enum NotUp {
    /// It exited (most likely the port was taken between choosing it and binding it): try another.
    Exited(String),
    TimedOut,
}

impl Browser {
    /// Starts chromedriver on a free port, waits until it answers, and opens a session in a headless Chromium
    /// with a fresh profile. Panics (naming the log) if either does not come up.
    pub async fn start() -> Browser {
        assert!(
            Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists(),
            "{CHROMIUM} or {CHROMEDRIVER} is missing: install Debian's chromium and chromium-driver (.ci/run does)"
        );
        let n = SERIAL.fetch_add(1, Ordering::Relaxed);
        let dir = crate::repo_root().join("target/test-logs");
        fs::create_dir_all(&dir).expect("target/test-logs");
        let log = dir.join(format!("chromedriver-{n}.log"));
        let profile = std::env::temp_dir().join(format!("fleetroll-chromium-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&profile);
        fs::create_dir_all(&profile).expect("a Chromium profile directory");
        for attempt in 1.. {
            let port = crate::operator::free_port();
            let mut driver =
                Driver { child: spawn_driver(port, &log), reaped: false, profile: profile.clone() };
            match wait_up(&mut driver, port).await {
                Ok(()) => {
                    let client = open_session(port, &profile, &log).await;
                    return Browser { client, log, _driver: driver };
                }
                Err(NotUp::Exited(status)) if attempt < 5 => {
                    eprintln!("chromedriver on port {port} exited ({status}); trying another port");
                }
                Err(NotUp::Exited(status)) => panic!("chromedriver exited ({status}); see {}", log.display()),
                Err(NotUp::TimedOut) => {
                    panic!("chromedriver did not answer within {START_DEADLINE:?}; see {}", log.display())
                }
            }
        }
        unreachable!()
    }

    /// The WebDriver client itself, for what this wrapper does not offer.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Navigates to `url` and waits until it has loaded (the document's load event).
    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap_or_else(|e| panic!("load {url}: {e}"));
    }

    /// Runs `script` (a function body: `return ...`; `arguments[i]` are `args`) in the page; what it returns.
    pub async fn js(&self, script: &str, args: Vec<Value>) -> Value {
        self.client.execute(script, args).await.unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Runs `script` (no arguments) until it returns a truthy value (as JavaScript judges it), and returns
    /// that; panics after `deadline` naming `what` and the last value (or error) seen. A script that throws
    /// counts as "not yet" (e.g. an element that is not there yet).
    pub async fn wait_js(&self, what: &str, script: &str, deadline: Duration) -> Value {
        let end = tokio::time::Instant::now() + deadline;
        loop {
            let last = match self.client.execute(script, Vec::new()).await {
                Ok(value) if truthy(&value) => return value,
                Ok(value) => value.to_string(),
                Err(e) => format!("error: {e}"),
            };
            if tokio::time::Instant::now() >= end {
                let url = self.client.current_url().await.map(|u| u.to_string()).unwrap_or_default();
                panic!(
                    "timed out after {deadline:?} waiting for {what} on {url}; the script last gave {last}\n{script}"
                )
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The first element matching the CSS selector; panics if there is none.
    pub async fn find(&self, css: &str) -> Element {
        self.client.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("no element {css:?}: {e}"))
    }

    /// Clicks the first element matching `css` (as a user would: it must be visible and not covered).
    pub async fn click(&self, css: &str) {
        self.find(css).await.click().await.unwrap_or_else(|e| panic!("click {css:?}: {e}"));
    }

    /// Presses `key` (e.g. `fantoccini::key::Key::Right`) in the focused element, through the browser's
    /// input pipeline as a person's key press goes.
    pub async fn press(&self, key: fantoccini::key::Key) {
        let focused =
            self.client.active_element().await.unwrap_or_else(|e| panic!("the focused element: {e}"));
        focused
            .send_keys(&char::from(key).to_string())
            .await
            .unwrap_or_else(|e| panic!("press {key:?}: {e}"));
    }

    /// The rendered text of the first element matching `css` (what a user sees: hidden text is left out).
    pub async fn text(&self, css: &str) -> String {
        self.find(css).await.text().await.unwrap_or_else(|e| panic!("text of {css:?}: {e}"))
    }

    /// An attribute of the first element matching `css`; None when it has no such attribute.
    pub async fn attr(&self, css: &str, name: &str) -> Option<String> {
        self.find(css).await.attr(name).await.unwrap_or_else(|e| panic!("attribute {name} of {css:?}: {e}"))
    }

    /// Writes a PNG of the viewport to `path` (creating its directory).
    pub async fn screenshot(&self, path: &Path) {
        let png = self.client.screenshot().await.unwrap_or_else(|e| panic!("screenshot: {e}"));
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        }
        fs::write(path, png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// The browser's log entries since the last call (chromedriver hands each out once), as
    /// `{"level", "message", "source", "timestamp"}`: console messages, uncaught errors, failed loads and
    /// Content-Security-Policy violations.
    pub async fn browser_log(&self) -> Vec<Value> {
        match self.client.issue_cmd(BrowserLog).await {
            Ok(Value::Array(entries)) => entries,
            Ok(other) => panic!("the browser log is not a list: {other}"),
            Err(e) => panic!("read the browser log: {e}"),
        }
    }

    /// The messages of the SEVERE entries of [`Browser::browser_log`] since the last call: `console.error`,
    /// uncaught exceptions, failed requests, CSP violations ("Executing inline script violates the following
    /// Content Security Policy directive ..."). Chromium asks for `/favicon.ico` by itself unless the page
    /// names an icon: a 404 there is an entry too.
    pub async fn console_errors(&self) -> Vec<String> {
        self.browser_log()
            .await
            .into_iter()
            .filter(|entry| entry["level"] == "SEVERE")
            .map(|entry| entry["message"].as_str().unwrap_or_default().to_string())
            .collect()
    }
}

impl Drop for Driver {
    /// SIGKILLs the process group (chromedriver and its Chromium), reaps chromedriver (Chromium's processes,
    /// orphaned, are reaped by init), and removes the profile.
    fn drop(&mut self) {
        if !self.reaped {
            let group = format!("-{}", self.child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = fs::remove_dir_all(&self.profile);
    }
}

/// JavaScript's truthiness, for a value come back as JSON.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

/// chromedriver on 127.0.0.1:`port`, in a process group of its own (the Chromium it starts joins it), its
/// output to `log`.
fn spawn_driver(port: u16, log: &Path) -> Child {
    let mut file = fs::File::create(log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
    let _ = writeln!(file, "# {CHROMEDRIVER} --port={port}");
    let stderr = file.try_clone().expect("the log file's handle");
    Command::new(CHROMEDRIVER)
        .args([format!("--port={port}"), "--log-level=INFO".into()])
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {CHROMEDRIVER}: {e}"))
}

/// Waits until chromedriver's `/status` says it is ready, it exits, or [`START_DEADLINE`] passes.
async fn wait_up(driver: &mut Driver, port: u16) -> Result<(), NotUp> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("an HTTP client");
    let url = format!("http://127.0.0.1:{port}/status");
    let end = tokio::time::Instant::now() + START_DEADLINE;
    loop {
        if let Ok(Some(status)) = driver.child.try_wait() {
            driver.reaped = true;
            return Err(NotUp::Exited(status.to_string()));
        }
        if let Ok(response) = http.get(&url).send().await
            && let Ok(body) = response.bytes().await
            && serde_json::from_slice::<Value>(&body).is_ok_and(|status| status["value"]["ready"] == true)
        {
            return Ok(());
        }
        if tokio::time::Instant::now() >= end {
            return Err(NotUp::TimedOut);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A WebDriver session in a new headless Chromium with its profile in `profile` and its console kept
/// (`goog:loggingPrefs`).
async fn open_session(port: u16, profile: &Path, log: &Path) -> Client {
    let args = [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        // Without these Chromium calls Google's services at start, which this machine's closed network
        // refuses (and Debian's launcher leaves them out when remote extensions are on, as they are by default).
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ];
    let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    args.push(format!("--user-data-dir={}", profile.display()));
    let capabilities = json!({
        "browserName": "chrome",
        "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        "goog:loggingPrefs": {"browser": "ALL"},
    });
    let Value::Object(capabilities) = capabilities else { unreachable!("a JSON object") };
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let opened = tokio::time::timeout(
        START_DEADLINE,
        ClientBuilder::new(connector).capabilities(capabilities).connect(&format!("http://127.0.0.1:{port}")),
    )
    .await;
    match opened {
        Ok(Ok(client)) => client,
        Ok(Err(e)) => panic!("Chromium did not start: {e}; see {}", log.display()),
        Err(_) => panic!("Chromium did not start within {START_DEADLINE:?}; see {}", log.display()),
    }
}

/// The browser's log (chromedriver's `POST /session/{id}/se/log`, which serves what `goog:loggingPrefs`
/// kept; fantoccini has no command for it).
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(&self, base_url: &url::Url, session_id: Option<&str>) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!("session/{}/se/log", session_id.unwrap_or_default()))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(json!({"type": "browser"}).to_string()))
    }
}
