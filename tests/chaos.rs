//! `make chaos`: fault injection, with the invariants checked after every fault.
//!
//!   cargo test --release --test chaos -- --full    the full run (make chaos); writes bench/results/chaos.md
//!   cargo test --test chaos                        a reduced smoke run, part of `make test`
//!   cargo test --test chaos -- plane fuzz          only the named scenarios (kills leader plane mcp fuzz)
//!   cargo test --test chaos -- --skip fuzz         all but the named ones (as libtest)
//!
//! Faults: SIGKILLs of the operator at seeded random points across several rollouts; the leader killed
//! mid-batch, again and again, with a standby replica; kube-apiserver and etcd restarted mid-rollout and
//! the apiserver frozen (SIGSTOP) for a while; the MCP server killed between rollout_fleet and tasks/get;
//! thousands of malformed or hostile MCP requests. FLEETROLL_CHAOS_SEED replays a run.
#![allow(clippy::unwrap_used)]

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use fleetroll::api::{FleetRollout, Phase};
use kube::{Api, Client, api::PostParams};
use serde_json::json;
use testkit::bench::{Observer, Row, row};
use testkit::{Rng, mcp::drive, operator::Operator};

struct Sizes {
    name: &'static str,
    kills: usize,
    kill_rollouts: usize,
    kill_targets: usize,
    leader_rounds: usize,
    freeze: Duration,
    fuzz: usize,
}

const FULL: Sizes = Sizes {
    name: "full",
    kills: 100,
    kill_rollouts: 4,
    kill_targets: 20,
    leader_rounds: 5,
    freeze: Duration::from_secs(30),
    fuzz: 10_000,
};
const SMOKE: Sizes = Sizes {
    name: "smoke",
    kills: 5,
    kill_rollouts: 2,
    kill_targets: 6,
    leader_rounds: 1,
    freeze: Duration::from_secs(3),
    fuzz: 300,
};

const LONG: Duration = Duration::from_secs(1800);

/// The invariants, counted over every fault.
#[derive(Default)]
struct Invariants {
    targets: usize,
    changed_not_once: usize,
    rollouts: usize,
    stuck: usize,
    over_in_flight: usize,
    task_disagreements: usize,
    tasks_checked: usize,
}

fn main() {
    let full = std::env::args().any(|a| a == "--full");
    let sizes = if full { FULL } else { SMOKE };
    let seed = std::env::var("FLEETROLL_CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20261129u64);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(run(sizes, seed));
}

async fn run(sizes: Sizes, seed: u64) {
    let client = testkit::client().await;
    testkit::fleet::ensure_crd(&client).await;
    let started = Instant::now();
    let speed = testkit::bench::MachineSpeed::measure();
    clear_old_logs();
    eprintln!("chaos ({}): seed {seed} (FLEETROLL_CHAOS_SEED={seed} replays it)", sizes.name);
    let mut rng = Rng(seed.max(1));
    let mut inv = Invariants::default();
    let mut rows = Vec::new();
    let mut namespaces = Vec::new();

    if selected("kills") {
        rows.push(kills(&client, &sizes, &mut rng, &mut inv, &mut namespaces).await);
    }
    if selected("leader") {
        rows.push(leader_kills(&client, &sizes, &mut inv, &mut namespaces).await);
    }
    if selected("plane") {
        rows.extend(control_plane(&client, &sizes, &mut inv, &mut namespaces).await);
    }
    if selected("mcp") {
        rows.push(mcp_restart(&client, &mut inv, &mut namespaces).await);
    }
    if selected("fuzz") {
        rows.push(fuzz(&client, &sizes, &mut rng, &mut namespaces).await);
    }
    testkit::bench::cleanup(&client, &namespaces).await;

    let panics = panics_in_logs();
    rows.push(row(
        "every target changed exactly once per revision (generation +1)",
        format!("{} of {} targets violated it", inv.changed_not_once, inv.targets),
        "0 double applies",
        Some(inv.changed_not_once == 0),
    ));
    rows.push(row(
        "never more targets in flight than the batch allows",
        format!("{} violations", inv.over_in_flight),
        "0",
        Some(inv.over_in_flight == 0),
    ));
    rows.push(row(
        "rollouts ending in a terminal phase (or one someone can act on)",
        format!("{} of {}", inv.rollouts - inv.stuck, inv.rollouts),
        "0 stuck",
        Some(inv.stuck == 0),
    ));
    rows.push(row(
        "status and tasks/get agree",
        format!("{} disagreements in {} checks", inv.task_disagreements, inv.tasks_checked),
        "0",
        Some(inv.task_disagreements == 0),
    ));
    rows.push(row("panics in operator and MCP server logs", format!("{panics}"), "0", Some(panics == 0)));
    let table = testkit::bench::table(&rows);
    println!("\n{table}");
    let out = testkit::bench::results_dir(sizes.name == "full");
    let facts = testkit::bench::machine_table(&speed);
    std::fs::write(
        out.join("chaos.md"),
        format!(
            "# fleetroll fault injection ({} run, seed {seed})\n\nProduced by `make chaos` in {:.0} s.\n\n{table}\n## Machine\n\n{facts}",
            sizes.name,
            started.elapsed().as_secs_f64()
        ),
    )
    .unwrap();
    // Every row is an invariant (kills survived, takeover within the lease, right answers to the fuzzer, ...):
    // break one and the run fails.
    let broken: Vec<&str> = rows.iter().filter(|r| r.met == Some(false)).map(|r| r.metric.as_str()).collect();
    assert!(broken.is_empty(), "invariants broken: {broken:?}");
    eprintln!(
        "chaos ({}): done in {:.0}s; results in {}",
        sizes.name,
        started.elapsed().as_secs_f64(),
        out.display()
    );
}

/// Scenarios named on the command line (`-- plane fuzz`) run alone; none named, all run; `--skip` as libtest.
fn selected(scenario: &str) -> bool {
    testkit::args::Selection::from_env().exact().selects(scenario)
}

/// Creates a rollout as a client would after a control-plane fault: a kube-apiserver that has just
/// restarted refuses FleetRollout writes for up to 30 s while its discovery has not found the
/// FleetRolloutPolicy CRD its guardrails policy takes parameters from ("failed to find resource referenced by
/// paramKind", kubernetes/kubernetes#124237); that refusal is tried again, any other is not.
async fn create(api: &Api<FleetRollout>, fr: &FleetRollout) {
    let what = "the API server to admit FleetRollouts again";
    testkit::poll_until(what, Duration::from_secs(90), || async {
        match api.create(&PostParams::default(), fr).await {
            Ok(_) => true,
            Err(kube::Error::Api(e)) if e.message.contains("failed to configure policy") => false,
            Err(e) => panic!("creating {:?}: {e}", fr.metadata.name),
        }
    })
    .await;
}

fn rollout(name: &str, image: &str, group: &str, batch: usize, soak: &str) -> FleetRollout {
    serde_json::from_value(json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": name},
        "spec": {"image": image, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"group": group}}},
                 "strategy": {"batchSize": batch}, "health": {"soak": soak, "timeout": "10m"}}
    }))
    .unwrap()
}

async fn phases(api: &Api<FleetRollout>) -> Vec<(String, Phase)> {
    api.list(&Default::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .map(|f| {
                    (
                        f.metadata.name.clone().unwrap_or_default(),
                        f.status.as_ref().map(|s| s.phase).unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Waits for every rollout of the namespace to succeed; counts the ones that did not.
async fn settle(api: &Api<FleetRollout>, inv: &mut Invariants) {
    settle_supervised(api, inv, || {}).await
}

/// `settle`, calling `tick` on every poll (to restart an operator that exited, as the kubelet would).
async fn settle_supervised(api: &Api<FleetRollout>, inv: &mut Invariants, mut tick: impl FnMut()) {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        tick();
        let p = phases(api).await;
        if p.iter().all(|(_, ph)| *ph == Phase::Succeeded) {
            inv.rollouts += p.len();
            return;
        }
        if Instant::now() > deadline {
            inv.rollouts += p.len();
            inv.stuck += p.iter().filter(|(_, ph)| *ph != Phase::Succeeded).count();
            eprintln!("stuck: {p:?}");
            return;
        }
        // A poll, not a watch: each round must also see whether the operator process has exited.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Checks generations (exactly once per revision) and in-flight counts from the observer.
fn check(obs: &Observer, expected_generation: i64, batch: usize, inv: &mut Invariants) {
    let state = obs.state.lock().unwrap();
    inv.targets += state.len();
    inv.changed_not_once += state.values().filter(|v| v.generation != expected_generation).count();
    // Every image a rollout rolls carries "chaos" and belongs to that rollout alone, so its in-flight count
    // is the rollout's; the initial image is in flight only while the fleet is created.
    inv.over_in_flight += obs
        .max_in_flight
        .lock()
        .unwrap()
        .iter()
        .filter(|(img, n)| img.contains("chaos") && **n > batch)
        .count();
}

async fn kills(
    client: &Client,
    sizes: &Sizes,
    rng: &mut Rng,
    inv: &mut Invariants,
    namespaces: &mut Vec<String>,
) -> Row {
    let (r, t, batch) = (sizes.kill_rollouts, sizes.kill_targets, 2usize);
    eprintln!("kills: {} SIGKILLs across {r} rollouts of {t} targets", sizes.kills);
    let ns = testkit::create_namespace(client, "chaos-kills", &[]).await;
    namespaces.push(ns.clone());
    testkit::bench::fleet(client, &ns, r * t, 1, t).await;
    let obs = Observer::start(client, vec![ns.clone()]);
    obs.wait("the fleet to be available", LONG, |s| s.len() == r * t && s.values().all(|v| v.rolled_out))
        .await;
    let api: Api<FleetRollout> = Api::namespaced(client.clone(), &ns);
    let identity = ["--identity", "chaos-operator"];
    let mut done = 0;
    let mut revisions = 0i64;
    while done < sizes.kills {
        // A new revision of every rollout: their batches are where the kills land.
        revisions += 1;
        for g in 0..r {
            let image = format!("example.invalid/chaos-g{g}:r{revisions}");
            let fr = rollout(&format!("g{g}"), &image, &format!("g{g}"), batch, "0s");
            let name = format!("g{g}");
            if revisions == 1 {
                create(&api, &fr).await;
            } else {
                api.patch(
                    &name,
                    &Default::default(),
                    &kube::api::Patch::Merge(json!({"spec": {"image": fr.spec.image}})),
                )
                .await
                .unwrap();
            }
        }
        loop {
            if phases(&api).await.iter().all(|(_, p)| *p == Phase::Succeeded)
                && revisions_done(&api, revisions).await
            {
                break;
            }
            if done >= sizes.kills {
                break;
            }
            let point = match rng.below(4) {
                0 => Some(fleetroll::failpoint::AFTER_INTENT),
                1 => Some(fleetroll::failpoint::BETWEEN_PATCHES),
                2 => Some(fleetroll::failpoint::AFTER_APPLY),
                _ => None,
            };
            let mut op = match point {
                // Not always the first hit: later batches and later targets of a batch get their kills too.
                Some(p) => Operator::start(
                    &ns,
                    &identity,
                    &[("FLEETROLL_FAILPOINT", &format!("{p}:{}", 1 + rng.below(3)))],
                ),
                None => Operator::start(&ns, &identity, &[]),
            };
            match point {
                Some(p) => {
                    if !op.wait_for_line(&format!("FAILPOINT {p} reached"), Duration::from_secs(20)).await {
                        continue; // nothing left to reach there: the next iteration sees the rollouts done
                    }
                }
                // A kill at an arbitrary instant: the delay is the point.
                None => tokio::time::sleep(Duration::from_millis(100 + rng.below(900))).await,
            }
            op.kill();
            done += 1;
        }
    }
    let _op = Operator::start(&ns, &identity, &[]);
    settle(&api, inv).await;
    obs.wait("every target on the last image", LONG, |s| {
        s.values().all(|v| v.image.ends_with(&format!(":r{revisions}")) && v.rolled_out)
    })
    .await;
    check(&obs, 1 + revisions, batch, inv);
    row(
        format!("SIGKILLs of the operator across {r} rollouts ({revisions} revisions each)"),
        format!("{done}/{} kills survived", sizes.kills),
        format!("{0}/{0}", sizes.kills),
        Some(done == sizes.kills),
    )
}

async fn revisions_done(api: &Api<FleetRollout>, revision: i64) -> bool {
    api.list(&Default::default()).await.is_ok_and(|l| {
        l.items.iter().all(|f| {
            f.status
                .as_ref()
                .and_then(|s| s.revision.as_ref())
                .is_some_and(|rv| i64::from(rv.number) == revision)
        })
    })
}

async fn leader_kills(
    client: &Client,
    sizes: &Sizes,
    inv: &mut Invariants,
    namespaces: &mut Vec<String>,
) -> Row {
    let rounds = sizes.leader_rounds;
    eprintln!("leader kills: {rounds} rounds, lease 4s");
    let ns = testkit::create_namespace(client, "chaos-leader", &[]).await;
    namespaces.push(ns.clone());
    let n = 4 * (rounds + 1);
    testkit::bench::fleet(client, &ns, n, 1, n).await;
    let obs = Observer::start(client, vec![ns.clone()]);
    obs.wait("the fleet to be available", LONG, |s| s.len() == n && s.values().all(|v| v.rolled_out)).await;
    let api: Api<FleetRollout> = Api::namespaced(client.clone(), &ns);
    let mut leader = Operator::start(&ns, &["--lease-duration", "4s"], &[]);
    assert!(leader.wait_for_line("became the leader", Duration::from_secs(30)).await);
    let mut standby = Operator::start(&ns, &["--lease-duration", "4s"], &[]);
    create(&api, &rollout("lead", "example.invalid/chaos:leader", "g0", 1, "1s")).await;
    let mut takeovers = Vec::new();
    for round in 0..rounds {
        // Mid-batch: wait for batch `round + 1` to start, then kill the leader.
        testkit::wait_for(&api, "lead", "the next batch", LONG, |f| {
            f.status.as_ref().and_then(|s| s.current_batch).is_some_and(|b| b as usize >= round)
        })
        .await;
        leader.kill();
        let killed = Instant::now();
        assert!(
            standby.wait_for_line("became the leader", Duration::from_secs(30)).await,
            "no takeover; see {}",
            standby.log.display()
        );
        takeovers.push(killed.elapsed().as_secs_f64());
        leader = standby;
        standby = Operator::start(&ns, &["--lease-duration", "4s"], &[]);
    }
    settle(&api, inv).await;
    obs.wait("every target on the new image", LONG, |s| {
        s.values().all(|v| v.image.contains("chaos") && v.rolled_out)
    })
    .await;
    check(&obs, 2, 1, inv);
    drop((leader, standby));
    let worst = takeovers.iter().copied().fold(0.0, f64::max);
    row(
        format!("leader killed mid-batch, {rounds} times (lease 4 s): worst takeover"),
        format!("{worst:.1} s"),
        "≤ lease + 2 s = 6 s",
        Some(worst <= 6.0),
    )
}

fn cluster_script() -> String {
    format!("{}/tests/testenv/cluster.sh", env!("CARGO_MANIFEST_DIR"))
}

fn pid_of(component: &str) -> Option<i32> {
    std::fs::read_to_string(format!("{}/target/testenv/pids/{component}.pid", env!("CARGO_MANIFEST_DIR")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

async fn control_plane(
    client: &Client,
    sizes: &Sizes,
    inv: &mut Invariants,
    namespaces: &mut Vec<String>,
) -> Vec<Row> {
    if !testkit::cluster().local {
        return vec![row("control-plane faults", "not run: they need the local control plane", "", None)];
    }
    let mut rows = Vec::new();
    for fault in ["restart kube-apiserver", "restart etcd", "freeze kube-apiserver"] {
        eprintln!("control plane: {fault} mid-rollout");
        let ns = testkit::create_namespace(client, "chaos-plane", &[]).await;
        namespaces.push(ns.clone());
        testkit::bench::fleet(client, &ns, 8, 1, 8).await;
        let obs = Observer::start(client, vec![ns.clone()]);
        obs.wait("the fleet to be available", LONG, |s| s.len() == 8 && s.values().all(|v| v.rolled_out))
            .await;
        let api: Api<FleetRollout> = Api::namespaced(client.clone(), &ns);
        // The production lease (15 s). An operator that loses it exits on purpose, and is restarted here as
        // the kubelet would restart its container.
        let start = || Operator::start(&ns, &["--lease-duration", "15s"], &[]);
        let mut op = start();
        let mut restarts = 0;
        create(&api, &rollout("plane", "example.invalid/chaos:plane", "g0", 2, "2s")).await;
        testkit::wait_for(&api, "plane", "batch 2", LONG, |f| {
            f.status.as_ref().and_then(|s| s.current_batch).is_some_and(|b| b >= 1)
        })
        .await;
        let t0 = Instant::now();
        match fault {
            "freeze kube-apiserver" => {
                let pid = pid_of("kube-apiserver").unwrap();
                let signal = |s: &str| {
                    std::process::Command::new("kill").args([s, &pid.to_string()]).status().unwrap()
                };
                signal("-STOP");
                // The freeze itself is the fault: hold it for its whole length.
                tokio::time::sleep(sizes.freeze).await;
                signal("-CONT");
            }
            other => {
                let component = other.trim_start_matches("restart ");
                let out = std::process::Command::new("bash")
                    .args([&cluster_script(), "restart", component])
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            }
        }
        let outage = t0.elapsed().as_secs_f64();
        settle_supervised(&api, inv, || {
            if !op.is_running() {
                restarts += 1;
                op = start();
            }
        })
        .await;
        obs.wait("every target on the new image", LONG, |s| {
            s.values().all(|v| v.image.contains("chaos") && v.rolled_out)
        })
        .await;
        check(&obs, 2, 2, inv);
        let succeeded = phases(&api).await.iter().all(|(_, p)| *p == Phase::Succeeded);
        drop(op);
        let outcome = match (succeeded, restarts) {
            (false, _) => "did not complete".to_string(),
            (true, 0) => "completed; the operator rode it out".to_string(),
            (true, n) => format!("completed; the operator lost its lease, exited and was restarted {n}×"),
        };
        rows.push(row(format!("{fault} mid-rollout ({outage:.0} s)"), outcome, "completes", Some(succeeded)));
    }
    rows
}

async fn mcp_restart(client: &Client, inv: &mut Invariants, namespaces: &mut Vec<String>) -> Row {
    eprintln!("MCP server killed between rollout_fleet and tasks/get");
    let ns = testkit::create_namespace(client, "chaos-mcp", &[]).await;
    namespaces.push(ns.clone());
    testkit::bench::fleet(client, &ns, 6, 1, 6).await;
    let obs = Observer::start(client, vec![ns.clone()]);
    obs.wait("the fleet to be available", LONG, |s| s.len() == 6 && s.values().all(|v| v.rolled_out)).await;
    let _op = Operator::start(&ns, &[], &[]);
    let mut first = Operator::start_mcp(&ns, &[], &[]);
    first.ready().await;
    let args = json!({"namespace": ns, "image": "example.invalid/chaos:mcp", "strategy": {"batchSize": 2},
        "targets": {"kind": "Deployment", "selector": {"matchLabels": {"group": "g0"}}}});
    let created = drive(&["start", &first.mcp_url(), &args.to_string()]).await;
    let id = created["taskId"].as_str().unwrap().to_string();
    first.kill();
    let second = Operator::start_mcp(&ns, &[], &[]);
    second.ready().await;
    let done = drive(&["wait", &second.mcp_url(), &id]).await;
    let api: Api<FleetRollout> = Api::namespaced(client.clone(), &ns);
    settle(&api, inv).await;
    let name = id.split('/').nth(1).unwrap();
    let phase = api.get(name).await.unwrap().status.unwrap().phase;
    inv.tasks_checked += 1;
    let agree =
        done["status"] == "completed" && phase == Phase::Succeeded && done["result"]["isError"] == false;
    if !agree {
        inv.task_disagreements += 1;
    }
    check(&obs, 2, 2, inv);
    row(
        "MCP server killed between rollout_fleet and tasks/get",
        format!("tasks/get on a new server: {}", done["status"]),
        "answers; completes",
        Some(agree),
    )
}

async fn fuzz(client: &Client, sizes: &Sizes, rng: &mut Rng, namespaces: &mut Vec<String>) -> Row {
    let n = sizes.fuzz;
    eprintln!("fuzz: {n} malformed or hostile MCP requests");
    let ns = testkit::create_namespace(client, "chaos-fuzz", &[]).await;
    namespaces.push(ns.clone());
    let server = Operator::start_mcp(&ns, &[], &[]);
    server.ready().await;
    let url = server.mcp_url();
    let http = reqwest::Client::new();
    let rss_before = testkit::operator::process_usage(server.pid()).0;
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}});
    let mut wrong = Vec::new();
    let mut kinds = std::collections::BTreeMap::<&str, usize>::new();
    for i in 0..n {
        let kind = [
            "broken json",
            "random bytes",
            "huge body",
            "wrong headers",
            "wrong types",
            "unknown method",
            "bad task id",
            "get",
        ][rng.below(8) as usize];
        *kinds.entry(kind).or_default() += 1;
        let base = http
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28");
        let (request, expected): (reqwest::RequestBuilder, &[u16]) = match kind {
            "broken json" => {
                let full =
                    json!({"jsonrpc": "2.0", "id": i, "method": "tools/list", "params": {"_meta": meta}})
                        .to_string();
                let cut = 1 + rng.below(full.len() as u64 - 1) as usize;
                (base.header("mcp-method", "tools/list").body(full[..cut].to_string()), &[400])
            }
            "random bytes" => {
                let bytes: Vec<u8> = (0..1 + rng.below(2048)).map(|_| rng.next_u64() as u8).collect();
                (base.header("mcp-method", "tools/list").body(bytes), &[400])
            }
            "huge body" => {
                (base.header("mcp-method", "tools/list").body(vec![b' '; 2 * 1024 * 1024]), &[413])
            }
            "wrong headers" => {
                let body =
                    json!({"jsonrpc": "2.0", "id": i, "method": "tools/list", "params": {"_meta": meta}});
                (base.header("mcp-method", "tasks/get").body(body.to_string()), &[400])
            }
            "wrong types" => {
                let body = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": 42, "arguments": "x", "_meta": meta}});
                (
                    base.header("mcp-method", "tools/call").header("mcp-name", "42").body(body.to_string()),
                    &[400],
                )
            }
            "unknown method" => {
                let body = json!({"jsonrpc": "2.0", "id": i, "method": format!("x/{}", rng.next_u64()), "params": {"_meta": meta}});
                let method = body["method"].as_str().unwrap().to_string();
                (base.header("mcp-method", method).body(body.to_string()), &[404])
            }
            "bad task id" => {
                let body = json!({"jsonrpc": "2.0", "id": i, "method": "tasks/get", "params": {"taskId": format!("{}", rng.next_u64()),
                    "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                              "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}}});
                let id = body["params"]["taskId"].as_str().unwrap().to_string();
                (base.header("mcp-method", "tasks/get").header("mcp-name", id).body(body.to_string()), &[200])
            }
            _ => (http.get(&url), &[405]),
        };
        match request.send().await {
            Ok(r) if expected.contains(&r.status().as_u16()) => {}
            Ok(r) => wrong.push(format!("{kind}: HTTP {}", r.status())),
            Err(e) => wrong.push(format!("{kind}: {e}")),
        }
    }
    let alive = reqwest::get(format!("http://127.0.0.1:{}/healthz", server.port))
        .await
        .is_ok_and(|r| r.status().is_success());
    let rss_after = testkit::operator::process_usage(server.pid()).0;
    let grown = rss_after.saturating_sub(rss_before) as f64 / (1024.0 * 1024.0);
    if !wrong.is_empty() {
        eprintln!("unexpected answers (first 10): {:?}", &wrong[..wrong.len().min(10)]);
    }
    let ok = wrong.is_empty() && alive && grown < 64.0;
    row(
        format!(
            "MCP fuzzing: {n} malformed or hostile requests ({})",
            kinds.iter().map(|(k, v)| format!("{v} {k}")).collect::<Vec<_>>().join(", ")
        ),
        format!("{} with the wrong answer; server up: {alive}; peak memory grew {grown:.1} MiB", wrong.len()),
        "all right; up; bounded",
        Some(ok),
    )
}

/// Logs of earlier runs would be counted by `panics_in_logs`.
fn clear_old_logs() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-logs");
    for e in std::fs::read_dir(dir).into_iter().flatten().filter_map(Result::ok) {
        if e.file_name().to_string_lossy().starts_with("chaos-") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Lines that say a process panicked, in the logs of every operator and MCP server this run started.
fn panics_in_logs() -> usize {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-logs");
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("chaos-"))
                .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default().matches("panicked at").count())
                .sum()
        })
        .unwrap_or(0)
}
