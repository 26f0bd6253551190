//! The approvals of a rollout as its status records them: the one a batch waits for, and those that
//! released batches (the approvals themselves are in the spec).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The approval a rollout waits for: add it to spec.approvals to release the batch.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingApproval {
    /// The index (0-based) of the batch waiting: the `batch` of the approval to add.
    pub batch: u32,
    /// The plan to approve (status.plan.hash): the `planHash` of the approval to add.
    pub plan_hash: String,
    /// The gates to approve (health, analysis, strategy.maxFailures, strategy.onFailure, strategy.approval,
    /// resumeToken and the approvers policies name, hashed): the `gatesHash` of the approval to add.
    #[serde(default)]
    pub gates_hash: String,
    /// Since when the batch has been waiting (RFC 3339).
    pub since: Time,
    /// Who may give it, when FleetRolloutPolicies say: an approver must be one of the users or in one of
    /// the groups of each policy listed (and hold the approve verb, and not be the creator). Empty: whoever
    /// holds the approve verb.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub approvers: Vec<PolicyApprovers>,
}

/// The approvers one FleetRolloutPolicy names, as far as status shows them (16 users and 16 groups at
/// most; `more` says some are left out, and the policy itself names them all).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyApprovers {
    /// The FleetRolloutPolicy's name.
    #[schemars(length(max = 253))]
    pub policy: String,
    /// User names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 512)))]
    pub users: Vec<String>,
    /// Group names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 256)))]
    pub groups: Vec<String>,
    /// true: the policy names more users or groups than are shown here.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub more: bool,
}

/// The approvers FleetRolloutPolicies name for a rollout, as the operator last saw them, and a nonce drawn
/// at random whenever they change. The gates an approval cites bind the nonce, so no approval written before
/// the approvers changed (nor one worked out in advance) cites them: the batch waits for one that admission
/// judged under the policies as they are.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApproverEpoch {
    /// A digest of the approvers every governing policy names (empty: none names any now).
    #[schemars(length(max = 64))]
    pub approvers: String,
    /// Drawn when they changed (16 hex digits).
    #[schemars(length(max = 64))]
    pub nonce: String,
}

/// An approval that released a batch.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRecord {
    /// The index (0-based) of the batch it released.
    pub batch: u32,
    /// The plan it approved (status.plan.hash at the time).
    pub plan_hash: String,
    /// The gates it approved: a change to them since needs another approval before the next batch.
    #[serde(default)]
    pub gates_hash: String,
    /// Who approved, when known (spec.approvals[].approvedBy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    /// When the batch was released (RFC 3339).
    pub approved_at: Time,
}
