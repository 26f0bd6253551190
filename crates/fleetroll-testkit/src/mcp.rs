//! Real MCP clients against the server under test: the Python `mcp` SDK (through `tests/mcp/drive.py`)
//! and the official conformance suite, both installed by `tests/mcp/install.sh` (`make mcp-tools`).

use std::{path::PathBuf, process::Stdio, time::Duration};

use serde_json::Value;

fn cache() -> PathBuf {
    std::env::var_os("FLEETROLL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/fleetroll"))
}

fn tool(env: &str, default: PathBuf) -> PathBuf {
    let path = std::env::var_os(env).map(PathBuf::from).unwrap_or(default);
    assert!(path.exists(), "{} not found: run `make mcp-tools` (tests/mcp/install.sh) first", path.display());
    path
}

pub fn python() -> PathBuf {
    tool("FLEETROLL_PYTHON", cache().join("py-venv/bin/python"))
}

pub fn conformance() -> PathBuf {
    tool("FLEETROLL_CONFORMANCE", cache().join("bin/conformance"))
}

fn mcp_dir() -> PathBuf {
    crate::repo_root().join("tests/mcp")
}

/// Runs one `drive.py` command and returns the JSON object it printed.
pub async fn drive(args: &[&str]) -> Value {
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(mcp_dir().join("drive.py"))
        .args(args)
        .current_dir(mcp_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(240), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("drive.py {args:?} did not finish in 240s"))
        .expect("run drive.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "drive.py {args:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("drive.py {args:?} printed no JSON ({e}): {stdout}"))
}

/// Runs the conformance suite's scenarios against `url`; returns (all passed, report).
pub async fn conformance_suite(url: &str, out: &std::path::Path) -> (bool, String) {
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg(mcp_dir().join("conformance.sh"))
        .args([url, &out.display().to_string()])
        .env("CONFORMANCE", conformance())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(600), cmd.output())
        .await
        .expect("the conformance suite did not finish in 600s")
        .expect("run the conformance suite");
    let report =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), report)
}

/// One modern (2026-07-28) JSON-RPC POST to an MCP endpoint, without an SDK, for load and floods: the
/// client declares `capabilities`, and sends `token` as its bearer token when given.
pub async fn post(
    http: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    method: &str,
    name: &str,
    params: Value,
    capabilities: Value,
) -> reqwest::Response {
    try_post(http, url, token, method, name, params, capabilities).await.expect("POST to the MCP endpoint")
}

/// [`post`], with a connection the server closed unanswered (HTTP "000") as an error.
pub async fn try_post(
    http: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    method: &str,
    name: &str,
    mut params: Value,
    capabilities: Value,
) -> reqwest::Result<reqwest::Response> {
    params["_meta"] = serde_json::json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities});
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let mut request = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .header("mcp-name", name)
        .body(body.to_string());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await
}
