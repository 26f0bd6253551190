//! The official MCP conformance suite (the 2026-07-28 stateless server scenarios and every Tasks-extension
//! one) against a running operator. Its scenarios call fixture tools that only a build with the
//! `conformance` feature serves (`cargo test --features conformance --test it -- mcp_conformance`; `make test`
//! passes the feature).

use testkit::{fleet::with_fleet, operator::Operator};

#[tokio::test]
async fn the_official_conformance_suite_passes() {
    with_fleet("mcp-conformance", 0, |fleet| async move {
        let op = Operator::start(&fleet.ns, &["--conformance-fixtures"], &[]);
        let out = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-logs/conformance");
        let (passed, report) = testkit::mcp::conformance_suite(&op.mcp_url(), &out).await;
        eprintln!("{report}");
        assert!(passed, "conformance failures (details in {}):\n{report}", out.display());
        for scenario in
            ["server-stateless", "tasks-lifecycle", "tasks-mrtr-input", "tasks-dispatch-and-envelope"]
        {
            assert!(report.contains(&format!("{scenario:<32} exit=0")), "{scenario} did not pass:\n{report}");
        }
    })
    .await;
}
