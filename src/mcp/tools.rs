//! The MCP tools: typed arguments (their JSON schema is what agents see) and what each does to the
//! FleetRollouts. Reads use the server's own credentials, after the caller's permission for exactly that
//! operation was checked (see `auth`); writes are made as the caller (see `impersonate`).

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Client, ResourceExt,
    api::{ObjectMeta, PostParams},
};
use rmcp::{
    handler::server::common::schema_for_input,
    model::{CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::{Value, json};

use super::{
    auth::Identity,
    impersonate::Writer,
    task::{
        self, CREATED_BY_ANNOTATION, IDEMPOTENCY_KEY_HASH_ANNOTATION, REQUEST_HASH_ANNOTATION,
        TASK_TOKEN_HASH_ANNOTATION, TaskId,
    },
};
use crate::{
    api::{FleetRollout, FleetRolloutSpec, Health, Strategy, Targets},
    core::plan,
    edge::control::{self, explain},
    edge::discovery,
};

/// Field manager of the MCP server's writes (distinct from the operator's and from GitOps tools').
pub const FIELD_MANAGER: &str = "fleetroll-mcp";

/// Start a rollout: the FleetRollout spec, plus where to put it.
#[derive(Deserialize, Serialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutFleetArgs {
    /// Namespace of the FleetRollout. Without targets.namespaceSelector, the targets are in it too.
    pub namespace: String,
    /// Name of the FleetRollout; generated when absent.
    #[serde(default)]
    pub name: Option<String>,
    /// Makes the call safe to repeat: the same key with the same arguments returns the same rollout and
    /// task and creates nothing; the same key with other arguments is an error.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// The image to roll out, e.g. registry.example.com/web:v2.
    pub image: String,
    /// The container whose image changes; required when targets have several containers.
    #[serde(default)]
    pub container: Option<String>,
    /// Which targets: kind (Deployment, StatefulSet, DaemonSet) with selector and optional namespaceSelector;
    /// or kind Node with daemonSet and optional nodeSelector (the DaemonSet's pod replaced node by node).
    pub targets: Targets,
    /// Batch sizes (batchSize, steps), failure budget (maxFailures), pacing, approvals, onFailure.
    #[serde(default)]
    pub strategy: Option<Strategy>,
    /// Health timeout, soak time, optional HTTP check.
    #[serde(default)]
    pub health: Option<Health>,
    /// Create the rollout paused.
    #[serde(default)]
    pub paused: bool,
}

/// Preview a rollout: the same description as rollout_fleet, nothing is written.
#[derive(Deserialize, Serialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreviewArgs {
    /// Namespace the FleetRollout would be created in.
    pub namespace: String,
    /// The image to roll out.
    pub image: String,
    /// The container whose image changes; required when targets have several containers.
    #[serde(default)]
    pub container: Option<String>,
    /// Which workloads.
    pub targets: Targets,
    /// Batch sizes and the rest.
    #[serde(default)]
    pub strategy: Option<Strategy>,
}

/// One FleetRollout.
#[derive(Deserialize, Serialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutRef {
    /// Namespace of the FleetRollout.
    pub namespace: String,
    /// Name of the FleetRollout.
    pub name: String,
}

/// FleetRollouts of a namespace, or of all namespaces.
#[derive(Deserialize, Serialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListArgs {
    /// Namespace to list; all namespaces when absent.
    #[serde(default)]
    pub namespace: Option<String>,
}

/// Approve a gated batch.
#[derive(Deserialize, Serialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApproveArgs {
    /// Namespace of the FleetRollout.
    pub namespace: String,
    /// Name of the FleetRollout.
    pub name: String,
    /// The batch (0-based) to approve; the one waiting when absent.
    #[serde(default)]
    pub batch: Option<u32>,
    /// The plan being approved (status.plan.hash); the current plan when absent. An approval of another
    /// plan is refused, so a plan that changed under you is never approved by mistake.
    #[serde(default)]
    pub plan_hash: Option<String>,
}

/// Whether a tool only reads.
pub fn is_read_only(name: &str) -> bool {
    matches!(name, "preview_rollout" | "get_rollout" | "list_rollouts")
}

fn tool<T: JsonSchema + 'static>(
    name: &'static str,
    description: &'static str,
    annotations: ToolAnnotations,
) -> Tool {
    let schema = schema_for_input::<T>().unwrap_or_else(|_| Arc::new(JsonObject::new()));
    Tool::new(name, description, schema).with_annotations(annotations)
}

fn hints(read_only: bool, destructive: bool, idempotent: bool) -> ToolAnnotations {
    ToolAnnotations::from_raw(None, Some(read_only), Some(destructive), Some(idempotent), Some(false))
}

/// The tools, in a stable order.
pub fn all(read_only_server: bool) -> Vec<Tool> {
    let tools = vec![
        tool::<RolloutFleetArgs>(
            "rollout_fleet",
            "Start a batched, health-checked rollout of a container image across a fleet of workloads (a \
             FleetRollout). With the MCP Tasks extension it returns a task to poll with tasks/get; otherwise it \
             returns the rollout's name, to poll with get_rollout.",
            hints(false, true, false),
        ),
        tool::<PreviewArgs>(
            "preview_rollout",
            "Show the exact plan a rollout would follow (its batches and their members, and the plan hash that \
             approvals cite) without writing anything.",
            hints(true, false, true),
        ),
        tool::<RolloutRef>(
            "get_rollout",
            "Where a rollout stands: phase, progress, batch, failures, pending approval.",
            hints(true, false, true),
        ),
        tool::<ListArgs>(
            "list_rollouts",
            "List FleetRollouts with their phase and progress.",
            hints(true, false, true),
        ),
        tool::<RolloutRef>(
            "pause_rollout",
            "Hold a rollout before its next batch (the batch in flight finishes).",
            hints(false, false, true),
        ),
        tool::<RolloutRef>("resume_rollout", "Let a paused rollout go on.", hints(false, true, true)),
        tool::<ApproveArgs>(
            "approve_batch",
            "Approve the batch a rollout waits for, bound to its plan hash; records who approved.",
            hints(false, true, true),
        ),
        tool::<RolloutRef>(
            "abort_rollout",
            "Stop a rollout for good; targets already changed keep the new image.",
            hints(false, false, true),
        ),
        tool::<RolloutRef>(
            "rollback_rollout",
            "Restore the previous image of every target the rollout changed, once, and stop.",
            hints(false, true, true),
        ),
    ];
    tools.into_iter().filter(|t| !read_only_server || is_read_only(&t.name)).collect()
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

/// What the MCP tools need of the world.
#[derive(Clone)]
pub struct Ops {
    /// The server's own client, for reads (the cache reads with it too).
    pub client: Client,
    /// Who writes are made as.
    pub writer: Writer,
    /// Reads go through the watch cache; writes are recorded in it.
    pub rollouts: super::cache::Rollouts,
    pub fleet_namespace: String,
    /// ttlSecondsAfterFinished of rollouts started over MCP (the task's retention).
    pub retention_seconds: i64,
}

fn api(client: &Client, ns: &str) -> Api<FleetRollout> {
    Api::namespaced(client.clone(), ns)
}

impl RolloutFleetArgs {
    pub fn spec(&self, retention_seconds: i64) -> FleetRolloutSpec {
        FleetRolloutSpec {
            image: self.image.clone(),
            container: self.container.clone(),
            targets: self.targets.clone(),
            strategy: self.strategy.clone().unwrap_or_default(),
            health: self.health.clone().unwrap_or_default(),
            paused: self.paused,
            abort: false,
            rollback: false,
            ttl_seconds_after_finished: Some(retention_seconds),
            approvals: Vec::new(),
        }
    }

    /// Identifies the request, so a replayed key can be told apart from a reused one.
    fn request_hash(&self) -> String {
        let mut args = self.clone();
        args.idempotency_key = None;
        let mut h = plan::sha256_hex(&args);
        h.truncate(32);
        h
    }

    /// The name a keyed request creates: derived from who asked and the key, so a replay finds it.
    fn name_for(&self, who: &Identity) -> Option<String> {
        if let Some(name) = &self.name {
            return Some(name.clone());
        }
        let key = self.idempotency_key.as_ref()?;
        let mut h = plan::sha256_hex(&(&who.username, key, &self.namespace));
        h.truncate(12);
        Some(format!("rollout-{h}"))
    }
}

/// The outcome of a start: the rollout (new, or the one a replayed key names) and its task's token.
pub struct Started {
    pub rollout: FleetRollout,
    /// Known only here: the rollout stores its hash.
    pub token: String,
    pub replayed: bool,
}

impl Started {
    pub fn task(&self) -> Option<TaskId> {
        TaskId::new(&self.rollout, self.token.clone())
    }
}

impl Ops {
    /// Creates the FleetRollout of a rollout_fleet call, as the caller. Err is a message for the caller.
    pub async fn start(&self, args: &RolloutFleetArgs, who: &Identity) -> Result<Started, String> {
        let client = self.writer.client_for(who)?;
        let name = args.name_for(who);
        let hash = args.request_hash();
        // With a key, the token can be derived again on a replay; without one, nothing needs it later.
        let (token, key_hash) = match (&args.idempotency_key, &name) {
            (Some(key), Some(name)) => (
                task::keyed_token(key, &who.username, &args.namespace, name),
                Some(task::key_hash(key, &who.username, &args.namespace)),
            ),
            _ => (task::new_token(), None),
        };
        let mut annotations = BTreeMap::from([
            (TASK_TOKEN_HASH_ANNOTATION.to_string(), task::token_hash(&token)),
            (CREATED_BY_ANNOTATION.to_string(), who.username.clone()),
            (REQUEST_HASH_ANNOTATION.to_string(), hash.clone()),
        ]);
        if let Some(key_hash) = &key_hash {
            annotations.insert(IDEMPOTENCY_KEY_HASH_ANNOTATION.to_string(), key_hash.clone());
        }
        let fr = FleetRollout {
            metadata: ObjectMeta {
                name: name.clone(),
                generate_name: name.is_none().then(|| "rollout-".to_string()),
                namespace: Some(args.namespace.clone()),
                annotations: Some(annotations),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/created-by".to_string(),
                    "fleetroll-mcp".to_string(),
                )])),
                ..Default::default()
            },
            spec: args.spec(self.retention_seconds),
            status: None,
        };
        let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        match api(&client, &args.namespace).create(&pp, &fr).await {
            Ok(created) => {
                self.rollouts.wrote(&created);
                Ok(Started { rollout: created, token, replayed: false })
            }
            Err(e) if crate::error::is_conflict(&e) => {
                let name = name.unwrap_or_default();
                let existing = api(&client, &args.namespace)
                    .get(&name)
                    .await
                    .map_err(|e| explain(&e, &format!("FleetRollout {}/{name}", args.namespace)))?;
                let a = existing.annotations();
                let same_key =
                    key_hash.is_some() && a.get(IDEMPOTENCY_KEY_HASH_ANNOTATION) == key_hash.as_ref();
                let same_caller = a.get(CREATED_BY_ANNOTATION) == Some(&who.username);
                match (same_key && same_caller, a.get(REQUEST_HASH_ANNOTATION) == Some(&hash)) {
                    (true, true) => Ok(Started { rollout: existing, token, replayed: true }),
                    (true, false) => Err(format!(
                        "idempotencyKey {:?} was already used with different arguments (FleetRollout {}/{name}); \
                         use a new key for a new rollout",
                        args.idempotency_key.as_deref().unwrap_or_default(),
                        args.namespace
                    )),
                    _ => Err(format!("a FleetRollout named {}/{name} already exists", args.namespace)),
                }
            }
            Err(e) => Err(explain(&e, "creating the FleetRollout")),
        }
    }

    /// The plan a rollout would follow, computed exactly as the operator would. Discovery runs as the
    /// caller (like its writes): a preview lists workloads, namespaces and nodes, and shows only what the
    /// caller could list itself.
    pub async fn preview(&self, args: &PreviewArgs, who: &Identity) -> Result<CallToolResult, String> {
        let mut fr = FleetRollout::new(
            "preview",
            FleetRolloutSpec {
                image: args.image.clone(),
                container: args.container.clone(),
                targets: args.targets.clone(),
                strategy: args.strategy.clone().unwrap_or_default(),
                health: Health::default(),
                paused: false,
                abort: false,
                rollback: false,
                ttl_seconds_after_finished: None,
                approvals: Vec::new(),
            },
        );
        fr.metadata.namespace = Some(args.namespace.clone());
        let client = self.writer.client_for(who)?;
        let plan = match discovery::preview(&client, &self.fleet_namespace, &fr).await {
            Ok(Ok(plan)) => plan,
            Ok(Err(blocked)) => {
                return Ok(error(format!(
                    "this rollout could not start ({}): {}",
                    blocked.reason, blocked.message
                )));
            }
            Err(e) => return Err(format!("discovering the fleet: {e}")),
        };
        let batches: Vec<Value> = plan
            .batches
            .iter()
            .enumerate()
            .map(|(i, b)| {
                json!({
                    "index": i,
                    "size": b.len(),
                    "targets": b.iter().map(|t| json!({"namespace": t.namespace, "name": t.name, "currentImage": t.previous_image})).collect::<Vec<_>>(),
                })
            })
            .collect();
        let text = format!(
            "{} targets in {} batches (sizes {}), plan {}. Nothing was written.",
            plan.total_targets(),
            plan.total_batches(),
            plan.batches.iter().map(|b| b.len().to_string()).collect::<Vec<_>>().join(", "),
            plan.hash
        );
        Ok(ok(
            text,
            json!({"planHash": plan.hash, "image": args.image, "totalTargets": plan.total_targets(), "batches": batches}),
        ))
    }

    pub async fn get(&self, r: &RolloutRef) -> Result<Arc<FleetRollout>, String> {
        let what = format!("FleetRollout {}/{}", r.namespace, r.name);
        match self.rollouts.get(&r.namespace, &r.name).await {
            Ok(Some(fr)) => Ok(fr),
            Ok(None) => Err(format!("{what}: not found")),
            Err(e) => Err(explain(&e, &what)),
        }
    }

    pub async fn list(&self, args: &ListArgs) -> Result<CallToolResult, String> {
        let list = self
            .rollouts
            .list(args.namespace.as_deref())
            .await
            .map_err(|e| explain(&e, "listing FleetRollouts"))?;
        let summaries: Vec<task::Summary> = list.iter().map(|fr| task::summary(fr)).collect();
        let text = if summaries.is_empty() {
            "no FleetRollouts".to_string()
        } else {
            summaries.iter().map(task::describe).collect::<Vec<_>>().join("\n")
        };
        Ok(ok(text, json!({"rollouts": summaries})))
    }

    /// Sets spec controls (paused, abort, rollback), as `who`.
    pub async fn set(&self, r: &RolloutRef, spec: Value, who: &Identity) -> Result<FleetRollout, String> {
        let client = self.writer.client_for(who)?;
        let fr = control::set(&client, &r.namespace, &r.name, spec, FIELD_MANAGER).await?;
        self.rollouts.wrote(&fr);
        Ok(fr)
    }

    /// Approves (batch, plan) as `who`, recording them: see [`crate::edge::control::approve`].
    pub async fn approve(&self, args: &ApproveArgs, who: &Identity) -> Result<FleetRollout, String> {
        let client = self.writer.client_for(who)?;
        let fr = control::approve(
            &client,
            &args.namespace,
            &args.name,
            args.batch,
            args.plan_hash.as_deref(),
            // Written as the caller, the approval names it; without authentication there is no one to name.
            matches!(self.writer, Writer::Caller(_)).then_some(who.username.as_str()),
            FIELD_MANAGER,
        )
        .await?;
        self.rollouts.wrote(&fr);
        Ok(fr)
    }

    /// The rollout a task id names, if the caller may see it (its creator).
    pub async fn task_rollout(
        &self,
        id: &TaskId,
        who: &Identity,
    ) -> Result<Option<Arc<FleetRollout>>, kube::Error> {
        let Some(fr) = self.rollouts.get(&id.namespace, &id.name).await? else {
            return Ok(None);
        };
        let owner = fr.annotations().get(CREATED_BY_ANNOTATION).cloned();
        Ok((id.matches(&fr)
            && owner.as_deref() == Some(who.username.as_str())
            && fr.metadata.deletion_timestamp.is_none())
        .then_some(fr))
    }
}

/// A summary result of one rollout.
pub fn summary_result(fr: &FleetRollout) -> CallToolResult {
    let s = task::summary(fr);
    ok(task::describe(&s), &s)
}

/// The synchronous answer to rollout_fleet for clients without the Tasks extension.
pub fn started_result(fr: &FleetRollout, replayed: bool) -> CallToolResult {
    let s = task::summary(fr);
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
