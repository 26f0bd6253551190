//! Planning: which target goes in which batch, decided once per revision and then frozen.
//!
//! Pure functions only. The order is deterministic (namespace, then name), so the same fleet always gives
//! the same plan, and the plan hash identifies it for approvals.

use std::collections::HashMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::{
    api::{FleetRolloutSpec, PlannedTarget, RevisionInputs, Unplanned},
    core::{
        Blocked,
        clusters::{Order, PlannedWave},
        count, reason,
    },
};

/// A workload found by discovery, as planning needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The member cluster it is in; empty for the rollout's own cluster.
    pub cluster: String,
    pub namespace: String,
    pub name: String,
    /// The image of the rolled container right now.
    pub current_image: String,
}

/// What discovery found for a new revision: the candidates, and for a rollout across member clusters the
/// waves they are in and the member Secrets it could not use (reported when the plan is frozen).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Discovered {
    pub candidates: Vec<Candidate>,
    pub waves: Vec<PlannedWave>,
    pub refused: Vec<String>,
    /// Member clusters picked but not reachable at planning, with why.
    pub left_out: Vec<(String, String)>,
    /// Those of `left_out` that did not answer at all (or refused the credentials), with why: planning
    /// waits for them. The others answered with an error and are left out at once.
    pub unanswered: Vec<(String, String)>,
}

impl Discovered {
    /// Candidates in the rollout's own cluster.
    pub fn local(candidates: Vec<Candidate>) -> Self {
        Self { candidates, ..Default::default() }
    }
}

/// The frozen plan of one revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub hash: String,
    pub batches: Vec<Vec<PlannedTarget>>,
}

impl Plan {
    pub fn total_targets(&self) -> u32 {
        count(self.batches.iter().map(Vec::len).sum())
    }

    pub fn total_batches(&self) -> u32 {
        count(self.batches.len())
    }

    pub fn batch(&self, index: u32) -> &[PlannedTarget] {
        self.batches.get(index as usize).map_or(&[], Vec::as_slice)
    }

    /// Every target of batches `0..=last`, in plan order.
    pub fn through(&self, last: u32) -> impl Iterator<Item = &PlannedTarget> {
        self.batches.iter().take(last as usize + 1).flatten()
    }

    /// Whether this plan is the one the operator froze for a revision with inputs hashed `spec_hash`: the
    /// hash it carries (recorded in status when it was frozen) is recomputed from its content. A plan read
    /// back from the cluster is input like any other; one edited since fails this.
    pub fn is_authentic(&self, spec_hash: &str) -> bool {
        short_hash(&(spec_hash, &self.batches)) == self.hash
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("{0:?} is neither a positive integer nor a percentage from 1% to 100%")]
    InvalidSize(String),
}

/// Resolves an int-or-percentage against the fleet size. Percentages round up (at least 1 target).
fn size_of(value: &IntOrString, total: u32) -> Result<u32, PlanError> {
    match value {
        IntOrString::Int(n) if *n >= 1 => Ok(u32::try_from(*n).unwrap_or(u32::MAX)),
        IntOrString::Int(n) => Err(PlanError::InvalidSize(n.to_string())),
        IntOrString::String(s) => {
            let pct = percent(s)
                .filter(|p| (1..=100).contains(p))
                .ok_or_else(|| PlanError::InvalidSize(s.clone()))?;
            Ok((u64::from(total) * u64::from(pct)).div_ceil(100).max(1) as u32)
        }
    }
}

fn percent(s: &str) -> Option<u32> {
    s.strip_suffix('%')?.parse().ok()
}

/// The failure budget: how many failed targets are tolerated. Percentages round down.
pub fn failure_budget(max_failures: &IntOrString, total: u32) -> u32 {
    match max_failures {
        IntOrString::Int(n) => u32::try_from(*n).unwrap_or(0),
        IntOrString::String(s) => {
            percent(s).map_or(0, |p| (u64::from(total) * u64::from(p.min(100)) / 100) as u32)
        }
    }
}

/// Sizes of successive batches for a fleet of `total`: each of `steps`, then `batch_size` repeatedly, the
/// last batch taking what remains.
pub fn batch_sizes(
    total: u32,
    steps: &[IntOrString],
    batch_size: &IntOrString,
) -> Result<Vec<u32>, PlanError> {
    let mut next = size_sequence(total, steps, batch_size)?;
    let mut sizes = Vec::new();
    let mut remaining = total;
    while remaining > 0 {
        let size = next().min(remaining);
        sizes.push(size);
        remaining -= size;
    }
    Ok(sizes)
}

/// The size of each successive batch: each of `steps`, then `batch_size` for ever.
fn size_sequence(
    total: u32,
    steps: &[IntOrString],
    batch_size: &IntOrString,
) -> Result<impl FnMut() -> u32, PlanError> {
    let steps: Vec<u32> = steps.iter().map(|s| size_of(s, total)).collect::<Result<_, _>>()?;
    let regular = size_of(batch_size, total)?;
    let mut steps = steps.into_iter();
    Ok(move || steps.next().unwrap_or(regular))
}

/// Builds the plan of a revision. `previous` carries each target's pre-rollout image (by
/// [`PlannedTarget::key`]) from the revision this one supersedes, so a rollback always restores what the
/// target had before this rollout touched it. `order` puts member clusters in waves, and within a wave
/// the targets whose namespaces' change windows allow a change sooner first: a batch never spans two waves,
/// two opening times, or more clusters than its wave's `maxConcurrency` (it ends early; the next takes the
/// next size).
pub fn build(
    mut candidates: Vec<Candidate>,
    inputs: &RevisionInputs,
    spec_hash: &str,
    previous: &HashMap<String, String>,
    order: &Order,
) -> Result<Plan, PlanError> {
    candidates.sort_by(|a, b| {
        (order.wave(&a.cluster), order.opens(&a.cluster, &a.namespace), &a.cluster, &a.namespace, &a.name)
            .cmp(&(
                order.wave(&b.cluster),
                order.opens(&b.cluster, &b.namespace),
                &b.cluster,
                &b.namespace,
                &b.name,
            ))
    });
    candidates.dedup_by(|a, b| a.cluster == b.cluster && a.namespace == b.namespace && a.name == b.name);
    let mut next_size = size_sequence(count(candidates.len()), &inputs.steps, &inputs.batch_size)?;
    let mut batches: Vec<Vec<PlannedTarget>> = Vec::new();
    let mut batch: Vec<PlannedTarget> = Vec::new();
    let mut size = next_size();
    for c in candidates {
        let mut t = PlannedTarget {
            cluster: c.cluster,
            namespace: c.namespace,
            name: c.name,
            previous_image: c.current_image,
        };
        if let Some(before) = previous.get(&t.key()) {
            t.previous_image = before.clone();
        }
        if count(batch.len()) >= size || order.must_cut(&batch, &t) {
            batches.push(std::mem::take(&mut batch));
            size = next_size();
        }
        batch.push(t);
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    let hash = short_hash(&(spec_hash, &batches));
    Ok(Plan { hash, batches })
}

/// sha256 over the canonical JSON of `value`, hex-encoded.
pub fn sha256_hex(value: &impl Serialize) -> String {
    // serde_json::Value keeps object keys sorted, which makes the encoding canonical.
    let canonical = serde_json::to_value(value).map(|v| v.to_string()).unwrap_or_default();
    hex(&Sha256::digest(canonical.as_bytes()))
}

/// What judges a rollout's batches and decides what happens when they fail (`health`, `analysis`,
/// `strategy.maxFailures`, `.onFailure`, `.approval`, `resumeToken`), with the nonce of its approver epoch
/// once policies named approvers for it, hashed (16 hex digits). An approval binds it beside the plan's
/// hash: what a person approved cannot be loosened behind them, nor approved before the approvers changed.
pub fn gates_hash(spec: &crate::api::FleetRolloutSpec, approver_nonce: Option<&str>) -> String {
    let mut gates = serde_json::json!({
        "health": spec.health,
        "analysis": spec.analysis,
        "maxFailures": spec.strategy.max_failures,
        "onFailure": spec.strategy.on_failure,
        "approval": spec.strategy.approval,
        // A new resumeToken releases a hold of the analysis: a person's decision as much as an approval.
        "resumeToken": spec.resume_token,
    });
    // Only once policies named approvers, so the hash of every other rollout stays what it was.
    if let Some(nonce) = approver_nonce {
        gates["approverNonce"] = serde_json::json!(nonce);
    }
    short_hash(&gates)
}

/// The gates an approval of `fr` must cite now, as the operator computes them.
pub fn gates_of(fr: &crate::api::FleetRollout) -> String {
    let epoch = fr.status.as_ref().and_then(|s| s.approver_epoch.as_ref());
    gates_hash(&fr.spec, epoch.map(|e| e.nonce.as_str()))
}

/// The first 16 hex digits of the SHA-256 of `value` as JSON: what plans, gates and approvers are told by.
pub fn short_hash(value: &impl Serialize) -> String {
    let mut full = sha256_hex(value);
    full.truncate(16);
    full
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new revision's frozen plan, with the inputs it was made from and their hash.
pub struct Planned {
    pub inputs: RevisionInputs,
    pub spec_hash: String,
    pub plan: Plan,
}

/// Plans a new revision of `spec` over `candidates`, as the operator freezes it (and as a preview shows it).
/// `previous`: see [`build`]. `opens`: when the change windows of each (cluster, namespace) whose owner
/// declares some first allow a change (see [`Order::with_openings`]).
pub fn plan_revision(
    spec: &FleetRolloutSpec,
    candidates: Vec<Candidate>,
    previous: &HashMap<String, String>,
    waves: &[PlannedWave],
    opens: HashMap<(String, String), k8s_openapi::jiff::Timestamp>,
) -> Result<Planned, Blocked> {
    let inputs = RevisionInputs::of(spec);
    let spec_hash = sha256_hex(&inputs);
    let plan = build(candidates, &inputs, &spec_hash, previous, &Order::new(waves).with_openings(opens))
        .map_err(|e| Blocked { reason: reason::INVALID_SPEC, message: e.to_string() })?;
    Ok(Planned { inputs, spec_hash, plan })
}

/// Matching targets outside the plan (reported, never added): how many, and a sample of their names.
pub fn unplanned(mut names: Vec<String>) -> Unplanned {
    names.sort();
    let count = count(names.len());
    names.truncate(UNPLANNED_SAMPLE);
    Unplanned { count, sample: names }
}

/// Names of unplanned targets listed in status.
const UNPLANNED_SAMPLE: usize = 10;

#[cfg(test)]
mod tests;
