//! The layering ARCHITECTURE.md promises, checked on the source: the core performs no IO and reads no
//! clock, and neither MCP nor the plugin reaches into the controller. No cluster needed.
//!
//! The core is a crate of its own (crates/fleetroll-core) without a kube client, tokio or reqwest, so the
//! compiler rejects a core that reaches for them, and its clippy.toml rejects a clock; the greps here are a
//! second line of defence, and the manifest check keeps those dependencies out.

use std::{
    fs,
    path::{Path, PathBuf},
};

use testkit::repo_root;

fn sources(dir: &Path) -> Vec<PathBuf> {
    testkit::files_under(dir, "rs")
}

/// The core crate's directory.
fn core_crate() -> PathBuf {
    repo_root().join("crates/fleetroll-core")
}

/// Every line of the Rust files under `<src>/<part>` (a folder, or a file without `.rs`) that contains one
/// of `forbidden`, comments left out.
fn offending_in(src: &Path, part: &str, forbidden: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    if src.join(part).is_dir() {
        files.extend(sources(&src.join(part)));
    }
    if src.join(format!("{part}.rs")).is_file() {
        files.push(src.join(format!("{part}.rs")));
    }
    assert!(!files.is_empty(), "no sources under {}/{part}", src.display());
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

/// [`offending_in`] the main crate's `src/`.
fn offending(part: &str, forbidden: &[&str]) -> Vec<String> {
    offending_in(&repo_root().join("src"), part, forbidden)
}

#[test]
fn the_core_performs_no_io_and_reads_no_clock() {
    // A kube client, tokio and reqwest do not compile in the core (see the manifest check below), and
    // clippy (crates/fleetroll-core/clippy.toml) rejects the clocks and IO of std and jiff; this catches
    // them in a build that skipped clippy.
    let io = [
        "std::fs",
        "fs::read",
        "fs::write",
        "File::",
        "std::net::TcpStream",
        "std::net::TcpListener",
        "std::net::UdpSocket",
        "to_socket_addrs",
        "std::process",
        "std::env::var",
        "thread::sleep",
        "Timestamp::now",
        "Zoned::now",
        "Instant::now",
        "SystemTime::now",
        // The machine's zoneinfo files (and TZ): the core names zones through its bundled database.
        "TimeZone::get",
        "TimeZone::system",
        "tz::db()",
        "TimeZoneDatabase::from_",
    ];
    let src = core_crate().join("src");
    let mut found = offending_in(&src, "core", &io);
    found.extend(offending_in(&src, "api", &io));
    assert!(found.is_empty(), "the core must stay pure:\n{}", found.join("\n"));
}

/// The packages the core crate must never depend on: a kube client (the `kube` facade with its `client`
/// feature, kube-client, kube-runtime), an async runtime, HTTP clients and servers.
const IMPURE: &[&str] = &[
    "kube",
    "kube-client",
    "kube-runtime",
    "tokio",
    "tokio-util",
    "futures",
    "reqwest",
    "hyper",
    "hyper-util",
    "tower",
    "axum",
    "rmcp",
];

/// The dependencies of a Cargo manifest, of every kind (normal, dev, build, per target), that are in
/// [`IMPURE`]: by their key and by a `package = "..."` rename.
fn impure_dependencies(manifest: &str) -> Vec<String> {
    let mut found = Vec::new();
    // Whether the lines are dependencies (`name = ...`), or the settings of one (`[dependencies.name]`).
    let (mut table_of_dependencies, mut one_dependency) = (false, false);
    for line in manifest.lines().map(str::trim) {
        if let Some(header) = line.strip_prefix('[') {
            let header = header.trim_end_matches(']');
            // `[dependencies]`, `[dev-dependencies]`, `[target.'cfg(unix)'.build-dependencies]`...
            table_of_dependencies = header.ends_with("dependencies");
            // ...or `[dev-dependencies.tokio]`.
            let name = header.rsplit_once("dependencies.").map(|(_, name)| name.trim_matches('"'));
            one_dependency = name.is_some();
            found.extend(name.filter(|n| IMPURE.contains(n)).map(str::to_string));
            continue;
        }
        let (key, value) = line.split_once('=').unwrap_or_default();
        let key = key.trim();
        let name = key.split('.').next().unwrap_or_default().trim_matches('"');
        // `package = "..."` renames a dependency: inline in a table of dependencies, or in its own table.
        let renamed = if table_of_dependencies {
            value.split_once("package").and_then(|(_, rest)| rest.split('"').nth(1))
        } else if one_dependency && key == "package" {
            value.split('"').nth(1)
        } else {
            None
        };
        let names = [table_of_dependencies.then_some(name), renamed];
        found.extend(names.into_iter().flatten().filter(|n| IMPURE.contains(n)).map(str::to_string));
    }
    found
}

#[test]
fn the_core_crate_depends_on_no_kube_client_no_runtime_and_no_http() {
    let manifest = fs::read_to_string(core_crate().join("Cargo.toml")).expect("the core crate's Cargo.toml");
    let found = impure_dependencies(&manifest);
    assert!(
        found.is_empty(),
        "crates/fleetroll-core must not depend on {found:?}: the core decides, the edge acts (kube-core, \
         not kube)"
    );
}

#[test]
fn the_manifest_check_finds_what_it_looks_for() {
    let manifest = r#"
[dependencies]
kube-core = "5"
kube = { version = "5", features = ["client"] }
k8s-openapi.workspace = true
http = { package = "reqwest", version = "0.12" }

[dev-dependencies.tokio]
version = "1"

[dependencies.client]
package = "kube-client"

[target.'cfg(unix)'.dependencies]
hyper = "1"
"#;
    assert_eq!(impure_dependencies(manifest), ["kube", "reqwest", "tokio", "kube-client", "hyper"]);
}

#[test]
fn mcp_and_the_plugin_reach_the_edge_never_the_controller() {
    for part in ["mcp", "plugin"] {
        let found = offending(part, &["crate::controller", "controller::"]);
        assert!(found.is_empty(), "{part} must not use the controller:\n{}", found.join("\n"));
    }
}

/// `runtime` is the composition root: the layers below it (the edge, the controller, MCP) import nothing
/// from it; what they share (metrics, failpoints, errors) lives beside `error.rs`. The plugin's process
/// entry (`plugin/mod.rs`) starts its async runtime there.
#[test]
fn nothing_below_the_composition_root_imports_it() {
    for part in ["edge", "controller", "mcp"] {
        // fleetroll's runtime, by its items' names (kube has a `runtime` module too).
        let runtime =
            ["crate::runtime", "runtime::cli", "runtime::http", "runtime::leader", "runtime::block_on"];
        let found = offending(part, &runtime);
        assert!(found.is_empty(), "{part} must not use runtime:\n{}", found.join("\n"));
    }
}

#[test]
fn the_check_finds_what_it_looks_for() {
    // A check that can never fail proves nothing: the edge does hold a client.
    assert!(!offending("edge", &["Client"]).is_empty());
}

/// The operator's files (`src/` and the core crate, unit tests included) stay readable: at most this many
/// lines each (the test fixtures, like the integration tests, are scenarios read top to bottom: exempt)...
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
    let mut problems = Vec::new();
    let files = sources(&repo_root().join("src")).into_iter().chain(sources(&core_crate()));
    for file in files {
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

/// The image's binary is built for the target rust-toolchain.toml installs (so a fresh machine's rustup has
/// it), and `make image-binary` and hack/image.sh agree on it: CI would otherwise only find out in the
/// install test, minutes in.
#[test]
fn the_image_is_built_for_the_target_the_toolchain_installs() {
    let root = repo_root();
    let read = |f: &str| fs::read_to_string(root.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    let makefile = read("Makefile");
    let target = makefile
        .lines()
        .find_map(|l| l.strip_prefix("IMAGE_TARGET := "))
        .expect("IMAGE_TARGET in the Makefile")
        .trim();
    let toolchain = read("rust-toolchain.toml");
    let targets =
        toolchain.lines().find_map(|l| l.strip_prefix("targets = ")).expect("targets in rust-toolchain.toml");
    assert!(
        targets.contains(&format!("\"{target}\"")),
        "rust-toolchain.toml installs {targets}, not {target}"
    );
    assert!(
        read("hack/image.sh").contains(&format!("target={target}\n")),
        "hack/image.sh builds for another target"
    );
    assert!(
        !root.join("Dockerfile").exists(),
        "make image builds the image; a Dockerfile beside it would drift"
    );
}

/// The tests share fixtures through the testkit crate, not by including one another's files (each includer
/// compiled its own copy and silenced what it left unused), so neither `#[path]` nor a dead-code allowance
/// appears in them.
#[test]
fn tests_share_fixtures_through_the_testkit() {
    let files = sources(&repo_root().join("tests"))
        .into_iter()
        .chain(sources(&repo_root().join("crates/fleetroll-testkit")));
    // Spelt in two halves, so that this file does not match itself.
    let (path_attribute, dead_code) = (concat!("#[", "path"), concat!("allow(", "dead_code"));
    let mut found = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).expect("a readable source file");
        for (i, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with(path_attribute) || code.contains(dead_code) {
                found.push(format!("{}:{}: {code}", file.display(), i + 1));
            }
        }
    }
    assert!(found.is_empty(), "move what these share into crates/fleetroll-testkit:\n{}", found.join("\n"));
}
