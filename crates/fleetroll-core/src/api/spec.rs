//! The FleetRollout spec: what to roll out, where, how fast, and the controls people and agents hold.
//!
//! The schema rejects nonsense at the API server (CEL rules with messages a person understands), so the
//! operator only ever sees specs of the right shape.

// Each printcolumn repeats `type_`/`priority` keys, which this lint mistakes for duplicates.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString};
use kube_derive::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    analysis::Analysis,
    clusters::{ClusterTargets, Wave},
    status::FleetRolloutStatus,
};

/// Rolls one container image across a fleet of workloads in health-checked batches.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[kube(
    crates(kube_core = "::kube_core"),
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
    printcolumn(
        name = "Creator",
        type_ = "string",
        json_path = ".spec.creator.username",
        priority = "1",
        description = "who created it, as the API server authenticated them"
    ),
    printcolumn(name = "Failed", type_ = "integer", json_path = ".status.counts.failed", priority = "1"),
    printcolumn(name = "Message", type_ = "string", json_path = ".status.message", priority = "1")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.strategy) || !has(self.strategy.waves) || size(self.strategy.waves) == 0 || has(self.targets.clusters)").message("strategy.waves orders member clusters: it needs targets.clusters"))]
#[x_kube(validation = Rule::new("!has(self.targets.clusters) || !has(self.health) || !has(self.health.http)").message("health.http does not apply to targets.clusters: the operator does not reach the Services of member clusters; readiness and metric analysis judge their targets"))]
#[x_kube(validation = Rule::new(CREATOR_RULE).message("spec.creator is recorded by admission when the rollout is created (or adopted, when it has none) and never changed afterwards"))]
pub struct FleetRolloutSpec {
    /// The image to roll out, by tag or digest, e.g. registry.example.com/web:v2.
    /// Changing it while the rollout runs starts a new revision.
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new("self.matches('^\\\\S+$')").message("image must be a non-empty image reference without spaces, such as registry.example.com/web:v2"))]
    pub image: String,

    /// The name of the container whose image changes in every target. Optional when every target has
    /// exactly one container; otherwise the rollout stays Pending (reason ContainerAmbiguous).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub container: Option<String>,

    /// Which workloads make up the fleet.
    pub targets: Targets,

    /// Batch sizes, failure budget, pacing and approvals.
    #[serde(default)]
    pub strategy: Strategy,

    /// Who created the rollout, as the API server authenticated them. Written by the chart's admission
    /// policy when the rollout is created (whatever a manifest says here is replaced) and never changed
    /// afterwards; approvals and platform policies judge it. Absent on rollouts created before it existed
    /// or without the admission policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creator: Option<Creator>,

    /// What "healthy" means for a target.
    #[serde(default)]
    pub health: Health,

    /// Metric analysis: queries against a Prometheus-compatible backend that a healthy batch must pass
    /// before it counts. Unset: no analysis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<Analysis>,

    /// Where notifications of this rollout go (webhooks, CloudEvents, Alertmanager), beside those
    /// FleetRolloutPolicies subscribe. Delivered at least once, each with an id that stays the same when
    /// sent again; never slowing a batch. At most 8.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub notify: Vec<super::Subscription>,

    /// true holds the rollout before its next batch (the batch in flight finishes); false lets it go on.
    /// Default false.
    #[serde(default)]
    pub paused: bool,

    /// true stops the rollout for good (phase Aborted). Targets already changed keep the new image.
    /// Default false.
    #[serde(default)]
    pub abort: bool,

    /// true restores the previous image of every target this rollout changed, once, then stops (phase
    /// RolledBack). Default false.
    #[serde(default)]
    pub rollback: bool,

    /// Set it to a new value (any text: the MCP resume_rollout tool and `kubectl fleetroll resume` write the
    /// current time, Argo CD's resume action a value naming the hold) to let a rollout go on that its analysis holds
    /// (reason AnalysisInconclusive, or AnalysisFailed under onFailure Pause): the metrics holding it count
    /// as Accepted. A value set before the hold began releases nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub resume_token: Option<String>,

    /// Deletes the FleetRollout (and its plan objects) this many seconds after it finishes, at most 2592000
    /// (30 days); notifications not yet delivered hold it up to 10 minutes more. Unset: kept until deleted.
    /// Rollouts started over MCP get the server's task retention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 2592000))]
    pub ttl_seconds_after_finished: Option<i64>,

    /// Approvals for the batches that `strategy.approval` gates, at most one per batch index, each bound
    /// to the plan it approves (status.plan.hash). At most 1000.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["batch"]))]
    pub approvals: Vec<Approval>,
}

/// The fleet: every workload of `kind` matching `selector`, in the allowed namespaces; or, for kind `Node`,
/// every node (matching `nodeSelector`) that runs a pod of the DaemonSet `daemonSet`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(SELECTOR_RULE).message("targets.selector must not be empty: an empty selector would select every workload"))]
#[x_kube(validation = Rule::new(DAEMONSET_RULE).message("targets.daemonSet is required when targets.kind is Node: name the DaemonSet (in the rollout's namespace) whose pods are replaced node by node"))]
#[x_kube(validation = Rule::new(NODE_ONLY_RULE).message("targets.daemonSet and targets.nodeSelector apply only to kind Node"))]
#[x_kube(validation = Rule::new(NODE_NAMESPACES_RULE).message("targets.namespaceSelector applies to kind Node only with targets.clusters (it picks the DaemonSet's namespaces in each member cluster); in the rollout's own cluster the DaemonSet is in the rollout's namespace"))]
#[x_kube(validation = Rule::new(CLUSTERS_NAMESPACES_RULE).message("targets.clusters needs targets.namespaceSelector: it picks the namespaces in each member cluster, and each must be labelled fleetroll.dev/rollouts=enabled there"))]
#[x_kube(validation = Rule::new(NODE_TRANSITION_RULE).message("a node rollout's targets.kind and targets.daemonSet cannot change: it holds that DaemonSet until it ends; create another FleetRollout"))]
pub struct Targets {
    /// What a target is: Deployment, StatefulSet or DaemonSet (each matching workload is one target), or
    /// Node (each node running a pod of `daemonSet` is one target). Changing it starts a new revision.
    pub kind: TargetKind,

    /// Label selector on the workloads; must not be empty, so that it never selects every workload. Not
    /// used with kind Node.
    #[serde(default)]
    pub selector: LabelSelector,

    /// Label selector on namespaces. Absent: the rollout's own namespace only. Present: honoured only for
    /// rollouts in the operator's fleet namespace, and only namespaces labelled
    /// `fleetroll.dev/rollouts: enabled` are touched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,

    /// The member clusters to reach (Argo CD cluster Secrets and Cluster API kubeconfig Secrets in the
    /// operator's fleet namespace). Unset: the cluster the FleetRollout lives in. Set: only member clusters,
    /// honoured only for rollouts in the fleet namespace, and `namespaceSelector` is required (it picks
    /// the namespaces in each member among those opted in there). Changing it starts a new revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusters: Option<ClusterTargets>,

    /// Kind Node (and required for it): the name of the DaemonSet, in the rollout's namespace, whose pods
    /// are replaced node by node. Cannot change while the rollout runs.
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
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct Strategy {
    /// How many targets per batch once the `steps` are used up: a count (10) or a percentage of all
    /// targets ("25%", rounded up to at least 1). Default "25%".
    #[serde(default = "default_batch_size")]
    #[x_kube(validation = Rule::new(BATCH_SIZE_RULE).message("batchSize must be a positive integer or a percentage from 1% to 100%, such as 10 or \"25%\""))]
    pub batch_size: IntOrString,

    /// Sizes of the first batches, in order, before `batchSize` takes over: each a count or a percentage of
    /// all targets, e.g. [1, "10%"] for a canary of one target, then 10%. At most 50.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    #[x_kube(validation = Rule::new(STEPS_RULE).message("every step must be a positive integer or a percentage from 1% to 100%, such as 1 or \"10%\""))]
    pub steps: Vec<IntOrString>,

    /// How many failed targets are tolerated: a count (2) or a percentage of all targets ("5%", rounded
    /// down). Once more targets than this have failed, `onFailure` applies. Default 0.
    #[serde(default = "default_max_failures")]
    #[x_kube(validation = Rule::new(MAX_FAILURES_RULE).message("maxFailures must be an integer of 0 or more, or a percentage from 0% to 100%, such as 2 or \"5%\""))]
    pub max_failures: IntOrString,

    /// How long to wait between one batch succeeding and the next starting, e.g. 30s, 5m or 1h30m (at most
    /// 720h). Default 0s.
    #[serde(default = "zero_duration")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(DURATION_RULE).message("pauseBetweenBatches must be a duration of at most 720h (30 days), such as 0s, 30s, 5m or 1h30m"))]
    pub pause_between_batches: String,

    /// Which batches wait for an approval in `spec.approvals`: None (default), FirstBatch (the plan is
    /// approved before anything changes) or EveryBatch.
    #[serde(default)]
    pub approval: ApprovalMode,

    /// The waves member clusters are rolled in, in order (e.g. a canary cluster, then regions): a batch
    /// never spans two waves, and every batch of a wave finishes before the next wave starts. Each cluster
    /// belongs to the first wave that selects it; the rest form a last wave, "(unassigned)". Needs
    /// `targets.clusters`. At most 20. Changing it starts a new revision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub waves: Vec<Wave>,

    /// When batches may start: the rollout's own change windows (Allow, and Deny for a freeze), on top of
    /// those FleetRolloutPolicies set. A batch starts only while every window allows it; one already started
    /// finishes. Changing them applies at once, with no new revision. At most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub windows: Vec<super::ChangeWindow>,

    /// What to do once more targets failed than `maxFailures` allows: Pause (default; wait for a person to
    /// raise maxFailures, abort or roll back), Rollback (restore the previous image of every changed
    /// target) or Abort (stop as Failed; targets keep what they have).
    #[serde(default)]
    pub on_failure: FailurePolicy,
}

const SELECTOR_RULE: &str = "self.kind == 'Node' || (has(self.selector) && ((has(self.selector.matchLabels) && size(self.selector.matchLabels) > 0) || (has(self.selector.matchExpressions) && size(self.selector.matchExpressions) > 0)))";
const DAEMONSET_RULE: &str = "self.kind != 'Node' || has(self.daemonSet)";
const NODE_ONLY_RULE: &str = "self.kind == 'Node' || (!has(self.daemonSet) && !has(self.nodeSelector))";
const CLUSTERS_NAMESPACES_RULE: &str = "!has(self.clusters) || has(self.namespaceSelector)";
const NODE_NAMESPACES_RULE: &str =
    "self.kind != 'Node' || !has(self.namespaceSelector) || has(self.clusters)";
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
            waves: Vec::new(),
            windows: Vec::new(),
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
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct Health {
    /// How long a changed target may take to become healthy (ready, and passing `http` if set) before it
    /// counts as failed, e.g. 90s or 10m (at most 720h). Default 10m.
    #[serde(default = "default_timeout")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(DURATION_RULE).message("timeout must be a duration of at most 720h (30 days), such as 90s, 10m or 1h"))]
    pub timeout: String,

    /// How long every target of a batch must stay healthy together before the batch succeeds, e.g. 1m (at
    /// most 720h). Default 0s.
    #[serde(default = "zero_duration")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(DURATION_RULE).message("soak must be a duration of at most 720h (30 days), such as 0s, 30s or 5m"))]
    pub soak: String,

    /// An HTTP GET each target must also pass, besides being ready. Unset: readiness alone.
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
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct HttpCheck {
    /// The URL to GET, with {name} and {namespace} replaced by the target's, e.g.
    /// http://{name}.{namespace}.svc:8080/healthz (node rollouts: {node}, {podIP}, {hostIP}). The host
    /// must name the target or be allowed by the operator (--http-check-allow); redirects are not followed.
    #[schemars(length(max = 2048))]
    #[x_kube(validation = Rule::new("self.matches('^https?://\\\\S+$')").message("http.url must be an http:// or https:// URL, such as http://{name}.{namespace}.svc:8080/healthz"))]
    #[x_kube(validation = Rule::new("!self.matches('^https?://[^/?#]*@')").message("http.url must not carry user information (user@host): it would name another host than it seems to"))]
    #[x_kube(validation = Rule::new("!self.matches('^https?://(169\\\\.254\\\\.|\\\\[[fF][eE][89abAB][0-9a-fA-F]:)')").message("http.url must not name a link-local address, where cloud metadata services answer"))]
    pub url: String,

    /// The HTTP status code that means healthy, 100 to 599. Default 200.
    #[serde(default = "default_expect_status")]
    #[schemars(range(min = 100, max = 599))]
    pub expect_status: u16,
}

/// A user as the API server authenticated them when they created a rollout.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct Creator {
    /// The user name, e.g. alice, or system:serviceaccount:<namespace>:<name> for a ServiceAccount.
    #[schemars(length(max = 512))]
    pub username: String,

    /// The user's uid, when the authenticator gives one (ServiceAccounts and most OIDC users do).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 256))]
    pub uid: String,

    /// The groups the user was in when creating the rollout. At most 256 (identity providers stop listing groups in tokens near 200: Entra ID at 200).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(max = 256)))]
    pub groups: Vec<String>,
}

/// The creator never changes once recorded. A rollout created without one (before creators were recorded)
/// may be given one: admission writes the adopting user (`kubectl fleetroll adopt`).
const CREATOR_RULE: &str = "!has(oldSelf.creator) || (has(self.creator) && self.creator == oldSelf.creator)";

/// An approval of one batch of one plan.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct Approval {
    /// The index of the batch this approves, 0-based (0 is the first batch); status.pendingApproval.batch
    /// names the batch waiting.
    #[schemars(range(min = 0, max = 100000))]
    pub batch: u32,

    /// The plan this approves (status.plan.hash). A changed plan needs a new approval.
    #[schemars(length(min = 1, max = 64))]
    pub plan_hash: String,

    /// The gates this approves (status.pendingApproval.gatesHash): health, analysis, strategy.maxFailures,
    /// strategy.onFailure, strategy.approval and resumeToken as they are when approving, and the approvers
    /// FleetRolloutPolicies name. A change to any of them needs a new approval; an approval without it never
    /// counts (it was written for plans alone).
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub gates_hash: String,

    /// Who approved, when known (the MCP server fills it in from the caller's verified identity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub approved_by: Option<String>,

    /// The change-window hold this also overrides (status.windowHold.hash): the batch starts outside its
    /// windows, or in a freeze. An override is given by someone who may approve (admission judges it as any
    /// approval), lifts only the hold it names (a later freeze needs another), and is recorded in
    /// status.windowOverrides with who gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 16))]
    pub override_windows: Option<String>,
}
