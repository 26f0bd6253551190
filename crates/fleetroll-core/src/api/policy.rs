//! FleetRolloutPolicy: guardrails a platform team sets on the rollouts of the users, groups and
//! ServiceAccounts it names, which their creators cannot lift. Enforced at admission (the chart's
//! ValidatingAdmissionPolicy takes each policy as its parameter) and again by the operator before every
//! batch. Several policies compose: each one that matches applies, so the strictest wins.

// Each printcolumn repeats `type_`/`priority` keys, which this lint mistakes for duplicates.
#![allow(clippy::duplicated_attributes)]

use kube_derive::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ApprovalMode;

/// Guardrails on the rollouts of the subjects it names.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "fleetroll.dev",
    version = "v1alpha1",
    kind = "FleetRolloutPolicy",
    plural = "fleetrolloutpolicies",
    shortname = "frp",
    category = "fleetroll",
    derive = "PartialEq",
    doc = "Guardrails a platform team sets on the FleetRollouts of the users, groups and ServiceAccounts it names: required approvals and approvers, batch and fleet size caps, required analysis, and where they may roll.",
    printcolumn(name = "Approval", type_ = "string", json_path = ".spec.approval"),
    printcolumn(name = "Max-Batch", type_ = "integer", json_path = ".spec.maxBatchSize"),
    printcolumn(name = "Max-Targets", type_ = "integer", json_path = ".spec.maxTargets"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct FleetRolloutPolicySpec {
    /// Whose rollouts it governs: those whose recorded creator (spec.creator) is one of these users, in one
    /// of these groups, or one of these ServiceAccounts. Every ServiceAccount: the group
    /// system:serviceaccounts; those of one namespace: system:serviceaccounts:<namespace>.
    pub subjects: PolicySubjects,

    /// The least approval their rollouts have: FirstBatch or EveryBatch. A rollout asking for less is
    /// refused at admission, and the operator holds its batches for this approval all the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalMode>,

    /// Who may approve their rollouts: one of these users or a member of one of these groups (who must
    /// also hold the approve verb, and not be the creator). Unset: whoever holds the approve verb.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvers: Option<Approvers>,

    /// The most targets one batch of their rollouts may change. A batchSize or step written as a count
    /// above it is refused at admission; one written as a percentage is judged on the plan, by the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub max_batch_size: Option<u32>,

    /// The most targets one of their rollouts may have, judged on its plan by the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub max_targets: Option<u32>,

    /// true: their rollouts must carry a metric analysis (spec.analysis). Default false.
    #[serde(default)]
    pub require_analysis: bool,

    /// The namespaces whose workloads they may roll (a rollout's own namespace, and every namespace a
    /// cross-namespace rollout reaches). Unset: any the rest of fleetroll allows. At most 256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 63)))]
    pub namespaces: Option<Vec<String>>,

    /// When their rollouts may start batches: Allow windows (a batch starts only while one is open) and Deny
    /// windows (freezes: no batch starts while one is open), on top of each rollout's own. At most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub windows: Vec<super::ChangeWindow>,

    /// Where notifications of their rollouts also go (each Secret in the fleet namespace). At most 8.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub notify: Vec<super::Subscription>,

    /// The member clusters they may roll, by name (a rollout's own cluster is not a member and is not
    /// limited by this). Unset: any. At most 256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 253)))]
    pub clusters: Option<Vec<String>>,
}

/// Users, groups and ServiceAccounts.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct PolicySubjects {
    /// User names, as the API server authenticates them. At most 256.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 512)))]
    pub users: Vec<String>,

    /// Group names. At most 256.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 256)))]
    pub groups: Vec<String>,

    /// ServiceAccounts by namespace and name. At most 256.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub service_accounts: Vec<ServiceAccountRef>,
}

/// A ServiceAccount.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountRef {
    /// Its namespace.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// Its name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Who may approve.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct Approvers {
    /// User names. At most 256.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 512)))]
    pub users: Vec<String>,

    /// Group names. At most 256.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 256)))]
    pub groups: Vec<String>,
}

/// A FleetRolloutPolicy a planned rollout breaks.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyHold {
    /// The FleetRolloutPolicy's name.
    pub policy: String,
    /// Its rule that the rollout breaks: approval, maxBatchSize, maxTargets, requireAnalysis, namespaces
    /// or clusters.
    pub rule: String,
    /// What breaks it, e.g. "batch 1 has 80 targets, at most 50 allowed".
    pub message: String,
}

/// The API server refused changes made as the rollout's creator: the creator no longer holds the rights.
/// Every later batch waits until a person resumes the rollout (`spec.resumeToken` changes), once the rights
/// are back, or aborts or rolls it back.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RightsHold {
    /// The index (0-based) of the batch whose changes were refused.
    pub batch: u32,
    /// The API server's words for the first refusal.
    #[schemars(length(max = 1024))]
    pub message: String,
    /// spec.resumeToken when the changes were refused: any other value releases the hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub resume_token: Option<String>,
}
