//! The manual's walkthroughs run as written: each page's ```sh block that a reader runs from nothing, in a new
//! user's shell on a fresh cluster of its own (`testkit::fresh`), so a step the page leaves out fails here.
//! The Helm chapter's is run by tests/it/helm_install.rs, on a cluster with a real node; `make demo`'s by
//! tests/it/demo.rs.

use std::{os::unix::fs::PermissionsExt, time::Duration};

use testkit::fresh::{FreshCluster, sh_blocks};

/// Runs a page's block; `cargo build` is the one command stood in for (by a shim that checks the binary the
/// tests built is there): what it would build is that binary, without the test-only features the other
/// tests run it with.
async fn run_page_block(fresh: &FreshCluster, script: &str) -> (bool, String) {
    let shims = fresh.path("shims");
    std::fs::create_dir_all(&shims).unwrap();
    let cargo = shims.join("cargo");
    let bin = env!("CARGO_BIN_EXE_fleetroll");
    let shim = format!(
        "#!/bin/sh\n[ \"$1\" = build ] && [ -x {bin} ] && exit 0\necho \"the test stands in only for cargo build\" >&2\nexit 1\n"
    );
    std::fs::write(&cargo, shim).unwrap();
    std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755)).unwrap();
    fresh.sh(script, Some(&shims), Duration::from_secs(900)).await
}

#[tokio::test]
async fn the_test_environment_and_getting_started_pages_run_as_written_on_a_fresh_cluster() {
    let fresh = FreshCluster::new("manual");
    let environment = sh_blocks("docs/src/test-environment.md");
    let (ok, out) = run_page_block(&fresh, &environment[0]).await;
    assert!(ok, "docs/src/test-environment.md:\n{out}");
    assert!(
        out.contains("kwok-node-0") && out.contains("Ready"),
        "kubectl get nodes lists the kwok nodes: {out}"
    );
    assert!(!fresh.testenv().exists(), "make cluster-down removes the cluster");

    let getting_started = sh_blocks("docs/src/getting-started.md");
    let (ok, out) = run_page_block(&fresh, &getting_started[0]).await;
    assert!(ok, "docs/src/getting-started.md:\n{out}");
    assert!(out.contains("fleetrollout.fleetroll.dev/web condition met"), "{out}");
    let row = out.lines().find(|l| l.starts_with("web ")).unwrap_or_else(|| panic!("kubectl get fro: {out}"));
    for expected in ["Succeeded", "6/6", "3/3", "registry.k8s.io/pause:3.9"] {
        assert!(row.contains(expected), "{expected} in {row}");
    }
}
