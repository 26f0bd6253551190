//! One MCP tenant, with valid tokens of its own, tries to refuse everyone else: one of its callers holds
//! connections open and sends bodies slowly, another floods calls each costing a permission check, and from
//! other addresses connections never send a request. A caller the server already knows, another tenant's
//! agent, keeps calling throughout.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    sync::{Arc, Mutex},
    time::Duration,
};

use fleetroll::mcp::limits::{
    ACCESS_REVIEWS_PER_CALLER, BODY_MIN_BYTES_PER_SECOND, BODY_TIMEOUT, CONNECTIONS_PER_CALLER,
    HEADER_READ_TIMEOUT, UNBOUND_CONNECTIONS_PER_PEER, UNBOUND_WAITING_PER_PEER,
};
use futures::StreamExt;
use tokio::time::Instant;

use super::*;
use testkit::flood::{self, HOME};

/// Another peer to the server: a pod of the attacker's elsewhere.
const ELSEWHERE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// And a third.
const THIRD: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);

/// Latencies (s) of a known caller's calls, and the calls not answered 200.
#[derive(Default)]
struct Calls {
    latencies: Vec<f64>,
    failed: Vec<u16>,
}

impl Calls {
    fn p(&self, p: f64) -> f64 {
        let mut sorted = self.latencies.clone();
        sorted.sort_by(f64::total_cmp);
        let i = ((p / 100.0) * (sorted.len().max(1) - 1) as f64).round() as usize;
        sorted.get(i).copied().unwrap_or(f64::NAN) * 1000.0
    }

    fn summary(&self) -> String {
        format!("{} calls, p50 {:.1} ms, p99 {:.1} ms", self.latencies.len(), self.p(50.0), self.p(99.0))
    }
}

/// A known caller's `list_rollouts`, one after another on its own client, `count` of them or until `until`.
async fn known_calls(url: &str, token: &str, ns: &str, count: usize, until: Option<Instant>) -> Calls {
    let http = reqwest::Client::new();
    let list = json!({"name": "list_rollouts", "arguments": {"namespace": ns}});
    let mut calls = Calls::default();
    while calls.latencies.len() < count && until.is_none_or(|u| Instant::now() < u) {
        let started = Instant::now();
        let status = post_status(&http, url, token, "tools/call", "list_rollouts", list.clone()).await;
        calls.latencies.push(started.elapsed().as_secs_f64());
        if status != 200 {
            calls.failed.push(status);
        }
    }
    calls
}

/// `tasks/get` of ever new rollouts in `ns` (each a permission check no cache answers), 8 at a time, until
/// `until`: the answers' statuses.
async fn permission_checks(url: String, token: String, ns: String, until: Instant) -> BTreeMap<u16, usize> {
    let http = reqwest::Client::new();
    let counts = Arc::new(Mutex::new(BTreeMap::new()));
    futures::stream::iter(0..)
        .take_while(|_| std::future::ready(Instant::now() < until))
        .for_each_concurrent(8, |i| {
            let (http, url, token, counts) = (http.clone(), url.clone(), token.clone(), counts.clone());
            let id = format!("{ns}/r-{i}/{i:032x}");
            async move {
                let status = post_status(&http, &url, &token, "tasks/get", &id, json!({"taskId": id})).await;
                *counts.lock().unwrap().entry(status).or_default() += 1;
            }
        })
        .await;
    counts.lock().unwrap().clone()
}

pub(super) async fn one_mcp_tenant_floods_slow_bodies_connections_and_permission_checks(
    env: &'static Env,
) -> Row {
    const SLOW_BODIES: usize = 260;
    const HELD: usize = 200;
    const SILENT: usize = 200;
    const ATTACK: Duration = Duration::from_secs(15);
    let margin = Duration::from_secs(2);
    let op = mcp_server(&env.t1).await;
    let url = op.mcp_url();
    let addr = flood::addr_of(&url);
    let flooder = Tenant::create(&env.admin, &env.t2, "mcp-flooder", &[Grant::cluster_role("edit")]).await;
    let known = mcp_token(env, &env.dev1, &url).await;
    let (attacker, flooder) = (mcp_token(env, &env.dev2, &url).await, mcp_token(env, &flooder, &url).await);
    let before = known_calls(&url, &known, &env.t1, 200, None).await;

    let reviews_before = requests_served(&env.admin, "subjectaccessreviews").await;
    let rss_before = rss_kib(op.pid());
    let started = Instant::now();
    let until = started + ATTACK;
    let during = tokio::spawn({
        let (url, known, ns) = (url.clone(), known.clone(), env.t1.clone());
        async move { known_calls(&url, &known, &ns, usize::MAX, Some(until)).await }
    });
    // From 127.0.0.1, where the agent is too: what the attacker holds is charged to it, not to the address.
    let idle = flood::open_idle(&url, &attacker, HOME, HELD).await;
    let idle = tokio::spawn(flood::watch_idle(idle, HEADER_READ_TIMEOUT + margin * 2));
    let slow = tokio::spawn({
        let (url, attacker) = (url.clone(), attacker.clone());
        async move { flood::slow_bodies(&url, &attacker, SLOW_BODIES, until).await }
    });
    let checks = tokio::spawn(permission_checks(url.clone(), flooder, env.t2.clone(), until));
    let wait = HEADER_READ_TIMEOUT + ATTACK;
    let silent = tokio::spawn(flood::silent_connections(addr, ELSEWHERE, SILENT, wait));
    let header = tokio::spawn(flood::slow_headers(addr, THIRD, Duration::from_millis(500), wait));
    let unauthenticated = tokio::spawn(flood::unauthenticated_slow_body(addr, THIRD));
    let during = during.await.unwrap();
    let rss_during = rss_kib(op.pid());
    let (slow, checked) = (slow.await.unwrap(), checks.await.unwrap());
    let elapsed = started.elapsed().as_secs_f64();
    let reviews = requests_served(&env.admin, "subjectaccessreviews").await - reviews_before;
    let (idle, silent, header) = (idle.await.unwrap(), silent.await.unwrap(), header.await.unwrap());
    let (unauth_answer, unauth_answered, unauth_closed) = unauthenticated.await.unwrap();

    // Idle connections: each answered, kept open only within the caller's share, and closed once idle.
    let answered = idle.iter().filter(|h| h.answer.is_some_and(|a| a.status == 200)).count();
    let kept = idle.iter().filter(|h| h.closed_after.is_none_or(|c| c > Duration::from_secs(1))).count();
    let idle_closed = idle.iter().all(|h| h.closed_after.is_some_and(|c| c <= HEADER_READ_TIMEOUT + margin));
    // Silent connections: an address holds its share of them read and its share waiting for a turn, each
    // until the header timeout of its opening; the rest are closed as soon as they are accepted.
    let lasted = silent.iter().filter(|s| s.is_none_or(|s| s > HEADER_READ_TIMEOUT / 2)).count();
    let silent_cut = silent.iter().all(|s| s.is_some_and(|s| s <= HEADER_READ_TIMEOUT + margin));
    let review_bound =
        ACCESS_REVIEWS_PER_CALLER.burst + ACCESS_REVIEWS_PER_CALLER.per_second * elapsed + 20.0;
    let unauth_ok = unauth_answer.is_some_and(|a| a.status == 401 && a.close)
        && unauth_answered < margin
        && unauth_closed.is_some_and(|c| c < margin);
    Row {
        attack: format!(
            "one MCP tenant: a caller opens {HELD} idle connections and holds {SLOW_BODIES} slow-body POSTs for {}s, \
             another floods tasks/get of unknown rollouts; {SILENT} silent connections and a slow-header client \
             from other addresses; another tenant's agent keeps calling",
            ATTACK.as_secs()
        ),
        who: who(&env.dev2, "edit in t2, MCP tokens for two ServiceAccounts"),
        expected: format!(
            "the agent is always served (p99 under 2 s); bodies cut within {}s + size at {} KiB/s, a caller's connections beyond \
             {CONNECTIONS_PER_CALLER} closed, idle or silent ones after {}s, permission checks within the \
             caller's budget (429 beyond)",
            BODY_TIMEOUT.as_secs(),
            BODY_MIN_BYTES_PER_SECOND / 1024,
            HEADER_READ_TIMEOUT.as_secs()
        ),
        outcome: format!(
            "agent: {} before, {} during, refused {:?}; idle connections answered {answered}/{HELD}, kept \
             {kept}, all closed when idle: {idle_closed}; slow bodies answered {:?} (longest {:.1}s), {} closed \
             unanswered; silent: {lasted}/{SILENT} held, all cut: {silent_cut}; slow header cut after {:?}; \
             unauthenticated slow body {:?} after {:?}, closed after {:?}; permission checks {checked:?}, \
             {reviews} SubjectAccessReviews in {elapsed:.1}s; RSS {} -> {} MiB",
            before.summary(),
            during.summary(),
            during.failed,
            slow.statuses,
            slow.longest.as_secs_f64(),
            slow.unanswered,
            header,
            unauth_answer,
            unauth_answered,
            unauth_closed,
            rss_before / 1024,
            rss_during / 1024,
        ),
        contained: before.failed.is_empty()
            && during.failed.is_empty()
            && !during.latencies.is_empty()
            && during.p(99.0) < 2000.0
            && answered == HELD
            && kept > 0
            && kept <= CONNECTIONS_PER_CALLER
            && idle_closed
            && slow.statuses.keys().all(|s| [408, 503].contains(s))
            && slow.statuses.get(&408).is_some_and(|n| *n > 0)
            && slow.longest <= BODY_TIMEOUT + margin
            && lasted <= UNBOUND_CONNECTIONS_PER_PEER + UNBOUND_WAITING_PER_PEER
            && silent_cut
            && header.is_some_and(|h| h <= HEADER_READ_TIMEOUT + margin)
            && unauth_ok
            && checked.get(&429).is_some_and(|n| *n > 0)
            && reviews <= review_bound
            && rss_during < rss_before + 32 * 1024,
    }
}

/// A known caller's `list_rollouts`, each on a new connection (an agent starting, or one whose pool the
/// server closed), one after another until `until`.
async fn calls_on_new_connections(url: &str, token: &str, ns: &str, until: Instant) -> Calls {
    let fresh = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let list = json!({"name": "list_rollouts", "arguments": {"namespace": ns}});
    let mut calls = Calls::default();
    while Instant::now() < until {
        let started = Instant::now();
        let sent = testkit::mcp::try_post(
            &fresh,
            url,
            Some(token),
            "tools/call",
            "list_rollouts",
            list.clone(),
            json!({}),
        );
        // 0: the connection was closed (or never accepted) without an answer.
        let sent = sent.await;
        if let Err(e) = &sent {
            eprintln!("DEBUG call error after {:?}: {e:?}", started.elapsed());
        }
        let status = sent.map_or(0, |r| r.status().as_u16());
        calls.latencies.push(started.elapsed().as_secs_f64());
        if status != 200 {
            calls.failed.push(status);
        }
    }
    calls
}

pub(super) async fn slow_header_connections_from_many_addresses_leave_callers_unanswered(
    env: &'static Env,
) -> Row {
    const SOURCES: u8 = 12;
    const PER_SOURCE: usize = 125;
    const ATTACK: Duration = Duration::from_secs(20);
    let op = mcp_server(&env.t1).await;
    let url = op.mcp_url();
    let known = mcp_token(env, &env.dev1, &url).await;
    let quiet =
        calls_on_new_connections(&url, &known, &env.t1, Instant::now() + Duration::from_secs(3)).await;
    let until = Instant::now() + ATTACK;
    let sources: Vec<Ipv4Addr> = (1..=SOURCES).map(|i| Ipv4Addr::new(127, 0, 1, i)).collect();
    let addr = flood::addr_of(&url);
    let flood = tokio::spawn(async move {
        flood::slow_header_flood(addr, &sources, PER_SOURCE, Duration::from_secs(1), until).await
    });
    let during = calls_on_new_connections(&url, &known, &env.t1, until).await;
    let flood = flood.await.unwrap();
    let total = usize::from(SOURCES) * PER_SOURCE;
    Row {
        attack: format!(
            "{total} connections from {SOURCES} addresses send /mcp headers a byte a second (opened again when \
             cut) for {}s, while another tenant's agent calls on new connections",
            ATTACK.as_secs()
        ),
        who: "anyone who can reach /mcp, no token".into(),
        expected: "every call of the agent answered 200; the flood held to the caps".into(),
        outcome: format!(
            "agent unflooded: {}; during: {}, not answered 200: {:?}; flood opened {} connections, {} cut or refused",
            quiet.summary(),
            during.summary(),
            during.failed,
            flood.opened,
            flood.closed
        ),
        contained: quiet.failed.is_empty()
            && during.latencies.len() >= 10
            && during.failed.is_empty()
            && flood.opened >= total,
    }
}

pub(super) async fn unread_pipelined_answers_hold_every_connection(env: &'static Env) -> Row {
    const SOURCES: u8 = 6;
    // Each address's most (unbound, read and waiting): together past the server's 1,024 connections.
    const PER_SOURCE: usize = 256;
    const ATTACK: Duration = Duration::from_secs(20);
    let op = mcp_server(&env.t1).await;
    let url = op.mcp_url();
    let known = mcp_token(env, &env.dev1, &url).await;
    let until = Instant::now() + ATTACK;
    let sources: Vec<Ipv4Addr> = (1..=SOURCES).map(|i| Ipv4Addr::new(127, 0, 2, i)).collect();
    let addr = flood::addr_of(&url);
    let flood = tokio::spawn(async move {
        flood::unread_pipeline_flood(addr, &sources, PER_SOURCE, "/healthz", 2000, until).await
    });
    let during = calls_on_new_connections(&url, &known, &env.t1, until).await;
    let flood = flood.await.unwrap();
    let total = usize::from(SOURCES) * PER_SOURCE;
    Row {
        attack: format!(
            "{total} connections from {SOURCES} addresses each pipeline 2000 GET /healthz on a one-byte receive \
             window and never read (opened again when cut) for {}s, while another tenant's agent calls on new \
             connections",
            ATTACK.as_secs()
        ),
        who: "anyone who can reach /mcp, no token".into(),
        expected: "every call of the agent answered 200: a connection no caller holds is answered once and \
                   closed, and one whose answers are not read gives way at the cap or after 10 s"
            .into(),
        outcome: format!(
            "agent during: {}, not answered 200: {:?}; flood opened {} connections, {} cut or refused",
            during.summary(),
            during.failed,
            flood.opened,
            flood.closed
        ),
        contained: during.latencies.len() >= 10 && during.failed.is_empty() && flood.opened >= total,
    }
}
