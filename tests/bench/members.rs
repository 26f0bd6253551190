//! Member clusters: a rollout across the two members of the test environment (through an Argo CD and a
//! Cluster API Secret) against a bare client patching the same targets on both, batch by batch in the same
//! order, side by side; then the operator's memory with 10,000 targets spread over the hub (registered as
//! a member too, as Argo CD registers its own cluster) and the two members.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use fleetroll::api::{FleetRollout, OPT_IN_LABEL, OPT_IN_VALUE};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::{LONG, Report, Sizes, batch_spans, row, transitions_of, wait_succeeded};
use testkit::{
    bench::Observer,
    members::{Member, member, service_account_token, write_argo_secret, write_capi_secret},
    operator::Operator,
};

/// A cluster of the scenario: its name, an admin client, and the namespace of its targets.
struct Site {
    name: String,
    client: Client,
    ns: String,
}

/// Registers the hub as a member of its own fleet namespace (an Argo CD Secret with a token of a hub
/// ServiceAccount of the bench's own, bound to the test environment's member ClusterRole), as Argo CD
/// registers its own cluster. Only the ClusterRole of member-rbac.yaml is applied to the hub: its
/// ServiceAccount is the members' alone (tests/it/members_env.rs checks the hub has none).
async fn hub_as_member(hub: &Client, fleet_ns: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testenv/member-rbac.yaml");
    let all = std::fs::read_to_string(path).unwrap();
    let role = all.split("\n---").find(|doc| doc.contains("\nkind: ClusterRole\n")).unwrap().to_string();
    let role_file = std::env::temp_dir().join(format!("{fleet_ns}-member-role.yaml"));
    std::fs::write(&role_file, role).unwrap();
    testkit::cli::kubectl(&["apply", "--server-side", "-f", &role_file.to_string_lossy()]).await.ok();
    let dir = testkit::testenv_dir();
    let port = std::fs::read_to_string(dir.join("ports/apiserver")).unwrap();
    let hub_member = Member { name: "hub".into(), dir, server: format!("https://127.0.0.1:{}", port.trim()) };
    let token = service_account_token(hub, fleet_ns, "hub-member").await;
    write_argo_secret(hub, fleet_ns, &hub_member, &token, &[("env", "hub")]).await;
}

/// An opted-in namespace labelled `team=<ns>` with `n` Deployments in a cluster.
async fn site(name: &str, client: Client, ns: &str, n: usize, replicas: i32) -> Site {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let body = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns, "labels": {"team": ns, OPT_IN_LABEL: OPT_IN_VALUE}}});
    namespaces.patch(ns, &PatchParams::apply("bench").force(), &Patch::Apply(&body)).await.unwrap();
    testkit::bench::fleet(&client, ns, n, replicas, n).await;
    Site { name: name.into(), client, ns: ns.into() }
}

async fn members(fleet_ns: &str, hub: &Client, team: &str, n: usize, replicas: i32) -> Vec<Site> {
    let mut sites = Vec::new();
    for name in ["member-1", "member-2"] {
        let m = member(name);
        let admin = m.admin_client().await;
        let token = service_account_token(&admin, "fleetroll-system", "fleetroll").await;
        match name {
            "member-1" => write_argo_secret(hub, fleet_ns, &m, &token, &[("env", "canary")]).await,
            _ => write_capi_secret(hub, fleet_ns, &m, &token, &[("env", "prod")]).await,
        };
        sites.push(site(name, admin, team, n, replicas).await);
    }
    sites
}

fn spec(image: &str, team: &str, batch: usize) -> FleetRollout {
    serde_json::from_value(json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": "across"},
        "spec": {
            "image": image,
            "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "bench"}},
                "namespaceSelector": {"matchLabels": {"team": team}},
                "clusters": {"selector": {"matchExpressions": [{"key": "env", "operator": "Exists"}]}}},
            "strategy": {"batchSize": batch, "waves": [
                {"name": "canary", "clusterSelector": {"matchLabels": {"env": "canary"}}},
                {"name": "prod", "clusterSelector": {"matchLabels": {"env": "prod"}}}]},
            "health": {"timeout": "30m"},
        }
    }))
    .unwrap()
}

pub async fn overhead(client: &Client, sizes: &Sizes, report: &mut Report, namespaces: &mut Vec<String>) {
    let (n, b) = (sizes.members_targets, sizes.members_batch);
    if testkit::members::members().len() < 2 {
        eprintln!("members: skipped, the test environment has no member clusters (make cluster MEMBERS=2)");
        return;
    }
    eprintln!("members: {n} Deployments in each of 2 members, batch {b}, fleetroll and a bare client");
    let fleet_ns = testkit::create_namespace(client, "bench-members", &[]).await;
    namespaces.push(fleet_ns.clone());
    let team = fleet_ns.clone();
    let sites = members(&fleet_ns, client, &team, n, 1).await;
    let observers: Vec<Observer> =
        sites.iter().map(|s| Observer::start(&s.client, vec![s.ns.clone()])).collect();
    let mut keys: Vec<String> = (0..n).map(|i| format!("{team}/t-{i:05}")).collect();
    keys.sort();
    for obs in &observers {
        obs.wait("the fleet to be available", LONG, |s| s.len() == n && s.values().all(|v| v.rolled_out))
            .await;
    }
    let op = Operator::start(&fleet_ns, &["--lease-duration", "15s"], &[]);
    // The process's start is not the rollout's cost: the bare client below is built before its clock too.
    assert!(
        op.wait_for_line("became the leader", Duration::from_secs(60)).await,
        "members: the operator did not lead"
    );
    let api: Api<FleetRollout> = Api::namespaced(client.clone(), &fleet_ns);
    let image = "example.invalid/bench:members";
    let mut before = Vec::new();
    for s in &sites {
        before.push(testkit::bench::apiserver_requests(&s.client).await);
    }
    let t0 = Instant::now();
    api.create(&PostParams::default(), &spec(image, &team, b)).await.unwrap();
    wait_succeeded(&api, "across").await;
    let fleetroll = t0.elapsed().as_secs_f64();
    for obs in &observers {
        obs.wait("every target on the new image", LONG, |s| testkit::bench::all_on(s, &keys, image)).await;
    }
    let fleetroll_time = TimeSpent::of(&observers, &keys, b, image, t0, fleetroll);
    drop(op);
    // Inside the members, the rollout's own requests: Deployment reads (a watch cache spares them) and
    // writes (server-side apply), per target.
    let (mut reads, mut writes) = (0.0, 0.0);
    for (s, before) in sites.iter().zip(&before) {
        let after = testkit::bench::apiserver_requests(&s.client).await;
        reads += testkit::bench::delta(before, &after, "GET", "deployments", "");
        writes += testkit::bench::delta(before, &after, "APPLY", "deployments", "")
            + testkit::bench::delta(before, &after, "PATCH", "deployments", "");
    }
    let per_target = |v: f64| v / (2 * n) as f64;
    // The floor: the same batches in the same order (member-1's, then member-2's), no checkpoints.
    let image = "example.invalid/bench:members-bare";
    let t0 = Instant::now();
    for (site, obs) in sites.iter().zip(&observers) {
        for batch in keys.chunks(b) {
            testkit::bench::patch_images(&site.client, batch, image, 16).await;
            obs.wait("the batch to roll out", LONG, |s| testkit::bench::all_on(s, batch, image)).await;
        }
    }
    let bare = t0.elapsed().as_secs_f64();
    let bare_time = TimeSpent::of(&observers, &keys, b, image, t0, bare);
    for (site, obs) in sites.iter().zip(&observers) {
        let twice = obs.state.lock().unwrap().values().filter(|v| v.generation != 3).count();
        assert_eq!(twice, 0, "members: targets of {} not changed exactly once per run", site.name);
    }
    let ratio = fleetroll / bare;
    report.rows.push(row(
        format!("members: 2-member rollout / bare client on both ({n} Deployments each, batch {b}, 2 waves)"),
        format!("{ratio:.3} ({fleetroll:.1} s vs {bare:.1} s)"),
        "≤ 1.10",
        Some(ratio <= 1.10),
    ));
    report.rows.push(row(
        "members: requests per target inside the members: Deployment reads / writes",
        format!("{:.2} / {:.2}", per_target(reads), per_target(writes)),
        "writes 1",
        Some((per_target(writes) - 1.0).abs() < 1e-9),
    ));
    report.rows.push(row(
        "members: where the time goes, fleetroll / bare client: before the first change, inside batches, \
         between batches (p50, max), after the last target rolled out",
        format!("{fleetroll_time} / {bare_time}"),
        "",
        None,
    ));
    tidy(&sites).await;
}

/// A run's time in parts, seconds, from the Deployments' watch: the batches are member-1's then member-2's.
struct TimeSpent {
    before: f64,
    inside: f64,
    between: Vec<f64>,
    after: f64,
}

impl TimeSpent {
    fn of(observers: &[Observer], keys: &[String], b: usize, image: &str, t0: Instant, total: f64) -> Self {
        let batches: Vec<Vec<String>> = keys.chunks(b).map(<[String]>::to_vec).collect();
        let spans: Vec<(f64, f64)> =
            observers.iter().flat_map(|obs| batch_spans(obs, &batches, image, t0)).collect();
        let mut between = transitions_of(&spans);
        between.sort_by(f64::total_cmp);
        Self {
            before: spans.first().map_or(0.0, |s| s.0),
            inside: spans.iter().map(|(start, end)| end - start).sum(),
            between,
            after: total - spans.last().map_or(total, |s| s.1),
        }
    }
}

impl std::fmt::Display for TimeSpent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p50 = testkit::bench::percentile(&self.between, 50.0);
        let max = self.between.last().copied().unwrap_or(0.0);
        write!(
            f,
            "{:.2} s, {:.2} s, {:.0} / {:.0} ms, {:.2} s",
            self.before,
            self.inside,
            p50 * 1e3,
            max * 1e3,
            self.after
        )
    }
}

pub async fn scale(client: &Client, sizes: &Sizes, report: &mut Report, namespaces: &mut Vec<String>) {
    let total = sizes.members_scale_targets;
    if testkit::members::members().len() < 2 {
        return;
    }
    let per = total / 3;
    eprintln!("members: {total} Deployments (0 replicas) over the hub and 2 members, one rollout");
    let fleet_ns = testkit::create_namespace(client, "bench-members-scale", &[]).await;
    namespaces.push(fleet_ns.clone());
    let team = fleet_ns.clone();
    let mut sites = members(&fleet_ns, client, &team, per, 0).await;
    hub_as_member(client, &fleet_ns).await;
    sites.push(site("hub", client.clone(), &team, total - 2 * per, 0).await);
    let op = Operator::start(&fleet_ns, &[], &[]);
    let api: Api<FleetRollout> = Api::namespaced(client.clone(), &fleet_ns);
    let mut fr = spec("example.invalid/bench:members-scale", &team, 0);
    fr.spec.strategy.batch_size =
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("10%".into());
    let t0 = Instant::now();
    api.create(&PostParams::default(), &fr).await.unwrap();
    let done = wait_succeeded(&api, "across").await;
    let took = t0.elapsed().as_secs_f64();
    let (rss, cpu) = testkit::operator::process_usage(op.pid());
    drop(op);
    let status_bytes = serde_json::to_vec(&done.status).unwrap().len();
    let mib = rss as f64 / (1024.0 * 1024.0);
    let updated = done.status.as_ref().map_or(0, |s| s.counts.updated);
    assert_eq!(updated as usize, total, "members: every target updated");
    report.rows.push(row(
        format!("members: one rollout of {total} Deployments over the hub and 2 members (batch 10%)"),
        format!(
            "{took:.1} s, operator peak RSS {mib:.1} MiB, {cpu:.1} CPU s, status {:.1} KiB",
            status_bytes as f64 / 1024.0
        ),
        "RSS ≤ 150 MiB",
        Some(mib <= 150.0),
    ));
    sites.pop();
    tidy(&sites).await;
}

async fn tidy(sites: &[Site]) {
    for s in sites {
        let namespaces: Api<Namespace> = Api::all(s.client.clone());
        let _ = namespaces.delete(&s.ns, &Default::default()).await;
    }
}
