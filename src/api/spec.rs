//! The FleetRollout spec: what to roll out, where, how fast, and the controls people and agents hold.
//!
//! The schema rejects nonsense at the API server (CEL rules with messages a person understands), so the
//! operator only ever sees specs of the right shape.

// Each printcolumn repeats `type_`/`priority` keys, which this lint mistakes for duplicates.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::status::FleetRolloutStatus;

/// Rolls one container image across a fleet of workloads in health-checked batches.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "fleetroll.dev",
    version = "v1alpha1",
    kind = "FleetRollout",
    plural = "fleetrollouts",
    shortname = "fro",
    category = "fleetroll",
    namespaced,
    status = "FleetRolloutStatus",
    derive = "PartialEq",
    doc = "A batched, health-checked image rollout across a fleet of workloads. Its status is the durable checkpoint.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Progress",
        type_ = "string",
        json_path = ".status.progress",
        description = "targets updated / total"
    ),
    printcolumn(
        name = "Batch",
        type_ = "string",
        json_path = ".status.batch",
        description = "current batch / batches"
    ),
    printcolumn(name = "Image", type_ = "string", json_path = ".spec.image"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Failed", type_ = "integer", json_path = ".status.counts.failed", priority = "1"),
    printcolumn(name = "Message", type_ = "string", json_path = ".status.message", priority = "1")
)]
#[serde(rename_all = "camelCase")]
pub struct FleetRolloutSpec {
    /// The image to roll out, e.g. registry.example.com/web:v2.
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new("self.matches('^\\\\S+$')").message("image must be a non-empty image reference without spaces, such as registry.example.com/web:v2"))]
    pub image: String,

    /// The container whose image changes. Optional when every target has exactly one container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub container: Option<String>,

    /// Which workloads make up the fleet.
    pub targets: Targets,

    /// Batch sizes, failure budget, pacing and approvals.
    #[serde(default)]
    pub strategy: Strategy,

    /// What "healthy" means for a target.
    #[serde(default)]
    pub health: Health,

    /// Holds the rollout before its next batch. The batch in flight finishes.
    #[serde(default)]
    pub paused: bool,

    /// Stops the rollout for good. Targets already changed keep the new image.
    #[serde(default)]
    pub abort: bool,

    /// Restores the previous image of every target this rollout changed, once, then stops.
    #[serde(default)]
    pub rollback: bool,

    /// Deletes the FleetRollout (and its plan objects) this many seconds after it finishes, at most 2592000
    /// (30 days). Unset: kept until deleted. Rollouts started over MCP get the server's task retention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 2592000))]
    pub ttl_seconds_after_finished: Option<i64>,

    /// Approvals for gated batches, each bound to the plan it approves (status.plan.hash).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["batch"]))]
    pub approvals: Vec<Approval>,
}

/// The fleet: every workload of `kind` matching `selector`, in the allowed namespaces; or, for kind `Node`,
/// every node (matching `nodeSelector`) that runs a pod of the DaemonSet `daemonSet`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(SELECTOR_RULE).message("targets.selector must not be empty: an empty selector would select every workload"))]
#[x_kube(validation = Rule::new(DAEMONSET_RULE).message("targets.daemonSet is required when targets.kind is Node: name the DaemonSet (in the rollout's namespace) whose pods are replaced node by node"))]
#[x_kube(validation = Rule::new(NODE_ONLY_RULE).message("targets.daemonSet and targets.nodeSelector apply only to kind Node"))]
#[x_kube(validation = Rule::new(NODE_NAMESPACES_RULE).message("targets.namespaceSelector does not apply to kind Node: the DaemonSet is in the rollout's own namespace"))]
#[x_kube(validation = Rule::new(NODE_TRANSITION_RULE).message("a node rollout's targets.kind and targets.daemonSet cannot change: it holds that DaemonSet until it ends; create another FleetRollout"))]
pub struct Targets {
    /// The kind of workload, each matching workload being one target; or `Node`, each node being one.
    pub kind: TargetKind,

    /// Label selector on the workloads (not used with kind Node).
    #[serde(default)]
    pub selector: LabelSelector,

    /// Label selector on namespaces. Absent: the rollout's own namespace only. Present: honoured only for
    /// rollouts in the operator's fleet namespace, and only namespaces labelled
    /// `fleetroll.dev/rollouts: enabled` are touched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,

    /// Kind Node: the DaemonSet, in the rollout's namespace, whose pods are replaced node by node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub daemon_set: Option<String>,

    /// Kind Node: label selector on the nodes. Absent: every node that runs a pod of the DaemonSet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
}

/// What a rollout's targets are.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
pub enum TargetKind {
    /// Each matching Deployment.
    #[default]
    Deployment,
    /// Each matching StatefulSet.
    StatefulSet,
    /// Each matching DaemonSet, rolled by its own update strategy.
    DaemonSet,
    /// Each node running a pod of `targets.daemonSet`: fleetroll replaces that pod node by node.
    Node,
}

/// How the fleet is cut into batches and what happens when targets fail.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Strategy {
    /// Targets per batch once the `steps` are used up: an integer or a percentage of the fleet ("25%").
    #[serde(default = "default_batch_size")]
    #[x_kube(validation = Rule::new(BATCH_SIZE_RULE).message("batchSize must be a positive integer or a percentage from 1% to 100%, such as 10 or \"25%\""))]
    pub batch_size: IntOrString,

    /// Sizes of the first batches (canary first), each an integer or a percentage; then `batchSize`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    #[x_kube(validation = Rule::new(STEPS_RULE).message("every step must be a positive integer or a percentage from 1% to 100%, such as 1 or \"10%\""))]
    pub steps: Vec<IntOrString>,

    /// Failed targets tolerated (an integer, or a percentage of the fleet) before `onFailure` applies.
    #[serde(default = "default_max_failures")]
    #[x_kube(validation = Rule::new(MAX_FAILURES_RULE).message("maxFailures must be an integer of 0 or more, or a percentage from 0% to 100%, such as 2 or \"5%\""))]
    pub max_failures: IntOrString,

    /// Wait between one batch finishing and the next starting, e.g. 30s, 5m, 1h30m (at most 720h).
    #[serde(default = "zero_duration")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(DURATION_RULE).message("pauseBetweenBatches must be a duration of at most 720h (30 days), such as 0s, 30s, 5m or 1h30m"))]
    pub pause_between_batches: String,

    /// Which batches wait for an approval.
    #[serde(default)]
    pub approval: ApprovalMode,

    /// What to do once more targets failed than `maxFailures` allows.
    #[serde(default)]
    pub on_failure: FailurePolicy,
}

const SELECTOR_RULE: &str = "self.kind == 'Node' || (has(self.selector) && ((has(self.selector.matchLabels) && size(self.selector.matchLabels) > 0) || (has(self.selector.matchExpressions) && size(self.selector.matchExpressions) > 0)))";
const DAEMONSET_RULE: &str = "self.kind != 'Node' || has(self.daemonSet)";
const NODE_ONLY_RULE: &str = "self.kind == 'Node' || (!has(self.daemonSet) && !has(self.nodeSelector))";
const NODE_NAMESPACES_RULE: &str = "self.kind != 'Node' || !has(self.namespaceSelector)";
// A transition rule (it reads oldSelf): checked on updates only.
const NODE_TRANSITION_RULE: &str = "oldSelf.kind != 'Node' || (self.kind == 'Node' && has(self.daemonSet) && has(oldSelf.daemonSet) && self.daemonSet == oldSelf.daemonSet)";
// int-or-string rules: CEL sees an int or a string.
const BATCH_SIZE_RULE: &str = "type(self) == int ? self >= 1 : self.matches('^(100|[1-9][0-9]?)%$')";
const STEPS_RULE: &str = "self.all(s, type(s) == int ? s >= 1 : s.matches('^(100|[1-9][0-9]?)%$'))";
const MAX_FAILURES_RULE: &str = "type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')";
const DURATION_RULE: &str = crate::core::duration::SCHEMA_RULE;

fn default_batch_size() -> IntOrString {
    IntOrString::String("25%".into())
}
fn default_max_failures() -> IntOrString {
    IntOrString::Int(0)
}
fn zero_duration() -> String {
    "0s".into()
}
fn default_timeout() -> String {
    "10m".into()
}
fn default_expect_status() -> u16 {
    200
}

impl Default for Strategy {
    fn default() -> Self {
        Self {
            batch_size: default_batch_size(),
            steps: Vec::new(),
            max_failures: default_max_failures(),
            pause_between_batches: zero_duration(),
            approval: ApprovalMode::default(),
            on_failure: FailurePolicy::default(),
        }
    }
}

/// Which batches wait for an approval.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ApprovalMode {
    /// No batch waits.
    #[default]
    None,
    /// The first batch waits, so the plan is approved before anything changes.
    FirstBatch,
    /// Every batch waits for its own approval.
    EveryBatch,
}

/// What happens once the failure budget is exceeded.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Stop before the next batch and wait (raise maxFailures to go on, or abort, or roll back).
    #[default]
    Pause,
    /// Restore the previous image of every changed target, then stop as RolledBack.
    Rollback,
    /// Stop as Failed; targets keep what they have.
    Abort,
}

/// What "healthy" means for a target.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    /// A target not healthy this long after its change has failed, e.g. 10m (at most 720h).
    #[serde(default = "default_timeout")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(DURATION_RULE).message("timeout must be a duration of at most 720h (30 days), such as 90s, 10m or 1h"))]
    pub timeout: String,

    /// How long every target of a batch must stay healthy before the batch counts, e.g. 1m (at most 720h).
    #[serde(default = "zero_duration")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(DURATION_RULE).message("soak must be a duration of at most 720h (30 days), such as 0s, 30s or 5m"))]
    pub soak: String,

    /// An HTTP check each target must also pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpCheck>,
}

impl Default for Health {
    fn default() -> Self {
        Self { timeout: default_timeout(), soak: zero_duration(), http: None }
    }
}

/// An HTTP GET per target; `{name}` and `{namespace}` in the URL are replaced by the target's. The host must
/// name the target (`{name}.{namespace}.svc`; node rollouts: `{node}`, `{podIP}`, `{hostIP}`) or be allowed
/// by the operator (`--http-check-allow`); loopback, link-local and the API server are never probed unless
/// allowed, and redirects are not followed.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpCheck {
    /// e.g. http://{name}.{namespace}.svc:8080/healthz
    #[schemars(length(max = 2048))]
    #[x_kube(validation = Rule::new("self.matches('^https?://\\\\S+$')").message("http.url must be an http:// or https:// URL, such as http://{name}.{namespace}.svc:8080/healthz"))]
    #[x_kube(validation = Rule::new("!self.matches('^https?://[^/?#]*@')").message("http.url must not carry user information (user@host): it would name another host than it seems to"))]
    #[x_kube(validation = Rule::new("!self.matches('^https?://(169\\\\.254\\\\.|\\\\[[fF][eE][89abAB][0-9a-fA-F]:)')").message("http.url must not name a link-local address, where cloud metadata services answer"))]
    pub url: String,

    /// The status code that means healthy.
    #[serde(default = "default_expect_status")]
    #[schemars(range(min = 100, max = 599))]
    pub expect_status: u16,
}

/// An approval of one batch of one plan.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Approval {
    /// The batch index (0-based) this approves.
    #[schemars(range(min = 0, max = 100000))]
    pub batch: u32,

    /// The plan this approves (status.plan.hash). A changed plan needs a new approval.
    #[schemars(length(min = 1, max = 64))]
    pub plan_hash: String,

    /// Who approved, when known (the MCP server fills it in from the caller's verified identity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub approved_by: Option<String>,
}
