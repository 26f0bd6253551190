//! `make demo` works from nothing: run as a newcomer runs it, on a fresh cluster of its own (started by the
//! demo itself, with nothing installed beforehand but what the demo installs) and in a new user's
//! environment, the rollout it starts over MCP completes.

use std::time::Duration;

use testkit::fresh::FreshCluster;

#[tokio::test]
async fn the_demo_runs_end_to_end_on_a_fresh_cluster() {
    let fresh = FreshCluster::new("demo");
    let port = testkit::operator::free_port().to_string();
    let run = |target: &str| {
        let mut cmd = fresh.command("make");
        cmd.args(["--no-print-directory", target])
            .env("FLEETROLL_DEMO_DIR", fresh.path("demo"))
            .env("FLEETROLL_DEMO_PORT", &port)
            // The binary cargo built for the tests: a build by the script would replace it with one without
            // the test-only features the other tests run with.
            .env("FLEETROLL_DEMO_BIN", env!("CARGO_BIN_EXE_fleetroll"));
        cmd
    };
    let out = tokio::time::timeout(Duration::from_secs(900), run("demo").output())
        .await
        .expect("the demo took over 15 minutes")
        .expect("run make demo");
    let down = run("demo-down").output().await.expect("run make demo-down");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the demo failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("created by fleetroll-admin"),
        "the chart's policy recorded the creator: {stdout}"
    );
    assert!(stdout.contains("status: completed | isError: False"), "{stdout}");
    assert!(stdout.contains("Succeeded: succeeded: 40/40 updated, 40 healthy, 0 failed"), "{stdout}");
    assert!(stdout.contains("make demo-operator"), "it says what to try next");
    assert!(down.status.success(), "make demo-down: {}", String::from_utf8_lossy(&down.stderr));
    assert!(!fresh.testenv().exists(), "make demo-down removes the cluster");
}
