//! `preview_rollout`: the plan a rollout would follow, computed exactly as the operator would, with
//! nothing written.
//!
//! In the rollout's own cluster, discovery runs as the caller (like its writes), so a preview shows only
//! what the caller could list itself. Across member clusters the caller has nothing to read with: the
//! members' credentials are Secrets of the fleet namespace (cluster credentials no caller should hold),
//! and the members do not know the caller. There the server reads the members with its own registry,
//! and only for a caller the API server lets create this very FleetRollout, proved by a dry run as the
//! caller (RBAC, the CRD's rules and the admission policies): the plan is then no more than the operator
//! would compute, and show in the rollout's status, once that caller created it.

use kube::{Api, Client, api::PostParams};
use rmcp::model::CallToolResult;
use serde_json::{Value, json};

use super::{
    args::PreviewArgs,
    auth::Identity,
    ops::{FIELD_MANAGER, Ops},
    tools::{error, ok},
};
use crate::{
    api::FleetRollout,
    core::Blocked,
    edge::{control::ControlError, discovery, members::workloads as member_workloads},
};

impl Ops {
    /// The plan of the rollout `args` describe, as `who` may see it (see the module's documentation).
    pub async fn preview(&self, args: &PreviewArgs, who: &Identity) -> Result<CallToolResult, ControlError> {
        let mut fr = FleetRollout::new("preview", args.as_rollout().spec(None));
        fr.metadata.namespace = Some(args.namespace.clone());
        let client = self.writer.client_for(who)?;
        let previewed = if fr.spec.targets.clusters.is_some() {
            // The answer a rollout outside the fleet namespace gets, before anything is read.
            if let Err(blocked) = member_workloads::may_reach_members(&self.fleet_namespace, &fr) {
                return Ok(blocked_result(&blocked));
            }
            may_create(&client, &fr).await?;
            discovery::preview_members(&self.members, &self.fleet_namespace, &fr).await
        } else {
            // In the rollout's own cluster: no member, no exec plugin.
            let exec = crate::edge::members::ExecPolicy::never("is not run for a preview in one cluster");
            discovery::preview(&client, &self.fleet_namespace, &fr, exec).await
        };
        match previewed {
            Ok(Ok(preview)) => Ok(preview_result(&preview, &args.image)),
            Ok(Err(blocked)) => Ok(blocked_result(&blocked)),
            Err(e) => Err(ControlError::from_operator(e, "discovering the fleet")),
        }
    }
}

fn blocked_result(blocked: &Blocked) -> CallToolResult {
    error(format!("this rollout could not start ({}): {}", blocked.reason, blocked.message))
}

/// Whether `client` (the caller) may create `fr`: a server-side dry run, so every judge of a real create
/// (RBAC, the CRD's validation rules, admission policies) answers, and nothing is stored. Err says what
/// was refused, for the caller.
async fn may_create(client: &Client, fr: &FleetRollout) -> Result<(), ControlError> {
    let ns = fr.metadata.namespace.clone().unwrap_or_default();
    let mut probe = fr.clone();
    // A generated name: an existing rollout of the same name must not make the answer a conflict.
    probe.metadata.name = None;
    probe.metadata.generate_name = Some("preview-".into());
    let pp = PostParams { dry_run: true, field_manager: Some(FIELD_MANAGER.into()) };
    match Api::<FleetRollout>::namespaced(client.clone(), &ns).create(&pp, &probe).await {
        Ok(_) => Ok(()),
        Err(e) => Err(ControlError::from_kube(
            e,
            format!(
                "a preview across member clusters is shown only to callers who may create this FleetRollout \
                 in namespace {ns:?}, and no member cluster was contacted; a dry-run create as you"
            ),
        )),
    }
}

/// What preview_rollout answers: the plan, batch by batch (and across member clusters, the waves and the
/// clusters).
fn preview_result(preview: &discovery::Preview, image: &str) -> CallToolResult {
    let plan = &preview.plan;
    let batches: Vec<Value> = plan
        .batches
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let targets: Vec<Value> = b
                .iter()
                .map(|t| {
                    let mut v =
                        json!({"namespace": t.namespace, "name": t.name, "currentImage": t.previous_image});
                    if !t.cluster.is_empty() {
                        v["cluster"] = json!(t.cluster);
                    }
                    v
                })
                .collect();
            json!({"index": i, "size": b.len(), "targets": targets})
        })
        .collect();
    let mut text = format!(
        "{} targets in {} batches (sizes {}), plan {}.",
        plan.total_targets(),
        plan.total_batches(),
        plan.batches.iter().map(|b| b.len().to_string()).collect::<Vec<_>>().join(", "),
        plan.hash
    );
    if let Some(clusters) = &preview.clusters {
        text.push_str(&format!(" {}.", crate::core::clusters::describe(clusters)));
    }
    for note in &preview.notes {
        text.push_str(&format!(" Left out: {note}."));
    }
    text.push_str(" Nothing was written.");
    let mut structured = json!({"planHash": plan.hash, "image": image, "totalTargets": plan.total_targets(), "batches": batches});
    if let Some(clusters) = &preview.clusters {
        structured["waves"] = json!(clusters.waves);
        structured["clusters"] = json!(clusters.members);
    }
    ok(text, structured)
}
