//! The MCP tools, named once: each one's wire name, the FleetRollout verb RBAC must allow for it, whether
//! it only reads, and how agents see it described. Their arguments are in `args`, what they do in `ops`.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use rmcp::{
    handler::server::common::schema_for_input,
    model::{CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations},
};
use schemars::JsonSchema;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};

use super::{
    args::{ApproveArgs, ListArgs, PreviewArgs, RolloutFleetArgs, RolloutRef},
    auth::{Access, Verb},
};
use crate::{
    api::FleetRollout,
    core::task::{describe, summary},
    edge::control::ControlError,
};

/// A tool this server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FleetTool {
    RolloutFleet,
    PreviewRollout,
    GetRollout,
    ListRollouts,
    ApproveBatch,
    /// pause_rollout, resume_rollout, abort_rollout, rollback_rollout.
    Set(Control),
}

/// A spec control: a field of the FleetRollout spec that people and agents set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    Pause,
    Resume,
    Abort,
    Rollback,
}

impl Control {
    /// The merge patch of the spec that sets it. Resuming also gives `resumeToken` a new value (the time),
    /// which releases a rollout its analysis holds.
    pub fn patch(self, now: Timestamp) -> Value {
        match self {
            Control::Pause => json!({"paused": true}),
            Control::Resume => json!({"paused": false, "resumeToken": now.to_string()}),
            Control::Abort => json!({"abort": true}),
            Control::Rollback => json!({"rollback": true}),
        }
    }
}

impl FleetTool {
    /// Every tool, in the order `tools/list` shows them.
    pub const ALL: [FleetTool; 9] = [
        FleetTool::RolloutFleet,
        FleetTool::PreviewRollout,
        FleetTool::GetRollout,
        FleetTool::ListRollouts,
        FleetTool::Set(Control::Pause),
        FleetTool::Set(Control::Resume),
        FleetTool::ApproveBatch,
        FleetTool::Set(Control::Abort),
        FleetTool::Set(Control::Rollback),
    ];

    /// The name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            FleetTool::RolloutFleet => "rollout_fleet",
            FleetTool::PreviewRollout => "preview_rollout",
            FleetTool::GetRollout => "get_rollout",
            FleetTool::ListRollouts => "list_rollouts",
            FleetTool::Set(Control::Pause) => "pause_rollout",
            FleetTool::Set(Control::Resume) => "resume_rollout",
            FleetTool::ApproveBatch => "approve_batch",
            FleetTool::Set(Control::Abort) => "abort_rollout",
            FleetTool::Set(Control::Rollback) => "rollback_rollout",
        }
    }

    /// The tool a wire name names, if any.
    pub fn parse(name: &str) -> Option<FleetTool> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The FleetRollout verb a call needs. A preview needs `create`: it shows what creating would do.
    pub fn verb(self) -> Verb {
        match self {
            FleetTool::RolloutFleet | FleetTool::PreviewRollout => Verb::Create,
            FleetTool::GetRollout => Verb::Get,
            FleetTool::ListRollouts => Verb::List,
            FleetTool::ApproveBatch => Verb::Approve,
            FleetTool::Set(_) => Verb::Patch,
        }
    }

    /// The permission a call with `args` needs: the verb, in the namespace the arguments name (all
    /// namespaces when they name none), on the rollout they name (creating and listing name none).
    pub fn access(self, args: &Value) -> Access {
        let arg = |k: &str| args.get(k).and_then(Value::as_str).map(String::from);
        let verb = self.verb();
        let name = match verb {
            Verb::Create | Verb::List => None,
            Verb::Get | Verb::Patch | Verb::Approve | Verb::SelfApprove => arg("name"),
        };
        Access { verb, namespace: arg("namespace"), name }
    }

    /// Whether the tool only reads (all a read-only server serves).
    pub fn read_only(self) -> bool {
        matches!(self, FleetTool::PreviewRollout | FleetTool::GetRollout | FleetTool::ListRollouts)
    }

    fn description(self) -> &'static str {
        match self {
            FleetTool::RolloutFleet => {
                "Start a batched, health-checked rollout of a container image across a fleet of workloads (a \
                 FleetRollout), in this cluster or across member clusters in waves. With the MCP Tasks extension it returns a task to poll with tasks/get; otherwise \
                 it returns the rollout's name, to poll with get_rollout."
            }
            FleetTool::PreviewRollout => {
                "Show the exact plan a rollout would follow (its batches and their members, across member \
                 clusters its waves and clusters, and the plan hash that approvals cite) without writing anything."
            }
            FleetTool::GetRollout => {
                "Where a rollout stands: phase, progress, batch, failures, pending approval; across member \
                 clusters, progress per wave and cluster and the clusters in trouble."
            }
            FleetTool::ListRollouts => "List FleetRollouts with their phase and progress.",
            FleetTool::Set(Control::Pause) => {
                "Hold a rollout before its next batch (the batch in flight finishes)."
            }
            FleetTool::Set(Control::Resume) => {
                "Let a paused rollout go on, including one its metric analysis holds (inconclusive, or failed \
                 under onFailure Pause)."
            }
            FleetTool::ApproveBatch => {
                "Approve the batch a rollout waits for, bound to its plan hash; records who approved."
            }
            FleetTool::Set(Control::Abort) => {
                "Stop a rollout for good; targets already changed keep the new image."
            }
            FleetTool::Set(Control::Rollback) => {
                "Restore the previous image of every target the rollout changed, once, and stop."
            }
        }
    }

    /// The behaviour hints agents see: read-only, destructive, idempotent (never open-world).
    fn annotations(self) -> ToolAnnotations {
        let (destructive, idempotent) = match self {
            FleetTool::RolloutFleet => (true, false),
            FleetTool::PreviewRollout | FleetTool::GetRollout | FleetTool::ListRollouts => (false, true),
            FleetTool::Set(Control::Pause | Control::Abort) => (false, true),
            FleetTool::Set(Control::Resume | Control::Rollback) | FleetTool::ApproveBatch => (true, true),
        };
        ToolAnnotations::from_raw(
            None,
            Some(self.read_only()),
            Some(destructive),
            Some(idempotent),
            Some(false),
        )
    }

    /// The JSON schema of the arguments.
    fn input_schema(self) -> Arc<JsonObject> {
        fn of<T: JsonSchema + 'static>() -> Arc<JsonObject> {
            schema_for_input::<T>().unwrap_or_else(|_| Arc::new(JsonObject::new()))
        }
        match self {
            FleetTool::RolloutFleet => of::<RolloutFleetArgs>(),
            FleetTool::PreviewRollout => of::<PreviewArgs>(),
            FleetTool::ListRollouts => of::<ListArgs>(),
            FleetTool::ApproveBatch => of::<ApproveArgs>(),
            FleetTool::GetRollout | FleetTool::Set(_) => of::<RolloutRef>(),
        }
    }

    /// The tool as `tools/list` shows it.
    pub fn definition(self) -> Tool {
        Tool::new(self.name(), self.description(), self.input_schema()).with_annotations(self.annotations())
    }
}

/// The tools, in a stable order; only the read-only ones on a read-only server.
pub fn all(read_only_server: bool) -> Vec<Tool> {
    FleetTool::ALL
        .into_iter()
        .filter(|t| !read_only_server || t.read_only())
        .map(FleetTool::definition)
        .collect()
}

/// Parses tool arguments; the error is meant for the caller (a model can correct itself from it).
pub fn parse<T: DeserializeOwned>(args: &JsonObject) -> Result<T, String> {
    serde_json::from_value(Value::Object(args.clone())).map_err(|e| format!("invalid arguments: {e}"))
}

/// A tool result the caller should read: text plus structured content.
pub fn ok(text: impl Into<String>, structured: impl Serialize) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text.into())]);
    r.structured_content = serde_json::to_value(structured).ok();
    r
}

/// A tool-level error: `isError: true` with a message the caller can act on.
pub fn error(text: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text.into())])
}

/// A tool-level error from the API or a refusal: the message, and the Kubernetes reason an agent can
/// branch on (`{"error": {"reason": "Forbidden", "message": …}}`).
pub fn failed(e: &ControlError) -> CallToolResult {
    let mut r = error(e.to_string());
    r.structured_content = Some(json!({"error": {"reason": e.reason(), "message": e.to_string()}}));
    r
}

/// A summary result of one rollout.
pub fn summary_result(fr: &FleetRollout) -> CallToolResult {
    let s = summary(fr);
    ok(describe(&s), &s)
}

/// The synchronous answer to rollout_fleet for clients without the Tasks extension.
pub fn started_result(fr: &FleetRollout, replayed: bool) -> CallToolResult {
    let s = summary(fr);
    let verb = if replayed { "Already started" } else { "Started" };
    ok(
        format!(
            "{verb} FleetRollout {}/{} rolling {}. It runs on its own; poll get_rollout with namespace {:?} and name {:?} to see \
             where it stands.",
            s.namespace, s.name, s.image, s.namespace, s.name
        ),
        &s,
    )
}

/// "Now", for task timestamps.
pub fn now() -> Timestamp {
    Timestamp::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_is_found_by_its_name_and_nothing_else_is() {
        for tool in FleetTool::ALL {
            assert_eq!(FleetTool::parse(tool.name()), Some(tool));
        }
        for unknown in ["greet", "", "Rollout_Fleet", "rollout_fleet "] {
            assert_eq!(FleetTool::parse(unknown), None, "{unknown:?}");
        }
    }

    #[test]
    fn tools_that_only_read_say_so_and_are_all_a_read_only_server_serves() {
        let names = |tools: Vec<Tool>| tools.iter().map(|t| t.name.to_string()).collect::<Vec<_>>();
        assert_eq!(names(all(true)), ["preview_rollout", "get_rollout", "list_rollouts"]);
        assert_eq!(names(all(false)).len(), 9);
        for tool in all(false) {
            let read_only = FleetTool::parse(&tool.name).is_some_and(FleetTool::read_only);
            assert_eq!(tool.annotations.and_then(|a| a.read_only_hint), Some(read_only), "{}", tool.name);
        }
    }
}
