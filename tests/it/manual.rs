//! The manual's walkthroughs run as written: each page's ```sh block that a reader runs from nothing (or from
//! where the page says to start, another page's end), in a new user's shell on a fresh cluster of its own
//! (`testkit::fresh`), so a step the page leaves out fails here. The windows page's fragments (an annotation,
//! an override) are what its walkthrough runs.
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
async fn the_manual_pages_run_as_written_on_a_fresh_cluster() {
    let fresh = FreshCluster::new("manual");
    let environment = sh_blocks("docs/src/test-environment.md");
    let (ok, out) = run_page_block(&fresh, &environment[0]).await;
    assert!(ok, "docs/src/test-environment.md:\n{out}");
    assert!(
        out.contains("kwok-node-0") && out.contains("Ready"),
        "kubectl get nodes lists the kwok nodes: {out}"
    );
    assert!(!fresh.testenv().exists(), "make cluster-down removes the cluster");

    // The windows page's walkthrough goes on in getting-started's shell, on its cluster and operator.
    let getting_started = sh_blocks("docs/src/getting-started.md");
    let windows = sh_blocks("docs/src/windows.md");
    let try_windows = windows.last().expect("the windows page's walkthrough");
    let (ok, out) = run_page_block(&fresh, &format!("{}\n{try_windows}", getting_started[0])).await;
    assert!(ok, "docs/src/getting-started.md, then docs/src/windows.md:\n{out}");
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("web ")).collect();
    let [done, held_first, held_second, done_again] = rows[..] else {
        panic!("four kubectl get fro rows: {out}")
    };
    for expected in ["Succeeded", "6/6", "3/3", "registry.k8s.io/pause:3.9"] {
        assert!(done.contains(expected), "{expected} in {done}");
    }
    for (row, batch, updated) in
        [(held_first, "batch 1/3 waits", "0/6"), (held_second, "batch 2/3 waits", "2/6")]
    {
        for expected in ["Paused", updated, batch, "deny window freeze of namespace default is open"] {
            assert!(row.contains(expected), "{expected} in {row}");
        }
    }
    assert!(out.lines().any(|l| l == "fleetroll-admin"), "the override records who overrode: {out}");
    for expected in ["Succeeded", "6/6", "3/3", "registry.k8s.io/pause:3.10"] {
        assert!(done_again.contains(expected), "{expected} in {done_again}");
    }

    // The GitOps page's argocd-cm patch, on the ConfigMap an Argo CD install leaves (its own keys kept).
    let gitops = sh_blocks("docs/src/gitops.md");
    let argocd = "eval \"$(tests/testenv/cluster.sh env)\"\nkubectl create namespace argocd\n\
                  kubectl -n argocd create configmap argocd-cm --from-literal=url=https://argocd.example\n";
    let (ok, out) = run_page_block(&fresh, &format!("{argocd}{}", gitops[0])).await;
    assert!(ok, "docs/src/gitops.md:\n{out}");
    let client = fresh.client().await;
    let cm: k8s_openapi::api::core::v1::ConfigMap =
        kube::Api::namespaced(client, "argocd").get("argocd-cm").await.expect("argocd-cm");
    let data = cm.data.unwrap_or_default();
    let argo = "manifests/argocd/resource_customizations/fleetroll.dev/FleetRollout";
    let health =
        std::fs::read_to_string(testkit::repo_root().join(argo).join("health.lua")).expect("health.lua");
    assert_eq!(data.get("resource.customizations.health.fleetroll.dev_FleetRollout"), Some(&health));
    assert!(data.contains_key("resource.customizations.actions.fleetroll.dev_FleetRollout"), "{data:?}");
    assert_eq!(data.get("url").map(String::as_str), Some("https://argocd.example"), "Argo CD's keys stay");
}
