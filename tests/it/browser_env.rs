//! The dashboard tests' harness (crates/fleetroll-testkit/src/browser.rs, proxy.rs), proved on real parts: a
//! headless Chromium enforces a page's Content-Security-Policy as a user's browser does, reports the
//! violations, clicks, reads and photographs the page; two browsers side by side share nothing; and the proxy
//! in front of the API server cuts a client's connections (a watch held open included) and lets it back.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use axum::{Router, http::header, response::IntoResponse, routing::get};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api,
    api::{ListParams, WatchParams},
};
use serde_json::Value;
use testkit::{browser::Browser, proxy::Proxy};

const DEADLINE: Duration = Duration::from_secs(30);

/// The dashboard's policy (docs/src/dashboard.md): scripts and styles from the page's own origin only.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
    connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// An inline script and an inline style attribute, which the policy forbids, between two scripts of the
/// page's own, which it allows: the first records the violations, the last runs after the inline one had its
/// turn (scripts run in document order).
const PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>CSP probe</title><script src="/first.js"></script></head>
<body>
<h1 id="heading" data-kind="probe">A page under a CSP</h1>
<p id="styled" style="color: rgb(255, 0, 0)">inline style</p>
<button id="button" type="button">Press</button>
<script>document.body.dataset.inline = "ran";</script>
<script src="/last.js"></script>
</body></html>
"#;

const FIRST_JS: &str = r#"window.violations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.violations.push(e.effectiveDirective + " " + e.blockedURI);
});
"#;

const LAST_JS: &str = r#"document.body.dataset.external = "ran";
document.getElementById("button").addEventListener("click", () => {
  document.getElementById("button").dataset.pressed = "yes";
});
"#;

/// Serves [`PAGE`] and its two scripts, every answer under [`CSP`]; on this test's runtime.
async fn serve_page() -> SocketAddr {
    let answer = |content_type: &'static str, body: &'static str| {
        move || async move {
            ([(header::CONTENT_TYPE, content_type), (header::CONTENT_SECURITY_POLICY, CSP)], body)
                .into_response()
        }
    };
    let app = Router::new()
        .route("/", get(answer("text/html; charset=utf-8", PAGE)))
        .route("/first.js", get(answer("text/javascript", FIRST_JS)))
        .route("/last.js", get(answer("text/javascript", LAST_JS)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::test]
async fn chromium_enforces_the_content_security_policy_and_reports_it() {
    let addr = serve_page().await;
    let started = Instant::now();
    let browser = Browser::start().await;
    let up = started.elapsed();
    browser.goto(&format!("http://{addr}/")).await;
    eprintln!("Browser::start took {up:?}; with the first page loaded, {:?}", started.elapsed());

    browser.wait_js("the page's own scripts to run", "return document.body.dataset.external", DEADLINE).await;
    let inline = browser.js("return document.body.dataset.inline ?? null", Vec::new()).await;
    assert_eq!(inline, Value::Null, "the inline script ran despite the policy");
    let color = browser
        .js("return getComputedStyle(document.querySelector(arguments[0])).color", vec!["#styled".into()])
        .await;
    assert_ne!(color, "rgb(255, 0, 0)", "the inline style attribute applied despite the policy");
    let violations = browser
        .wait_js(
            "both violations reported",
            "return window.violations.length >= 2 && window.violations",
            DEADLINE,
        )
        .await;
    let violations: Vec<&str> = violations.as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(violations.contains(&"script-src-elem inline"), "{violations:?}");
    assert!(violations.contains(&"style-src-attr inline"), "{violations:?}");
    let errors = browser.console_errors().await;
    assert!(
        errors.iter().any(|e| e.contains("inline script") && e.contains("Content Security Policy")),
        "the browser log names the refused script: {errors:?}"
    );

    assert_eq!(browser.text("#heading").await, "A page under a CSP");
    assert_eq!(browser.attr("#heading", "data-kind").await.as_deref(), Some("probe"));
    assert_eq!(browser.attr("#heading", "data-missing").await, None);
    browser.click("#button").await;
    browser
        .wait_js("the click handled", "return document.getElementById('button').dataset.pressed", DEADLINE)
        .await;

    let png = testkit::repo_root().join("target/test-logs/browser-env-csp.png");
    let _ = std::fs::remove_file(&png);
    browser.screenshot(&png).await;
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.len() > 1000, "a screenshot of {} bytes", bytes.len());
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "the screenshot is not a PNG");
}

#[tokio::test]
async fn two_browsers_side_by_side_share_nothing() {
    let addr = serve_page().await;
    let (a, b) = tokio::join!(Browser::start(), Browser::start());
    let url = format!("http://{addr}/");
    tokio::join!(a.goto(&url), b.goto(&url));
    a.js("localStorage.setItem('who', 'a'); sessionStorage.setItem('who', 'a')", Vec::new()).await;
    let seen = b.js("return [localStorage.getItem('who'), sessionStorage.getItem('who')]", Vec::new()).await;
    assert_eq!(seen, serde_json::json!([null, null]), "the second browser sees the first one's storage");
    let kept = a.js("return localStorage.getItem('who')", Vec::new()).await;
    assert_eq!(kept, "a");
    drop(a);
    // The other one goes on.
    b.goto(&url).await;
    b.wait_js("the page to load again", "return document.body.dataset.external", DEADLINE).await;
}

#[tokio::test]
async fn the_proxy_cuts_a_clients_connections_and_restores_them() {
    let cluster = testkit::cluster();
    let proxy = Proxy::to_cluster(&cluster.kubeconfig).await;
    let kubeconfig = proxy.kubeconfig_through(&cluster.kubeconfig);
    let namespaces: Api<Namespace> = Api::all(testkit::tenant::client_from(&kubeconfig, None).await);
    let one = ListParams::default().limit(1);
    let listed = namespaces.list(&one).await.expect("a list through the proxy");
    let version = listed.metadata.resource_version.expect("a list's resourceVersion");
    // A watch held open, as the dashboard's are.
    let mut watch = namespaces
        .watch(&WatchParams::default().timeout(290), &version)
        .await
        .expect("a watch through the proxy")
        .boxed();
    assert!(proxy.open_connections() >= 1, "no connection through the proxy");

    proxy.cut().await;
    // Events that arrived before the cut come first (tests create namespaces all the time), then the end.
    let ended = tokio::time::timeout(DEADLINE, async {
        loop {
            match watch.next().await {
                Some(Ok(_)) => continue,
                Some(Err(e)) => break format!("error: {e}"),
                None => break "ended".to_string(),
            }
        }
    })
    .await
    .expect("the watch went on after the cut");
    eprintln!("the watch after the cut: {ended}");
    let refused = namespaces.list(&one).await.expect_err("a list through a cut proxy");
    eprintln!("a list through the cut proxy: {refused}");

    proxy.restore();
    namespaces.list(&one).await.expect("a list once the proxy is restored");
}
