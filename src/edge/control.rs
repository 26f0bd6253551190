//! The controls people and agents hold on a rollout (pause, resume, abort, rollback, approvals), shared by
//! the MCP server and the kubectl plugin. Each is a spec write, so GitOps can hold it too.

use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};

use crate::api::{Approval, FleetRollout};

/// Why a control, a read or a start did not happen, told apart where callers branch on it: the MCP server
/// maps each kind to a JSON-RPC code once (`mcp::handler`'s `rpc_error`), the plugin to a documented exit
/// code.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("{what}: not found")]
    NotFound { what: String },
    /// RBAC, an admission policy or impersonation said no.
    #[error("{what}: not allowed: {reason}")]
    Forbidden { what: String, reason: String },
    /// The API server found the request invalid (admission refused the spec, a field out of bounds).
    #[error("{what}: the API server rejected it: {reason}")]
    Invalid { what: String, reason: String },
    /// What the caller asked about is not what the rollout is now: its plan or gates changed, the name is
    /// taken, it kept changing while written, or it waits for nothing. Read it again and decide again.
    #[error("{0}")]
    Changed(String),
    /// Refused before reaching the API server, in fleetroll's own words (a caller who cannot be
    /// impersonated, a rollout whose creator is recorded already).
    #[error("{0}")]
    Refused(String),
    /// The credentials were not accepted by the API server (an expired or revoked token, a certificate it
    /// does not trust): new ones, not a retry, help. (Credentials that could not be had, an exec plugin
    /// failing, may come with a retry: those are Unavailable.)
    #[error("{what}: the credentials were not accepted ({reason})")]
    Unauthorized { what: String, reason: String },
    /// The API server could not be reached, or failed (transport, timeouts, 5xx, throttling): trying again
    /// may work; nothing the caller asked was refused.
    #[error("{what}: {source}")]
    Unavailable {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl ControlError {
    /// Tells an API error apart, naming `what` was being done or read.
    pub fn from_kube(e: kube::Error, what: impl Into<String>) -> Self {
        let what = what.into();
        match e {
            kube::Error::Api(s) if s.code == 404 => ControlError::NotFound { what },
            kube::Error::Api(s) if s.code == 401 => ControlError::Unauthorized { what, reason: s.message },
            kube::Error::Api(s) if s.code == 403 => ControlError::Forbidden { what, reason: s.message },
            kube::Error::Api(s) if matches!(s.code, 400 | 422) => {
                ControlError::Invalid { what, reason: s.message }
            }
            kube::Error::Api(s) if s.code == 409 => ControlError::Changed(format!("{what}: {}", s.message)),
            other => ControlError::Unavailable { what, source: Box::new(other) },
        }
    }

    /// Tells an operator error apart (the discovery and plan reads the MCP server and the plugin share).
    pub fn from_operator(e: crate::error::Error, what: impl Into<String>) -> Self {
        match e {
            crate::error::Error::Kube(e) => Self::from_kube(e, what),
            crate::error::Error::Conflict => {
                ControlError::Changed(format!("{}: changed while it was read", what.into()))
            }
            other => ControlError::Unavailable { what: what.into(), source: Box::new(other) },
        }
    }

    /// The Kubernetes `Status` reason it stands for, for machines reading an answer: `NotFound`,
    /// `Unauthorized`, `Forbidden`, `Invalid`, `Conflict` or `ServiceUnavailable`.
    pub fn reason(&self) -> &'static str {
        match self {
            ControlError::NotFound { .. } => "NotFound",
            ControlError::Unauthorized { .. } => "Unauthorized",
            ControlError::Forbidden { .. } | ControlError::Refused(_) => "Forbidden",
            ControlError::Invalid { .. } => "Invalid",
            ControlError::Changed(_) => "Conflict",
            ControlError::Unavailable { .. } => "ServiceUnavailable",
        }
    }
}

fn what(ns: &str, name: &str) -> String {
    format!("FleetRollout {ns}/{name}")
}

pub async fn get(client: &Client, ns: &str, name: &str) -> Result<FleetRollout, ControlError> {
    Api::<FleetRollout>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| ControlError::from_kube(e, what(ns, name)))
}

/// The merge patch adding an approval of (`batch`, `plan_hash`, `gates_hash`) to `fr`, replacing any other
/// of that batch, against the version read.
fn approval_patch(
    fr: &FleetRollout,
    batch: u32,
    plan_hash: &str,
    gates_hash: &str,
    override_windows: Option<&str>,
    who: Option<&str>,
) -> Value {
    // An approval of a batch already overridden (of the same plan and gates) keeps the override, and the
    // other way round: one entry per batch carries both.
    let same = |a: &&Approval| a.batch == batch && a.plan_hash == plan_hash && a.gates_hash == gates_hash;
    let kept = fr.spec.approvals.iter().find(same).and_then(|a| a.override_windows.clone());
    let mut approvals: Vec<Approval> =
        fr.spec.approvals.iter().filter(|a| a.batch != batch).cloned().collect();
    approvals.push(Approval {
        batch,
        plan_hash: plan_hash.to_string(),
        gates_hash: gates_hash.to_string(),
        approved_by: who.map(String::from),
        override_windows: override_windows.map(String::from).or(kept),
    });
    approvals.sort_by_key(|a| a.batch);
    json!({"metadata": {"resourceVersion": fr.resource_version()}, "spec": {"approvals": approvals}})
}

/// Whether the client's user may give `fr` the approval it waits for: a dry run of that very approval, so
/// the API server judges it as it would the real one (RBAC's `approve`, the creator's own rollout, a
/// platform policy's approvers). Ok(false) also when it waits for none, has changed since it was read, or is
/// gone.
pub async fn may_approve(client: &Client, fr: &FleetRollout) -> Result<bool, ControlError> {
    let Some(pending) = crate::core::task::awaited_approval(fr) else { return Ok(false) };
    let (ns, name) = (fr.namespace().unwrap_or_default(), fr.name_any());
    let patch = approval_patch(fr, pending.batch, &pending.plan_hash, &pending.gates_hash, None, None);
    let pp = PatchParams { dry_run: true, ..Default::default() };
    match Api::<FleetRollout>::namespaced(client.clone(), &ns).patch(&name, &pp, &Patch::Merge(patch)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if matches!(s.code, 403 | 404 | 409) => Ok(false),
        Err(e) => Err(ControlError::from_kube(e, what(&ns, &name))),
    }
}

/// Sets spec controls (`paused`, `abort`, `rollback`) with a merge patch under `manager`.
pub async fn set(
    client: &Client,
    ns: &str,
    name: &str,
    spec: Value,
    manager: &str,
) -> Result<FleetRollout, ControlError> {
    let pp = PatchParams { field_manager: Some(manager.into()), ..Default::default() };
    Api::<FleetRollout>::namespaced(client.clone(), ns)
        .patch(name, &pp, &Patch::Merge(json!({ "spec": spec })))
        .await
        .map_err(|e| ControlError::from_kube(e, what(ns, name)))
}

/// What an approval approves; each part defaults to what the rollout waits for now.
#[derive(Clone, Copy, Debug, Default)]
pub struct Approving<'a> {
    pub batch: Option<u32>,
    pub plan_hash: Option<&'a str>,
    pub gates_hash: Option<&'a str>,
    /// Also let the batch start outside its change windows (spec.approvals[].overrideWindows).
    pub override_windows: bool,
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
) -> Result<FleetRollout, ControlError> {
    let Approving { batch, plan_hash, gates_hash, override_windows } = approving;
    let api = Api::<FleetRollout>::namespaced(client.clone(), ns);
    let mut approved_gates = gates_hash.map(String::from);
    for _ in 0..5 {
        let fr = get(client, ns, name).await?;
        let status = fr.status.clone().unwrap_or_default();
        let current = status
            .plan
            .as_ref()
            .map(|p| p.hash.clone())
            .ok_or_else(|| ControlError::Changed("the rollout has no plan yet".into()))?;
        let plan_hash = plan_hash.map_or_else(|| current.clone(), String::from);
        if plan_hash != current {
            return Err(ControlError::Changed(format!(
                "plan {plan_hash} is not the rollout's plan any more (now {current}): review it and approve again"
            )));
        }
        let gates = crate::core::plan::gates_of(&fr);
        let gates_hash = approved_gates.get_or_insert_with(|| gates.clone()).clone();
        if gates_hash != gates {
            return Err(ControlError::Changed(format!(
                "the rollout's gates (health, analysis, maxFailures, onFailure, approval, resumeToken, approvers) are not {gates_hash} \
                 any more (now {gates}): review them and approve again"
            )));
        }
        // An override cites the hold it lifts, and is for the batch the windows hold (the next one).
        let hold = match (override_windows, &status.window_hold) {
            (false, _) => None,
            (true, Some(h)) if !h.hash.is_empty() => Some(h.hash.clone()),
            (true, _) => {
                return Err(ControlError::Changed("no batch is held by a change window now".into()));
            }
        };
        let held = hold.as_ref().map(|_| status.current_batch.map_or(0, |i| i + 1));
        let batch = match (batch, &status.pending_approval, held) {
            (Some(b), _, _) => b,
            (None, Some(p), _) => p.batch,
            (None, None, Some(b)) => b,
            (None, None, None) => {
                return Err(ControlError::Changed(
                    "no batch is waiting for approval (or held by a change window); name one with the batch argument"
                        .into(),
                ));
            }
        };
        let patch = approval_patch(&fr, batch, &plan_hash, &gates_hash, hold.as_deref(), who);
        let pp = PatchParams { field_manager: Some(manager.into()), ..Default::default() };
        match api.patch(name, &pp, &Patch::Merge(patch)).await {
            Ok(updated) => return Ok(updated),
            Err(e) if crate::error::is_conflict(&e) => continue,
            Err(e) => return Err(ControlError::from_kube(e, what(ns, name))),
        }
    }
    Err(ControlError::Changed("the rollout kept changing while approving; try again".into()))
}
