//! MCP Tasks over FleetRollouts: task ids (which name the rollout and carry a secret), and the wrapping
//! of a rollout's task ([`crate::core::task`], pure) in the Tasks extension's types.

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use rmcp::model::{
    CallToolResult, ContentBlock, DetailedTask, InputRequest, InputRequests, JsonObject, Task, TaskPayload,
};
use serde::Serialize;
use serde_json::{Value, json};

use crate::{
    api::FleetRollout,
    core::{
        plan::sha256_hex,
        task::{ApprovalRequest, Summary, TaskState, TaskView, describe},
    },
};

/// Annotation holding a hash of the task's secret part ([`token_hash`]). The task id itself is shown only to
/// the caller that started the rollout: anyone who can read the FleetRollout sees only this hash.
pub use crate::api::TASK_TOKEN_HASH_ANNOTATION;
/// Annotation naming the identity that created the rollout over MCP (tasks are bound to it).
pub const CREATED_BY_ANNOTATION: &str = "fleetroll.dev/created-by";
/// Who created `fr` over MCP: its created-by annotation, which the admission policy makes the user who
/// created it; without one, an anonymous caller (`--auth none`, where the server writes as itself and
/// records no one, since the policy would refuse a name that is not the writer's).
pub fn created_by(fr: &FleetRollout) -> &str {
    fr.annotations().get(CREATED_BY_ANNOTATION).map_or(ANONYMOUS, String::as_str)
}

/// The user name of an anonymous caller.
pub const ANONYMOUS: &str = "system:anonymous";

/// Annotation holding a hash of the client's idempotency key ([`key_hash`]), and the hash of the
/// arguments it was used with.
pub const IDEMPOTENCY_KEY_HASH_ANNOTATION: &str = "fleetroll.dev/idempotency-key-sha256";
pub const REQUEST_HASH_ANNOTATION: &str = "fleetroll.dev/request-hash";

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

/// The tool result of a finished rollout: a completed task carries it, and `isError` says whether the
/// rollout did what was asked.
pub fn tool_result(summary: &Summary, is_error: bool) -> CallToolResult {
    let content = vec![ContentBlock::text(describe(summary))];
    let mut result = if is_error { CallToolResult::error(content) } else { CallToolResult::success(content) };
    result.structured_content = Some(serde_json::to_value(summary).unwrap_or(Value::Null));
    result
}

/// A rollout's task as the Tasks extension shows it (see [`crate::core::task::view`] for the mapping).
/// `failed` is left for protocol-level errors: a rollout's own failure is a tool result.
pub fn detailed(id: &TaskId, view: TaskView) -> DetailedTask {
    let task = Task::new(
        id.to_string(),
        rmcp::model::TaskStatus::Working,
        iso(view.created_at),
        iso(view.last_updated_at),
    )
    .with_status_message(view.message);
    let task = match view.ttl_ms {
        Some(ttl) => task.with_ttl_ms(ttl),
        None => task,
    };
    let task = match view.poll_interval_ms {
        Some(ms) => task.with_poll_interval_ms(ms),
        None => task,
    };
    let payload = match view.state {
        TaskState::Working => TaskPayload::Working,
        TaskState::InputRequired(request) => match input_requests(&request) {
            Some(input_requests) => TaskPayload::InputRequired { input_requests },
            None => TaskPayload::Working,
        },
        TaskState::Completed { is_error } => {
            TaskPayload::Completed { result: to_object(&tool_result(&view.summary, is_error)) }
        }
        TaskState::Cancelled => TaskPayload::Cancelled,
    };
    DetailedTask::new(task, payload)
}

/// The elicitation form asking for an approval.
fn input_requests(approval: &ApprovalRequest) -> Option<InputRequests> {
    let request: InputRequest = serde_json::from_value(json!({
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": approval.message,
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
    Some(InputRequests::from([(approval.key.clone(), request)]))
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
