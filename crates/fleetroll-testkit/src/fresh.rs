//! A newcomer's machine, as far as a test can make one: a local cluster of the test's own (tests/testenv with
//! a state directory of its own, so nothing another test or fixture installed is there), and commands run
//! with only what a new user's shell has in its environment. A shared, prepared cluster would hide what the
//! user's path fails to install.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use super::repo_root;

/// What a user's shell has, and the caches a fresh machine builds once (Go's, Cargo's, the test
/// environment's): every other variable of the test process (KUBECONFIG, FLEETROLL_*, MEMBERS) is left out.
const USER_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "TERM",
    "TMPDIR",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
    "CARGO_INCREMENTAL",
    "GOPATH",
    "GOCACHE",
    "GOMODCACHE",
    "XDG_CACHE_HOME",
    "FLEETROLL_CACHE",
];

/// A fresh local cluster's state directory, `target/fresh/<name>`: started by what the test runs
/// (`make cluster`, the demo), stopped and removed on drop, pass or fail.
pub struct FreshCluster {
    pub dir: PathBuf,
}

impl FreshCluster {
    /// A clean `target/fresh/<name>`; a cluster a killed earlier run left there is stopped first.
    pub fn new(name: &str) -> FreshCluster {
        let fresh = FreshCluster { dir: repo_root().join("target/fresh").join(name) };
        fresh.down();
        std::fs::create_dir_all(&fresh.dir).unwrap_or_else(|e| panic!("create {}: {e}", fresh.dir.display()));
        fresh
    }

    /// The local control plane's directory (FLEETROLL_TESTENV) for this cluster.
    pub fn testenv(&self) -> PathBuf {
        self.dir.join("testenv")
    }

    /// `program` in the repository, with a new user's environment pointed at this cluster's directory.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(program);
        cmd.current_dir(repo_root()).env_clear().stdin(Stdio::null()).kill_on_drop(true);
        for key in USER_ENV {
            if let Some(value) = std::env::var_os(key) {
                cmd.env(key, value);
            }
        }
        cmd.env("FLEETROLL_TESTENV", self.testenv());
        cmd
    }

    fn down(&self) {
        if self.testenv().join("pids").is_dir() {
            let _ = std::process::Command::new("bash")
                .arg(repo_root().join("tests/testenv/cluster.sh"))
                .arg("down")
                .env("FLEETROLL_TESTENV", self.testenv())
                .stdout(Stdio::null())
                .status();
        }
        if self.dir.exists() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// A client of this cluster, as its admin (once `make cluster` has started it).
    pub async fn client(&self) -> kube::Client {
        super::tenant::client_from(&self.testenv().join("kubeconfig"), None).await
    }

    /// Runs `script` with `bash -euo pipefail` in [`FreshCluster::command`]'s shell, with `path_front` before
    /// its PATH, in a process group of its own that is killed when the script ends (the manual's pages start
    /// processes in the background); whether it succeeded, and its output (stdout and stderr together).
    /// Panics after `timeout`.
    pub async fn sh(&self, script: &str, path_front: Option<&Path>, timeout: Duration) -> (bool, String) {
        static RUNS: AtomicUsize = AtomicUsize::new(0);
        let log = self.path(&format!("sh-{}.log", RUNS.fetch_add(1, Ordering::Relaxed)));
        let out = std::fs::File::create(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let mut cmd = self.command("bash");
        if let Some(front) = path_front {
            cmd.env("PATH", format!("{}:{}", front.display(), std::env::var("PATH").unwrap_or_default()));
        }
        // Output to a file, not a pipe: a process left in the background would hold a pipe open.
        cmd.args(["-euo", "pipefail", "-c", script])
            .stdout(Stdio::from(out.try_clone().expect("the log")))
            .stderr(Stdio::from(out))
            .process_group(0);
        let mut child = cmd.spawn().expect("run bash");
        let group = child.id().map(|pid| format!("-{pid}"));
        let status = tokio::time::timeout(timeout, child.wait()).await;
        if let Some(group) = group {
            let _ = tokio::process::Command::new("kill").args(["-TERM", "--", &group]).status().await;
        }
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        match status {
            Ok(Ok(status)) => (status.success(), text),
            Ok(Err(e)) => panic!("waiting for bash: {e}"),
            Err(_) => panic!("this took over {timeout:?}:\n{script}\n{text}"),
        }
    }

    /// A path in this cluster's directory, for what the test keeps beside the cluster (the demo's files).
    pub fn path(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }
}

impl Drop for FreshCluster {
    fn drop(&mut self) {
        self.down();
    }
}

/// The ```sh blocks of a page of the repository, in order: what a reader of it runs.
pub fn sh_blocks(page: &str) -> Vec<String> {
    let path = repo_root().join(page);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.split("```sh\n")
        .skip(1)
        .map(|rest| {
            rest[..rest.find("```").unwrap_or_else(|| panic!("{page}: a block never closed"))].to_string()
        })
        .collect()
}
