//! The tools' arguments: typed, so that their JSON schema is what agents see and a wrong argument is an
//! error the caller can fix.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::auth::Identity;
use crate::{
    api::{Analysis, FleetRolloutSpec, Health, Strategy, Targets},
    core::plan,
};

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
    /// With clusters.selector (rollouts in the fleet namespace, with a namespaceSelector): the workloads of
    /// the member clusters it picks instead.
    pub targets: Targets,
    /// Batch sizes (batchSize, steps), failure budget (maxFailures), pacing, approvals, onFailure; across
    /// member clusters, waves [{name, clusterSelector, maxConcurrency}] in order (canary cluster first).
    #[serde(default)]
    pub strategy: Option<Strategy>,
    /// Health timeout, soak time, optional HTTP check.
    #[serde(default)]
    pub health: Option<Health>,
    /// Metric analysis each healthy batch must pass (the FleetRollout's spec.analysis).
    #[serde(default)]
    pub analysis: Option<Analysis>,
    /// Where notifications of the rollout go (the FleetRollout's spec.notify): each names a Secret of the
    /// namespace labelled fleetroll.dev/notification-sink=true.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notify: Vec<crate::api::Subscription>,
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
    /// Which workloads (and, with clusters.selector, in which member clusters).
    pub targets: Targets,
    /// Batch sizes and the rest (waves, across member clusters).
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
    /// true: only the rollouts waiting for an approval you may give (the API server judges a dry run of
    /// each approval, as you).
    #[serde(default)]
    pub awaiting_my_approval: bool,
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
    /// The gates being approved (status.pendingApproval.gatesHash: health, analysis, maxFailures,
    /// onFailure, approval, resumeToken and who may approve); the current ones when absent. An approval of other gates is refused, so gates
    /// loosened under you are never approved by mistake.
    #[serde(default)]
    pub gates_hash: Option<String>,
    /// true also lets the batch the change windows hold now start (outside its windows, or in a freeze): an
    /// override of that hold only (status.windowHold), recorded with who gave it (status.windowOverrides).
    #[serde(default)]
    pub override_windows: bool,
}

impl RolloutFleetArgs {
    /// The spec this call asks for; `retention_seconds` is its ttlSecondsAfterFinished.
    pub fn spec(&self, retention_seconds: Option<i64>) -> FleetRolloutSpec {
        FleetRolloutSpec {
            image: self.image.clone(),
            container: self.container.clone(),
            targets: self.targets.clone(),
            strategy: self.strategy.clone().unwrap_or_default(),
            health: self.health.clone().unwrap_or_default(),
            analysis: self.analysis.clone(),
            notify: self.notify.clone(),
            resume_token: None,
            paused: self.paused,
            abort: false,
            rollback: false,
            ttl_seconds_after_finished: retention_seconds,
            approvals: Vec::new(),
            creator: None,
        }
    }

    /// Identifies the request, so a replayed key can be told apart from a reused one.
    pub fn request_hash(&self) -> String {
        let mut args = self.clone();
        args.idempotency_key = None;
        let mut h = plan::sha256_hex(&args);
        h.truncate(32);
        h
    }

    /// The name a keyed request creates: derived from who asked and the key, so a replay finds it.
    pub fn name_for(&self, who: &Identity) -> Option<String> {
        if let Some(name) = &self.name {
            return Some(name.clone());
        }
        let key = self.idempotency_key.as_ref()?;
        let mut h = plan::sha256_hex(&(&who.username, key, &self.namespace));
        h.truncate(12);
        Some(format!("rollout-{h}"))
    }
}

impl PreviewArgs {
    /// The rollout_fleet call this preview stands for: nothing beyond what a plan depends on.
    pub fn as_rollout(&self) -> RolloutFleetArgs {
        RolloutFleetArgs {
            namespace: self.namespace.clone(),
            name: None,
            idempotency_key: None,
            image: self.image.clone(),
            container: self.container.clone(),
            targets: self.targets.clone(),
            strategy: self.strategy.clone(),
            health: None,
            analysis: None,
            notify: Vec::new(),
            paused: false,
        }
    }
}
