//! What the MCP tools do to the FleetRollouts. Reads use the server's own credentials, after the caller's
//! permission for exactly that operation was checked (see `auth`); writes are made as the caller (see
//! `impersonate`).

use std::{collections::BTreeMap, sync::Arc};

use kube::{
    Api, Client, ResourceExt,
    api::{ObjectMeta, PostParams},
};
use rmcp::model::CallToolResult;
use serde_json::{Value, json};
use tracing::{debug, warn};

use super::{
    args::{ApproveArgs, ListArgs, RolloutFleetArgs, RolloutRef},
    auth::Identity,
    cache::Rollouts,
    impersonate::Writer,
    task::{
        self, CREATED_BY_ANNOTATION, IDEMPOTENCY_KEY_HASH_ANNOTATION, REQUEST_HASH_ANNOTATION,
        TASK_TOKEN_HASH_ANNOTATION, TaskId,
    },
    tools::ok,
};
use crate::{
    api::{FleetRollout, PlannedTarget},
    core::task::{Summary, describe, summary},
    edge::{
        control::{self, ControlError},
        members::Members,
        plans::PlanStore,
    },
};

/// Field manager of the MCP server's writes (distinct from the operator's and from GitOps tools').
pub const FIELD_MANAGER: &str = "fleetroll-mcp";

/// What the MCP tools need of the world.
#[derive(Clone)]
pub struct Ops {
    /// The server's own client, for reads (the cache reads with it too).
    pub client: Client,
    /// Who writes are made as.
    pub writer: Writer,
    /// Reads go through the watch cache; writes are recorded in it.
    pub rollouts: Rollouts,
    /// Frozen plans, read back (and checked against their hash) for the approval forms that name targets.
    pub plans: Arc<PlanStore>,
    /// The member clusters, read with the server's own client: a preview across members reads them only
    /// for a caller who may create that rollout (see `preview`), so callers need no Secret rights.
    pub members: Members,
    pub fleet_namespace: String,
    /// ttlSecondsAfterFinished of rollouts started over MCP (the task's retention).
    pub retention_seconds: i64,
}

fn api(client: &Client, ns: &str) -> Api<FleetRollout> {
    Api::namespaced(client.clone(), ns)
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

/// How a start is recognised when it is made again: the name it creates, a hash of its arguments, its
/// task token and the hash of its idempotency key.
struct StartKeys {
    name: Option<String>,
    request_hash: String,
    token: String,
    key_hash: Option<String>,
}

impl StartKeys {
    fn of(args: &RolloutFleetArgs, who: &Identity) -> Self {
        let name = args.name_for(who);
        // With a key, the token can be derived again on a replay; without one, nothing needs it later.
        let (token, key_hash) = match (&args.idempotency_key, &name) {
            (Some(key), Some(name)) => (
                task::keyed_token(key, &who.username, &args.namespace, name),
                Some(task::key_hash(key, &who.username, &args.namespace)),
            ),
            _ => (task::new_token(), None),
        };
        Self { name, request_hash: args.request_hash(), token, key_hash }
    }

    fn annotations(&self, who: &Identity) -> BTreeMap<String, String> {
        let mut annotations = BTreeMap::from([
            (TASK_TOKEN_HASH_ANNOTATION.to_string(), task::token_hash(&self.token)),
            (REQUEST_HASH_ANNOTATION.to_string(), self.request_hash.clone()),
        ]);
        if who.username != task::ANONYMOUS {
            annotations.insert(CREATED_BY_ANNOTATION.to_string(), who.username.clone());
        }
        if let Some(key_hash) = &self.key_hash {
            annotations.insert(IDEMPOTENCY_KEY_HASH_ANNOTATION.to_string(), key_hash.clone());
        }
        annotations
    }

    /// Whether `existing` is what this start created before, or what another start (or someone else) did.
    fn replays(&self, existing: &FleetRollout, who: &Identity) -> (bool, bool) {
        let a = existing.annotations();
        let same_key =
            self.key_hash.is_some() && a.get(IDEMPOTENCY_KEY_HASH_ANNOTATION) == self.key_hash.as_ref();
        let same_caller = task::created_by(existing) == who.username;
        (same_key && same_caller, a.get(REQUEST_HASH_ANNOTATION) == Some(&self.request_hash))
    }
}

impl Ops {
    /// Creates the FleetRollout of a rollout_fleet call, as the caller. Err is a message for the caller.
    pub async fn start(&self, args: &RolloutFleetArgs, who: &Identity) -> Result<Started, ControlError> {
        let client = self.writer.client_for(who)?;
        let keys = StartKeys::of(args, who);
        let fr = FleetRollout {
            metadata: ObjectMeta {
                name: keys.name.clone(),
                generate_name: keys.name.is_none().then(|| "rollout-".to_string()),
                namespace: Some(args.namespace.clone()),
                annotations: Some(keys.annotations(who)),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/created-by".to_string(),
                    "fleetroll-mcp".to_string(),
                )])),
                ..Default::default()
            },
            spec: args.spec(Some(self.retention_seconds)),
            status: None,
        };
        let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        match api(&client, &args.namespace).create(&pp, &fr).await {
            Ok(created) => {
                self.rollouts.wrote(&created);
                Ok(Started { rollout: created, token: keys.token, replayed: false })
            }
            Err(e) if crate::error::is_conflict(&e) => Self::replay(&client, args, keys, who).await,
            Err(e) => Err(ControlError::from_kube(e, "creating the FleetRollout")),
        }
    }

    /// A start whose name is taken: the same start made again (the same caller, key and arguments) gets
    /// the rollout it made; anything else is refused.
    async fn replay(
        client: &Client,
        args: &RolloutFleetArgs,
        keys: StartKeys,
        who: &Identity,
    ) -> Result<Started, ControlError> {
        let (ns, name) = (&args.namespace, keys.name.clone().unwrap_or_default());
        let existing = control::get(client, ns, &name).await?;
        match keys.replays(&existing, who) {
            (true, true) => Ok(Started { rollout: existing, token: keys.token, replayed: true }),
            (true, false) => Err(ControlError::Changed(format!(
                "idempotencyKey {:?} was already used with different arguments (FleetRollout {ns}/{name}); \
                 use a new key for a new rollout",
                args.idempotency_key.as_deref().unwrap_or_default(),
            ))),
            _ => Err(ControlError::Changed(format!("a FleetRollout named {ns}/{name} already exists"))),
        }
    }

    pub async fn get(&self, r: &RolloutRef) -> Result<Arc<FleetRollout>, ControlError> {
        let what = format!("FleetRollout {}/{}", r.namespace, r.name);
        match self.rollouts.get(&r.namespace, &r.name).await {
            Ok(Some(fr)) => Ok(fr),
            Ok(None) => Err(ControlError::NotFound { what }),
            Err(e) => Err(ControlError::from_kube(e, what)),
        }
    }

    pub async fn list(&self, args: &ListArgs, who: &Identity) -> Result<CallToolResult, ControlError> {
        let mut list = self
            .rollouts
            .list(args.namespace.as_deref())
            .await
            .map_err(|e| ControlError::from_kube(e, "listing FleetRollouts"))?;
        if args.awaiting_my_approval {
            let client = self.writer.client_for(who)?;
            let mut mine = Vec::new();
            // Only those waiting, one dry run each; one the API server cannot judge now is left out (and
            // logged), not the whole answer.
            for fr in list.into_iter().filter(|fr| crate::core::task::awaited_approval(fr).is_some()) {
                match control::may_approve(&client, &fr).await {
                    Ok(true) => mine.push(fr),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, user = %who.username, "awaitingMyApproval: left out")
                    }
                }
            }
            list = mine;
        }
        let summaries: Vec<Summary> = list.iter().map(|fr| summary(fr)).collect();
        let text = if summaries.is_empty() {
            "no FleetRollouts".to_string()
        } else {
            summaries.iter().map(describe).collect::<Vec<_>>().join("\n")
        };
        Ok(ok(text, json!({"rollouts": summaries})))
    }

    /// Sets spec controls (paused, abort, rollback), as `who`.
    pub async fn set(
        &self,
        r: &RolloutRef,
        spec: Value,
        who: &Identity,
    ) -> Result<FleetRollout, ControlError> {
        let client = self.writer.client_for(who)?;
        let fr = control::set(&client, &r.namespace, &r.name, spec, FIELD_MANAGER).await?;
        self.rollouts.wrote(&fr);
        Ok(fr)
    }

    /// Approves (batch, plan) as `who`, recording them: see [`crate::edge::control::approve`].
    pub async fn approve(&self, args: &ApproveArgs, who: &Identity) -> Result<FleetRollout, ControlError> {
        let client = self.writer.client_for(who)?;
        let fr = control::approve(
            &client,
            &args.namespace,
            &args.name,
            control::Approving {
                batch: args.batch,
                plan_hash: args.plan_hash.as_deref(),
                gates_hash: args.gates_hash.as_deref(),
                override_windows: args.override_windows,
            },
            // Written as the caller, the approval names it; without authentication there is no one to name.
            matches!(self.writer, Writer::Caller(_)).then_some(who.username.as_str()),
            FIELD_MANAGER,
        )
        .await?;
        self.rollouts.wrote(&fr);
        Ok(fr)
    }

    /// The rollout a task id names (its secret token matching), with whether `who` created the task.
    pub async fn task_rollout(
        &self,
        id: &TaskId,
        who: &Identity,
    ) -> Result<Option<(Arc<FleetRollout>, bool)>, kube::Error> {
        let Some(fr) = self.rollouts.get(&id.namespace, &id.name).await? else {
            return Ok(None);
        };
        let owned = task::created_by(&fr) == who.username;
        Ok((id.matches(&fr) && fr.metadata.deletion_timestamp.is_none()).then_some((fr, owned)))
    }

    /// The targets of `batch` in the plan the operator froze for `fr`, wherever it is stored (status or
    /// ConfigMaps), checked against its hash. None when it cannot be read or is not the frozen plan: an
    /// approval form then names no targets, and still asks about the right batch and plan hash. Read with
    /// the server's own account, which needs `get` on ConfigMaps for large plans (the chart grants it).
    pub async fn batch_targets(&self, fr: &FleetRollout, batch: u32) -> Option<Vec<PlannedTarget>> {
        let plan_ref = fr.status.as_ref()?.plan.as_ref()?;
        let loaded = match self.plans.load(&self.client, fr, plan_ref).await {
            Ok(Ok(loaded)) => loaded,
            // The operator says so itself, in the rollout's status and events.
            Ok(Err(refused)) => {
                debug!(rollout = %fr.name_any(), reason = refused.reason, "the frozen plan is not trusted");
                return None;
            }
            Err(e) => {
                warn!(rollout = %fr.name_any(), error = %e, "cannot read the frozen plan");
                return None;
            }
        };
        loaded.plan.batches.get(usize::try_from(batch).ok()?).cloned()
    }
}
