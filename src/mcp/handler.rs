//! The MCP methods: `tools/list` and `tools/call`, and `tasks/get`, `tasks/update` and `tasks/cancel` for
//! rollouts started as tasks. Each re-checks that the caller was granted exactly the operation it runs.

use std::{future::Future, sync::Arc};

use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, CreateTaskResult,
        GetTaskParams, GetTaskResult, Implementation, JsonObject, ListToolsResult, PaginatedRequestParams,
        ServerCapabilities, ServerConfig, UpdateTaskParams,
    },
    service::RequestContext,
};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::{info, warn};

use super::{
    FleetMcp,
    args::{ApproveArgs, ListArgs, PreviewArgs, RolloutFleetArgs, RolloutRef},
    auth::{Access, Decision, Granted, Identity, Verb},
    task::{self, TaskId},
    tools::{self, Control, FleetTool},
};
use crate::{
    api::{FleetRollout, FleetRolloutStatus},
    core::{
        policy,
        task::{Asker, awaited_approval, parse_approval_key, view},
    },
    edge::control::ControlError,
};

/// The identity and grant the auth middleware attached to the HTTP request. Without them (a request that
/// did not come through the middleware: in-process, or a routing mistake) the caller is refused, unless the
/// server runs with `--auth none`, where every caller is the anonymous one with every permission.
fn caller(cx: &RequestContext<RoleServer>, auth_off: bool) -> Result<(Identity, Granted), McpError> {
    caller_of(cx.extensions.get::<axum::http::request::Parts>(), auth_off)
}

fn caller_of(
    parts: Option<&axum::http::request::Parts>,
    auth_off: bool,
) -> Result<(Identity, Granted), McpError> {
    let identity = parts.and_then(|p| p.extensions.get::<Identity>()).cloned();
    let granted = parts.and_then(|p| p.extensions.get::<Granted>()).cloned();
    match (identity, granted) {
        (Some(i), Some(g)) => Ok((i, g)),
        _ if auth_off => Ok((Identity::anonymous(), Granted::All)),
        _ => Err(McpError::invalid_request("no authenticated caller: this request was not authorized", None)),
    }
}

fn not_found() -> McpError {
    McpError::invalid_params("Failed to retrieve task: Task not found", None)
}

fn forbidden() -> McpError {
    McpError::invalid_request("this operation was not authorized for this request", None)
}

fn internal(e: impl std::fmt::Display) -> McpError {
    McpError::internal_error(format!("Kubernetes API: {e}"), None)
}

/// The JSON-RPC error of a failed control (tasks/update, tasks/cancel), one code per kind, with the
/// Kubernetes reason in `data.reason`: what does not exist is a bad parameter (as the Tasks extension
/// answers an unknown task), what is refused or changed meanwhile is a request that cannot be granted, and
/// an API server that cannot answer is an internal error worth retrying.
fn rpc_error(e: &ControlError) -> McpError {
    let data = Some(serde_json::json!({"reason": e.reason()}));
    match e {
        ControlError::NotFound { .. } | ControlError::Invalid { .. } => {
            McpError::invalid_params(e.to_string(), data)
        }
        ControlError::Forbidden { .. } | ControlError::Refused(_) | ControlError::Changed(_) => {
            McpError::invalid_request(e.to_string(), data)
        }
        // The operator's own credentials refused is no fault of the caller's.
        ControlError::Unauthorized { .. } | ControlError::Unavailable { .. } => {
            McpError::internal_error(e.to_string(), data)
        }
    }
}

/// Runs a tool with its parsed arguments; bad arguments and failures are tool errors the caller reads.
async fn with_args<T, F, Fut>(args: &JsonObject, run: F) -> CallToolResult
where
    T: DeserializeOwned,
    F: FnOnce(T) -> Fut,
    Fut: Future<Output = Result<CallToolResult, ControlError>>,
{
    match tools::parse::<T>(args) {
        Ok(args) => run(args).await.unwrap_or_else(|e| tools::failed(&e)),
        Err(e) => tools::error(e),
    }
}

impl FleetMcp {
    /// The caller, if they were granted `access` for this request.
    fn authorized(&self, cx: &RequestContext<RoleServer>, access: &Access) -> Result<Identity, McpError> {
        let (who, granted) = caller(cx, self.auth_off)?;
        if granted.allows(access) { Ok(who) } else { Err(forbidden()) }
    }

    /// The rollout of a task the caller may act on with `verb` (`patch` changes it: not on a read-only
    /// server), and who they are. A task is its creator's; someone else who was given its id may read it
    /// and answer its approval form only if they may be asked (hold `approve` on the rollout, and did not
    /// create it), never cancel it.
    async fn task_rollout(
        &self,
        task_id: &str,
        verb: Verb,
        cx: &RequestContext<RoleServer>,
    ) -> Result<(TaskId, Identity, Arc<FleetRollout>), McpError> {
        let id = TaskId::parse(task_id).ok_or_else(not_found)?;
        let access = Access { verb, namespace: Some(id.namespace.clone()), name: Some(id.name.clone()) };
        let who = self.authorized(cx, &access)?;
        if verb != Verb::Get && self.read_only {
            return Err(forbidden());
        }
        let (fr, owned) = self.ops.task_rollout(&id, &who).await.map_err(internal)?.ok_or_else(not_found)?;
        let approver =
            || async { matches!(verb, Verb::Get | Verb::Approve) && self.may_be_asked(&who, &fr).await };
        if !owned && !approver().await {
            return Err(not_found());
        }
        Ok((id, who, fr))
    }

    async fn run(&self, tool: FleetTool, args: &JsonObject, who: &Identity, tasks: bool) -> CallToolResponse {
        let ops = &self.ops;
        let result = match tool {
            FleetTool::RolloutFleet => return self.rollout_fleet(args, who, tasks).await,
            FleetTool::PreviewRollout => {
                with_args(args, |a: PreviewArgs| async move { ops.preview(&a, who).await }).await
            }
            FleetTool::GetRollout => {
                with_args(
                    args,
                    |r: RolloutRef| async move { Ok(tools::summary_result(&*ops.get(&r).await?)) },
                )
                .await
            }
            FleetTool::ListRollouts => {
                with_args(args, |a: ListArgs| async move { ops.list(&a, who).await }).await
            }
            FleetTool::ApproveBatch => {
                with_args(args, |a: ApproveArgs| async move {
                    Ok(tools::summary_result(&ops.approve(&a, who).await?))
                })
                .await
            }
            FleetTool::Set(control) => {
                with_args(args, |r: RolloutRef| async move {
                    Ok(tools::summary_result(
                        &ops.set(&r, control.patch(k8s_openapi::jiff::Timestamp::now()), who).await?,
                    ))
                })
                .await
            }
        };
        result.into()
    }

    /// rollout_fleet: a task for clients with the Tasks extension, else the rollout's name to poll.
    async fn rollout_fleet(&self, args: &JsonObject, who: &Identity, tasks: bool) -> CallToolResponse {
        let args: RolloutFleetArgs = match tools::parse(args) {
            Ok(a) => a,
            Err(e) => return tools::error(e).into(),
        };
        let started = match self.ops.start(&args, who).await {
            Ok(started) => started,
            Err(e) => return tools::failed(&e).into(),
        };
        let fr = &started.rollout;
        info!(rollout = %format!("{}/{}", args.namespace, fr.metadata.name.clone().unwrap_or_default()), user = %who.username, replayed = started.replayed, "rollout_fleet");
        if tasks && let Some(id) = started.task() {
            // The FleetRollout is in etcd: tasks/get on any replica finds it from now on.
            let asker = Asker { forms: false, may_approve: false };
            let detailed = task::detailed(&id, view(fr, asker, &[], tools::now()));
            return CallToolResponse::Task(CreateTaskResult::new(detailed.task));
        }
        tools::started_result(fr, started.replayed).into()
    }

    /// Whether `who` is asked for the approval `fr` waits for: it is one of the approvers its policies name
    /// (status.pendingApproval.approvers), holds the approve verb on it, and is not its creator unless also
    /// granted self-approve (what admission asks of an approval, without a dry run per poll). When the API
    /// server cannot say (the caller's review budget spent), no: the message says who may.
    async fn may_be_asked(&self, who: &Identity, fr: &FleetRollout) -> bool {
        if self.auth_off {
            return true;
        }
        let approvers = fr.status.as_ref().and_then(|s| s.pending_approval.as_ref()).map(|p| &p.approvers);
        if !policy::allows_approver(approvers.map_or(&[][..], |a| a), &who.username, &who.groups) {
            return false;
        }
        let on =
            |verb| Access { verb, namespace: fr.metadata.namespace.clone(), name: fr.metadata.name.clone() };
        let allowed = |access: Access| async move {
            matches!(self.auth.authorize(who, &access).await, Ok(Decision::Allowed))
        };
        let created = fr.spec.creator.as_ref().is_some_and(|c| c.username == who.username);
        allowed(on(Verb::Approve)).await && (!created || allowed(on(Verb::SelfApprove)).await)
    }

    /// Approves the batch an input response answers, if it answers the approval outstanding in `status`.
    async fn answer(
        &self,
        id: &TaskId,
        who: &Identity,
        status: &FleetRolloutStatus,
        key: &str,
        answer: &Value,
    ) -> Result<(), McpError> {
        let revision = status.revision_number();
        // Keys that are not outstanding (answered, superseded, unknown) are ignored, as the extension asks.
        let Some((rev, batch, hash, gates)) = parse_approval_key(key) else { return Ok(()) };
        let outstanding = status
            .pending_approval
            .as_ref()
            .is_some_and(|p| p.batch == batch && p.plan_hash == hash && p.gates_hash == gates)
            && rev == revision;
        if !outstanding {
            return Ok(());
        }
        let accepted = answer.get("action").and_then(Value::as_str) == Some("accept")
            && answer.pointer("/content/approve").and_then(Value::as_bool) == Some(true);
        if !accepted {
            info!(rollout = %format!("{}/{}", id.namespace, id.name), user = %who.username, "approval declined; the rollout keeps waiting");
            return Ok(());
        }
        let args = ApproveArgs {
            namespace: id.namespace.clone(),
            name: id.name.clone(),
            batch: Some(batch),
            plan_hash: Some(hash),
            gates_hash: Some(gates),
            override_windows: false,
        };
        self.ops.approve(&args, who).await.map(drop).map_err(|e| {
            warn!(error = %e, user = %who.username, "approval through tasks/update failed");
            rpc_error(&e)
        })
    }
}

impl ServerHandler for FleetMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tasks().build())
            .with_server_info(Implementation::new("fleetroll", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "fleetroll rolls container images across fleets of Kubernetes workloads in health-checked batches. \
                 Start with preview_rollout to see the plan, then rollout_fleet. With the Tasks extension, poll the \
                 returned task; otherwise poll get_rollout. Approvals, pauses and aborts are tools too.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools::all(self.read_only)))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let Some(tool) = FleetTool::parse(&request.name) else {
            return Err(McpError::invalid_params(format!("unknown tool: {}", request.name), None));
        };
        if self.read_only && !tool.read_only() {
            return Ok(
                tools::error(format!("{} is not available: this server is read-only", tool.name())).into()
            );
        }
        let args = request.arguments.unwrap_or_default();
        // The middleware authorized exactly this operation: make sure it is the one about to run.
        let who = self.authorized(&cx, &tool.access(&Value::Object(args.clone())))?;
        let tasks = cx.client_capabilities().is_some_and(|c| c.supports_tasks());
        Ok(self.run(tool, &args, &who, tasks).await)
    }

    async fn get_task(
        &self,
        p: GetTaskParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let (id, who, fr) = self.task_rollout(&p.task_id, Verb::Get, &cx).await?;
        let forms = cx.client_capabilities().is_some_and(|c| c.elicitation.is_some());
        let pending = awaited_approval(&fr);
        let may_approve = pending.is_some() && self.may_be_asked(&who, &fr).await;
        let asker = Asker { forms, may_approve };
        // The form names the batch's targets, from the frozen plan wherever it is stored.
        let targets = match pending {
            Some(pending) if forms && may_approve => self.ops.batch_targets(&fr, pending.batch).await,
            _ => None,
        };
        let view = view(&fr, asker, targets.as_deref().unwrap_or_default(), tools::now());
        Ok(GetTaskResult::new(task::detailed(&id, view)))
    }

    async fn update_task(&self, p: UpdateTaskParams, cx: RequestContext<RoleServer>) -> Result<(), McpError> {
        let (id, who, fr) = self.task_rollout(&p.task_id, Verb::Approve, &cx).await?;
        let status = fr.status.clone().unwrap_or_default();
        for (key, answer) in &p.input_responses {
            self.answer(&id, &who, &status, key, answer).await?;
        }
        Ok(())
    }

    async fn cancel_task(&self, p: CancelTaskParams, cx: RequestContext<RoleServer>) -> Result<(), McpError> {
        let (id, who, fr) = self.task_rollout(&p.task_id, Verb::Patch, &cx).await?;
        // Idempotent: a finished rollout, or one already asked to abort, needs nothing more.
        let terminal = fr.status.as_ref().is_some_and(|s| s.phase.is_terminal());
        if !terminal && !fr.spec.abort {
            let r = RolloutRef { namespace: id.namespace.clone(), name: id.name.clone() };
            self.ops
                .set(&r, Control::Abort.patch(k8s_openapi::jiff::Timestamp::now()), &who)
                .await
                .map_err(|e| rpc_error(&e))?;
            let rollout = p.task_id.rsplit_once('/').map_or("", |(rollout, _)| rollout);
            info!(%rollout, user = %who.username, "cancel requested: abort");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{Granted, Identity, caller_of};

    #[test]
    fn a_request_without_an_identity_is_refused_unless_authentication_is_off() {
        assert!(caller_of(None, false).is_err(), "no HTTP request at all");
        let (bare, ()) = axum::http::Request::new(()).into_parts();
        assert!(caller_of(Some(&bare), false).is_err(), "an HTTP request the middleware did not see");
        let (mut only_identity, ()) = axum::http::Request::new(()).into_parts();
        only_identity.extensions.insert(Identity::anonymous());
        assert!(caller_of(Some(&only_identity), false).is_err(), "an identity without a grant");

        let (who, granted) = caller_of(None, true).unwrap();
        assert_eq!((who, granted), (Identity::anonymous(), Granted::All), "--auth none");

        let mut authorized = bare;
        let alice = Identity { username: "alice".into(), ..Identity::anonymous() };
        authorized.extensions.insert(alice.clone());
        authorized.extensions.insert(Granted::Only(None));
        assert_eq!(caller_of(Some(&authorized), false).unwrap(), (alice.clone(), Granted::Only(None)));
        assert_eq!(caller_of(Some(&authorized), true).unwrap().0, alice, "what the middleware found wins");
    }
}
