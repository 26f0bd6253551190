//! Attacks the operator itself must contain: what it reads back from the cluster (plans), what it is asked
//! to touch (itself, protected namespaces, namespaces that opted out, targets another rollout holds), where
//! it is asked to send requests (health checks, analysis backends), and what fails under it (a denied
//! change, a panic). Each runs an operator of its own on namespaces of its own.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use fleetroll::api::{OPT_IN_LABEL, OPT_IN_VALUE};
use k8s_openapi::api::{
    admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
    apps::v1::{DaemonSet, Deployment},
    core::v1::ConfigMap,
};
use testkit::fleet::{FLEET_LABEL, NEXT_IMAGE, image_of, phase};

use super::*;

/// How long an operator gets to reach a verdict.
const VERDICT: Duration = Duration::from_secs(120);

/// A fleet of `n` ready Deployments `web-00..` (label `fleet=web`) in a namespace of its own.
async fn fleet_of(env: &Env, prefix: &str, n: usize) -> Fleet {
    let ns = env.scratch_namespace(prefix, &[]).await;
    let fleet = Fleet { client: env.admin.clone(), ns: ns.clone(), tenants: vec![] };
    fleet.deployments(&ns, n, READY_IMAGE).await;
    fleet
}

/// The image of each Deployment labelled `fleet=web` in `ns`, by name.
async fn images(env: &Env, ns: &str) -> Vec<(String, String)> {
    let list = Api::<Deployment>::namespaced(env.admin.clone(), ns)
        .list(&kube::api::ListParams::default().labels("fleet=web"))
        .await
        .unwrap();
    list.items.iter().map(|d| (d.name_any(), image_of(d))).collect()
}

/// Whether every Deployment of `ns` still runs the image it started with.
async fn untouched(env: &Env, ns: &str) -> bool {
    images(env, ns).await.iter().all(|(_, image)| image == READY_IMAGE)
}

/// `Phase/Reason: message` of a rollout, for the table.
pub(super) fn state(fr: &FleetRollout) -> String {
    let s = fr.status.clone().unwrap_or_default();
    format!("{}/{}: {}", s.phase, s.reason.unwrap_or_default(), s.message.unwrap_or_default())
}

fn reason(fr: &FleetRollout) -> Option<String> {
    fr.status.as_ref().and_then(|s| s.reason.clone())
}

pub(super) fn refusals(fr: &FleetRollout, reason: &str) -> usize {
    fr.status.as_ref().map_or(0, |s| s.failures.iter().filter(|f| f.reason == reason).count())
}

/// Whether the operator still runs and serves (`/readyz`).
pub(super) async fn serving(op: &mut Operator) -> bool {
    let url = format!("http://127.0.0.1:{}/readyz", op.port);
    op.is_running() && reqwest::get(&url).await.is_ok_and(|r| r.status().is_success())
}

fn edit() -> [Grant; 1] {
    [Grant::cluster_role("edit")]
}

/// A plan entry as the operator stores it in a shard (the format is the attacker's to read).
fn shard_entry(batch: u32, ns: &str, name: &str) -> Value {
    json!({"batch": batch, "namespace": ns, "name": name, "previousImage": READY_IMAGE})
}

// ---------------------------------------------------------------------------------------------------------

pub(super) async fn tenant_replaces_a_frozen_plan(env: &'static Env) -> Row {
    let fleet = fleet_of(env, "sec-plan", 2).await;
    let victim = fleet_of(env, "sec-plan-victim", 1).await;
    let dev = Tenant::create(&env.admin, &fleet.ns, "dev", &edit()).await;
    let large_plans = ["--plan-inline-max-bytes", "0"];
    let op = Operator::start(&fleet.ns, &large_plans, &[]);
    let spec = json!({"image": NEXT_IMAGE, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
        "strategy": {"batchSize": 1, "approval": "FirstBatch"}});
    create_as(&dev, &fleet.ns, "r", spec).await.ok();
    let fr = fleet
        .wait_rollout("r", "the plan to be frozen", VERDICT, |f| phase(f) == Phase::WaitingForApproval)
        .await;
    let shard = fr.status.as_ref().and_then(|s| s.plan.as_ref()).map(|p| p.shards[0].clone()).unwrap();

    // As the tenant: replace the shard (an ordinary ConfigMap in its namespace) with one naming a workload
    // in a namespace that never opted in, then have the operator restart (its cache gone); a person (the
    // tenant may not approve its own rollout) approves.
    let forged = json!([shard_entry(0, &victim.ns, "web-00"), shard_entry(1, &fleet.ns, "web-01")]);
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": shard, "namespace": fleet.ns},
        "data": {"plan.json": forged.to_string()}});
    dev.kubectl(&["delete", "configmap", &shard, "-n", &fleet.ns]).await.ok();
    dev.kubectl(&["create", "-f", &file(&format!("{}-forged", fleet.ns), &cm)]).await.ok();
    drop(op);
    let mut op = Operator::start(&fleet.ns, &large_plans, &[]);
    testkit::cli::kubectl(&["fleetroll", "approve", "r", "-n", &fleet.ns]).await.ok();

    let fr = fleet
        .wait_rollout("r", "the forged plan to be refused", VERDICT, |f| {
            reason(f).as_deref() == Some("PlanTampered")
        })
        .await;
    let (victim_safe, own_safe) = (untouched(env, &victim.ns).await, untouched(env, &fleet.ns).await);
    let alive = serving(&mut op).await;
    Row {
        attack: "replaces a frozen plan's ConfigMap with one naming a workload elsewhere, restarts the operator; a person approves".into(),
        who: format!("{} (edit in its namespace)", short_user(&dev)),
        expected: "the plan is refused (PlanTampered); nothing changes".into(),
        outcome: format!("{}; victim untouched: {victim_safe}; own Deployments untouched: {own_safe}; operator serving: {alive}", state(&fr)),
        contained: victim_safe && own_safe && alive,
    }
}

pub(super) async fn tenant_preplants_a_plan(env: &'static Env) -> Row {
    let fleet = fleet_of(env, "sec-preplant", 2).await;
    let victim = fleet_of(env, "sec-preplant-victim", 1).await;
    let dev = Tenant::create(&env.admin, &fleet.ns, "dev", &edit()).await;
    let mut op = Operator::start(&fleet.ns, &["--plan-inline-max-bytes", "0"], &[]);
    let spec = json!({"image": NEXT_IMAGE, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
        "strategy": {"batchSize": 1}});
    // The plan is deterministic: the tenant computes its hash (and so its shard's name) as the operator will.
    let mut fr: FleetRollout = serde_json::from_value(json!({"apiVersion": "fleetroll.dev/v1alpha1",
        "kind": "FleetRollout", "metadata": {"name": "r", "namespace": fleet.ns}, "spec": spec.clone()}))
    .unwrap();
    fr.metadata.namespace = Some(fleet.ns.clone());
    let exec = fleetroll::mcp::ExecPolicy::never("is not run: no member here");
    let plan =
        fleetroll::edge::discovery::preview(&dev.client, &fleet.ns, &fr, exec).await.unwrap().unwrap().plan;
    let shard = format!("r-plan-{}-0", plan.hash);
    let planted = json!([shard_entry(0, &victim.ns, "web-00"), shard_entry(1, &fleet.ns, "web-01")]);
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": shard, "namespace": fleet.ns},
        "data": {"plan.json": planted.to_string()}});
    dev.kubectl(&["create", "-f", &file(&format!("{}-planted", fleet.ns), &cm)]).await.ok();
    create_as(&dev, &fleet.ns, "r", spec).await.ok();

    let fr = fleet
        .wait_rollout("r", "the planted plan to be refused", VERDICT, |f| {
            reason(f).as_deref() == Some("PlanTampered")
        })
        .await;
    let kept: ConfigMap = Api::namespaced(env.admin.clone(), &fleet.ns).get(&shard).await.unwrap();
    let (victim_safe, own_safe) = (untouched(env, &victim.ns).await, untouched(env, &fleet.ns).await);
    let alive = serving(&mut op).await;
    let never_read = fr.status.as_ref().is_some_and(|s| s.current_batch.is_none());
    Row {
        attack: "plants a ConfigMap under the name the plan's shard will have, naming a workload elsewhere"
            .into(),
        who: format!("{} (edit in its namespace)", short_user(&dev)),
        expected: "the clash is read back and refused (PlanTampered); nothing changes".into(),
        outcome: format!(
            "{}; planted shard left as it was ({} bytes); victim untouched: {victim_safe}; own untouched: {own_safe}; operator serving: {alive}",
            state(&fr),
            kept.data.unwrap_or_default().get("plan.json").map_or(0, String::len)
        ),
        contained: victim_safe && own_safe && alive && never_read,
    }
}

pub(super) async fn rollout_aims_at_the_operator(env: &'static Env) -> Row {
    let ns = env.scratch_namespace("sec-self", &[]).await;
    let fleet = Fleet { client: env.admin.clone(), ns: ns.clone(), tenants: vec![] };
    // The operator's own Deployment, by the name the chart tells it (--self-workload).
    let api: Api<Deployment> = Api::namespaced(env.admin.clone(), &ns);
    api.create(
        &PostParams::default(),
        &testkit::fleet::deployment("fleetroll", READY_IMAGE, &[("fleet", "web")]),
    )
    .await
    .unwrap();
    let mut op = Operator::start(&ns, &["--self-workload", &format!("Deployment/{ns}/fleetroll")], &[]);
    fleet
        .rollout(
            "takeover",
            json!({"image": "registry.example/evil:latest",
            "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}}}),
        )
        .await;
    let fr = fleet
        .wait_rollout("takeover", "the rollout to be refused", VERDICT, |f| {
            reason(f).as_deref() == Some("TargetProtected")
        })
        .await;
    let safe = untouched(env, &ns).await;
    let alive = serving(&mut op).await;
    Row {
        attack: "rolls the operator's own Deployment to an image of its choosing".into(),
        who: "the cluster admin (anyone who may create FleetRollouts in the operator's namespace)".into(),
        expected: "refused (TargetProtected); the operator's image unchanged".into(),
        outcome: format!(
            "{}; operator's Deployment untouched: {safe}; operator serving: {alive}",
            state(&fr)
        ),
        contained: safe && alive,
    }
}

pub(super) async fn rollout_reaches_a_protected_namespace(env: &'static Env) -> Row {
    let fleet_ns = env.scratch_namespace("sec-prot-fleet", &[]).await;
    let labels = [(OPT_IN_LABEL, OPT_IN_VALUE), (FLEET_LABEL, fleet_ns.as_str())];
    let (open, protected) = (
        env.scratch_namespace("sec-prot-a", &labels).await,
        env.scratch_namespace("sec-prot-p", &labels).await,
    );
    let fleet = Fleet {
        client: env.admin.clone(),
        ns: fleet_ns.clone(),
        tenants: vec![open.clone(), protected.clone()],
    };
    fleet.tenant_deployments(2).await;
    // kube-system is protected by default; the test protects a namespace of its own the same way.
    let mut op =
        Operator::start(&fleet_ns, &["--protected-namespaces", &format!("kube-system,{protected}")], &[]);
    fleet
        .rollout(
            "everywhere",
            json!({"image": NEXT_IMAGE, "strategy": {"batchSize": 2},
            "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}},
                "namespaceSelector": {"matchLabels": {FLEET_LABEL: fleet_ns}}}}),
        )
        .await;
    let fr =
        fleet.wait_rollout("everywhere", "the rollout to finish", VERDICT, |f| phase(f).is_terminal()).await;
    let rolled = images(env, &open).await.iter().all(|(_, i)| i == NEXT_IMAGE);
    let safe = untouched(env, &protected).await;
    let alive = serving(&mut op).await;
    let refused = refusals(&fr, "TargetProtected");
    Row {
        attack: "rolls across opted-in namespaces, one of them protected (as kube-system is by default)"
            .into(),
        who: "a fleet admin".into(),
        expected: "the protected namespace's targets refused (TargetProtected), the others rolled".into(),
        outcome: format!(
            "{}; {refused} refused; protected untouched: {safe}; the other rolled: {rolled}",
            state(&fr)
        ),
        contained: safe && rolled && refused == 2 && alive,
    }
}

pub(super) async fn namespace_opts_out_mid_rollout(env: &'static Env) -> Row {
    let fleet_ns = env.scratch_namespace("sec-optout-fleet", &[]).await;
    let labels = [(OPT_IN_LABEL, OPT_IN_VALUE), (FLEET_LABEL, fleet_ns.as_str())];
    let (stays, leaves) = (
        env.scratch_namespace("sec-optout-a", &labels).await,
        env.scratch_namespace("sec-optout-b", &labels).await,
    );
    let fleet = Fleet {
        client: env.admin.clone(),
        ns: fleet_ns.clone(),
        tenants: vec![stays.clone(), leaves.clone()],
    };
    fleet.tenant_deployments(2).await;
    let mut op = Operator::start(&fleet_ns, &[], &[]);
    fleet
        .rollout(
            "fleet",
            json!({"image": NEXT_IMAGE, "strategy": {"batchSize": 2, "approval": "FirstBatch"},
            "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}},
                "namespaceSelector": {"matchLabels": {FLEET_LABEL: fleet_ns}}}}),
        )
        .await;
    let fr = fleet
        .wait_rollout("fleet", "the plan to be frozen", VERDICT, |f| phase(f) == Phase::WaitingForApproval)
        .await;
    // Planned over both; now the second namespace's owner withdraws consent, before its batch comes.
    let label = json!({"metadata": {"labels": {OPT_IN_LABEL: null}}});
    Api::<Namespace>::all(env.admin.clone())
        .patch(&leaves, &PatchParams::default(), &Patch::Merge(label))
        .await
        .unwrap();
    let hash = fr.status.and_then(|s| s.plan).map(|p| p.hash).unwrap();
    {
        fleet.approve("fleet", &[0], &hash).await;
    }
    let fr = fleet.wait_rollout("fleet", "the rollout to finish", VERDICT, |f| phase(f).is_terminal()).await;
    let rolled = images(env, &stays).await.iter().all(|(_, i)| i == NEXT_IMAGE);
    let safe = untouched(env, &leaves).await;
    let refused = refusals(&fr, "NamespaceNotOptedIn");
    let alive = serving(&mut op).await;
    Row {
        attack: "a namespace's owner removes the opt-in label after the plan was frozen".into(),
        who: "the namespace owner (withdrawing consent)".into(),
        expected: "its targets refused at their batch (NamespaceNotOptedIn), never changed".into(),
        outcome: format!(
            "{}; {refused} refused; opted-out namespace untouched: {safe}; the other rolled: {rolled}",
            state(&fr)
        ),
        contained: safe && rolled && refused == 2 && alive,
    }
}

pub(super) async fn two_rollouts_take_one_target(env: &'static Env) -> Row {
    let fleet = fleet_of(env, "sec-overlap", 1).await;
    let dev = Tenant::create(&env.admin, &fleet.ns, "dev", &edit()).await;
    let mut op = Operator::start(&fleet.ns, &[], &[]);
    let targets = json!({"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}});
    // The first holds web-00: changed, and soaking for an hour.
    create_as(
        &dev,
        &fleet.ns,
        "first",
        json!({"image": NEXT_IMAGE, "targets": targets, "health": {"soak": "1h"}}),
    )
    .await
    .ok();
    fleet
        .wait_rollout("first", "the first to change its target", VERDICT, |f| {
            f.status.as_ref().is_some_and(|s| s.counts.updated == 1)
        })
        .await;
    create_as(&dev, &fleet.ns, "second", json!({"image": "registry.k8s.io/pause:3.8", "targets": targets}))
        .await
        .ok();
    let second =
        fleet.wait_rollout("second", "the second to finish", VERDICT, |f| phase(f).is_terminal()).await;
    let first = fleet.rollouts().get("first").await.unwrap();
    let kept = images(env, &fleet.ns).await.iter().all(|(_, i)| i == NEXT_IMAGE);
    let refused = refusals(&second, "TargetHeldByAnotherRollout");
    let alive = serving(&mut op).await;
    Row {
        attack: "a second rollout selects a target the first is still rolling".into(),
        who: format!("{} (edit in its namespace)", short_user(&dev)),
        expected: "the second refuses it (TargetHeldByAnotherRollout) and finishes; the first keeps it"
            .into(),
        outcome: format!(
            "second {}; {refused} refused; first {}; target still on the first's image: {kept}",
            state(&second),
            state(&first)
        ),
        contained: kept && refused == 1 && phase(&first) == Phase::Progressing && alive,
    }
}

pub(super) async fn node_rollouts_fight_over_a_daemonset(env: &'static Env) -> Row {
    let ns = env.scratch_namespace("sec-ds", &[]).await;
    let fleet = Fleet { client: env.admin.clone(), ns: ns.clone(), tenants: vec![] };
    let outcome = Arc::new(std::sync::Mutex::new(None));
    let (client, pool, found) = (env.admin.clone(), ns.clone(), outcome.clone());
    testkit::nodes::with_pool(client.clone(), pool.clone(), 2, |_| async move {
        testkit::nodes::daemonset(&client, &ns, &pool, READY_IMAGE, 2).await;
        let mut op = Operator::start(&ns, &[], &[]);
        let spec = json!({"image": NEXT_IMAGE, "strategy": {"batchSize": 1, "approval": "EveryBatch"},
            "targets": {"kind": "Node", "daemonSet": testkit::nodes::DAEMONSET,
                "nodeSelector": {"matchLabels": {testkit::nodes::POOL_LABEL: pool}}}});
        fleet.rollout("first", spec.clone()).await;
        let fr =
            fleet.wait_rollout("first", "approval", VERDICT, |f| phase(f) == Phase::WaitingForApproval).await;
        let first_uid = fr.uid().unwrap();
        let hash = fr.status.and_then(|s| s.plan).map(|p| p.hash).unwrap();
        {
            fleet.approve("first", &[0], &hash).await;
        }
        // Batch 1 done, batch 2 awaited: the first holds the DaemonSet (OnDelete, its strategy saved).
        fleet
            .wait_rollout("first", "batch 2 to wait", VERDICT, |f| {
                f.status.as_ref().is_some_and(|s| s.pending_approval.as_ref().is_some_and(|p| p.batch == 1))
            })
            .await;
        fleet.rollout("second", spec).await;
        let second = fleet
            .wait_rollout("second", "the second to be refused", VERDICT, |f| {
                reason(f).as_deref() == Some("TargetHeldByAnotherRollout")
            })
            .await;
        // Deleting it hands the DaemonSet back, a change to the DaemonSet: a user who may only delete
        // FleetRollouts may not.
        let deleter_rights =
            [Grant::rules(vec![rule("fleetroll.dev", &["fleetrollouts"], &["get", "delete"])])];
        let deleter = Tenant::create(&client, &ns, "deleter", &deleter_rights).await;
        let refused = deleter.kubectl(&["delete", "fleetrollout", "first", "-n", &ns, "--wait=false"]).await;
        let delete_denied = refused.code != 0 && refused.stderr.contains("may not update daemonsets");
        // Deleting the first (unfinished) hands the DaemonSet back as it was before it, template and
        // strategy, before the rollout goes (its finalizer): never the new image on every node at once.
        fleet.rollouts().delete("first", &DeleteParams::default()).await.unwrap();
        let dss: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
        let released = testkit::wait_for(
            &dss,
            testkit::nodes::DAEMONSET,
            "the DaemonSet to be handed back",
            VERDICT,
            |ds| !ds.annotations().contains_key("fleetroll.dev/saved-update-strategy"),
        )
        .await;
        let strategy = released.spec.update_strategy.clone().and_then(|s| s.type_).unwrap_or_default();
        let template_image = testkit::fleet::template_image(&released.spec.template);
        let gone = fleet.wait_deleted("first", &first_uid, VERDICT).await;
        let alive = serving(&mut op).await;
        // The second may plan now and hold the DaemonSet in turn: let the operator release it before it goes.
        let second_uid = second.uid().unwrap();
        fleet.rollouts().delete("second", &DeleteParams::default()).await.unwrap();
        fleet.wait_deleted("second", &second_uid, VERDICT).await;
        *found.lock().unwrap() = Some((state(&second), delete_denied, strategy, template_image, gone, alive));
    })
    .await;
    let (second, delete_denied, strategy, template_image, gone, alive) =
        outcome.lock().unwrap().take().unwrap();
    Row {
        attack: "a second node rollout takes a DaemonSet the first holds; a delete-only user, then an admin, deletes the first mid-rollout".into(),
        who: "the cluster admin; a user who may only delete FleetRollouts".into(),
        expected: "the second refused (TargetHeldByAnotherRollout); the delete-only user denied; the admin's deletion hands the DaemonSet back as it was".into(),
        outcome: format!(
            "second {second}; delete-only user denied: {delete_denied}; after the admin's deletion: \
             updateStrategy {strategy}, template image {template_image}, rollout gone: {gone}"
        ),
        contained: second.contains("TargetHeldByAnotherRollout")
            && delete_denied
            && strategy == "RollingUpdate"
            && template_image == READY_IMAGE
            && gone
            && alive,
    }
}

/// An HTTP listener on loopback that answers `status` (with `location`, if any) and counts requests.
async fn listener(status: u16, location: Option<String>) -> (u16, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let app = axum::Router::new().fallback(move || {
        let (counted, location) = (counted.clone(), location.clone());
        async move {
            counted.fetch_add(1, Ordering::Relaxed);
            let mut response = axum::http::Response::builder().status(status);
            if let Some(l) = location {
                response = response.header("location", l);
            }
            response.body(axum::body::Body::empty()).unwrap()
        }
    });
    let socket = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = socket.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(socket, app).await });
    (port, hits)
}

/// A tenant's rollout whose health check points at `url`; the operator allows `allow` (if any).
async fn health_check_attack(
    env: &'static Env,
    prefix: &str,
    url: &str,
    allow: &[&str],
) -> (Fleet, Operator, Tenant) {
    let fleet = fleet_of(env, prefix, 1).await;
    let dev = Tenant::create(&env.admin, &fleet.ns, "dev", &edit()).await;
    let op = Operator::start(&fleet.ns, allow, &[]);
    // 30 s: a check that is refused or fails must be seen failing for that reason, not because the target
    // was slow to become ready beside 70 attacks at once (then no check runs and the failure says so).
    let spec = json!({"image": NEXT_IMAGE, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
        "health": {"timeout": "30s", "http": {"url": url}}});
    create_as(&dev, &fleet.ns, "probe", spec).await.ok();
    (fleet, op, dev)
}

pub(super) async fn health_check_aims_at_loopback(env: &'static Env) -> Row {
    let (port, hits) = listener(200, None).await;
    let url = format!("http://127.0.0.1:{port}/{{namespace}}/{{name}}");
    let (fleet, mut op, dev) = health_check_attack(env, "sec-loopback", &url, &[]).await;
    let fr = fleet
        .wait_rollout("probe", "the check to be refused", VERDICT, |f| {
            reason(f).as_deref() == Some("HttpCheckRefused")
        })
        .await;
    let safe = untouched(env, &fleet.ns).await;
    let requests = hits.load(Ordering::Relaxed);
    let alive = serving(&mut op).await;
    Row {
        attack: "a health check aimed at a service on the operator's loopback".into(),
        who: format!("{} (edit in its namespace)", short_user(&dev)),
        expected: "refused before anything changes (HttpCheckRefused); no request sent".into(),
        outcome: format!("{}; requests received: {requests}; targets untouched: {safe}", state(&fr)),
        contained: safe && requests == 0 && alive,
    }
}

pub(super) async fn health_check_names_a_host_that_resolves_to_loopback(env: &'static Env) -> Row {
    let (port, hits) = listener(200, None).await;
    let url = format!("http://localhost:{port}/{{name}}");
    // The operator allows URLs to name this host; where the name leads is still checked.
    let (fleet, mut op, dev) =
        health_check_attack(env, "sec-resolves", &url, &["--http-check-allow", "localhost"]).await;
    let fr = fleet.wait_rollout("probe", "the check to fail", VERDICT, |f| phase(f) == Phase::Paused).await;
    let said =
        fr.status.as_ref().and_then(|s| s.failures.first()).map(|f| f.message.clone()).unwrap_or_default();
    let requests = hits.load(Ordering::Relaxed);
    let alive = serving(&mut op).await;
    Row {
        attack: "a health check names an allowed host that resolves to loopback".into(),
        who: format!("{} (edit in its namespace)", short_user(&dev)),
        expected: "no connection to the address; the check fails".into(),
        outcome: format!("{}; failure: {said}; requests received: {requests}", state(&fr)),
        contained: requests == 0 && said.contains("loopback") && alive,
    }
}

pub(super) async fn health_check_follows_an_externalname_service(env: &'static Env) -> Row {
    let fleet = fleet_of(env, "sec-externalname", 1).await;
    let dev = Tenant::create(&env.admin, &fleet.ns, "dev", &edit()).await;
    // The tenant names a Service after its Deployment, pointing wherever it likes.
    let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-00", "namespace": fleet.ns},
        "spec": {"type": "ExternalName", "externalName": "metadata.google.internal"}});
    dev.kubectl(&["create", "-f", &file(&format!("{}-externalname", fleet.ns), &service)]).await.ok();
    let mut op = Operator::start(&fleet.ns, &[], &[]);
    // 30 s, as in health_check_attack: the failure must be the refusal, not a target slow to become ready.
    let spec = json!({"image": NEXT_IMAGE, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
        "health": {"timeout": "30s", "http": {"url": "http://{name}.{namespace}.svc:80/computeMetadata/v1/"}}});
    create_as(&dev, &fleet.ns, "probe", spec).await.ok();
    let fr = fleet.wait_rollout("probe", "the check to fail", VERDICT, |f| phase(f) == Phase::Paused).await;
    let said =
        fr.status.as_ref().and_then(|s| s.failures.first()).map(|f| f.message.clone()).unwrap_or_default();
    let alive = serving(&mut op).await;
    Row {
        attack: "a health check at the target's Service, which the tenant made an ExternalName to elsewhere"
            .into(),
        who: format!("{} (edit in its namespace)", short_user(&dev)),
        expected: "the ExternalName is not followed; the check fails".into(),
        outcome: format!("{}; failure: {said}", state(&fr)),
        contained: said.contains("ExternalName") && alive,
    }
}

pub(super) async fn health_check_aims_at_the_api_server(env: &'static Env) -> Row {
    let url = "https://kubernetes.default.svc/api/v1/namespaces/kube-system/secrets";
    let (fleet, mut op, dev) = health_check_attack(env, "sec-apiserver", url, &[]).await;
    let fr = fleet
        .wait_rollout("probe", "the check to be refused", VERDICT, |f| {
            reason(f).as_deref() == Some("HttpCheckRefused")
        })
        .await;
    let safe = untouched(env, &fleet.ns).await;
    let alive = serving(&mut op).await;
    Row {
        attack: "a health check aimed at the Kubernetes API server".into(),
        who: format!("{} (edit in its namespace)", short_user(&dev)),
        expected: "refused before anything changes (HttpCheckRefused)".into(),
        outcome: format!("{}; targets untouched: {safe}", state(&fr)),
        contained: safe && alive,
    }
}

pub(super) async fn health_check_aims_at_the_metadata_service(env: &'static Env) -> Row {
    let spec = json!({"image": NEXT_IMAGE, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
        "health": {"http": {"url": "http://169.254.169.254/latest/meta-data/iam/security-credentials/"}}});
    let ran = create_as(&env.dev1, &env.t1, "metadata", spec).await;
    row(
        "a health check aimed at the cloud metadata service (link-local)",
        who(&env.dev1, "edit in t1"),
        Expect::Schema("spec.health.http.url".into()),
        &ran,
    )
}

pub(super) async fn health_check_redirects_elsewhere(env: &'static Env) -> Row {
    let (elsewhere, hits) = listener(200, None).await;
    let (port, _) = listener(302, Some(format!("http://127.0.0.1:{elsewhere}/"))).await;
    let url = format!("http://127.0.0.1:{port}/{{name}}");
    // The operator allows its checks to reach this one address: the redirect must not widen that.
    let (fleet, mut op, dev) =
        health_check_attack(env, "sec-redirect", &url, &["--http-check-allow", "127.0.0.1"]).await;
    let fr = fleet.wait_rollout("probe", "the check to fail", VERDICT, |f| phase(f) == Phase::Paused).await;
    let said =
        fr.status.as_ref().and_then(|s| s.failures.first()).map(|f| f.message.clone()).unwrap_or_default();
    let followed = hits.load(Ordering::Relaxed);
    let alive = serving(&mut op).await;
    Row {
        attack: "a health check answered by a redirect to another address".into(),
        who: format!("{} (edit in its namespace)", short_user(&dev)),
        expected: "the redirect is not followed; the check fails".into(),
        outcome: format!("{}; failure: {said}; requests at the redirect's target: {followed}", state(&fr)),
        contained: followed == 0 && said.contains("returned 302") && alive,
    }
}

pub(super) async fn a_change_the_api_server_refuses(env: &'static Env) -> Row {
    let fleet = fleet_of(env, "sec-denied", 2).await;
    let ns = fleet.ns.clone();
    // web-01 is frozen by an admission policy of the cluster's own.
    let label = json!({"metadata": {"labels": {"frozen": "true"}}});
    let deployments: Api<Deployment> = Api::namespaced(env.admin.clone(), &ns);
    deployments.patch("web-01", &PatchParams::default(), &Patch::Merge(label)).await.unwrap();
    let name = format!("{ns}-frozen");
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": ["deployments"]}]},
        "validations": [{"expression": "!has(object.metadata.labels) || !('frozen' in object.metadata.labels)",
            "message": "this Deployment is frozen by the change board", "reason": "Forbidden"}]}}))
    .unwrap();
    let binding: ValidatingAdmissionPolicyBinding =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
        "policyName": name, "validationActions": ["Deny"],
        "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}}}))
        .unwrap();
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(env.admin.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(env.admin.clone());
    policies.create(&PostParams::default(), &policy).await.unwrap();
    bindings.create(&PostParams::default(), &binding).await.unwrap();
    // It applies once the API server has loaded it: nothing to watch, so a dry-run change, until refused.
    let dry = PatchParams { dry_run: true, ..Default::default() };
    let touch = json!({"metadata": {"annotations": {"probe": "1"}}});
    testkit::poll_until("the policy to apply", Duration::from_secs(30), || async {
        deployments.patch("web-01", &dry, &Patch::Merge(touch.clone())).await.is_err()
    })
    .await;

    let mut op = Operator::start(&ns, &[], &[]);
    fleet
        .rollout(
            "r",
            json!({"image": NEXT_IMAGE, "strategy": {"batchSize": 2, "maxFailures": 1},
            "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}}}),
        )
        .await;
    let fr = fleet.wait_rollout("r", "the rollout to finish", VERDICT, |f| phase(f).is_terminal()).await;
    let _ = bindings.delete(&name, &DeleteParams::default()).await;
    let _ = policies.delete(&name, &DeleteParams::default()).await;
    let failure = fr.status.as_ref().and_then(|s| s.failures.iter().find(|f| f.name == "web-01").cloned());
    let imgs = images(env, &ns).await;
    let frozen_kept = imgs.iter().any(|(n, i)| n == "web-01" && i == READY_IMAGE);
    let other_rolled = imgs.iter().any(|(n, i)| n == "web-00" && i == NEXT_IMAGE);
    let alive = serving(&mut op).await;
    let said = failure.map(|f| format!("{}: {}", f.reason, f.message)).unwrap_or_default();
    Row {
        attack: "a target whose change the cluster's own admission policy refuses".into(),
        who: "the cluster admin (a change board's policy)".into(),
        expected: "that target fails at once with the API server's message (ChangeDenied); the rest roll"
            .into(),
        outcome: format!("{}; web-01: {said}", state(&fr)),
        contained: frozen_kept
            && other_rolled
            && said.contains("ChangeDenied")
            && said.contains("frozen by the change board")
            && alive,
    }
}

pub(super) async fn a_reconcile_panics(env: &'static Env) -> Row {
    let fleet = fleet_of(env, "sec-panic", 2).await;
    // The first reconcile to reach the batch intent panics (a bug meeting some input).
    let mut op = Operator::start(&fleet.ns, &[], &[("FLEETROLL_FAILPOINT", "after-intent:1:panic")]);
    fleet
        .rollout(
            "r",
            json!({"image": NEXT_IMAGE, "strategy": {"batchSize": 1},
            "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}}}),
        )
        .await;
    let fr = fleet.wait_rollout("r", "the rollout to finish", VERDICT, |f| phase(f).is_terminal()).await;
    let panics =
        testkit::operator::metric(&op.metrics().await, "fleetroll_reconcile_panics_total").unwrap_or(0.0);
    let alive = serving(&mut op).await;
    Row {
        attack: "a reconcile panics mid-rollout".into(),
        who: "(a bug meeting some input)".into(),
        expected: "that step fails and is retried; the process and its other work go on".into(),
        outcome: format!("{}; panics caught: {panics}; operator serving: {alive}", state(&fr)),
        contained: phase(&fr) == Phase::Succeeded && panics == 1.0 && alive,
    }
}

/// Two tenants, each with a metrics backend of its own bound to its namespace (the analysis chapter's
/// advice: one scoped backend per tenant). The first names the second's in its analysis; then its own.
pub(super) async fn tenant_queries_another_tenants_metrics_backend(env: &'static Env) -> Row {
    use testkit::prometheus::{Exporter, Options, Prometheus, REQUESTS, REQUESTS_PER_SEC, error_ratio_query};
    let fleet = fleet_of(env, "sec-an-a", 2).await;
    let victim = env.scratch_namespace("sec-an-b", &[]).await;
    let dev = Tenant::create(&env.admin, &fleet.ns, "dev", &edit()).await;
    let exporter = Exporter::start();
    for (name, _) in images(env, &fleet.ns).await {
        exporter.set_rate(&fleet.ns, &name, REQUESTS_PER_SEC, 0.0);
    }
    let (own, theirs) = (
        Prometheus::start(&exporter, Options::default()).await,
        Prometheus::start(&exporter, Options::default()).await,
    );
    own.wait_for_series(&format!("min(count_over_time({REQUESTS}[1h])) >= 7")).await;
    theirs.wait_for_series(REQUESTS).await;
    let bound = |ns: &str, p: &Prometheus| format!("--analysis-allow={ns}=127.0.0.1:{}", p.port());
    let mut op = Operator::start(&fleet.ns, &[&bound(&fleet.ns, &own), &bound(&victim, &theirs)], &[]);
    let asked_before = theirs.queries_served().await;
    let spec = |p: &Prometheus| {
        json!({"image": NEXT_IMAGE, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
            "analysis": {"provider": {"prometheus": {"address": p.address()}}, "metrics": [{"name": "errors",
                "query": error_ratio_query(), "thresholdRange": {"max": 0.05}, "interval": "1s", "count": 1}]}})
    };

    // The other's backend by its address, and by spellings that name the same one to an HTTP client: a
    // trailing dot, decimal and hex forms, a trailing slash.
    let port = theirs.port();
    let spellings = [
        theirs.address(),
        format!("http://127.0.0.1.:{port}"),
        format!("http://2130706433:{port}"),
        format!("http://0x7f000001:{port}/"),
        format!("http://127.1:{port}/"),
    ];
    let steal = |i: usize, address: &str| {
        let mut spec = spec(&theirs);
        spec["analysis"]["provider"]["prometheus"]["address"] = json!(address);
        let (dev, fleet) = (&dev, &fleet);
        async move {
            let name = format!("steal-{i}");
            let created = create_as(dev, &fleet.ns, &name, spec).await;
            if created.code != 0 {
                // Refused at admission is refused too, if it is the address that was refused.
                return created.stderr.contains("prometheus.address");
            }
            let fr = fleet
                .wait_rollout(&name, "the other tenant's backend to be refused", VERDICT, |f| {
                    reason(f).as_deref() == Some("AnalysisAddressRefused")
                })
                .await;
            dev.kubectl(&["delete", "fleetrollout", &name, "-n", &fleet.ns]).await.ok();
            reason(&fr).as_deref() == Some("AnalysisAddressRefused")
        }
    };
    let attempts = futures::future::join_all(spellings.iter().enumerate().map(|(i, a)| steal(i, a))).await;
    let refused_all = attempts.iter().filter(|refused| **refused).count();
    let untouched_then = untouched(env, &fleet.ns).await;
    create_as(&dev, &fleet.ns, "own", spec(&own)).await.ok();
    let fr = fleet.wait_rollout("own", "its own analysis to pass", VERDICT, |f| phase(f).is_terminal()).await;
    let measured = fr.status.as_ref().map_or(0, |s| {
        s.batches
            .iter()
            .filter_map(|b| b.analysis.as_ref())
            .flat_map(|a| &a.metrics)
            .map(|m| m.successful)
            .sum()
    });
    let asked = theirs.queries_served().await - asked_before;
    let alive = serving(&mut op).await;
    Row {
        attack: "names another tenant's metrics backend (bound to that tenant's namespace) in its analysis, as \
                 written and spelled four other ways (trailing dot, decimal, hex, short form, trailing slash)"
            .into(),
        who: format!("{} (edit in its namespace)", short_user(&dev)),
        expected: "refused before anything changes (AnalysisAddressRefused), the backend never asked; its own backend works".into(),
        outcome: format!(
            "{refused_all}/{} spellings refused (AnalysisAddressRefused or at admission); queries the other \
             backend received: {asked}; then its own: {} with {measured} measurements",
            spellings.len(),
            state(&fr)
        ),
        contained: refused_all == spellings.len()
            && untouched_then
            && asked == 0.0
            && phase(&fr) == Phase::Succeeded
            && measured > 0
            && alive,
    }
}

/// `ns/name` of a tenant, short enough for the table.
pub(super) fn short_user(t: &Tenant) -> String {
    format!("{}/{}", short(&t.namespace), t.name)
}
