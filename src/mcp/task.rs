//! MCP Tasks over FleetRollouts: task ids, and the mapping from a rollout's status to the task a client
//! sees. Pure functions: the status in etcd is the task, so any replica, after any restart, answers the same.

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use rmcp::model::{
    CallToolResult, ContentBlock, DetailedTask, InputRequest, InputRequests, JsonObject, Task, TaskPayload,
};
use serde::Serialize;
use serde_json::{Value, json};

use crate::{
    api::{FleetRollout, FleetRolloutStatus, Phase},
    core::plan::sha256_hex,
};

/// Annotation holding a hash of the task's secret part ([`token_hash`]). The task id itself is shown only to
/// the caller that started the rollout: anyone who can read the FleetRollout sees only this hash.
pub const TASK_TOKEN_HASH_ANNOTATION: &str = "fleetroll.dev/task-token-sha256";
/// Annotation naming the identity that created the rollout over MCP (tasks are bound to it).
pub const CREATED_BY_ANNOTATION: &str = "fleetroll.dev/created-by";
/// Annotation holding a hash of the client's idempotency key ([`key_hash`]), and the hash of the
/// arguments it was used with.
pub const IDEMPOTENCY_KEY_HASH_ANNOTATION: &str = "fleetroll.dev/idempotency-key-sha256";
pub const REQUEST_HASH_ANNOTATION: &str = "fleetroll.dev/request-hash";

/// How often clients should poll while a rollout runs, and while it waits for a person.
pub const POLL_WORKING_MS: u64 = 2_000;
pub const POLL_INPUT_MS: u64 = 5_000;

/// A task id: `<namespace>/<name>/<token>`. It names the rollout, so any replica can find it, and
/// carries a 128-bit secret, so it cannot be guessed from the name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskId {
    pub namespace: String,
    pub name: String,
    pub token: String,
}

impl TaskId {
    pub fn parse(id: &str) -> Option<TaskId> {
        let mut parts = id.split('/');
        let (namespace, name, token) = (parts.next()?, parts.next()?, parts.next()?);
        let valid = parts.next().is_none()
            && !namespace.is_empty()
            && !name.is_empty()
            && token.len() == 32
            && token.bytes().all(|b| b.is_ascii_hexdigit());
        valid.then(|| TaskId { namespace: namespace.into(), name: name.into(), token: token.into() })
    }

    /// The task of `fr` whose secret part is `token`.
    pub fn new(fr: &FleetRollout, token: String) -> Option<TaskId> {
        Some(TaskId { namespace: fr.namespace()?, name: fr.name_any(), token })
    }

    /// Whether this id names `fr`: its token hashes to the stored hash, compared without leaking where a
    /// guess went wrong.
    pub fn matches(&self, fr: &FleetRollout) -> bool {
        let stored =
            fr.annotations().get(TASK_TOKEN_HASH_ANNOTATION).map(String::as_bytes).unwrap_or_default();
        let given = token_hash(&self.token);
        let given = given.as_bytes();
        stored.len() == given.len() && stored.iter().zip(given).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.name, self.token)
    }
}

/// A new random task token (128 bits, hex).
pub fn new_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The token of a rollout started with an idempotency key: derived from the key, the caller and the
/// rollout, so that a replay returns the same task id without the token being stored anywhere.
pub fn keyed_token(key: &str, username: &str, namespace: &str, name: &str) -> String {
    let mut token = sha256_hex(&("fleetroll.dev/task-token-from-key/v1", username, namespace, name, key));
    token.truncate(32);
    token
}

/// What is stored of a task token. The JSON array encoding keeps each purpose's hashes apart.
pub fn token_hash(token: &str) -> String {
    sha256_hex(&("fleetroll.dev/task-token/v1", token))
}

/// What is stored of an idempotency key: bound to the caller and namespace it was used by.
pub fn key_hash(key: &str, username: &str, namespace: &str) -> String {
    sha256_hex(&("fleetroll.dev/idempotency-key/v1", username, namespace, key))
}

/// The key of the input request asking to approve `batch` of plan `plan_hash` in revision `revision`;
/// unique over the task's lifetime, as the extension requires.
pub fn approval_key(revision: u32, batch: u32, plan_hash: &str) -> String {
    format!("approve-r{revision}-b{batch}-{plan_hash}")
}

/// (revision, batch, plan hash) of an approval key.
pub fn parse_approval_key(key: &str) -> Option<(u32, u32, String)> {
    let rest = key.strip_prefix("approve-r")?;
    let (revision, rest) = rest.split_once("-b")?;
    let (batch, hash) = rest.split_once('-')?;
    Some((revision.parse().ok()?, batch.parse().ok()?, hash.to_string()))
}

/// What agents see of a rollout: the status, condensed.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub namespace: String,
    pub name: String,
    pub image: String,
    pub phase: Phase,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub progress: String,
    pub batch: String,
    pub counts: crate::api::Counts,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_approval: Option<crate::api::PendingApproval>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<crate::api::TargetFailure>,
    pub paused: bool,
}

pub fn summary(fr: &FleetRollout) -> Summary {
    let s = fr.status.clone().unwrap_or_default();
    Summary {
        namespace: fr.namespace().unwrap_or_default(),
        name: fr.name_any(),
        image: fr.spec.image.clone(),
        phase: s.phase,
        reason: s.reason.clone(),
        message: s.message.clone(),
        progress: s.progress.clone().unwrap_or_else(|| "0/0".into()),
        batch: s.batch.clone().unwrap_or_else(|| "0/0".into()),
        counts: s.counts.clone(),
        revision: s.revision.as_ref().map(|r| r.number),
        plan_hash: s.plan.as_ref().map(|p| p.hash.clone()),
        pending_approval: s.pending_approval.clone(),
        failures: s.failures.iter().rev().take(5).cloned().collect(),
        paused: fr.spec.paused,
    }
}

/// One line for people (and models).
pub fn describe(s: &Summary) -> String {
    let mut line = format!("FleetRollout {}/{} ({}): {}", s.namespace, s.name, s.image, s.phase);
    if let Some(m) = &s.message {
        line.push_str(&format!(" — {m}"));
    }
    if let Some(p) = &s.pending_approval {
        line.push_str(&format!(
            ". Batch {} waits for approval of plan {}: call approve_batch",
            p.batch + 1,
            p.plan_hash
        ));
    }
    line
}

/// The tool result of a finished rollout: a completed task carries it, and `isError` says whether the
/// rollout did what was asked.
pub fn result_of(fr: &FleetRollout) -> CallToolResult {
    let s = summary(fr);
    let structured = serde_json::to_value(&s).unwrap_or(Value::Null);
    let mut result = if s.phase == Phase::Succeeded {
        CallToolResult::success(vec![ContentBlock::text(describe(&s))])
    } else {
        CallToolResult::error(vec![ContentBlock::text(describe(&s))])
    };
    result.structured_content = Some(structured);
    result
}

/// Maps a rollout to its task.
///
/// | rollout | task |
/// |---|---|
/// | Pending, Progressing, Paused, RollingBack | `working` (the status message says which) |
/// | WaitingForApproval | `input_required` with an elicitation form, if the client can answer one; else `working` |
/// | Succeeded | `completed` |
/// | Failed, RolledBack, Aborted by a failure policy | `completed` with `isError: true` |
/// | Aborted on request | `cancelled` |
///
/// `failed` is left for protocol-level errors: a rollout's own failure is a tool result.
pub fn detailed(fr: &FleetRollout, id: &TaskId, elicitation: bool, now: Timestamp) -> DetailedTask {
    let s = fr.status.clone().unwrap_or_default();
    let summary = summary(fr);
    let created = fr.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
    let task = Task::new(
        id.to_string(),
        rmcp::model::TaskStatus::Working,
        iso(created),
        iso(last_updated(&s, created)),
    );
    let task = match ttl_ms(fr, &s, created, now) {
        Some(ttl) => task.with_ttl_ms(ttl),
        None => task,
    };
    let task = task.with_status_message(describe(&summary));
    let payload = match s.phase {
        Phase::Succeeded | Phase::Failed | Phase::RolledBack => {
            TaskPayload::Completed { result: to_object(&result_of(fr)) }
        }
        Phase::Aborted if s.reason.as_deref() == Some(crate::core::reason::ABORT_REQUESTED) => {
            TaskPayload::Cancelled
        }
        Phase::Aborted => TaskPayload::Completed { result: to_object(&result_of(fr)) },
        Phase::WaitingForApproval if elicitation => match approval_request(fr, &s) {
            Some(requests) => TaskPayload::InputRequired { input_requests: requests },
            None => TaskPayload::Working,
        },
        _ => TaskPayload::Working,
    };
    let poll = match payload {
        TaskPayload::InputRequired { .. } => Some(POLL_INPUT_MS),
        TaskPayload::Working => Some(POLL_WORKING_MS),
        _ => None,
    };
    let task = match poll {
        Some(ms) => task.with_poll_interval_ms(ms),
        None => task,
    };
    DetailedTask::new(task, payload)
}

/// The elicitation form asking for the pending approval.
fn approval_request(fr: &FleetRollout, s: &FleetRolloutStatus) -> Option<InputRequests> {
    let pending = s.pending_approval.as_ref()?;
    let revision = s.revision.as_ref().map_or(0, |r| r.number);
    let total = s.plan.as_ref().map_or(0, |p| p.total_batches);
    let members: Vec<String> = s
        .plan
        .as_ref()
        .and_then(|p| p.batches.get(pending.batch as usize))
        .map(|b| b.iter().take(20).map(|t| format!("{}/{}", t.namespace, t.name)).collect())
        .unwrap_or_default();
    let mut message = format!(
        "Approve batch {}/{total} of FleetRollout {}/{} (image {}, plan {})?",
        pending.batch + 1,
        fr.namespace().unwrap_or_default(),
        fr.name_any(),
        fr.spec.image,
        pending.plan_hash
    );
    if !members.is_empty() {
        message.push_str(&format!(" Targets: {}", members.join(", ")));
    }
    let request: InputRequest = serde_json::from_value(json!({
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "approve": {"type": "boolean", "title": "Approve", "description": "Release this batch"}
                },
                "required": ["approve"]
            }
        }
    }))
    .ok()?;
    Some(InputRequests::from([(approval_key(revision, pending.batch, &pending.plan_hash), request)]))
}

/// `ttlMs` counts from creation: it covers the rollout so far plus the retention after it ends (the
/// operator deletes the rollout then). Unlimited (None) for rollouts without a TTL.
fn ttl_ms(fr: &FleetRollout, s: &FleetRolloutStatus, created: Timestamp, now: Timestamp) -> Option<u64> {
    let retention = u64::try_from(fr.spec.ttl_seconds_after_finished?).ok()?.saturating_mul(1000);
    let end = match (&s.finished_at, s.phase.is_terminal()) {
        (Some(t), true) => t.0,
        _ => now,
    };
    let elapsed = u64::try_from(end.duration_since(created).as_millis()).unwrap_or(0);
    Some(elapsed.saturating_add(retention).max(1))
}

fn last_updated(s: &FleetRolloutStatus, created: Timestamp) -> Timestamp {
    let batch_times = s.batches.iter().flat_map(|b| {
        [&b.started_at, &b.applied_at, &b.healthy_since, &b.finished_at].into_iter().flatten().map(|t| t.0)
    });
    let condition_times = s.conditions.iter().map(|c| c.last_transition_time.0);
    let others = [&s.started_at, &s.finished_at].into_iter().flatten().map(|t| t.0);
    batch_times.chain(condition_times).chain(others).fold(created, Timestamp::max)
}

fn iso(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn to_object(value: &impl Serialize) -> JsonObject {
    match serde_json::to_value(value) {
        Ok(Value::Object(map)) => map,
        _ => JsonObject::new(),
    }
}

#[cfg(test)]
mod tests;
