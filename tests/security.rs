//! Attacks on fleetroll's security boundary (issue 13): no identity can cause, through fleetroll, a change, a
//! read or a network request it could not make itself.
//!
//!   cargo test --test security                 every attack; a Markdown table on stdout; exits non-zero if
//!                                              any attack was not contained
//!   cargo test --test security -- status node  only the attacks whose name contains one of the words
//!
//! Each attack is an async function returning a `Row`, and acts with real credentials: ServiceAccounts with
//! tokens from the TokenRequest API, bound to the built-in roles (or to Roles of their own) in their own
//! namespaces only, through `kubectl`, so the message a person would see is checked too.
//!
//! Adding one: write `async fn my_attack(env: &'static Env) -> Row` and add `attack!(my_attack)` to
//! `ATTACKS` (`attack!(my_attack, exclusive)` if it must not run alongside the others).
#![allow(clippy::unwrap_used)]

mod common;

use std::{path::PathBuf, time::Duration};

use common::{
    TEST_LABEL,
    cli::Ran,
    fleet::{Fleet, READY_IMAGE, ensure_crd},
    operator::Operator,
    tenant::{FLEET_ADMIN_ROLE, Grant, POLICY, Tenant, rule},
};
use fleetroll::api::{FleetRollout, Phase};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

/// One attack's result: a row of the table.
pub struct Row {
    pub attack: String,
    pub who: String,
    pub expected: String,
    pub outcome: String,
    /// The attack achieved nothing its identity could not do itself (and a legitimate action worked).
    pub contained: bool,
}

type Attack = fn(&'static Env) -> BoxFuture<'static, Row>;

struct Entry {
    name: &'static str,
    run: Attack,
    /// Runs alone, after the concurrent ones (for attacks that change what others rely on).
    exclusive: bool,
}

macro_rules! attack {
    ($f:ident) => {
        Entry { name: stringify!($f), run: |env| Box::pin($f(env)), exclusive: false }
    };
    ($f:ident, exclusive) => {
        Entry { name: stringify!($f), run: |env| Box::pin($f(env)), exclusive: true }
    };
}

const ATTACKS: &[Entry] = &[
    attack!(edit_tenant_rolls_its_own_deployments),
    attack!(create_only_caller_rolls_deployments),
    attack!(edit_tenant_rolls_across_namespaces),
    attack!(fleet_admin_rolls_across_namespaces),
    attack!(tenant_of_t2_creates_a_rollout_in_t1),
    attack!(edit_tenant_changes_an_admins_rollout),
    attack!(create_only_caller_changes_a_rollouts_spec),
    attack!(rollouts_only_caller_pauses_a_rollout),
    attack!(rollouts_only_caller_labels_a_rollout),
    attack!(edit_tenant_writes_rollout_status),
    attack!(edit_tenant_rolls_a_daemonset_node_by_node),
    attack!(caller_without_pod_delete_rolls_nodes),
    attack!(oversized_health_timeout),
    attack!(oversized_health_soak),
    attack!(oversized_pause_between_batches),
];

/// What the attacks share: namespaces t1, t2 and a fleet namespace, and the identities acting in them.
pub struct Env {
    pub admin: Client,
    pub t1: String,
    pub t2: String,
    pub fleet: String,
    /// `edit` in t1.
    pub dev1: Tenant,
    /// `edit` in t2.
    pub dev2: Tenant,
    /// Only create and get on fleetrollouts in t1: no rights over any workload.
    pub creator: Tenant,
    /// Every verb on fleetrollouts in t1 (get, list, create, update, patch): still no rights over workloads.
    pub rollouts_only: Tenant,
    /// A platform team: the chart's fleet-admin role (span-namespaces) and `edit` in the fleet namespace.
    pub fleet_admin: Tenant,
    /// May create rollouts and update DaemonSets in t1, but not delete pods.
    pub no_pod_delete: Tenant,
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let all_contained = runtime.block_on(run());
    std::process::exit(if all_contained { 0 } else { 1 });
}

/// Attacks named on the command line (`-- node status`) run alone; none named, all run.
fn selected(name: &str) -> bool {
    let words: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    words.is_empty() || words.iter().any(|w| name.contains(w.as_str()))
}

async fn run() -> bool {
    let admin = common::client().await;
    ensure_crd(&admin).await;
    let namespaces = [
        namespace(&admin, "sec-t1").await,
        namespace(&admin, "sec-t2").await,
        namespace(&admin, "sec-fleet").await,
    ];
    // The namespaces go whatever happens to the attacks (the panic, if any, is raised afterwards).
    let outcome = tokio::spawn(attack_all(admin.clone(), namespaces.clone())).await;
    for ns in &namespaces {
        if let Err(e) = Api::<Namespace>::all(admin.clone()).delete(ns, &DeleteParams::background()).await {
            eprintln!("warning: could not delete test namespace {ns}: {e}");
        }
    }
    let rows = outcome.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    println!("\n{}", table(&rows));
    let escaped: Vec<&str> = rows.iter().filter(|r| !r.contained).map(|r| r.attack.as_str()).collect();
    match (rows.len(), escaped.is_empty()) {
        (0, _) => eprintln!("security: no attack matches {:?}", std::env::args().skip(1).collect::<Vec<_>>()),
        (_, true) => eprintln!("security: every attack was contained"),
        (_, false) => eprintln!("security: NOT contained: {escaped:?}"),
    }
    !rows.is_empty() && escaped.is_empty()
}

async fn attack_all(admin: Client, namespaces: [String; 3]) -> Vec<Row> {
    let env: &'static Env = Box::leak(Box::new(setup(admin, &namespaces).await));
    let chosen: Vec<&Entry> = ATTACKS.iter().filter(|a| selected(a.name)).collect();
    eprintln!("security: {} attacks", chosen.len());
    let concurrent: Vec<_> =
        chosen.iter().filter(|a| !a.exclusive).map(|a| (a.name, tokio::spawn((a.run)(env)))).collect();
    let mut rows = Vec::new();
    for (name, handle) in concurrent {
        rows.push(finished(name, handle.await));
    }
    for a in chosen.iter().filter(|a| a.exclusive) {
        rows.push(finished(a.name, tokio::spawn((a.run)(env)).await));
    }
    rows
}

/// An attack that panicked proves nothing: it counts as not contained.
fn finished(name: &str, joined: Result<Row, tokio::task::JoinError>) -> Row {
    joined.unwrap_or_else(|e| {
        let why = match e.try_into_panic() {
            Ok(p) => p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default(),
            Err(e) => e.to_string(),
        };
        Row {
            attack: name.replace('_', " "),
            who: String::new(),
            expected: String::new(),
            outcome: format!("the attack itself failed: {why}"),
            contained: false,
        }
    })
}

fn table(rows: &[Row]) -> String {
    let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    let mut out = String::from("| attack | who | expected | outcome | contained |\n|---|---|---|---|---|\n");
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            cell(&r.attack),
            cell(&r.who),
            cell(&r.expected),
            cell(&r.outcome),
            if r.contained { "yes" } else { "**NO**" }
        ));
    }
    out
}

async fn namespace(admin: &Client, prefix: &str) -> String {
    let ns = Namespace {
        metadata: ObjectMeta {
            generate_name: Some(format!("{prefix}-")),
            labels: Some([(TEST_LABEL.to_string(), "true".to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(admin.clone()).create(&PostParams::default(), &ns).await.unwrap().name_any()
}

async fn setup(admin: Client, namespaces: &[String; 3]) -> Env {
    let [t1, t2, fleet] = namespaces.clone();
    let edit = [Grant::cluster_role("edit")];
    let creator = [Grant::rules(vec![rule("fleetroll.dev", &["fleetrollouts"], &["create", "get"])])];
    let every_rollout_verb = ["get", "list", "watch", "create", "update", "patch"];
    let rollouts_only = [Grant::rules(vec![rule("fleetroll.dev", &["fleetrollouts"], &every_rollout_verb)])];
    let fleet_admin = [Grant::cluster_role(FLEET_ADMIN_ROLE), Grant::cluster_role("edit")];
    let no_pod_delete = [Grant::rules(vec![
        rule("fleetroll.dev", &["fleetrollouts"], &["create", "get"]),
        rule("apps", &["daemonsets"], &["get", "update", "patch"]),
    ])];
    let (dev1, dev2, creator, rollouts_only, fleet_admin, no_pod_delete) = tokio::join!(
        Tenant::create(&admin, &t1, "dev", &edit),
        Tenant::create(&admin, &t2, "dev", &edit),
        Tenant::create(&admin, &t1, "creator", &creator),
        Tenant::create(&admin, &t1, "rollouts-only", &rollouts_only),
        Tenant::create(&admin, &fleet, "platform", &fleet_admin),
        Tenant::create(&admin, &t1, "ds-updater", &no_pod_delete),
    );
    Env { admin, t1, t2, fleet, dev1, dev2, creator, rollouts_only, fleet_admin, no_pod_delete }
}

// ---------------------------------------------------------------------------------------------------------
// How attacks act and are judged.

/// `ns/name (what it may do)`, short enough for the table.
fn who(t: &Tenant, may: &str) -> String {
    format!("{}/{} ({may})", short(&t.namespace), t.name)
}

/// `sec-t1-x7k2p` → `t1`: the table reads the same in every run.
fn short(ns: &str) -> String {
    ns.strip_prefix("sec-").and_then(|s| s.rsplit_once('-')).map_or(ns, |(s, _)| s).to_string()
}

fn deployments_spec() -> Value {
    json!({"image": "registry.k8s.io/pause:3.9", "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}}})
}

fn node_spec() -> Value {
    json!({"image": "registry.k8s.io/pause:3.9", "targets": {"kind": "Node", "daemonSet": "edge-agent"}})
}

/// A FleetRollout manifest in a file, for `kubectl create -f`.
fn manifest(ns: &str, name: &str, spec: Value) -> String {
    let fr = json!({"apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": name, "namespace": ns}, "spec": spec});
    file(&format!("{ns}-{name}"), &fr)
}

/// `object` as a JSON file under target/test-logs/security, for kubectl's `-f`.
fn file(name: &str, object: &Value) -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-logs/security");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, object.to_string()).unwrap();
    path.display().to_string()
}

/// `kubectl create` of a FleetRollout as `t`.
async fn create_as(t: &Tenant, ns: &str, name: &str, spec: Value) -> Ran {
    t.kubectl(&["create", "-n", ns, "-f", &manifest(ns, name, spec)]).await
}

/// A rollout created by the cluster admin, for attacks on existing rollouts.
async fn admin_rollout(env: &Env, ns: &str, name: &str) {
    let fr: FleetRollout = serde_json::from_value(json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": name}, "spec": deployments_spec(),
    }))
    .unwrap();
    Api::<FleetRollout>::namespaced(env.admin.clone(), ns).create(&PostParams::default(), &fr).await.unwrap();
}

/// What should happen.
enum Expect {
    /// The request succeeds (a legitimate action, or one that grants nothing).
    Allowed,
    /// The admission policy refuses it, with a message containing this.
    Policy(String),
    /// RBAC refuses it, with a message containing this.
    Rbac(String),
    /// The CRD's schema refuses it, naming this field.
    Schema(String),
}

impl Expect {
    fn describe(&self) -> String {
        match self {
            Expect::Allowed => "allowed".into(),
            Expect::Policy(_) => "denied by the admission policy".into(),
            Expect::Rbac(_) => "forbidden by RBAC".into(),
            Expect::Schema(field) => format!("rejected by the schema ({field})"),
        }
    }
}

/// What happened, in the words the API server used.
fn outcome(ran: &Ran) -> String {
    if ran.code == 0 {
        return format!("allowed: {}", ran.stdout.trim());
    }
    let err = ran.stderr.trim();
    if let Some((_, msg)) = err.split_once("denied request: ") {
        return format!("denied by the admission policy: {msg}");
    }
    if let Some((_, msg)) = err.split_once("is invalid: ") {
        return format!("rejected by the schema: {msg}");
    }
    if err.contains("(Forbidden)") {
        return format!("forbidden: {}", err.rsplit_once("forbidden: ").map_or(err, |(_, m)| m));
    }
    format!("failed (exit {}): {err}", ran.code)
}

fn contained(expect: &Expect, ran: &Ran) -> bool {
    let err = &ran.stderr;
    match expect {
        Expect::Allowed => ran.code == 0,
        Expect::Policy(msg) => {
            ran.code != 0
                && err.contains(&format!("ValidatingAdmissionPolicy '{POLICY}'"))
                && err.contains("(Forbidden)")
                && err.contains(msg.as_str())
        }
        Expect::Rbac(msg) => {
            ran.code != 0
                && err.contains("(Forbidden)")
                && !err.contains("ValidatingAdmissionPolicy")
                && err.contains(msg.as_str())
        }
        Expect::Schema(field) => {
            ran.code != 0 && err.contains("(Invalid)") && err.contains(&format!("{field}: Invalid value"))
        }
    }
}

fn row(attack: &str, who: String, expect: Expect, ran: &Ran) -> Row {
    Row {
        attack: attack.into(),
        who,
        expected: expect.describe(),
        outcome: outcome(ran),
        contained: contained(&expect, ran),
    }
}

/// The policy's message for a missing right, as the user reads it.
fn may_not(t: &Tenant, what: &str, ns: &str) -> String {
    format!("FleetRollout denied: {} may not {what} in namespace {ns}", t.username)
}

// ---------------------------------------------------------------------------------------------------------
// The attacks.

async fn edit_tenant_rolls_its_own_deployments(env: &'static Env) -> Row {
    let ran = create_as(&env.dev1, &env.t1, "own", deployments_spec()).await;
    row(
        "baseline: a tenant rolls its own namespace's Deployments",
        who(&env.dev1, "edit in t1"),
        Expect::Allowed,
        &ran,
    )
}

async fn create_only_caller_rolls_deployments(env: &'static Env) -> Row {
    let ran = create_as(&env.creator, &env.t1, "creator", deployments_spec()).await;
    let expect = Expect::Policy(format!(
        "{}; a FleetRollout may change only what its creator could change",
        may_not(&env.creator, "patch deployments", &env.t1)
    ));
    row(
        "rolls Deployments it may not patch, through a FleetRollout",
        who(&env.creator, "create/get fleetrollouts in t1"),
        expect,
        &ran,
    )
}

async fn edit_tenant_rolls_across_namespaces(env: &'static Env) -> Row {
    let mut spec = deployments_spec();
    spec["targets"]["namespaceSelector"] = json!({"matchLabels": {"fleetroll.dev/rollouts": "enabled"}});
    let ran = create_as(&env.dev1, &env.t1, "span", spec).await;
    let expect = Expect::Policy(may_not(&env.dev1, "span-namespaces on fleetrollouts", &env.t1));
    row(
        "rolls across every opted-in namespace (namespaceSelector)",
        who(&env.dev1, "edit in t1"),
        expect,
        &ran,
    )
}

async fn fleet_admin_rolls_across_namespaces(env: &'static Env) -> Row {
    let mut spec = deployments_spec();
    spec["targets"]["namespaceSelector"] = json!({"matchLabels": {"fleetroll.dev/rollouts": "enabled"}});
    let ran = create_as(&env.fleet_admin, &env.fleet, "span", spec).await;
    row(
        "baseline: a fleet admin rolls across opted-in namespaces",
        who(&env.fleet_admin, "fleet-admin + edit in fleet"),
        Expect::Allowed,
        &ran,
    )
}

async fn tenant_of_t2_creates_a_rollout_in_t1(env: &'static Env) -> Row {
    let ran = create_as(&env.dev2, &env.t1, "from-t2", deployments_spec()).await;
    let expect =
        Expect::Rbac(format!("User \"{}\" cannot create resource \"fleetrollouts\"", env.dev2.username));
    row("creates a FleetRollout in another tenant's namespace", who(&env.dev2, "edit in t2"), expect, &ran)
}

async fn edit_tenant_changes_an_admins_rollout(env: &'static Env) -> Row {
    admin_rollout(env, &env.t1, "admins").await;
    let ran = env
        .dev1
        .kubectl(&[
            "patch",
            "fleetrollout",
            "admins",
            "-n",
            &env.t1,
            "--type=merge",
            "-p",
            r#"{"spec":{"image":"registry.k8s.io/pause:3.8","paused":true}}"#,
        ])
        .await;
    row(
        "baseline: a tenant changes (image, pause) a rollout an admin created in its namespace",
        who(&env.dev1, "edit in t1"),
        Expect::Allowed,
        &ran,
    )
}

async fn create_only_caller_changes_a_rollouts_spec(env: &'static Env) -> Row {
    admin_rollout(env, &env.t1, "admins-2").await;
    let ran = env
        .creator
        .kubectl(&[
            "patch",
            "fleetrollout",
            "admins-2",
            "-n",
            &env.t1,
            "--type=merge",
            "-p",
            r#"{"spec":{"image":"registry.example.com/evil:1"}}"#,
        ])
        .await;
    let expect =
        Expect::Rbac(format!("User \"{}\" cannot patch resource \"fleetrollouts\"", env.creator.username));
    row(
        "changes the image of an existing rollout",
        who(&env.creator, "create/get fleetrollouts in t1"),
        expect,
        &ran,
    )
}

async fn rollouts_only_caller_pauses_a_rollout(env: &'static Env) -> Row {
    admin_rollout(env, &env.t1, "admins-3").await;
    let ran = env
        .rollouts_only
        .kubectl(&[
            "patch",
            "fleetrollout",
            "admins-3",
            "-n",
            &env.t1,
            "--type=merge",
            "-p",
            r#"{"spec":{"paused":true}}"#,
        ])
        .await;
    let expect = Expect::Policy(may_not(&env.rollouts_only, "patch deployments", &env.t1));
    row(
        "pauses a rollout of Deployments it may not patch (any spec change needs the target rights)",
        who(&env.rollouts_only, "all verbs on fleetrollouts in t1, nothing else"),
        expect,
        &ran,
    )
}

async fn rollouts_only_caller_labels_a_rollout(env: &'static Env) -> Row {
    admin_rollout(env, &env.t1, "admins-4").await;
    let ran =
        env.rollouts_only.kubectl(&["label", "fleetrollout", "admins-4", "-n", &env.t1, "team=web"]).await;
    row(
        "baseline: labels a rollout (metadata only: changes nothing it could not change)",
        who(&env.rollouts_only, "all verbs on fleetrollouts in t1, nothing else"),
        Expect::Allowed,
        &ran,
    )
}

async fn edit_tenant_writes_rollout_status(env: &'static Env) -> Row {
    admin_rollout(env, &env.t1, "admins-5").await;
    // A PUT of the whole status with the current resourceVersion: it would succeed if RBAC allowed it.
    let mut fr = Api::<FleetRollout>::namespaced(env.admin.clone(), &env.t1).get("admins-5").await.unwrap();
    fr.metadata.managed_fields = None;
    let mut forged = serde_json::to_value(&fr).unwrap();
    forged["status"] = json!({"phase": "Succeeded", "message": "forged"});
    let path = file(&format!("{}-admins-5-status", env.t1), &forged);
    let ran = env.dev1.kubectl(&["replace", "--subresource=status", "-n", &env.t1, "-f", &path]).await;
    let expect = Expect::Rbac(format!(
        "User \"{}\" cannot update resource \"fleetrollouts/status\"",
        env.dev1.username
    ));
    row("forges a rollout's status (the operator's checkpoint)", who(&env.dev1, "edit in t1"), expect, &ran)
}

async fn edit_tenant_rolls_a_daemonset_node_by_node(env: &'static Env) -> Row {
    let ran = create_as(&env.dev1, &env.t1, "nodes", node_spec()).await;
    row(
        "baseline: a tenant rolls its DaemonSet node by node (edit may update it and delete its pods)",
        who(&env.dev1, "edit in t1"),
        Expect::Allowed,
        &ran,
    )
}

async fn caller_without_pod_delete_rolls_nodes(env: &'static Env) -> Row {
    let ran = create_as(&env.no_pod_delete, &env.t1, "nodes-2", node_spec()).await;
    let expect = Expect::Policy(may_not(&env.no_pod_delete, "delete pods", &env.t1));
    row(
        "has pods deleted node by node without the right to delete pods",
        who(&env.no_pod_delete, "create fleetrollouts, update daemonsets in t1"),
        expect,
        &ran,
    )
}

async fn oversized_health_timeout(env: &'static Env) -> Row {
    oversized(env, "timeout", "spec.health.timeout", json!({"health": {"timeout": "99999999h"}})).await
}

async fn oversized_health_soak(env: &'static Env) -> Row {
    oversized(env, "soak", "spec.health.soak", json!({"health": {"soak": "99999999h"}})).await
}

async fn oversized_pause_between_batches(env: &'static Env) -> Row {
    oversized(
        env,
        "pause",
        "spec.strategy.pauseBetweenBatches",
        json!({"strategy": {"pauseBetweenBatches": "99999999h"}}),
    )
    .await
}

/// A duration of 11,000 years in one field. The schema must refuse it (at most 30 days) with a message; if it
/// does not, the outcome reports what the operator does with it.
async fn oversized(env: &'static Env, name: &str, field: &str, overrides: Value) -> Row {
    let mut spec = deployments_spec();
    merge(&mut spec, &overrides);
    let ran = create_as(&env.dev1, &env.t1, &format!("huge-{name}"), spec.clone()).await;
    let mut r = row(
        &format!("{field}: 99999999h (11,000 years)"),
        who(&env.dev1, "edit in t1"),
        Expect::Schema(field.into()),
        &ran,
    );
    if ran.code == 0 {
        r.outcome = format!("admitted; {}", consequence(env, name, spec).await);
    }
    r
}

fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b.clone(),
    }
}

/// Runs an operator on a rollout with `spec` over two Deployments (batches of one) in a namespace of its own,
/// and says what became of the operator and the rollout.
async fn consequence(env: &'static Env, name: &str, mut spec: Value) -> String {
    let ns = namespace(&env.admin, &format!("sec-{name}")).await;
    let fleet = Fleet { client: env.admin.clone(), ns: ns.clone(), tenants: vec![] };
    fleet.deployments(&ns, 2, READY_IMAGE).await;
    let mut op = Operator::start(&ns, &[], &[]);
    spec["strategy"]["batchSize"] = json!(1);
    fleet.rollout(name, spec).await;
    // The verdict needs both the rollout and the operator's process and log, which no single watch shows:
    // poll them together, up to a deadline.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut panicked_at = None;
    // Once the rollout looks fine, a harmless spec change makes the operator take it up again: a deadline
    // that cannot be computed fails at every reconcile, not only the first.
    let mut nudged: Option<i64> = None;
    let said = loop {
        let log = std::fs::read_to_string(&op.log).unwrap_or_default();
        let status = fleet.rollouts().get(name).await.ok().and_then(|f| f.status).unwrap_or_default();
        let state = format!("{:?}: {}", status.phase, status.message.clone().unwrap_or_default());
        if let Some(at) = log.lines().position(|l| l.contains("panicked at")) {
            let why = log.lines().nth(at + 1).unwrap_or_default().trim().to_string();
            let since = *panicked_at.get_or_insert_with(tokio::time::Instant::now);
            // A panic in a reconcile ends the process a moment later (the controller's task is joined).
            if !op.is_running() || since.elapsed() > Duration::from_secs(30) {
                let process = if op.is_running() { "still running 30 s later" } else { "exited" };
                break format!("the operator panicked ({why}) and {process}; the rollout stays {state}");
            }
        } else if copes(&status) {
            match nudged {
                None => {
                    let ttl = json!({"spec": {"ttlSecondsAfterFinished": 86400}});
                    let fr = fleet
                        .rollouts()
                        .patch(name, &PatchParams::default(), &Patch::Merge(&ttl))
                        .await
                        .unwrap();
                    nudged = fr.metadata.generation;
                }
                Some(g) if status.observed_generation >= Some(g) => {
                    break format!("the operator copes: {state}");
                }
                Some(_) => {}
            }
        } else if tokio::time::Instant::now() > deadline {
            break format!("after 60 s the operator has not panicked; the rollout is {state}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    op.kill();
    let _ = Api::<Namespace>::all(env.admin.clone()).delete(&ns, &DeleteParams::background()).await;
    said
}

/// The rollout waits the long duration out (soaking with healthy targets, or waiting before batch 2), or has
/// finished (a timeout that never needed to expire).
fn copes(s: &fleetroll::api::FleetRolloutStatus) -> bool {
    let soaking =
        s.reason.as_deref() == Some("Soaking") && s.batches.iter().any(|b| b.healthy_since.is_some());
    let pausing = s.message.as_deref().is_some_and(|m| m.starts_with("waiting before batch"));
    s.phase == Phase::Succeeded || soaking || pausing
}
