//! The layering ARCHITECTURE.md promises, checked on the source: the core performs no IO and reads no
//! clock, and neither MCP nor the plugin reaches into the controller. No cluster needed.

use std::{
    fs,
    path::{Path, PathBuf},
};

fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    found
}

/// Every line of the Rust files under `src/<part>` (a folder, or a file without `.rs`) that contains one
/// of `forbidden`, comments left out.
fn offending(part: &str, forbidden: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    if root.join(part).is_dir() {
        files.extend(sources(&root.join(part)));
    }
    if root.join(format!("{part}.rs")).is_file() {
        files.push(root.join(format!("{part}.rs")));
    }
    assert!(!files.is_empty(), "no sources under src/{part}");
    let mut lines = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).expect("a readable source file");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if let Some(word) = forbidden.iter().find(|w| code.contains(*w)) {
                lines.push(format!("{}:{}: {word}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    lines
}

#[test]
fn the_core_holds_no_client_performs_no_io_and_reads_no_clock() {
    let io = [
        "kube::Client",
        "kube::Api",
        "Client::",
        "Api::",
        "Api<",
        "kube::runtime",
        "tokio",
        "reqwest",
        "std::fs",
        "std::net::TcpStream",
        "Timestamp::now",
        "Instant::now",
        "SystemTime::now",
        "crate::edge",
        "crate::controller",
        "crate::mcp",
        "crate::runtime",
    ];
    let found = offending("core", &io);
    assert!(found.is_empty(), "the core must stay pure:\n{}", found.join("\n"));
}

#[test]
fn mcp_and_the_plugin_reach_the_edge_never_the_controller() {
    for part in ["mcp", "plugin"] {
        let found = offending(part, &["crate::controller", "controller::"]);
        assert!(found.is_empty(), "{part} must not use the controller:\n{}", found.join("\n"));
    }
}

#[test]
fn the_check_finds_what_it_looks_for() {
    // A check that can never fail proves nothing: the edge does hold a client.
    assert!(!offending("edge", &["Client"]).is_empty());
}
