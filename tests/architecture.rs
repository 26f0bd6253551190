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

/// Files in `src/` stay readable: at most this many lines each (tests included)...
const MAX_FILE_LINES: usize = 450;
/// ...and functions at most this many.
const MAX_FN_LINES: usize = 70;

/// The functions of a rustfmt-formatted file longer than `max` lines: (line, name, length).
fn long_functions(text: &str, max: usize) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut long = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let Some(name) = ["pub(crate) ", "pub(super) ", "pub ", ""]
            .iter()
            .filter_map(|vis| trimmed.strip_prefix(vis))
            .flat_map(|rest| {
                [rest.strip_prefix("async fn "), rest.strip_prefix("const fn "), rest.strip_prefix("fn ")]
            })
            .flatten()
            .next()
            .map(|rest| rest.split(['(', '<']).next().unwrap_or_default().to_string())
        else {
            continue;
        };
        // Where the signature ends: a declaration ends with `;`, a one-line function with `}`.
        let Some(opening) =
            lines[i..].iter().find(|l| l.ends_with('{') || l.ends_with(';') || l.ends_with('}'))
        else {
            continue;
        };
        if !opening.ends_with('{') {
            continue;
        }
        let closing = format!("{}}}", &line[..line.len() - trimmed.len()]);
        if let Some(end) = lines[i + 1..].iter().position(|l| *l == closing) {
            let length = end + 2;
            if length > max {
                long.push((i + 1, name, length));
            }
        }
    }
    long
}

#[test]
fn no_source_file_or_function_is_too_long_to_read() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut problems = Vec::new();
    for file in sources(&root) {
        let text = fs::read_to_string(&file).expect("a readable source file");
        let lines = text.lines().count();
        if lines > MAX_FILE_LINES {
            problems.push(format!("{}: {lines} lines (at most {MAX_FILE_LINES})", file.display()));
        }
        for (line, name, length) in long_functions(&text, MAX_FN_LINES) {
            problems.push(format!(
                "{}:{line}: fn {name} is {length} lines (at most {MAX_FN_LINES})",
                file.display()
            ));
        }
    }
    assert!(problems.is_empty(), "split these by concern:\n{}", problems.join("\n"));
}

#[test]
fn the_length_check_measures_functions() {
    let body: String = (0..80).map(|i| format!("    let x{i} = {i};\n")).collect();
    let text = format!("pub async fn long() {{\n{body}}}\n\nfn short() -> u8 {{\n    1\n}}\n");
    assert_eq!(long_functions(&text, MAX_FN_LINES), vec![(1, "long".to_string(), 82)]);
}

/// The image builds with the toolchain the repository pins, from base images pinned by digest: a bump of
/// rust-toolchain.toml that forgets the Dockerfile would otherwise go unnoticed (CI builds no image).
#[test]
fn the_dockerfile_pins_its_bases_by_digest_and_builds_with_the_pinned_rust() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let toolchain = fs::read_to_string(root.join("rust-toolchain.toml")).expect("rust-toolchain.toml");
    let channel = toolchain
        .lines()
        .find_map(|l| l.strip_prefix("channel = "))
        .map(|v| v.trim_matches('"'))
        .expect("a channel in rust-toolchain.toml");
    let dockerfile = fs::read_to_string(root.join("Dockerfile")).expect("the Dockerfile");
    let bases: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("FROM "))
        .map(|l| l.split_whitespace().next().unwrap_or_default())
        .filter(|image| *image != "scratch")
        .collect();
    assert!(!bases.is_empty(), "the Dockerfile has no base image");
    for image in &bases {
        let digest = image.split_once("@sha256:").map_or("", |(_, d)| d);
        assert!(
            digest.len() == 64 && digest.chars().all(|c| c.is_ascii_hexdigit()),
            "{image}: pin it by digest (image:tag@sha256:...)"
        );
    }
    let rust = format!("rust:{channel}-");
    assert!(
        bases.iter().any(|b| b.starts_with(&rust)),
        "the Dockerfile builds on {bases:?}, not on the Rust of rust-toolchain.toml ({rust}...)"
    );
}
