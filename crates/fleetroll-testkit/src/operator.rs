//! The real `fleetroll` binary, run as a child process against the test cluster, SIGKILLed at will.

use std::{
    io::{BufRead, BufReader, Write},
    net::TcpListener,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex, mpsc},
    time::Duration,
};

/// A running operator. Killed (SIGKILL) when dropped.
pub struct Operator {
    child: Child,
    /// The lease holder identity it campaigns as (`--identity`): an operator started again with the same
    /// one takes its lease back at once, as a restarted pod of a StatefulSet would.
    pub identity: String,
    pub port: u16,
    pub log: PathBuf,
    lines: Arc<Mutex<mpsc::Receiver<String>>>,
}

static SERIAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

impl Operator {
    /// Starts `fleetroll operator` scoped to namespace `ns` (its FleetRollouts, its lease, and as the fleet
    /// namespace), with `extra` arguments and environment. Its MCP endpoint is unauthenticated unless
    /// `extra` says otherwise.
    pub fn start(ns: &str, extra: &[&str], env: &[(&str, &str)]) -> Operator {
        Self::spawn("operator", ns, extra, env)
    }

    /// Starts `fleetroll operator` as [`Operator::start`] does, under libfaketime with its wall clock
    /// `offset` from the real one (libfaketime's syntax: "+60s", "-60s"). Its monotonic clock is left
    /// alone, as NTP leaves it on a node whose wall clock is off.
    pub fn start_skewed(ns: &str, offset: &str, extra: &[&str], env: &[(&str, &str)]) -> Operator {
        let lib = libfaketime();
        let mut all =
            vec![("LD_PRELOAD", lib.as_str()), ("FAKETIME", offset), ("FAKETIME_DONT_FAKE_MONOTONIC", "1")];
        all.extend_from_slice(env);
        Self::spawn("operator", ns, extra, &all)
    }

    /// Starts `fleetroll mcp` (the MCP server alone) with `ns` as its fleet namespace.
    pub fn start_mcp(ns: &str, extra: &[&str], env: &[(&str, &str)]) -> Operator {
        Self::spawn("mcp", ns, extra, env)
    }

    fn spawn(subcommand: &str, ns: &str, extra: &[&str], env: &[(&str, &str)]) -> Operator {
        let port = free_port();
        let n = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = crate::repo_root().join("target/test-logs");
        std::fs::create_dir_all(&dir).expect("log dir");
        let log = dir.join(format!("{ns}-{subcommand}-{n}.log"));
        let mut cmd = Command::new(crate::fleetroll_bin());
        cmd.args([subcommand, "--listen", &format!("127.0.0.1:{port}")]);
        if subcommand == "operator" {
            cmd.args(["--namespace", ns, "--lease-namespace", ns]);
        }
        // `{port}` in an argument stands for the port this process listens on (e.g. in an MCP audience).
        cmd.args(extra.iter().map(|a| a.replace("{port}", &port.to_string())))
            .env("KUBECONFIG", &super::cluster().kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("FLEETROLL_TEST_LOG")
                    .unwrap_or_else(|_| "info,fleetroll=debug,kube_runtime=debug".into()),
            )
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // Defaults for what `extra` does not set itself.
        let identity = format!("test-operator-{n}");
        let mut defaults = vec![("--fleet-namespace", ns), ("--auth", "none")];
        if subcommand == "operator" {
            // A lease long enough that a renewal delayed by a loaded machine (every test's operators and control
            // planes on two cores) does not make a leader step down mid-test; tests of leadership set their own.
            defaults.extend([("--identity", identity.as_str()), ("--lease-duration", "30s")]);
        }
        for (flag, value) in defaults {
            if !extra.contains(&flag) {
                cmd.args([flag, value]);
            }
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn fleetroll operator");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        let path = log.clone();
        std::thread::spawn(move || {
            let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path).ok();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(f) = file.as_mut() {
                    let _ = writeln!(f, "{line}");
                }
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let identity = extra
            .iter()
            .position(|a| *a == "--identity")
            .and_then(|i| extra.get(i + 1))
            .map_or(identity, |given| given.to_string());
        Operator { child, identity, port, log, lines: Arc::new(Mutex::new(rx)) }
    }

    /// Waits until the operator prints a line containing `needle`; false after `timeout`.
    pub async fn wait_for_line(&self, needle: &str, timeout: Duration) -> bool {
        self.wait_for_line_text(needle, timeout).await.is_some()
    }

    /// Waits until the operator prints a line containing `needle`, and returns that line; None after
    /// `timeout`.
    pub async fn wait_for_line_text(&self, needle: &str, timeout: Duration) -> Option<String> {
        let lines = self.lines.clone();
        let needle = needle.to_string();
        tokio::task::spawn_blocking(move || {
            let rx = lines.lock().expect("lines");
            let deadline = std::time::Instant::now() + timeout;
            loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                match rx.recv_timeout(left) {
                    Ok(line) if line.contains(&needle) => return Some(line),
                    Ok(_) => {}
                    Err(_) => return None,
                }
            }
        })
        .await
        .unwrap_or(None)
    }

    /// The MCP endpoint.
    pub fn mcp_url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// SIGKILL: no clean-up of any kind, as in a node failure.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the HTTP listener answers /readyz with 200 (the CRD is reachable).
    pub async fn ready(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let url = format!("http://127.0.0.1:{}/readyz", self.port);
        while std::time::Instant::now() < deadline {
            if reqwest::get(&url).await.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            // An HTTP endpoint has nothing to watch: poll it, up to the deadline.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{url} did not become ready; see {}", self.log.display());
    }

    /// The operator's own metrics.
    pub async fn metrics(&self) -> String {
        http_get(self.port, "/metrics").await
    }
}

/// libfaketime's preload library: `$FLEETROLL_LIBFAKETIME`, else where Debian's `faketime` package puts it.
/// Panics when it is not there: a clock-skew test that skipped itself would prove nothing.
pub fn libfaketime() -> String {
    if let Some(path) = std::env::var_os("FLEETROLL_LIBFAKETIME") {
        assert!(PathBuf::from(&path).is_file(), "FLEETROLL_LIBFAKETIME={} is not a file", path.display());
        return path.to_string_lossy().into_owned();
    }
    ["/usr/lib", "/usr/lib64", "/usr/local/lib"]
        .into_iter()
        .flat_map(|root| {
            let multiarch = std::fs::read_dir(root).into_iter().flatten().flatten().map(|e| e.path());
            std::iter::once(PathBuf::from(root)).chain(multiarch)
        })
        .map(|dir| dir.join("faketime/libfaketime.so.1"))
        .find(|lib| lib.is_file())
        .map(|lib| lib.to_string_lossy().into_owned())
        .unwrap_or_else(|| {
            panic!(
                "libfaketime is not installed, and the clock-skew tests need it: install Debian's `faketime` \
                 package (`apt-get install faketime`; .ci/run does), or set FLEETROLL_LIBFAKETIME to its \
                 libfaketime.so.1"
            )
        })
}

/// `GET path` on 127.0.0.1:`port` over plain HTTP/1.0: the whole response, status line first; empty if
/// nothing answers.
pub async fn http_get(port: u16, path: &str) -> String {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return String::new();
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let mut out = String::new();
        if write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").is_ok() {
            let _ = std::io::Read::read_to_string(&mut stream, &mut out);
        }
        out
    })
    .await
    .unwrap_or_default()
}

/// The status code of a response [`http_get`] returned.
pub fn status(response: &str) -> Option<u16> {
    response.split_whitespace().nth(1)?.parse().ok()
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A metric's value from the text exposition.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Peak resident memory (VmHWM, bytes) and CPU seconds (user + system) of a process.
pub fn process_usage(pid: u32) -> (u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, r)| r).split_whitespace().collect();
    // After the command: state(0) ... utime(11) stime(12), in clock ticks (100 per second on Linux).
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (hwm, (ticks(11) + ticks(12)) / 100.0)
}
