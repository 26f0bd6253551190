//! The controls people and agents hold on a rollout (pause, resume, abort, rollback, approvals), shared by
//! the MCP server and the kubectl plugin. Each is a spec write, so GitOps can hold it too.

use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};

use crate::api::{Approval, FleetRollout};

/// Turns an API error into words for a person or an agent.
pub fn explain(e: &kube::Error, what: &str) -> String {
    match e {
        kube::Error::Api(s) if s.code == 404 => format!("{what}: not found"),
        kube::Error::Api(s) if s.code == 422 => format!("{what}: the API server rejected it: {}", s.message),
        kube::Error::Api(s) if s.code == 403 => format!("{what}: not allowed: {}", s.message),
        other => format!("{what}: {other}"),
    }
}

fn what(ns: &str, name: &str) -> String {
    format!("FleetRollout {ns}/{name}")
}

pub async fn get(client: &Client, ns: &str, name: &str) -> Result<FleetRollout, String> {
    Api::<FleetRollout>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| explain(&e, &what(ns, name)))
}

/// The merge patch adding an approval of (`batch`, `plan_hash`, `gates_hash`) to `fr`, replacing any other
/// of that batch, against the version read.
fn approval_patch(
    fr: &FleetRollout,
    batch: u32,
    plan_hash: &str,
    gates_hash: &str,
    who: Option<&str>,
) -> Value {
    let mut approvals: Vec<Approval> =
        fr.spec.approvals.iter().filter(|a| a.batch != batch).cloned().collect();
    approvals.push(Approval {
        batch,
        plan_hash: plan_hash.to_string(),
        gates_hash: gates_hash.to_string(),
        approved_by: who.map(String::from),
    });
    approvals.sort_by_key(|a| a.batch);
    json!({"metadata": {"resourceVersion": fr.resource_version()}, "spec": {"approvals": approvals}})
}

/// Whether the client's user may give `fr` the approval it waits for: a dry run of that very approval, so
/// the API server judges it as it would the real one (RBAC's `approve`, the creator's own rollout, a
/// platform policy's approvers). Ok(false) also when it waits for none, has changed since it was read, or is
/// gone.
pub async fn may_approve(client: &Client, fr: &FleetRollout) -> Result<bool, String> {
    let Some(pending) = crate::core::task::awaited_approval(fr) else { return Ok(false) };
    let (ns, name) = (fr.namespace().unwrap_or_default(), fr.name_any());
    let patch = approval_patch(fr, pending.batch, &pending.plan_hash, &pending.gates_hash, None);
    let pp = PatchParams { dry_run: true, ..Default::default() };
    match Api::<FleetRollout>::namespaced(client.clone(), &ns).patch(&name, &pp, &Patch::Merge(patch)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if matches!(s.code, 403 | 404 | 409) => Ok(false),
        Err(e) => Err(explain(&e, &what(&ns, &name))),
    }
}

/// Sets spec controls (`paused`, `abort`, `rollback`) with a merge patch under `manager`.
pub async fn set(
    client: &Client,
    ns: &str,
    name: &str,
    spec: Value,
    manager: &str,
) -> Result<FleetRollout, String> {
    let pp = PatchParams { field_manager: Some(manager.into()), ..Default::default() };
    Api::<FleetRollout>::namespaced(client.clone(), ns)
        .patch(name, &pp, &Patch::Merge(json!({ "spec": spec })))
        .await
        .map_err(|e| explain(&e, &what(ns, name)))
}

/// What an approval approves; each part defaults to what the rollout waits for now.
#[derive(Clone, Copy, Debug, Default)]
pub struct Approving<'a> {
    pub batch: Option<u32>,
    pub plan_hash: Option<&'a str>,
    pub gates_hash: Option<&'a str>,
}

/// Approves `batch` (default: the one waiting) of `plan_hash` (default: the current plan) under
/// `gates_hash` (default: the rollout's gates as first read here), recording `who` approved when known:
/// the admission policy lets an approval name only the user who writes it. Refuses a plan or gates that are
/// not the rollout's current ones, so what changed under the approver is never approved by mistake.
/// Read-modify-write with the resourceVersion: a concurrent change is never lost.
pub async fn approve(
    client: &Client,
    ns: &str,
    name: &str,
    approving: Approving<'_>,
    who: Option<&str>,
    manager: &str,
) -> Result<FleetRollout, String> {
    let Approving { batch, plan_hash, gates_hash } = approving;
    let api = Api::<FleetRollout>::namespaced(client.clone(), ns);
    let mut approved_gates = gates_hash.map(String::from);
    for _ in 0..5 {
        let fr = get(client, ns, name).await?;
        let status = fr.status.clone().unwrap_or_default();
        let current = status.plan.as_ref().map(|p| p.hash.clone()).ok_or("the rollout has no plan yet")?;
        let plan_hash = plan_hash.map_or_else(|| current.clone(), String::from);
        if plan_hash != current {
            return Err(format!(
                "plan {plan_hash} is not the rollout's plan any more (now {current}): review it and approve again"
            ));
        }
        let gates = crate::core::plan::gates_of(&fr);
        let gates_hash = approved_gates.get_or_insert_with(|| gates.clone()).clone();
        if gates_hash != gates {
            return Err(format!(
                "the rollout's gates (health, analysis, maxFailures, onFailure, approval, resumeToken, approvers) are not {gates_hash} \
                 any more (now {gates}): review them and approve again"
            ));
        }
        let batch = match (batch, &status.pending_approval) {
            (Some(b), _) => b,
            (None, Some(p)) => p.batch,
            (None, None) => {
                return Err("no batch is waiting for approval; name one with the batch argument".into());
            }
        };
        let patch = approval_patch(&fr, batch, &plan_hash, &gates_hash, who);
        let pp = PatchParams { field_manager: Some(manager.into()), ..Default::default() };
        match api.patch(name, &pp, &Patch::Merge(patch)).await {
            Ok(updated) => return Ok(updated),
            Err(e) if crate::error::is_conflict(&e) => continue,
            Err(e) => return Err(explain(&e, &what(ns, name))),
        }
    }
    Err("the rollout kept changing while approving; try again".into())
}
