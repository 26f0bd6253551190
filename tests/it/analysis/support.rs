//! What the analysis tests share: a fleet of Deployments whose traffic a test exporter reports to a real
//! Prometheus, the operator pointed at it, and readers of a rollout's analysis.

use std::{sync::Arc, time::Duration};

use fleetroll::api::FleetRollout;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use testkit::{
    cli::{gitops_judge, repo_path},
    fleet::{Fleet, NEXT_IMAGE, READY_IMAGE},
    operator::Operator,
    prometheus::{Exporter, Options, Prometheus, REQUESTS, REQUESTS_PER_SEC},
};

pub const DEADLINE: Duration = Duration::from_secs(120);

pub struct Lab {
    pub exporter: Arc<Exporter>,
    pub prometheus: Prometheus,
    pub operator: Operator,
}

/// `n` Deployments with traffic and no errors, a Prometheus scraping it (with `options`), and the operator
/// with that Prometheus as its default backend.
pub async fn lab(fleet: &Fleet, n: usize, options: Options, operator_env: &[(&str, &str)]) -> Lab {
    let names = fleet.deployments(&fleet.ns, n, READY_IMAGE).await;
    let exporter = Arc::new(Exporter::start());
    for name in &names {
        exporter.set_rate(&fleet.ns, name, REQUESTS_PER_SEC, 0.0);
    }
    let prometheus = Prometheus::start(&exporter, options).await;
    // rate() over [5s] holds once a whole window of samples lies after the counters' start.
    prometheus.wait_for_series(&format!("min(count_over_time({REQUESTS}[1h])) >= 7")).await;
    let address = format!("--analysis-prometheus-address={}", prometheus.address());
    let operator = Operator::start(&fleet.ns, &[&address], operator_env);
    Lab { exporter, prometheus, operator }
}

/// A rollout spec of the fleet's Deployments with `analysis`, in batches of `batch`.
pub fn spec(batch: u32, on_failure: &str, analysis: Value) -> Value {
    json!({
        "image": NEXT_IMAGE,
        "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
        "strategy": {"batchSize": batch, "onFailure": on_failure},
        "health": {"timeout": "2m"},
        "analysis": analysis,
    })
}

pub fn reason(fr: &FleetRollout) -> String {
    fr.status.as_ref().and_then(|s| s.reason.clone()).unwrap_or_default()
}

const ARGO: &str = "manifests/argocd/resource_customizations/fleetroll.dev/FleetRollout";

/// What GitOps tools make of the rollout, with their own libraries (tests/testenv/gitops-judge): kstatus
/// (cli-utils, and Flux's fork) and Argo CD's health check.
pub async fn judged(fr: &FleetRollout) -> (String, String, String) {
    let object = serde_json::to_value(fr).unwrap();
    let kstatus = gitops_judge(&["kstatus"], &object).await;
    let health = gitops_judge(&["lua-health", &repo_path(&format!("{ARGO}/health.lua"))], &object).await;
    let text = |v: &Value, p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or_default().to_string();
    (text(&kstatus, "/cliUtils/status"), text(&kstatus, "/flux/status"), text(&health, "/status"))
}

/// Argo CD's resume action, offered and run as Argo CD runs it, its merge patch sent as Argo CD sends it.
pub async fn argo_resume(fleet: &Fleet, name: &str) {
    let live = serde_json::to_value(fleet.rollouts().get(name).await.unwrap()).unwrap();
    let offered =
        gitops_judge(&["lua-discovery", &repo_path(&format!("{ARGO}/actions/discovery.lua"))], &live).await;
    assert_eq!(offered["resume"]["disabled"], json!(false), "resume is not offered on {live}");
    let out =
        gitops_judge(&["lua-action", &repo_path(&format!("{ARGO}/actions/resume/action.lua"))], &live).await;
    let patch = out["patch"].clone();
    fleet.rollouts().patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

/// With FLEETROLL_CAPTURE_TESTDATA=1, keeps the live object as the Argo CD customization's testdata `row`
/// (hack/argocd-testdata.py turns it into action tests), without what differs between runs.
pub fn capture(fr: &FleetRollout, row: &str) {
    if std::env::var_os("FLEETROLL_CAPTURE_TESTDATA").is_none() {
        return;
    }
    let mut o = serde_json::to_value(fr).unwrap();
    let meta = o["metadata"].as_object_mut().unwrap();
    meta.retain(|k, _| ["name", "generation"].contains(&k.as_str()));
    meta.insert("namespace".into(), json!("fleet"));
    std::fs::write(repo_path(&format!("{ARGO}/testdata/{row}.yaml")), serde_saphyr::to_string(&o).unwrap())
        .unwrap();
}
