//! Tenant-controlled text is text: a rollout whose message, a target's image and a failure's message
//! carry markup that would run script if it were parsed shows that markup as characters, and nothing runs.
//! Every answer carries the CSP; an action from another origin, or without the session token, is refused,
//! by the server and in a real browser (a page of another origin posting to it), and changes nothing.

use axum::{Router, response::Html, routing::get};
use kube::ResourceExt;
use serde_json::{Value, json};
use testkit::{browser::Browser, dashboard::Dashboard, fleet::with_fleet};

use testkit::frozen::{frozen, planned, unwatched};

use super::{DEADLINE, open_grid};

const MESSAGE: &str =
    r#""><script>window.pwned = 'message'</script><img src=x onerror="window.pwned='message-img'">"#;
const IMAGE: &str = r#"registry.example/app:1"><img src=x onerror="window.pwned='image'">"#;
const FAILURE: &str = r#"<img src=x onerror="window.pwned='failure'"> never became ready"#;
const EVENT: &str =
    r#"</li><script>window.pwned = 'event'</script><a href="javascript:window.pwned='link'">click</a>"#;

#[tokio::test]
async fn tenant_text_renders_as_text_and_foreign_actions_are_refused() {
    with_fleet("dash-hostile", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        let tns = unwatched(&ns);
        let targets = planned(&tns, "evil", 3, IMAGE);
        let failure = json!({"cluster": "", "namespace": tns, "name": "evil-00001", "batch": 0, "reason": "Timeout", "message": FAILURE});
        let status = json!({"message": MESSAGE, "currentBatch": 0, "failures": [failure],
            "batches": [{"index": 0, "size": 3, "state": "Verifying", "idempotencyKey": "k/1/0"}]});
        let fr = frozen(&fleet.client, &ns, "evil", vec![targets], status).await;
        // An Event about the rollout, as anyone who may create Events in the namespace can write one.
        let injected: k8s_openapi::api::core::v1::Event = serde_json::from_value(json!({
            "metadata": {"name": "evil-injected", "namespace": ns},
            "involvedObject": {"apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "name": "evil",
                               "namespace": ns, "uid": fr.uid()},
            "type": "Warning", "reason": "Injected", "message": EVENT,
            "lastTimestamp": k8s_openapi::jiff::Timestamp::now().to_string(), "source": {"component": "tenant"},
        }))
        .unwrap();
        kube::Api::namespaced(fleet.client.clone(), &ns).create(&Default::default(), &injected).await.unwrap();
        let dash = Dashboard::start(&testkit::cluster().kubeconfig, &[]).await;
        let browser = Browser::start().await;
        open_grid(&browser, &dash, &format!("#/r/{ns}/evil"), 3).await;
        let key = format!("{tns}/evil-00001");
        browser.click(&format!("#grid [data-target=\"{key}\"]")).await;
        let detail = browser
            .wait_js("the target's detail", "const d = document.querySelector('#cell-detail'); return d && d.textContent.length > 0 ? d.textContent : null", DEADLINE)
            .await;
        let detail = detail.as_str().unwrap_or_default();
        assert!(detail.contains(IMAGE), "the previous image, as text: {detail}");
        assert!(detail.contains(FAILURE), "the failure's message, as text: {detail}");
        let timeline = format!("return document.querySelector('#timeline')?.textContent.includes({})", Value::from(EVENT));
        browser.wait_js("the event in the timeline, as text", &timeline, DEADLINE).await;
        let page = browser.js("return document.body.textContent", vec![]).await;
        assert!(page.as_str().unwrap_or_default().contains(MESSAGE), "the message, as text");
        let links = "return [...document.querySelectorAll('a[href]')].filter(a => !a.getAttribute('href').startsWith('#')).length";
        assert_eq!(browser.js(links, vec![]).await, json!(0), "no link but the page's own routes");
        assert_eq!(browser.js("return window.pwned === undefined", vec![]).await, Value::Bool(true), "no script ran");
        let injected = "return document.querySelectorAll('img[src=\"x\"], script:not([src])').length";
        assert_eq!(browser.js(injected, vec![]).await, json!(0), "no element was made of tenant text");
        assert_eq!(cells_state(&browser, &key).await, "failed");

        // The CSP is on every answer, the page's and the API's.
        let http = reqwest::Client::new();
        for path in ["/", "/assets/app.js", "/api/me"] {
            let answer = http.get(dash.api(path)).bearer_auth(&dash.token).send().await.unwrap();
            let csp = answer.headers().get("content-security-policy").and_then(|v| v.to_str().ok());
            assert!(csp.is_some_and(|c| c.contains("script-src 'self'") && c.contains("default-src 'none'")), "{path}: {csp:?}");
        }
        // An action without the token, or from another origin, is refused, and nothing changes.
        let pause = dash.api(&format!("/api/rollouts/{ns}/evil/pause"));
        let no_token = http.post(&pause).header("origin", &dash.origin).body("{}").send().await.unwrap();
        assert_eq!(no_token.status(), 401);
        let foreign = http.post(&pause).bearer_auth(&dash.token).header("origin", "http://evil.example").body("{}").send().await.unwrap();
        assert_eq!(foreign.status(), 403);
        let no_origin = http.post(&pause).bearer_auth(&dash.token).body("{}").send().await.unwrap();
        assert_eq!(no_origin.status(), 403);
        // The same from a real page of another origin, in the same browser: a post that needs no preflight
        // (the browser drops the token header such a post may not carry, and the Origin gives it away).
        let attacker = serve_attacker().await;
        browser.goto(&format!("http://{attacker}/")).await;
        let post = |mode: &str| {
            format!(
                "return fetch(arguments[0], {{method: 'POST', mode: '{mode}', body: '{{}}', \
                   headers: {{'Authorization': 'Bearer ' + arguments[1], 'Content-Type': 'application/json'}}}}) \
                   .then(() => 'sent', (e) => 'blocked: ' + e)"
            )
        };
        let args = || vec![Value::from(pause.clone()), Value::from(dash.token.clone())];
        // As a script may send it with the token: the browser asks first (a preflight), and is refused.
        let cors = browser.js(&post("cors"), args()).await;
        assert!(cors.as_str().is_some_and(|p| p.starts_with("blocked")), "the browser sent it: {cors}");
        // As a form may send it: it goes, without the token, and the server refuses it.
        let no_cors = browser.js(&post("no-cors"), args()).await;
        eprintln!("the attacker's posts: {cors}, {no_cors}");
        let after = fleet.rollouts().get("evil").await.unwrap();
        assert_eq!(after.spec.paused, fr.spec.paused, "not paused by a foreign page");
        assert_eq!(after.resource_version(), fr.resource_version(), "nothing changed");
    })
    .await;
}

async fn cells_state(browser: &Browser, key: &str) -> String {
    let state = browser
        .js(
            "return document.querySelector(`#grid [data-target=\"${arguments[0]}\"]`)?.dataset.state",
            vec![Value::from(key)],
        )
        .await;
    state.as_str().unwrap_or_default().to_string()
}

/// Another origin: a page on another port of the same machine.
async fn serve_attacker() -> std::net::SocketAddr {
    let app = Router::new()
        .route("/", get(|| async { Html("<!doctype html><title>elsewhere</title><p>another site</p>") }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}
