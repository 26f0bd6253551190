//! Command-line tools as a user runs them: kubectl (with the fleetroll plugin on its PATH) and helm.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

fn root() -> PathBuf {
    crate::repo_root().to_path_buf()
}

/// The local control plane's binary, else the one on PATH (a user's own cluster).
fn binary(name: &str) -> PathBuf {
    let local = root().join("target/testenv/bin").join(name);
    if local.exists() { local } else { PathBuf::from(name) }
}

/// PATH with a directory holding `kubectl-fleetroll` (a link to the binary under test) in front.
fn plugin_path() -> String {
    let dir = root().join("target/test-bin");
    std::fs::create_dir_all(&dir).expect("target/test-bin");
    let link = dir.join("kubectl-fleetroll");
    let bin = crate::fleetroll_bin();
    if std::fs::read_link(&link).ok() != Some(bin.clone()) {
        // Tests run this concurrently: link under a name of our own, then rename over (atomic).
        static SERIAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let own = dir.join(format!(".kubectl-fleetroll-{}-{n}", std::process::id()));
        let _ = std::fs::remove_file(&own);
        std::os::unix::fs::symlink(&bin, &own).expect("link kubectl-fleetroll");
        std::fs::rename(&own, &link).expect("link kubectl-fleetroll");
    }
    format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default())
}

/// What a command did.
#[derive(Debug)]
pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    /// Panics with the output unless the command exited 0.
    pub fn ok(self) -> Ran {
        assert_eq!(self.code, 0, "exit {}\nstdout:\n{}\nstderr:\n{}", self.code, self.stdout, self.stderr);
        self
    }
}

pub async fn run(program: &Path, args: &[&str], kubeconfig: Option<&Path>) -> Ran {
    run_in(program, args, kubeconfig, plugin_path()).await
}

/// `kubectl` (with `kubeconfig`, else the test cluster's) with `dir` in front of its PATH too (a stand-in
/// for a program it may run).
pub async fn kubectl_with_path(dir: &Path, kubeconfig: Option<&Path>, args: &[&str]) -> Ran {
    run_in(&binary("kubectl"), args, kubeconfig, format!("{}:{}", dir.display(), plugin_path())).await
}

async fn run_in(program: &Path, args: &[&str], kubeconfig: Option<&Path>, path: String) -> Ran {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig.map_or_else(|| super::cluster().kubeconfig, Path::to_path_buf))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(300), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{} {args:?} did not finish in 300s", program.display()))
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub async fn kubectl(args: &[&str]) -> Ran {
    run(&binary("kubectl"), args, None).await
}

pub async fn kubectl_as(kubeconfig: &Path, args: &[&str]) -> Ran {
    run(&binary("kubectl"), args, Some(kubeconfig)).await
}

pub async fn helm(args: &[&str]) -> Ran {
    let helm = std::env::var_os("HELM").map(PathBuf::from).unwrap_or_else(|| binary("helm"));
    run(&helm, args, None).await
}

/// krew's manifest validator, which tests/testenv/build.sh builds and cluster.sh links with kubectl.
pub async fn validate_krew_manifest(args: &[&str]) -> Ran {
    let validator = binary("validate-krew-manifest");
    assert!(
        validator.is_absolute() || which(&validator),
        "validate-krew-manifest is neither in target/testenv/bin nor on PATH: run tests/testenv/build.sh \
         (and link it as tests/testenv/cluster.sh does)"
    );
    run(&validator, args, None).await
}

fn which(name: &Path) -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(name).is_file()))
}

pub fn repo_path(relative: &str) -> String {
    root().join(relative).display().to_string()
}

/// A kubectl command left running, whose output is read as it comes.
pub struct Running {
    child: tokio::process::Child,
    seen: String,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

pub fn spawn_kubectl(args: &[&str]) -> Running {
    let mut child = tokio::process::Command::new(binary("kubectl"))
        .args(args)
        .env("PATH", plugin_path())
        .env("KUBECONFIG", super::cluster().kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn kubectl");
    let stdout = child.stdout.take().expect("stdout");
    let lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    Running { child, seen: String::new(), lines }
}

impl Running {
    /// Reads output until a line contains `needle`; returns everything read so far.
    pub async fn read_until(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.next_line()).await {
                Ok(Ok(Some(line))) => {
                    self.seen.push_str(&line);
                    self.seen.push('\n');
                    if line.contains(needle) {
                        return self.seen.clone();
                    }
                }
                Ok(_) => {
                    let stderr = self.stderr().await;
                    panic!("the command ended before printing {needle:?}:\n{}\nstderr:\n{stderr}", self.seen)
                }
                Err(_) => panic!("no {needle:?} within {timeout:?}:\n{}", self.seen),
            }
        }
    }

    /// What the command wrote to stderr, once it has ended (it is small: an error message).
    async fn stderr(&mut self) -> String {
        let mut text = String::new();
        if let Some(stderr) = self.child.stderr.as_mut() {
            let _ = tokio::io::AsyncReadExt::read_to_string(stderr, &mut text).await;
        }
        text
    }

    /// Waits for the command to end; all its output, from the start.
    pub async fn finish(mut self, timeout: Duration) -> Ran {
        let rest = async {
            while let Ok(Some(line)) = self.lines.next_line().await {
                self.seen.push_str(&line);
                self.seen.push('\n');
            }
            self.child.wait_with_output().await
        };
        let out = tokio::time::timeout(timeout, rest)
            .await
            .expect("the command did not end in time")
            .expect("wait");
        Ran {
            code: out.status.code().unwrap_or(-1),
            stdout: self.seen,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// What the GitOps tools' own libraries make of `object` (tests/testenv/gitops-judge): `args` is one of
/// `kstatus`, `flux-cel FILE`, `lua-health FILE`, `lua-discovery FILE`, `lua-action FILE`.
pub async fn gitops_judge(args: &[&str], object: &serde_json::Value) -> serde_json::Value {
    use tokio::io::AsyncWriteExt;
    let judge = binary("gitops-judge");
    let mut child = tokio::process::Command::new(&judge)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("run {} (`make testenv` builds and links it): {e}", judge.display()));
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(object.to_string().as_bytes()).await.expect("write the object");
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("gitops-judge did not finish in 30s")
        .expect("gitops-judge");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "gitops-judge {args:?} failed: {stderr}\nobject: {object}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("gitops-judge {args:?} printed no JSON: {e}"))
}
