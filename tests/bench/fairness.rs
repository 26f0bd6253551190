//! Fair shares on `/mcp`, measured: an agent's `tasks/get` latency while another tenant's caller holds as
//! many slow-body POSTs as it can (each promising a body it never sends), beside the same agent unflooded,
//! both with real ServiceAccount tokens on a server that checks them; and the same agent, each call on a new
//! connection, beside 1,500 connections from 12 addresses dribbling their headers, against unflooded.

use std::time::Duration;

use futures::future::join_all;
use kube::Client;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::{Report, Sizes, row};
use testkit::{
    flood,
    operator::Operator,
    tenant::{Grant, Tenant, token_for},
};

/// The agent's concurrent pollers: an agent watching a few tasks at once, within its share of requests.
const POLLERS: usize = 4;
/// The flooder's slow-body POSTs held at once: more than all the server's request slots.
const SLOW_BODIES: usize = 260;

/// The slow-header flood: this many addresses, this many connections from each.
const HEADER_SOURCES: u8 = 12;
const HEADERS_PER_SOURCE: usize = 125;

/// `tasks/get` of `task` as `token`, on `POLLERS` loops for `seconds` (each call on a new connection when
/// `fresh`): sorted latencies (s), and the statuses of calls that were not answered with a result (000: the
/// connection closed unanswered).
async fn poll(url: &str, token: &str, task: &str, seconds: u64, fresh: bool) -> (Vec<f64>, Vec<String>) {
    let until = Instant::now() + Duration::from_secs(seconds);
    let loops = (0..POLLERS).map(|_| {
        let (url, token, task) = (url.to_string(), token.to_string(), task.to_string());
        tokio::spawn(async move {
            let mut http = reqwest::Client::builder();
            if fresh {
                http = http.pool_max_idle_per_host(0);
            }
            let http = http.build().unwrap();
            let (mut latencies, mut failed) = (Vec::new(), Vec::new());
            while Instant::now() < until {
                let started = Instant::now();
                let tasks = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
                let params = json!({"taskId": task});
                let sent =
                    testkit::mcp::try_post(&http, &url, Some(&token), "tasks/get", &task, params, tasks);
                let Ok(r) = sent.await else {
                    latencies.push(started.elapsed().as_secs_f64());
                    failed.push("000".to_string());
                    continue;
                };
                let status = r.status();
                let body: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap_or_default();
                latencies.push(started.elapsed().as_secs_f64());
                if !status.is_success() || body.get("result").is_none() {
                    failed.push(format!("{status}: {body}"));
                }
            }
            (latencies, failed)
        })
    });
    let (mut latencies, mut failed) = (Vec::new(), Vec::new());
    for done in join_all(loops).await {
        let (l, f) = done.unwrap();
        latencies.extend(l);
        failed.extend(f);
    }
    latencies.sort_by(f64::total_cmp);
    (latencies, failed)
}

pub async fn mcp_fairness(client: &Client, sizes: &Sizes, report: &mut Report, namespaces: &mut Vec<String>) {
    let seconds = sizes.fairness_seconds;
    eprintln!(
        "fairness: an agent's tasks/get for {seconds}s unflooded, then beside {SLOW_BODIES} slow bodies"
    );
    let ns = testkit::create_namespace(client, "bench-fair", &[]).await;
    let other = testkit::create_namespace(client, "bench-fair-x", &[]).await;
    namespaces.extend([ns.clone(), other.clone()]);
    let edit = [Grant::cluster_role("edit")];
    let (agent, flooder) = tokio::join!(
        Tenant::create(client, &ns, "agent", &edit),
        Tenant::create(client, &other, "flooder", &edit)
    );
    let op = Operator::start(
        &ns,
        &["--auth", "serviceaccount", "--mcp-audience", "http://127.0.0.1:{port}/mcp"],
        &[],
    );
    op.ready().await;
    let url = op.mcp_url();
    let agent_token = token_for(client, &agent.namespace, &agent.name, Some(&url)).await;
    let flooder_token = token_for(client, &flooder.namespace, &flooder.name, Some(&url)).await;

    // The agent starts a paused rollout over no targets (only the MCP path is measured) and polls its task.
    let args = json!({"name": "rollout_fleet", "arguments": {"namespace": ns, "name": "fair", "image": "example.invalid/x:1",
        "paused": true, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"none": "none"}}}}});
    let tasks = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let http = reqwest::Client::new();
    let started =
        testkit::mcp::post(&http, &url, Some(&agent_token), "tools/call", "rollout_fleet", args, tasks).await;
    let started: Value = serde_json::from_slice(&started.bytes().await.unwrap()).unwrap();
    let task =
        started["result"]["taskId"].as_str().unwrap_or_else(|| panic!("no task: {started}")).to_string();

    let (calm, calm_failed) = poll(&url, &agent_token, &task, seconds, false).await;
    // The flood outlasts the polling by a body allowance, so that the whole poll is under it.
    let until = Instant::now() + Duration::from_secs(seconds + 6);
    let flood = tokio::spawn({
        let (url, token) = (url.clone(), flooder_token.clone());
        async move { flood::slow_bodies(&url, &token, SLOW_BODIES, until).await }
    });
    let (flooded, flooded_failed) = poll(&url, &agent_token, &task, seconds, false).await;
    let flood = flood.await.unwrap();
    assert!(
        calm_failed.is_empty() && flooded_failed.is_empty(),
        "fairness: the agent was refused: {calm_failed:?} {flooded_failed:?}"
    );
    assert!(flood.statuses.get(&408).is_some_and(|n| *n > 0), "fairness: the flood held no slot: {flood:?}");

    let p99 = |sorted: &[f64]| testkit::bench::percentile(sorted, 99.0);
    report.rows.push(row(
        format!("MCP fairness: an agent's tasks/get, {POLLERS} concurrent, unflooded: p50 / p99"),
        format!("{} ({} calls)", testkit::bench::p50_p99_ms(&calm), calm.len()),
        "",
        None,
    ));
    report.rows.push(row(
        format!(
            "known caller's tasks/get p99 under a slow-body flood by another identity ({SLOW_BODIES} at once): p50 / p99"
        ),
        format!(
            "{} ({} calls, 0 refused; flood: {} slow bodies cut at the body timeout, {} refused 503)",
            testkit::bench::p50_p99_ms(&flooded),
            flooded.len(),
            flood.statuses.get(&408).copied().unwrap_or(0),
            flood.statuses.get(&503).copied().unwrap_or(0),
        ),
        "every call served",
        Some(true),
    ));
    let ratio = p99(&flooded) / p99(&calm);
    report.rows.push(row(
        "tasks/get p99 flooded / unflooded",
        format!("{ratio:.2}"),
        "≤ 2",
        Some(ratio <= 2.0),
    ));

    // Connections before requests: the agent on new connections, unflooded and beside slow headers.
    let (fresh_calm, fresh_calm_failed) = poll(&url, &agent_token, &task, seconds, true).await;
    let headers = HeaderFlooder::start(flood::addr_of(&url), seconds + 2).await;
    let (fresh_flooded, fresh_flooded_failed) = poll(&url, &agent_token, &task, seconds, true).await;
    let headers = headers.finish().await;
    let total = usize::from(HEADER_SOURCES) * HEADERS_PER_SOURCE;
    assert!(fresh_calm_failed.is_empty(), "fairness: the agent was refused unflooded: {fresh_calm_failed:?}");
    report.rows.push(row(
        format!("MCP fairness: an agent's tasks/get on new connections, {POLLERS} concurrent, unflooded: p50 / p99"),
        format!("{} ({} calls)", testkit::bench::p50_p99_ms(&fresh_calm), fresh_calm.len()),
        "",
        None,
    ));
    let ratio = p99(&fresh_flooded) / p99(&fresh_calm);
    report.rows.push(row(
        format!(
            "known caller's tasks/get on new connections under {total} slow-header connections from {HEADER_SOURCES} addresses: p50 / p99 (flooded / unflooded p99)"
        ),
        format!(
            "{} ({} calls, {} refused; flood opened {}, {} cut, its own CPU {:.1} s); {ratio:.2}",
            testkit::bench::p50_p99_ms(&fresh_flooded),
            fresh_flooded.len(),
            fresh_flooded_failed.len(),
            headers.opened,
            headers.closed,
            headers.cpu_seconds,
        ),
        "≤ 2, 0 refused",
        Some(ratio <= 2.0 && fresh_flooded_failed.is_empty()),
    ));
}

/// Set to `ADDR SECONDS`, the bench binary is the slow-header flooder instead ([`flooder`]).
pub const FLOODER_ENV: &str = "FLEETROLL_BENCH_SLOW_HEADERS";

/// The slow-header flood, from a process of its own at the lowest priority, as if from other machines: its
/// CPU is the attacker's. In the bench's own process it took a core of the two here, and the row measured
/// how the agent beside it was starved of CPU rather than how the server shares its connections.
struct HeaderFlooder {
    child: tokio::process::Child,
    said: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

/// What the flooder did: connections opened and cut by the server, and the CPU it spent.
struct HeaderFlood {
    opened: u64,
    closed: u64,
    cpu_seconds: f64,
}

impl HeaderFlooder {
    /// Starts the flood at `addr` for `seconds`; returns once it has begun.
    async fn start(addr: std::net::SocketAddr, seconds: u64) -> Self {
        let exe = std::env::current_exe().expect("the bench's own binary");
        let mut child = tokio::process::Command::new("nice")
            .args(["-n", "19"])
            .arg(exe)
            .env(FLOODER_ENV, format!("{addr} {seconds}"))
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the flooder (nice, the bench binary)");
        let stdout = child.stdout.take().expect("the flooder's stdout");
        let mut said = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
        let first = said.next_line().await.ok().flatten();
        assert_eq!(first.as_deref(), Some("flooding"), "the flooder did not start");
        Self { child, said }
    }

    async fn finish(mut self) -> HeaderFlood {
        let last = self.said.next_line().await.ok().flatten().unwrap_or_default();
        let status = self.child.wait().await.expect("the flooder's end");
        let words: Vec<&str> = last.split_whitespace().collect();
        let parsed = match words[..] {
            [opened, closed, cpu] => opened.parse().ok().zip(closed.parse().ok()).zip(cpu.parse().ok()),
            _ => None,
        };
        let Some(((opened, closed), cpu_seconds)) = parsed.filter(|_| status.success()) else {
            panic!("the flooder failed ({status}): {last:?}");
        };
        HeaderFlood { opened, closed, cpu_seconds }
    }
}

/// The flooder's process: `spec` is `ADDR SECONDS`; floods from [`HEADER_SOURCES`] addresses, says
/// `flooding` as it begins, and at the end `OPENED CUT CPU-SECONDS`.
pub fn flooder(spec: &str) {
    let mut words = spec.split_whitespace();
    let addr: Option<std::net::SocketAddr> = words.next().and_then(|a| a.parse().ok());
    let seconds: Option<u64> = words.next().and_then(|s| s.parse().ok());
    let (Some(addr), Some(seconds)) = (addr, seconds) else {
        panic!("{FLOODER_ENV}={spec:?}: expected ADDR SECONDS");
    };
    let sources: Vec<std::net::Ipv4Addr> =
        (1..=HEADER_SOURCES).map(|i| std::net::Ipv4Addr::new(127, 0, 1, i)).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let flood = runtime.block_on(async move {
        let until = Instant::now() + Duration::from_secs(seconds);
        let every = Duration::from_secs(1);
        let flood = tokio::spawn(async move {
            flood::slow_header_flood(addr, &sources, HEADERS_PER_SOURCE, every, until).await
        });
        println!("flooding");
        flood.await.unwrap()
    });
    println!("{} {} {:.2}", flood.opened, flood.closed, cpu_seconds());
}

/// This process's CPU time, user and system, from /proc/self/stat (in USER_HZ, 100 a second).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // After the command's closing parenthesis, utime and stime are the 12th and 13th fields.
    let fields = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    fields.split_whitespace().skip(11).take(2).filter_map(|t| t.parse::<f64>().ok()).sum::<f64>() / 100.0
}
