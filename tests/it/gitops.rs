//! GitOps tools see a rollout's real state. Live FleetRollouts go through every phase on the real control
//! plane, and every version of them the API server hands out is judged by the libraries those tools run
//! (tests/testenv/gitops-judge): kstatus as cli-utils and Flux compute it, Flux's healthCheckExprs evaluator
//! on the documented Kustomization, and Argo CD's health.lua in gopher-lua. The rollouts are driven by
//! Argo CD's own actions: each runs in gopher-lua, and its merge patch is sent the way Argo CD sends it.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use fleetroll::api::{FleetRollout, Phase};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api, ResourceExt,
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::{Value, json};
use testkit::{
    cli::{gitops_judge, repo_path},
    fleet::{Fleet, NEXT_IMAGE, READY_IMAGE, UNREADY_IMAGE, deployment, phase, with_fleet},
    operator::Operator,
    poll_until,
    tenant::{Grant, Tenant},
    wait_for,
};

const DEADLINE: Duration = Duration::from_secs(180);
const ARGO: &str = "manifests/argocd/resource_customizations/fleetroll.dev/FleetRollout";
const FLUX_CEL: &str = "manifests/flux/kustomization-healthcheckexprs.yaml";

/// The rows of the table in the GitOps chapter (docs/src/gitops.md): what a rollout is, as far as GitOps
/// tools are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Row {
    /// Just created: the operator has not seen it (status is the CRD's default).
    Unseen,
    /// The spec changed and the operator has not observed the change yet.
    Stale,
    Blocked,
    Progressing,
    Paused,
    PausedByFailures,
    WaitingForApproval,
    RollingBack,
    Succeeded,
    /// Succeeded, and someone else has changed the image of one of its targets since.
    ChangedByOthers,
    Failed,
    Aborted,
    RolledBack,
}

const ALL: [Row; 13] = [
    Row::Unseen,
    Row::Stale,
    Row::Blocked,
    Row::Progressing,
    Row::Paused,
    Row::PausedByFailures,
    Row::WaitingForApproval,
    Row::RollingBack,
    Row::Succeeded,
    Row::ChangedByOthers,
    Row::Failed,
    Row::Aborted,
    Row::RolledBack,
];

/// A row's name in testdata file names: `waiting-for-approval`.
fn kebab(r: Row) -> String {
    format!("{r:?}").chars().fold(String::new(), |mut out, c| {
        if c.is_uppercase() && !out.is_empty() {
            out.push('-');
        }
        out.push(c.to_ascii_lowercase());
        out
    })
}

/// kstatus (and Flux's CEL, which must agree) and Argo CD health, per row: the table in docs/src/gitops.md.
fn expected(row: Row) -> (&'static str, &'static str) {
    match row {
        Row::Unseen | Row::Stale | Row::Progressing | Row::RollingBack => ("InProgress", "Progressing"),
        Row::Paused | Row::WaitingForApproval => ("InProgress", "Suspended"),
        Row::Succeeded => ("Current", "Healthy"),
        Row::Blocked
        | Row::PausedByFailures
        | Row::ChangedByOthers
        | Row::Failed
        | Row::Aborted
        | Row::RolledBack => ("Failed", "Degraded"),
    }
}

fn row(object: &Value) -> Row {
    let generation = object.pointer("/metadata/generation").and_then(Value::as_i64).unwrap();
    let status = object.get("status").expect("the API server always returns a status (the CRD's default)");
    let observed = status.get("observedGeneration").and_then(Value::as_i64).unwrap_or(0);
    if observed == 0 {
        return Row::Unseen;
    }
    if observed < generation {
        return Row::Stale;
    }
    let text = |p: &str| status.pointer(p).and_then(Value::as_str).unwrap_or_default();
    let degraded = status["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Degraded" && c["status"] == "True"));
    match (text("/phase"), degraded) {
        ("Pending", true) => Row::Blocked,
        ("Progressing", _) => Row::Progressing,
        ("Paused", true) => Row::PausedByFailures,
        ("Paused", false) => Row::Paused,
        ("WaitingForApproval", _) => Row::WaitingForApproval,
        ("RollingBack", _) => Row::RollingBack,
        ("Succeeded", false) => Row::Succeeded,
        ("Succeeded", true) => Row::ChangedByOthers,
        ("Failed", _) => Row::Failed,
        ("Aborted", _) => Row::Aborted,
        ("RolledBack", _) => Row::RolledBack,
        other => panic!("no row for {other:?}: {object}"),
    }
}

/// What each tool says of one version of a rollout.
async fn judge(object: &Value) -> (String, String, String, String) {
    let kstatus = gitops_judge(&["kstatus"], object).await;
    let cel = gitops_judge(&["flux-cel", &repo_path(FLUX_CEL)], object).await;
    let health = gitops_judge(&["lua-health", &repo_path(&format!("{ARGO}/health.lua"))], object).await;
    let text = |v: &Value, p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or_default().to_string();
    (
        text(&kstatus, "/cliUtils/status"),
        text(&kstatus, "/flux/status"),
        text(&cel, "/status"),
        format!("{}: {}", text(&health, "/status"), text(&health, "/message")),
    )
}

/// Every version of every FleetRollout in the namespace, as the API server sends it to watchers; returns
/// once the watch is established, so no version written afterwards is missed.
async fn record(fleet: &Fleet) -> Arc<Mutex<Vec<Value>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let api: Api<DynamicObject> =
        Api::namespaced_with(fleet.client.clone(), &fleet.ns, &ApiResource::erase::<FleetRollout>(&()));
    let (ready, established) = tokio::sync::oneshot::channel();
    let sink = seen.clone();
    tokio::spawn(async move {
        let mut ready = Some(ready);
        // A watch error is retried with backoff, and the versions written meanwhile come with the relist.
        let mut events = watcher(api, watcher::Config::default()).default_backoff().boxed();
        while let Some(event) = events.next().await {
            match event.unwrap_or(watcher::Event::Init) {
                watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                    sink.lock().unwrap().push(serde_json::to_value(o).unwrap());
                }
                watcher::Event::InitDone => {
                    if let Some(r) = ready.take() {
                        let _ = r.send(());
                    }
                }
                _ => {}
            }
        }
    });
    established.await.expect("the watch of FleetRollouts started");
    seen
}

/// Waits until the recorder holds the current version of every rollout: the waits of `drive` watch on
/// their own, and a last version must not go unjudged because its event has not reached the recorder yet.
async fn caught_up(fleet: &Fleet, seen: &Arc<Mutex<Vec<Value>>>) {
    let current: Vec<String> = fleet
        .rollouts()
        .list(&Default::default())
        .await
        .unwrap()
        .iter()
        .filter_map(|f| f.resource_version())
        .collect();
    poll_until("the recorder to hold every rollout's current version", DEADLINE, || {
        let recorded = seen.lock().unwrap();
        let has = |rv: &String| {
            recorded
                .iter()
                .any(|o| o.pointer("/metadata/resourceVersion").and_then(Value::as_str) == Some(rv))
        };
        std::future::ready(current.iter().all(has))
    })
    .await;
}

/// Runs an Argo CD action on the live rollout: the script in gopher-lua, then its merge patch, as Argo CD's
/// server does (it refuses an action that discovery.lua disables, and so does this).
async fn argo_action(fleet: &Fleet, name: &str, action: &str) {
    argo_action_as(fleet, &fleet.client, name, action).await.unwrap_or_else(|e| {
        panic!("Argo CD's {action} patch was refused: {e}");
    });
}

/// Runs an Argo CD action's Lua on the live rollout and applies its patch with `client` (the identity Argo CD
/// acts with).
async fn argo_action_as(fleet: &Fleet, client: &kube::Client, name: &str, action: &str) -> kube::Result<()> {
    let live = serde_json::to_value(fleet.rollouts().get(name).await.unwrap()).unwrap();
    let offered =
        gitops_judge(&["lua-discovery", &repo_path(&format!("{ARGO}/actions/discovery.lua"))], &live).await;
    assert_eq!(offered[action]["disabled"], json!(false), "{action} is not offered on {live}");
    let script = repo_path(&format!("{ARGO}/actions/{action}/action.lua"));
    let out = gitops_judge(&["lua-action", &script], &live).await;
    let patch = out["patch"].clone();
    let api: Api<FleetRollout> = Api::namespaced(client.clone(), &fleet.ns);
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(drop)
}

async fn group(fleet: &Fleet, label: &str, n: usize) {
    let api: Api<Deployment> = Api::namespaced(fleet.client.clone(), &fleet.ns);
    for i in 0..n {
        let d = deployment(&format!("{label}-{i}"), READY_IMAGE, &[("group", label)]);
        api.create(&PostParams::default(), &d).await.unwrap();
    }
    for i in 0..n {
        wait_for(&api, &format!("{label}-{i}"), "the Deployment to be available", DEADLINE, |d| {
            d.status.as_ref().and_then(|s| s.available_replicas) == Some(1)
        })
        .await;
    }
}

fn spec(group: &str, image: &str, extra: Value) -> Value {
    let mut spec = json!({
        "image": image,
        "targets": {"kind": "Deployment", "selector": {"matchLabels": {"group": group}}},
        "strategy": {"batchSize": 1},
        "health": {"timeout": "5s"},
    });
    for (k, v) in extra.as_object().unwrap() {
        match (spec.get_mut(k), v) {
            (Some(Value::Object(base)), Value::Object(more)) => base.extend(more.clone()),
            _ => {
                spec[k] = v.clone();
            }
        }
    }
    spec
}

async fn wait_phase(fleet: &Fleet, name: &str, want: Phase) -> FleetRollout {
    fleet.wait_rollout(name, &format!("{name} to be {want}"), DEADLINE, |f| phase(f) == want).await
}

/// Seven rollouts, driven by Argo CD actions through every phase.
async fn drive(fleet: &Fleet) {
    // approve → Succeeded.
    fleet.rollout("gated", spec("gated", NEXT_IMAGE, json!({"strategy": {"approval": "FirstBatch"}}))).await;
    // resume → Succeeded.
    fleet.rollout("paused", spec("paused", NEXT_IMAGE, json!({"paused": true}))).await;
    // Soaks, then abort → Aborted.
    fleet.rollout("soaking", spec("soaking", NEXT_IMAGE, json!({"health": {"soak": "1h"}}))).await;
    // Its targets never become ready: the failure budget pauses it, then rollback → RollingBack → RolledBack.
    fleet
        .rollout("failing", spec("failing", UNREADY_IMAGE, json!({"strategy": {"onFailure": "Pause"}})))
        .await;
    // Its failure policy rolls it back: RollingBack (FailureBudgetExceeded), then RolledBack.
    fleet
        .rollout(
            "autorollback",
            spec("autorollback", UNREADY_IMAGE, json!({"strategy": {"onFailure": "Rollback"}})),
        )
        .await;
    // Fails by its own policy.
    fleet.rollout("failed", spec("failed", UNREADY_IMAGE, json!({"strategy": {"onFailure": "Abort"}}))).await;
    // Nothing to roll: cannot be acted on.
    fleet.rollout("blocked", spec("nothing", NEXT_IMAGE, json!({}))).await;

    let _op = Operator::start(&fleet.ns, &[], &[]);
    wait_phase(fleet, "gated", Phase::WaitingForApproval).await;
    // Argo CD acting with an identity that may patch the rollout but holds no approve verb: refused.
    let editor =
        Tenant::create(&fleet.client, &fleet.ns, "argo-editor", &[Grant::cluster_role("edit")]).await;
    match argo_action_as(fleet, &editor.client, "gated", "approve").await {
        Err(kube::Error::Api(e)) => assert!(e.code == 403 && e.message.contains("may not approve"), "{e:?}"),
        other => panic!("an editor without the approve verb approved through Argo CD's action: {other:?}"),
    }
    assert!(fleet.rollouts().get("gated").await.unwrap().spec.approvals.is_empty());
    argo_action(fleet, "gated", "approve").await;
    wait_phase(fleet, "paused", Phase::Paused).await;
    argo_action(fleet, "paused", "resume").await;
    fleet
        .wait_rollout("soaking", "soaking to soak", DEADLINE, |f| {
            f.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("Soaking")
        })
        .await;
    argo_action(fleet, "soaking", "abort").await;
    wait_phase(fleet, "failing", Phase::Paused).await;
    argo_action(fleet, "failing", "rollback").await;
    // After success, Argo CD (not configured to leave fleetroll the image) syncs Git's image back.
    wait_phase(fleet, "paused", Phase::Succeeded).await;
    let git = deployment("paused-0", READY_IMAGE, &[("group", "paused")]);
    Api::<Deployment>::namespaced(fleet.client.clone(), &fleet.ns)
        .patch("paused-0", &PatchParams::apply("argocd-controller").force(), &Patch::Apply(&git))
        .await
        .unwrap();
    fleet
        .wait_rollout("paused", "the change to be seen", DEADLINE, |f| {
            f.status.as_ref().is_some_and(|s| s.changed_by_others.as_ref().is_some_and(|c| c.count == 1))
        })
        .await;
    fleet.wait_events("paused", &["ImageChangedByOthers"], DEADLINE).await;
    for (name, end) in [
        ("gated", Phase::Succeeded),
        ("paused", Phase::Succeeded),
        ("soaking", Phase::Aborted),
        ("failing", Phase::RolledBack),
        ("autorollback", Phase::RolledBack),
        ("failed", Phase::Failed),
    ] {
        wait_phase(fleet, name, end).await;
    }
    fleet
        .wait_rollout("blocked", "blocked to be refused", DEADLINE, |f| {
            f.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("NoTargets")
        })
        .await;
}

/// With FLEETROLL_CAPTURE_TESTDATA=1, keeps one live object per row as the Argo CD customization's
/// testdata (the layout Argo CD's resource_customizations use), without what differs between runs. A
/// running rollout is taken from one that is not paused by spec, so the pause action has work to do.
fn capture(r: Row, object: &Value) -> bool {
    let paused_by_spec = object.pointer("/spec/paused") == Some(&json!(true));
    if std::env::var_os("FLEETROLL_CAPTURE_TESTDATA").is_none() || (r == Row::Progressing && paused_by_spec) {
        return false;
    }
    let mut o = object.clone();
    let meta = o["metadata"].as_object_mut().unwrap();
    meta.retain(|k, _| ["name", "generation"].contains(&k.as_str()));
    meta.insert("namespace".into(), json!("fleet"));
    let path = repo_path(&format!("{ARGO}/testdata/{}.yaml", kebab(r)));
    std::fs::write(&path, serde_saphyr::to_string(&o).unwrap()).unwrap();
    true
}

#[tokio::test]
async fn kstatus_flux_and_argo_cd_see_every_phase_as_documented() {
    with_fleet("gitops", 0, |fleet| async move {
        let groups =
            [("gated", 2), ("paused", 1), ("soaking", 1), ("failing", 2), ("autorollback", 1), ("failed", 1)];
        for (label, n) in groups {
            group(&fleet, label, n).await;
        }
        let seen = record(&fleet).await;
        drive(&fleet).await;
        caught_up(&fleet, &seen).await;

        // Judge each distinct version once (the watch may hand one out again after a relist).
        let versions: BTreeMap<String, Value> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|o| (o.pointer("/metadata/resourceVersion").unwrap().to_string(), o.clone()))
            .collect();
        let mut rows = BTreeSet::new();
        let mut captured = BTreeSet::new();
        let mut table = Vec::new();
        for object in versions.values() {
            let r = row(object);
            let (kstatus, flux, cel, health) = judge(object).await;
            let (want_kstatus, want_health) = expected(r);
            let name = object.pointer("/metadata/name").unwrap();
            let what =
                format!("{name} {r:?}: kstatus {kstatus}, Flux {flux}, Flux CEL {cel}, Argo CD {health}");
            assert_eq!(
                (kstatus.as_str(), flux.as_str(), cel.as_str()),
                (want_kstatus, want_kstatus, want_kstatus),
                "{what}"
            );
            assert!(health.starts_with(&format!("{want_health}: ")), "{what}");
            if rows.insert(r) {
                table.push(what);
            }
            if !captured.contains(&r) && capture(r, object) {
                captured.insert(r);
            }
        }
        eprintln!("{}", table.join("\n"));

        let missing: Vec<_> = ALL.iter().filter(|r| !rows.contains(r)).collect();
        assert!(missing.is_empty(), "phases never seen live: {missing:?}");
    })
    .await;
}

/// The health a person reads in Argo CD says why: the operator's own message, or the reason it is stuck.
#[tokio::test]
async fn argo_cd_health_carries_the_reason() {
    with_fleet("gitops-why", 0, |fleet| async move {
        fleet.rollout("nothing", spec("none", NEXT_IMAGE, json!({}))).await;
        let unseen = serde_json::to_value(fleet.rollouts().get("nothing").await.unwrap()).unwrap();
        let (kstatus, _, _, health) = judge(&unseen).await;
        assert_eq!(
            (kstatus.as_str(), health.as_str()),
            ("InProgress", "Progressing: Waiting for the fleetroll operator to observe generation 1")
        );
        let _op = Operator::start(&fleet.ns, &[], &[]);
        let fr = fleet
            .wait_rollout("nothing", "the rollout to be refused", DEADLINE, |f| {
                f.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("NoTargets")
            })
            .await;
        let (_, _, _, health) = judge(&serde_json::to_value(&fr).unwrap()).await;
        assert!(health.starts_with("Degraded: NoTargets: "), "{health}");
        // Argo CD offers no action that would not do anything on it.
        let offered = gitops_judge(
            &["lua-discovery", &repo_path(&format!("{ARGO}/actions/discovery.lua"))],
            &serde_json::to_value(&fr).unwrap(),
        )
        .await;
        assert_eq!(offered["approve"]["disabled"], json!(true), "{offered}");
        assert_eq!(offered["resume"]["disabled"], json!(true), "{offered}");
    })
    .await;
}

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(repo_path(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The customization's own tests, in the files Argo CD's harness reads (health_test.yaml,
/// actions/action_test.yaml), run with the same interpreter: what we would send upstream passes there.
#[tokio::test]
async fn the_argo_cd_customization_passes_its_own_test_files() {
    let health = repo_path(&format!("{ARGO}/health.lua"));
    let tests = yaml(&format!("{ARGO}/health_test.yaml"));
    let cases = tests["tests"].as_array().unwrap();
    let files: BTreeSet<String> = cases
        .iter()
        .map(|c| c["inputPath"].as_str().unwrap().trim_start_matches("testdata/").into())
        .collect();
    let rows: BTreeSet<String> = ALL.iter().map(|r| format!("{}.yaml", kebab(*r))).collect();
    assert_eq!(files, rows, "a case per row of the table, captured live");
    for case in cases {
        let input = yaml(&format!("{ARGO}/{}", case["inputPath"].as_str().unwrap()));
        let got = gitops_judge(&["lua-health", &health], &input).await;
        assert_eq!(got, case["healthStatus"], "{}", case["inputPath"]);
        // The expectation is the table's, not only what the script said when the file was written.
        let r = row(&input);
        assert!(case["inputPath"].as_str().unwrap().ends_with(&format!("/{}.yaml", kebab(r))));
        assert_eq!(got["status"], json!(expected(r).1), "{}", case["inputPath"]);
    }
    let actions = yaml(&format!("{ARGO}/actions/action_test.yaml"));
    let discovery = repo_path(&format!("{ARGO}/actions/discovery.lua"));
    for case in actions["discoveryTests"].as_array().unwrap() {
        let input = yaml(&format!("{ARGO}/actions/{}", case["inputPath"].as_str().unwrap()));
        let offered = gitops_judge(&["lua-discovery", &discovery], &input).await;
        // As Argo CD's harness compares them: whole entries (name, disabled, iconClass).
        let offered: BTreeMap<String, Value> = offered
            .as_object()
            .unwrap()
            .iter()
            .map(|(name, a)| {
                (name.clone(), json!({"name": name, "disabled": a["disabled"], "iconClass": a["iconClass"]}))
            })
            .collect();
        let wanted: BTreeMap<String, Value> = case["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| (w["name"].as_str().unwrap().to_string(), w.clone()))
            .collect();
        assert_eq!(offered, wanted, "{}", case["inputPath"]);
    }
    for case in actions["actionTests"].as_array().unwrap() {
        let action = case["action"].as_str().unwrap();
        let input = yaml(&format!("{ARGO}/actions/{}", case["inputPath"].as_str().unwrap()));
        let script = repo_path(&format!("{ARGO}/actions/{action}/action.lua"));
        let out = gitops_judge(&["lua-action", &script], &input).await;
        let expected = yaml(&format!("{ARGO}/actions/{}", case["expectedOutputPath"].as_str().unwrap()));
        assert_eq!(out["object"], expected, "{action} on {}", case["inputPath"]);
        assert!(
            out["patch"].get("status").is_none() && out["patch"]["spec"].is_object(),
            "{action}: {}",
            out["patch"]
        );
    }
}

/// The argocd-cm patch the GitOps chapter says to apply carries exactly the tested scripts, in the shape
/// Argo CD reads: the health script as is, the actions as a YAML document of discovery.lua and definitions.
#[test]
fn the_argocd_cm_patch_carries_the_tested_scripts() {
    let read = |p: &str| std::fs::read_to_string(repo_path(&format!("{ARGO}/{p}"))).unwrap();
    let cm = yaml("manifests/argocd/argocd-cm-patch.yaml");
    let data = &cm["data"];
    assert_eq!(data["resource.customizations.health.fleetroll.dev_FleetRollout"], json!(read("health.lua")));
    let actions: Value = serde_saphyr::from_str(
        data["resource.customizations.actions.fleetroll.dev_FleetRollout"].as_str().expect("the actions"),
    )
    .expect("the actions are YAML");
    assert_eq!(actions["discovery.lua"], json!(read("actions/discovery.lua")));
    let definitions = actions["definitions"].as_array().unwrap();
    let names: BTreeSet<&str> = definitions.iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(names, BTreeSet::from(["abort", "approve", "pause", "resume", "rollback"]));
    for d in definitions {
        let name = d["name"].as_str().unwrap();
        assert_eq!(d["action.lua"], json!(read(&format!("actions/{name}/action.lua"))), "{name}");
    }
}

/// Whatever the object, the health check answers and discovery offers actions: a Lua error would show in
/// Argo CD as Unknown health with the error instead of the rollout's state.
#[tokio::test]
async fn the_argo_cd_scripts_answer_on_malformed_objects() {
    let health = repo_path(&format!("{ARGO}/health.lua"));
    let discovery = repo_path(&format!("{ARGO}/actions/discovery.lua"));
    let base = json!({"apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout"});
    let variants = [
        json!({"metadata": "x", "spec": "y", "status": "z"}),
        json!({"metadata": {"name": "a", "generation": "3"}, "status": {"observedGeneration": "x"}}),
        json!({"metadata": {"name": "a", "generation": 1}, "status": {"observedGeneration": 1, "conditions": "c"}}),
        json!({"metadata": {"name": "a", "generation": 1}, "spec": {"approvals": 7}, "status": {
            "observedGeneration": 1, "phase": 5, "message": {"m": 1}, "counts": "n", "pendingApproval": [],
            "conditions": ["s", 1, {"type": "Stalled", "status": "True"}, {"type": "Stalled", "reason": 2}],
        }}),
    ];
    for variant in variants {
        let mut object = base.clone();
        object.as_object_mut().unwrap().extend(variant.as_object().unwrap().clone());
        let h = gitops_judge(&["lua-health", &health], &object).await;
        let valid = ["Healthy", "Progressing", "Degraded", "Suspended"];
        assert!(valid.contains(&h["status"].as_str().unwrap_or_default()), "{h} for {object}");
        assert!(h["message"].is_string(), "{h} for {object}");
        let offered = gitops_judge(&["lua-discovery", &discovery], &object).await;
        assert_eq!(offered["approve"]["disabled"], json!(true), "{offered} for {object}");
    }
}
