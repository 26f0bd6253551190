//! Attacks on fleetroll's security boundary (issue 13): no identity can cause, through fleetroll, a change, a
//! read or a network request it could not make itself.
//!
//!   cargo test --test security                 every attack; a Markdown table on stdout; exits non-zero if
//!                                              any attack was not contained
//!   cargo test --test security -- status node  only the attacks whose name contains one of the words
//!   cargo test --test security -- --skip mcp   all but the attacks whose name contains `mcp` (as libtest)
//!
//! Each attack is an async function returning a `Row`, and acts with real credentials: ServiceAccounts with
//! tokens from the TokenRequest API, bound to the built-in roles (or to Roles of their own) in their own
//! namespaces only, through `kubectl`, so the message a person would see is checked too.
//!
//! Adding one: write `async fn my_attack(env: &'static Env) -> Row` and add `attack!(my_attack)` to
//! `ATTACKS` (`attack!(my_attack, exclusive)` if it must not run alongside the others).
#![allow(clippy::unwrap_used)]

mod admission;
mod bypass;
mod duties;
mod guardrails;
mod mcp;
mod mcp_shares;
mod members;
mod notify;
mod operator;
mod overlap;
mod reads;
mod starve;

use admission::*;
use bypass::*;
use duties::*;
use guardrails::*;
use mcp::*;
use mcp_shares::*;
use members::*;
use notify::*;
use operator::*;
use overlap::*;
use reads::*;
use starve::*;

use std::{path::PathBuf, time::Duration};

use fleetroll::api::{FleetRollout, Phase};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use testkit::{
    cli::Ran,
    fleet::{Fleet, READY_IMAGE, ensure_crd},
    operator::Operator,
    tenant::{APPROVER_ROLE, FLEET_ADMIN_ROLE, Grant, POLICY, Tenant, rule},
};

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
    attack!(analysis_sends_a_secret_its_creator_may_not_read),
    attack!(edit_tenant_uses_its_own_analysis_credentials),
    attack!(edit_tenant_rolls_across_namespaces),
    attack!(fleet_admin_rolls_across_namespaces),
    attack!(tenant_of_t2_creates_a_rollout_in_t1),
    attack!(edit_tenant_changes_an_admins_rollout),
    attack!(create_only_caller_changes_a_rollouts_spec),
    attack!(rollouts_only_caller_pauses_a_rollout),
    attack!(rollouts_only_caller_applies_server_side),
    attack!(rollouts_only_caller_labels_a_rollout),
    attack!(edit_tenant_writes_rollout_status),
    attack!(edit_tenant_rolls_a_daemonset_node_by_node),
    attack!(caller_without_pod_delete_rolls_nodes),
    attack!(oversized_health_timeout),
    attack!(oversized_health_soak),
    attack!(oversized_pause_between_batches),
    attack!(approver_forges_who_approved),
    attack!(edit_tenant_approves_a_batch),
    attack!(approver_approves_an_others_rollout),
    attack!(approver_approves_its_own_rollout),
    attack!(creator_written_into_the_manifest),
    attack!(creator_rewritten_after_create),
    attack!(creator_erased_by_an_apply),
    attack!(argo_cd_approve_action_run_by_a_patcher),
    attack!(agent_omits_the_approval_a_policy_requires),
    attack!(agent_exceeds_a_policys_batch_cap),
    attack!(approver_outside_a_policys_approvers),
    attack!(approval_given_before_a_policy_named_approvers),
    attack!(every_serviceaccount_and_the_group_agents_are_governed, exclusive),
    attack!(a_plan_beyond_a_policys_caps_is_held),
    attack!(governed_agent_loosens_someone_elses_rollout),
    attack!(governed_agent_repoints_an_ungoverned_rollout),
    attack!(override_of_a_tenants_window_lifts_the_platforms_freeze),
    attack!(finalizer_stripped_from_a_held_node_rollout),
    attack!(owner_reference_makes_the_garbage_collector_delete_a_rollout),
    attack!(deleting_a_rollout_that_still_runs),
    attack!(deleting_a_finished_rollout),
    attack!(fleet_namespace_editor_unmakes_a_cross_namespace_rollout),
    attack!(creator_annotation_names_someone_else),
    attack!(task_annotations_rewritten),
    attack!(gates_loosened_after_a_persons_approval),
    attack!(node_rollout_switches_its_daemonset),
    attack!(tenant_replaces_a_frozen_plan),
    attack!(tenant_preplants_a_plan),
    attack!(rollout_aims_at_the_operator),
    attack!(rollout_reaches_a_protected_namespace),
    attack!(namespace_opts_out_mid_rollout),
    attack!(fleet_admin_probes_namespaces_that_never_opted_in),
    attack!(fleet_admin_reads_member_credentials),
    attack!(two_rollouts_take_one_target),
    attack!(two_rollouts_applied_together_race),
    attack!(node_rollouts_fight_over_a_daemonset),
    attack!(health_check_aims_at_loopback),
    attack!(health_check_names_a_host_that_resolves_to_loopback),
    attack!(health_check_follows_an_externalname_service),
    attack!(health_check_aims_at_the_api_server),
    attack!(health_check_aims_at_the_metadata_service),
    attack!(health_check_redirects_elsewhere),
    attack!(tenant_queries_another_tenants_metrics_backend),
    attack!(fleet_admin_has_an_exec_plugin_send_the_operators_token_elsewhere),
    attack!(member_secret_runs_its_plugin_on_the_previewers_machine),
    attack!(tenant_hangs_its_sinks_to_silence_the_platforms_audit),
    attack!(tenant_outruns_the_platforms_sink_to_drop_its_audit),
    attack!(tenant_deletes_its_rollout_before_the_platform_heard_of_it),
    attack!(tenant_sends_to_an_address_the_platform_opened_for_its_own_sink),
    attack!(a_change_the_api_server_refuses),
    attack!(a_reconcile_panics),
    attack!(adopter_without_rights_or_in_someone_elses_name, exclusive),
    attack!(tenant_deployments_of_maximal_size, exclusive),
    attack!(tenant_rollouts_of_maximal_size, exclusive),
    attack!(another_tenants_workload_wakes_a_rollout, exclusive),
    attack!(mcp_caller_rolls_what_it_may_not_patch),
    attack!(mcp_caller_previews_what_it_may_not_list),
    attack!(a_foreign_page_calls_the_mcp_server),
    attack!(a_flood_of_random_bearer_tokens, exclusive),
    attack!(one_mcp_tenant_floods_slow_bodies_connections_and_permission_checks, exclusive),
    attack!(slow_header_connections_from_many_addresses_leave_callers_unanswered, exclusive),
    attack!(unread_pipelined_answers_hold_every_connection, exclusive),
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
    /// `edit` and the chart's approver role in t1.
    pub approver: Tenant,
    /// Only create and get on fleetrollouts in t1: no rights over any workload.
    pub creator: Tenant,
    /// Every verb on fleetrollouts in t1 (get, list, create, update, patch): still no rights over workloads.
    pub rollouts_only: Tenant,
    /// A platform team: the chart's fleet-admin role (span-namespaces, patch on workloads) in the fleet namespace.
    pub fleet_admin: Tenant,
    /// May create rollouts and update DaemonSets in t1, but not delete pods.
    pub no_pod_delete: Tenant,
    /// May create rollouts and patch Deployments in t1, but not read Secrets.
    pub deployer: Tenant,
    /// Namespaces attacks made for themselves (each with an operator of its own), deleted at the end.
    scratch: std::sync::Mutex<Vec<String>>,
}

impl Env {
    /// A namespace of the attack's own, labelled `labels`, deleted after every attack has run.
    pub async fn scratch_namespace(&self, prefix: &str, labels: &[(&str, &str)]) -> String {
        let name = testkit::create_namespace(&self.admin, prefix, labels).await;
        self.scratch.lock().unwrap().push(name.clone());
        name
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let all_contained = runtime.block_on(run());
    std::process::exit(if all_contained { 0 } else { 1 });
}

/// Attacks named on the command line (`-- node status`) run alone; none named, all run; `--skip` as libtest.
fn selected(name: &str) -> bool {
    testkit::args::Selection::from_env().selects(name)
}

async fn run() -> bool {
    let admin = testkit::client().await;
    ensure_crd(&admin).await;
    let namespaces = [
        testkit::create_namespace(&admin, "sec-t1", &[]).await,
        testkit::create_namespace(&admin, "sec-t2", &[]).await,
        testkit::create_namespace(&admin, "sec-fleet", &[]).await,
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
    let scratch = std::mem::take(&mut *env.scratch.lock().unwrap());
    for ns in scratch {
        // The (cluster-scoped) FleetRolloutPolicy a guardrails attack made for its namespace, if any.
        let policies = Api::<fleetroll::api::FleetRolloutPolicy>::all(env.admin.clone());
        let _gone_or_never_made =
            policies.delete(&guardrails::policy_name(&ns), &DeleteParams::default()).await;
        if let Err(e) = testkit::delete_namespace(&env.admin, &ns).await {
            eprintln!("warning: could not delete test namespace {ns}: {e}");
        }
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

async fn setup(admin: Client, namespaces: &[String; 3]) -> Env {
    let [t1, t2, fleet] = namespaces.clone();
    let edit = [Grant::cluster_role("edit")];
    let approver = [Grant::cluster_role("edit"), Grant::cluster_role(APPROVER_ROLE)];
    let creator = [Grant::rules(vec![rule("fleetroll.dev", &["fleetrollouts"], &["create", "get"])])];
    let every_rollout_verb = ["get", "list", "watch", "create", "update", "patch"];
    let rollouts_only = [Grant::rules(vec![rule("fleetroll.dev", &["fleetrollouts"], &every_rollout_verb)])];
    // The chart's fleet-admin role alone, as the chart's notes say to bind it: it patches workloads, and does
    // not read Secrets (the members' credentials live in the fleet namespace).
    let fleet_admin = [Grant::cluster_role(FLEET_ADMIN_ROLE)];
    let no_pod_delete = [Grant::rules(vec![
        rule("fleetroll.dev", &["fleetrollouts"], &["create", "get"]),
        rule("apps", &["daemonsets"], &["get", "update", "patch"]),
    ])];
    let deployer = [Grant::rules(vec![
        rule("fleetroll.dev", &["fleetrollouts"], &["create", "get"]),
        rule("apps", &["deployments"], &["get", "list", "patch"]),
    ])];
    let (dev1, approver, dev2, creator, rollouts_only, fleet_admin, no_pod_delete, deployer) = tokio::join!(
        Tenant::create(&admin, &t1, "dev", &edit),
        Tenant::create(&admin, &t1, "approver", &approver),
        Tenant::create(&admin, &t2, "dev", &edit),
        Tenant::create(&admin, &t1, "creator", &creator),
        Tenant::create(&admin, &t1, "rollouts-only", &rollouts_only),
        Tenant::create(&admin, &fleet, "platform", &fleet_admin),
        Tenant::create(&admin, &t1, "ds-updater", &no_pod_delete),
        Tenant::create(&admin, &t1, "deployer", &deployer),
    );
    Env {
        admin,
        t1,
        t2,
        fleet,
        dev1,
        approver,
        dev2,
        creator,
        rollouts_only,
        fleet_admin,
        no_pod_delete,
        deployer,
        scratch: Default::default(),
    }
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
            // kubectl create says `The FleetRollout "x" is invalid: <field>: Invalid value: ...`.
            ran.code != 0 && err.contains("is invalid") && err.contains(&format!("{field}: Invalid value"))
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
