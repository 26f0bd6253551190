//! Attacks through MCP, as agents with real ServiceAccount tokens issued for the MCP endpoint: starting a
//! rollout of workloads the caller may not change, a page on another site calling a local server, and a
//! flood of random bearer tokens.

use fleetroll::mcp::limits::{REVIEW_BURST, REVIEWS_PER_SECOND};
use futures::StreamExt;

use super::*;
use std::sync::Arc;
use testkit::{Rng, mcp::drive};

/// The MCP server alone, checking callers' tokens for its own URL and writing as its callers. It runs with
/// the cluster admin's credentials: impersonation means that is no longer what its callers get.
pub(super) async fn mcp_server(ns: &str) -> Operator {
    let op = Operator::start_mcp(
        ns,
        &["--auth", "serviceaccount", "--mcp-audience", "http://127.0.0.1:{port}/mcp"],
        &[("RUST_LOG", "warn")],
    );
    op.ready().await;
    op
}

/// A token of `t`'s ServiceAccount for the MCP endpoint (its audience).
pub(super) async fn mcp_token(env: &Env, t: &Tenant, audience: &str) -> String {
    testkit::tenant::token_for(&env.admin, &t.namespace, &t.name, Some(audience)).await
}

pub(super) async fn mcp_caller_rolls_what_it_may_not_patch(env: &'static Env) -> Row {
    let op = mcp_server(&env.t1).await;
    let url = op.mcp_url();
    let token = mcp_token(env, &env.creator, &url).await;
    let args = json!({"namespace": env.t1, "name": "through-mcp", "image": "registry.example/evil:latest",
        "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}}});
    let result =
        drive(&["call", &url, "rollout_fleet", &args.to_string(), "--no-tasks", "--token", &token]).await;
    let text = result["content"][0]["text"].as_str().unwrap_or_default().to_string();
    let created =
        Api::<FleetRollout>::namespaced(env.admin.clone(), &env.t1).get_opt("through-mcp").await.unwrap();
    let judged_as_caller = text.contains(&may_not(&env.creator, "patch deployments", &env.t1));
    Row {
        attack: "an agent starts, over MCP, a rollout of Deployments it may not patch".into(),
        who: who(&env.creator, "create/get fleetrollouts in t1, an MCP token"),
        expected:
            "the MCP server writes as the caller, so the admission policy refuses it; nothing is created"
                .into(),
        outcome: format!("isError {}: {text}; created: {}", result["isError"], created.is_some()),
        contained: result["isError"] == true && judged_as_caller && created.is_none(),
    }
}

pub(super) async fn mcp_caller_previews_what_it_may_not_list(env: &'static Env) -> Row {
    let op = mcp_server(&env.t1).await;
    let url = op.mcp_url();
    let token = mcp_token(env, &env.creator, &url).await;
    let args = json!({"namespace": env.t1, "image": "registry.example/any:1",
        "targets": {"kind": "Deployment", "selector": {"matchExpressions": [{"key": "fleet", "operator": "Exists"}]}}});
    let result =
        drive(&["call", &url, "preview_rollout", &args.to_string(), "--no-tasks", "--token", &token]).await;
    let text = result["content"][0]["text"].as_str().unwrap_or_default().to_string();
    Row {
        attack:
            "an agent previews a rollout to learn the workloads and images of a namespace it may not list"
                .into(),
        who: who(&env.creator, "create/get fleetrollouts in t1, an MCP token"),
        expected: "discovery runs as the caller: refused, nothing listed".into(),
        outcome: format!("isError {}: {text}", result["isError"]),
        contained: result["isError"] == true && text.contains("forbidden") && !text.contains("currentImage"),
    }
}

pub(super) async fn a_foreign_page_calls_the_mcp_server(env: &'static Env) -> Row {
    let op = mcp_server(&env.t1).await;
    let url = op.mcp_url();
    // A page on another site, through a browser on a machine that can reach the server (DNS rebinding).
    let forged =
        drive(&["raw", &url, "tools/list", "{}", "--header", "Origin=https://evil.example.com"]).await;
    let said = forged["body"]["error"]["message"].as_str().unwrap_or_default().to_string();
    Row {
        attack: "a page on another site calls the MCP server through a browser (foreign Origin)".into(),
        who: "https://evil.example.com".into(),
        expected: "403 before anything else is looked at".into(),
        outcome: format!("{}: {said}", forged["status"]),
        contained: forged["status"] == 403 && said.contains("Origin"),
    }
}

/// TokenReviews the API server has answered, from its own metrics.
async fn token_reviews_served(client: &Client) -> f64 {
    requests_served(client, "tokenreviews").await
}

/// Requests for `resource` the API server has answered, from its own metrics.
pub(super) async fn requests_served(client: &Client, resource: &str) -> f64 {
    let text = client.request_text(http::Request::get("/metrics").body(Vec::new()).unwrap()).await.unwrap();
    let resource = format!("resource=\"{resource}\"");
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains(&resource))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Resident memory of a process, in KiB.
pub(super) fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap()
}

/// One MCP request's HTTP status; a 429 must say when to come back.
pub(super) async fn post_status(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    method: &str,
    name: &str,
    params: Value,
) -> u16 {
    let response = testkit::mcp::post(http, url, Some(token), method, name, params, json!({})).await;
    let status = response.status().as_u16();
    if status == 429 {
        assert!(response.headers().contains_key("retry-after"), "429 without Retry-After");
    }
    status
}

pub(super) async fn a_flood_of_random_bearer_tokens(env: &'static Env) -> Row {
    const FLOOD: usize = 10_000;
    const CONCURRENCY: usize = 64;
    let op = mcp_server(&env.t1).await;
    let url = op.mcp_url();
    let http = reqwest::Client::builder().pool_max_idle_per_host(CONCURRENCY * 2).build().unwrap();
    let known = mcp_token(env, &env.dev1, &url).await;
    let list = json!({"name": "list_rollouts", "arguments": {"namespace": env.t1}});
    assert_eq!(post_status(&http, &url, &known, "tools/call", "list_rollouts", list.clone()).await, 200);

    let reviews_before = token_reviews_served(&env.admin).await;
    let rss_before = rss_kib(op.pid());
    let started = std::time::Instant::now();
    let flooding = Arc::new(std::sync::atomic::AtomicBool::new(true));
    // A caller the server knows keeps calling throughout; the flood must not lock it out.
    let caller = {
        let (http, url, flooding) = (http.clone(), url.clone(), flooding.clone());
        tokio::spawn(async move {
            let (mut served, mut refused) = (0, 0);
            while flooding.load(std::sync::atomic::Ordering::Relaxed) {
                match post_status(&http, &url, &known, "tools/call", "list_rollouts", list.clone()).await {
                    200 => served += 1,
                    _ => refused += 1,
                }
            }
            (served, refused)
        })
    };
    let mut rng = Rng(0x5eed_f100d);
    let tokens: Vec<String> =
        (0..FLOOD).map(|_| format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64())).collect();
    // Ten waves of 1,000, a second apart (pacing the load, not waiting for anything), so that the sustained
    // rate shows and not only the burst.
    let mut statuses: Vec<u16> = Vec::with_capacity(FLOOD);
    for (i, wave) in tokens.chunks(FLOOD / 10).enumerate() {
        tokio::time::sleep_until(tokio::time::Instant::from_std(started) + Duration::from_secs(i as u64))
            .await;
        let wave: Vec<u16> = futures::stream::iter(wave.to_vec())
            .map(|t| {
                let (http, url) = (http.clone(), url.clone());
                async move { post_status(&http, &url, &t, "tools/list", "", json!({})).await }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        statuses.extend(wave);
    }
    flooding.store(false, std::sync::atomic::Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let (served, refused) = caller.await.unwrap();
    let reviews = token_reviews_served(&env.admin).await - reviews_before;
    let rss_after = rss_kib(op.pid());
    let count = |code: u16| statuses.iter().filter(|s| **s == code).count();
    let (unauthorized, limited) = (count(401), count(429));
    // The attack runs alone; the allowance covers the tenants' own token checks elsewhere in the cluster.
    let bound = REVIEW_BURST + REVIEWS_PER_SECOND * elapsed + 20.0;
    Row {
        attack: format!("a flood of {FLOOD} random bearer tokens, {CONCURRENCY} at a time, over ten seconds"),
        who: "anyone who can reach /mcp".into(),
        expected: format!(
            "at most {REVIEW_BURST} + {REVIEWS_PER_SECOND}/s TokenReviews, the rest 429; known callers still served; memory bounded"
        ),
        outcome: format!(
            "{unauthorized} x 401, {limited} x 429 in {elapsed:.1} s; {reviews} TokenReviews ({:.1}/s); known caller \
             served {served}, refused {refused}; RSS {} -> {} MiB",
            reviews / elapsed,
            rss_before / 1024,
            rss_after / 1024
        ),
        contained: unauthorized + limited == FLOOD
            && limited > 0
            && reviews <= bound
            && served > 0
            && refused == 0
            && rss_after < rss_before + 16 * 1024,
    }
}
