//! `make demo` keeps working: the script runs end to end (next to the other tests, so with its operator
//! scoped to the fleet namespace) and the rollout it starts over MCP completes.

use std::time::Duration;

#[tokio::test]
async fn the_demo_runs_end_to_end() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dir = format!("{root}/target/demo-test");
    let port = testkit::operator::free_port().to_string();
    let kubeconfig = testkit::cluster().kubeconfig.display().to_string();
    let run = |arg: Option<&'static str>| {
        let mut cmd = tokio::process::Command::new("bash");
        cmd.arg(format!("{root}/hack/demo.sh"))
            .args(arg)
            .env("FLEETROLL_DEMO_DIR", &dir)
            .env("FLEETROLL_DEMO_PORT", &port)
            .env("FLEETROLL_DEMO_PREFIX", "demotest-")
            .env("FLEETROLL_DEMO_SCOPE", "demotest-fleetroll-system")
            .env("FLEETROLL_DEMO_KUBECONFIG", &kubeconfig)
            // The binary cargo built for the tests: a build by the script would replace it with one without
            // the test-only features the other tests run with.
            .env("FLEETROLL_DEMO_BIN", env!("CARGO_BIN_EXE_fleetroll"))
            .kill_on_drop(true);
        cmd
    };
    let out = tokio::time::timeout(Duration::from_secs(900), run(None).output())
        .await
        .expect("the demo took over 15 minutes")
        .unwrap();
    let _ = run(Some("stop-operator")).output().await;
    let client = testkit::client().await;
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
    for ns in [
        "demotest-fleetroll-system",
        "demotest-tenant-1",
        "demotest-tenant-2",
        "demotest-tenant-3",
        "demotest-tenant-4",
    ] {
        let _ = namespaces.delete(ns, &Default::default()).await;
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the demo failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("status: completed | isError: False"), "{stdout}");
    assert!(stdout.contains("Succeeded: succeeded: 40/40 updated, 40 healthy, 0 failed"), "{stdout}");
    assert!(stdout.contains("make demo-operator"), "it says what to try next");
}
