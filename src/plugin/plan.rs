//! `plan`: the frozen plan of a rollout, or a preview of the one a manifest would get (nothing written).

use std::{path::Path, process::ExitCode};

use kube::{Client, ResourceExt};
use serde::Serialize;

use super::{Exit, PluginError, args::Output, print};
use crate::{
    api::{ClusterCount, ClustersStatus, FleetRollout, WaveStatus},
    core::{clusters, plan::Plan},
    edge::{
        control::{self, ControlError},
        discovery,
        members::ExecPolicy,
        plans::PlanStore,
    },
};

/// A plan as the plugin prints it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PlanView {
    plan_hash: String,
    total_targets: u32,
    batches: Vec<BatchView>,
    /// True when this is what the rollout would get (nothing frozen or written yet).
    preview: bool,
    /// Across member clusters: the waves, with their batches and clusters.
    #[serde(skip_serializing_if = "Option::is_none")]
    waves: Option<Vec<WaveStatus>>,
    /// Across member clusters: the targets per cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    clusters: Option<Vec<ClusterCount>>,
    /// What the plan leaves out, and why: member Secrets refused, clusters that did not answer or have no
    /// target, waves left empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    left_out: Vec<String>,
    /// The waves in one line (text output only).
    #[serde(skip)]
    waves_line: Option<String>,
}

#[derive(Serialize)]
struct BatchView {
    batch: u32,
    targets: Vec<String>,
    /// The analysis queries one measurement of this batch sends, placeholders replaced.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    queries: Vec<QueryView>,
}

#[derive(Serialize)]
struct QueryView {
    metric: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<String>,
    query: String,
}

/// What a plan says of member clusters besides its batches: the waves and counts, and what it leaves out.
#[derive(Default)]
struct Across {
    clusters: Option<ClustersStatus>,
    left_out: Vec<String>,
}

impl Across {
    /// A frozen plan's, from the rollout's status.
    fn of_status(fr: &FleetRollout) -> Self {
        let clusters = fr.status.as_ref().and_then(|s| s.clusters.clone());
        let left_out = clusters.iter().flat_map(|c| &c.left_out).map(|t| {
            format!("member cluster {} did not answer when the plan was made: {}", t.name, t.message)
        });
        Across { left_out: left_out.collect(), clusters }
    }
}

fn plan_view(fr: &FleetRollout, plan: &Plan, preview: bool, across: Across) -> PlanView {
    let metrics = fr.spec.analysis.as_ref().map_or(&[][..], |a| a.metrics.as_slice());
    let waves_line = across.clusters.as_ref().filter(|c| !c.waves.is_empty()).map(clusters::describe);
    let (waves, members) = across.clusters.map(|c| (c.waves, c.members)).unzip();
    PlanView {
        plan_hash: plan.hash.clone(),
        total_targets: plan.total_targets(),
        batches: plan
            .batches
            .iter()
            .enumerate()
            .map(|(i, b)| BatchView {
                batch: i as u32 + 1,
                targets: b.iter().map(|t| t.key()).collect(),
                queries: metrics
                    .iter()
                    .flat_map(|m| crate::core::analysis::queries(m, b))
                    .map(|q| QueryView { metric: q.metric, target: q.target, query: q.promql })
                    .collect(),
            })
            .collect(),
        preview,
        waves,
        clusters: members,
        left_out: across.left_out,
        waves_line,
    }
}

/// What member Secrets' exec plugins may do in a preview: nothing, unless the person running it asks
/// (`--run-exec-plugins`: then what the operator allows by default). A plugin would run on this machine,
/// with this person's environment and cloud credentials, chosen by whoever wrote the Secret.
pub(super) fn exec_policy(run: bool) -> ExecPolicy {
    match run {
        true => ExecPolicy::default(),
        false => ExecPolicy::never(
            "is not run by kubectl fleetroll plan, which leaves this member out: it would run on this machine, \
             with your environment and cloud credentials (--run-exec-plugins runs it)",
        ),
    }
}

/// The plan of the rollout `name`, or of the manifest `file` (in namespace `ns` unless it names one), across
/// member clusters through the fleet namespace's Secrets, their exec plugins run as `exec` allows.
pub(super) async fn plan(
    client: &Client,
    ns: &str,
    name: Option<&str>,
    file: Option<&Path>,
    fleet_namespace: &str,
    exec: ExecPolicy,
    output: Option<Output>,
) -> Result<ExitCode, PluginError> {
    let (fr, frozen) = match (name, file) {
        (Some(name), _) => {
            let fr = control::get(client, ns, name).await?;
            let frozen = frozen_plan(client, &fr).await?;
            (fr, frozen)
        }
        (None, Some(path)) => (read_manifest(path, ns)?, None),
        (None, None) => {
            return Err(PluginError::Usage("name a FleetRollout, or give a manifest with -f".into()));
        }
    };
    let view = match frozen {
        Some(plan) => plan_view(&fr, &plan, false, Across::of_status(&fr)),
        None => {
            let previewed = discovery::preview(client, fleet_namespace, &fr, exec).await;
            match previewed.map_err(|e| ControlError::from_operator(e, "discovering the fleet"))? {
                Ok(preview) => {
                    let across = Across { clusters: preview.clusters, left_out: preview.notes };
                    plan_view(&fr, &preview.plan, true, across)
                }
                Err(blocked) => {
                    return Err(PluginError::Refused(format!(
                        "this rollout could not be planned ({}): {}",
                        blocked.reason, blocked.message
                    )));
                }
            }
        }
    };
    match output {
        Some(o) => print(&view, o)?,
        None => print!("{}", plan_text(&fr, &view)),
    }
    Ok(Exit::Done.into())
}

/// The plan the rollout froze, if it has one yet.
async fn frozen_plan(client: &Client, fr: &FleetRollout) -> Result<Option<Plan>, PluginError> {
    let Some(plan_ref) = fr.status.as_ref().and_then(|s| s.plan.as_ref()) else {
        return Ok(None);
    };
    let loaded = PlanStore::default()
        .load(client, fr, plan_ref)
        .await
        .map_err(|e| ControlError::from_operator(e, "reading the frozen plan"))?
        .map_err(|refused| PluginError::Refused(format!("{}: {}", refused.reason, refused.message)))?;
    Ok(Some(loaded.plan.clone()))
}

fn read_manifest(path: &Path, ns: &str) -> Result<FleetRollout, PluginError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| PluginError::Usage(format!("reading {}: {e}", path.display())))?;
    let mut fr: FleetRollout = serde_saphyr::from_str(&text)
        .map_err(|e| PluginError::Usage(format!("{} is not a FleetRollout: {e}", path.display())))?;
    if fr.metadata.namespace.is_none() {
        fr.metadata.namespace = Some(ns.to_string());
    }
    Ok(fr)
}

/// The human view of a plan: what it rolls where, then its batches one per line.
fn plan_text(fr: &FleetRollout, view: &PlanView) -> String {
    let kind = if view.preview { "would roll" } else { "rolls" };
    let mut out = format!(
        "FleetRollout {}/{} {kind} {} targets in {} batches to {} (plan {}):\n",
        fr.namespace().unwrap_or_default(),
        fr.name_any(),
        view.total_targets,
        view.batches.len(),
        fr.spec.image,
        view.plan_hash
    );
    if let Some(waves) = &view.waves_line {
        out.push_str(&format!("  {waves}\n"));
    }
    for b in &view.batches {
        out.push_str(&format!(
            "  batch {:>3}  ({:>3})  {}\n",
            b.batch,
            b.targets.len(),
            b.targets.join(", ")
        ));
        for q in &b.queries {
            let whose = q.target.as_ref().map(|t| format!(" ({t})")).unwrap_or_default();
            out.push_str(&format!("             {}{whose}: {}\n", q.metric, q.query));
        }
    }
    for why in &view.left_out {
        out.push_str(&format!("Left out: {why}\n"));
    }
    if view.preview {
        out.push_str("Nothing was written.\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::PlannedTarget;

    fn target(namespace: &str, name: &str) -> PlannedTarget {
        PlannedTarget {
            namespace: namespace.into(),
            name: name.into(),
            previous_image: "web:v1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_preview_runs_no_exec_plugin_unless_asked() {
        let refused = exec_policy(false).refusal("prod", "kubelogin", &["get-token".into()], &[]);
        let refused = refused.expect("refused");
        assert!(
            refused.contains("\"kubelogin\" of member cluster \"prod\" is not run by kubectl fleetroll plan")
        );
        assert!(refused.contains("--run-exec-plugins"), "{refused}");
        assert_eq!(exec_policy(true), ExecPolicy::default(), "asked: what the operator allows by default");
    }

    #[test]
    fn a_preview_lists_its_batches_one_based_and_says_nothing_was_written() {
        let fr: FleetRollout = serde_json::from_value(json!({
            "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"image": "web:v2", "targets": {"kind": "Deployment", "selector": {}}}
        }))
        .unwrap();
        let plan = Plan {
            hash: "abc".into(),
            batches: vec![vec![target("shop", "a")], vec![target("shop", "b"), target("team", "c")]],
        };
        let preview = plan_text(&fr, &plan_view(&fr, &plan, true, Across::default()));
        assert_eq!(
            preview,
            "FleetRollout shop/web would roll 3 targets in 2 batches to web:v2 (plan abc):\n\
             \x20 batch   1  (  1)  shop/a\n\
             \x20 batch   2  (  2)  shop/b, team/c\n\
             Nothing was written.\n"
        );
        let frozen = plan_text(&fr, &plan_view(&fr, &plan, false, Across::default()));
        assert!(frozen.starts_with("FleetRollout shop/web rolls 3 targets"), "{frozen}");
        assert!(!frozen.contains("Nothing was written"), "{frozen}");
    }

    #[test]
    fn across_member_clusters_the_plan_shows_its_waves_and_what_it_left_out() {
        let fr: FleetRollout = serde_json::from_value(json!({
            "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
            "metadata": {"name": "web", "namespace": "fleet"},
            "spec": {"image": "web:v2", "targets": {"kind": "Deployment", "selector": {},
                     "clusters": {"selector": {}}}},
            "status": {"clusters": {"leftOut": [{"name": "edge-7", "reason": "ClusterUnreachable",
                     "message": "no answer within 20s", "since": "2026-12-01T00:00:00Z"}]}}
        }))
        .unwrap();
        let member =
            |cluster: &str, name: &str| PlannedTarget { cluster: cluster.into(), ..target("shop", name) };
        let plan = Plan {
            hash: "abc".into(),
            batches: vec![vec![member("canary", "a")], vec![member("eu-1", "a"), member("eu-1", "b")]],
        };
        let waves = [
            crate::core::clusters::PlannedWave {
                name: "canary".into(),
                clusters: vec!["canary".into()],
                max_concurrency: None,
            },
            crate::core::clusters::PlannedWave {
                name: "eu".into(),
                clusters: vec!["eu-1".into()],
                max_concurrency: None,
            },
        ];
        let across = Across {
            clusters: Some(crate::core::clusters::planned_status(&waves, &plan.batches)),
            left_out: vec!["member cluster lab has no target: nothing in it matches the rollout".into()],
        };
        let preview = plan_text(&fr, &plan_view(&fr, &plan, true, across));
        assert!(
            preview.contains(
                "  waves: canary: canary (1 targets, batches 1-1); eu: eu-1 (2 targets, batches 2-2)\n\
                 \x20 batch   1  (  1)  canary/shop/a\n"
            ),
            "{preview}"
        );
        assert!(preview.contains("Left out: member cluster lab has no target"), "{preview}");
        // A frozen plan's come from status.
        let view = plan_view(&fr, &plan, false, Across::of_status(&fr));
        assert_eq!(
            view.left_out,
            ["member cluster edge-7 did not answer when the plan was made: no answer within 20s"]
        );
        let json = serde_json::to_value(plan_view(&fr, &plan, true, Across::default())).unwrap();
        assert!(json.get("waves").is_none() && json.get("leftOut").is_none(), "{json}");
    }

    #[test]
    fn the_plan_shows_the_queries_each_batch_sends() {
        let fr: FleetRollout = serde_json::from_value(json!({
            "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"image": "web:v2", "targets": {"kind": "Deployment", "selector": {}}, "analysis": {"metrics": [
                {"name": "errors", "query": "e{d=~\"{{targets}}\"}", "thresholdRange": {"max": 0}},
                {"name": "up", "scope": "Target", "query": "up{d=\"{{name}}\"}", "thresholdRange": {"min": 1}},
            ]}}
        }))
        .unwrap();
        let plan =
            Plan { hash: "abc".into(), batches: vec![vec![target("shop", "a.v2"), target("shop", "b")]] };
        let text = plan_text(&fr, &plan_view(&fr, &plan, true, Across::default()));
        assert!(text.contains("             errors: e{d=~\"a\\\\.v2|b\"}\n"), "{text}");
        assert!(text.contains("             up (shop/b): up{d=\"b\"}\n"), "{text}");
    }
}
