//! Why a rollout is where it is: the reasons of its phase, conditions and events, and of each target that
//! failed or was refused. One list, so that a reason means the same thing in `kubectl`, in events, over MCP
//! and in the plugin.

// How a rollout moves on.
pub const PLANNED: &str = "Planned";
pub const BATCH_STARTED: &str = "BatchStarted";
pub const BATCH_APPLIED: &str = "BatchApplied";
pub const BATCH_SUCCEEDED: &str = "BatchSucceeded";
pub const BATCH_FAILED: &str = "BatchFailed";
pub const SOAKING: &str = "Soaking";
pub const WAITING_BETWEEN_BATCHES: &str = "WaitingBetweenBatches";
pub const PAUSED_BY_SPEC: &str = "PausedBySpec";
pub const RESUMED: &str = "Resumed";
pub const WAITING_FOR_APPROVAL: &str = "WaitingForApproval";
pub const APPROVED: &str = "Approved";
/// A platform policy (FleetRolloutPolicy) holds the next batch: the planned rollout breaks it.
pub const POLICY_VIOLATION: &str = "PolicyViolation";
/// A change window holds the next batch: outside an owner's Allow windows, or inside a Deny window.
pub const OUTSIDE_WINDOW: &str = "OutsideWindow";
/// Every change window that held the next batch allows it now.
pub const WINDOW_OPEN: &str = "WindowOpen";
/// Change windows that cannot be read (a schedule or time zone the operator cannot use) hold the next batch.
pub const INVALID_WINDOW: &str = "InvalidWindow";
/// Someone who may approve let a batch start outside its change windows (spec.approvals[].overrideWindows).
pub const WINDOW_OVERRIDDEN: &str = "WindowOverridden";
/// A notification could not be delivered to a subscription (it is sent again, with backoff).
pub const NOTIFICATION_FAILED: &str = "NotificationFailed";
/// Notifications owed to a platform subscription were dropped from a full outbox (a notice of the gap).
pub const NOTIFICATIONS_DROPPED: &str = "NotificationsDropped";
/// The rollout was deleted before it finished (the Deleted notification).
pub const DELETED: &str = "Deleted";
/// The operator changes targets as the rollout's creator, and cannot act as this one.
pub const CANNOT_ACT_AS_CREATOR: &str = "CannotActAsCreator";
/// The API server refused changes made as the rollout's creator: the creator lost its rights.
pub const CREATOR_LACKS_RIGHTS: &str = "CreatorLacksRights";
pub const SUCCEEDED: &str = "Succeeded";
pub const FAILURE_BUDGET_EXCEEDED: &str = "FailureBudgetExceeded";
pub const ABORT_REQUESTED: &str = "AbortRequested";
pub const ROLLBACK_REQUESTED: &str = "RollbackRequested";
pub const ROLLED_BACK: &str = "RolledBack";
pub const SUPERSEDED: &str = "Superseded";

// Why a target failed.
pub const TIMEOUT: &str = "Timeout";
pub const TARGET_MISSING: &str = "TargetMissing";
pub const IMAGE_CHANGED: &str = "ImageChangedByOthers";
pub const HTTP_CHECK_FAILED: &str = "HttpCheckFailed";
/// The API server refused the change (RBAC, an admission webhook or policy).
pub const CHANGE_DENIED: &str = "ChangeDenied";
pub const INVALID_SPEC: &str = "InvalidSpec";
pub const NODE_NOT_READY: &str = "NodeNotReady";
pub const POD_FAILED: &str = "PodFailed";

// Why a revision cannot be planned or run: the rollout stays Pending with Degraded=True, nothing changes.
pub const INVALID_SELECTOR: &str = "InvalidSelector";
pub const CROSS_NAMESPACE_NOT_ALLOWED: &str = "CrossNamespaceNotAllowed";
pub const NO_NAMESPACES: &str = "NoNamespacesMatch";
pub const NO_TARGETS: &str = "NoTargets";
pub const CONTAINER_NOT_FOUND: &str = "ContainerNotFound";
pub const CONTAINER_AMBIGUOUS: &str = "ContainerAmbiguous";
/// A matching workload's image is longer than any image reference can be.
pub const IMAGE_TOO_LONG: &str = "ImageTooLong";
pub const DAEMONSET_NOT_FOUND: &str = "DaemonSetNotFound";
/// A stored plan does not match the hash recorded when it was frozen.
pub const PLAN_TAMPERED: &str = "PlanTampered";
/// A node rollout in an installation without node rollouts.
pub const NODE_ROLLOUTS_DISABLED: &str = "NodeRolloutsDisabled";
/// A health check aimed where this installation does not let checks go.
pub const HTTP_CHECK_REFUSED: &str = "HttpCheckRefused";
/// An analysis without a backend: no provider address and no operator default.
pub const ANALYSIS_PROVIDER_MISSING: &str = "AnalysisProviderMissing";
/// An analysis backend this installation does not let rollouts query.
pub const ANALYSIS_ADDRESS_REFUSED: &str = "AnalysisAddressRefused";
/// An analysis the schema let through but the operator cannot run (an unknown placeholder, say).
pub const INVALID_ANALYSIS: &str = "InvalidAnalysis";
/// targets.clusters: no member cluster matches the selector (or none is registered).
pub const NO_CLUSTERS: &str = "NoClustersMatch";
/// targets.clusters picks one API server under two names (two Secrets for one cluster).
pub const DUPLICATE_CLUSTER: &str = "DuplicateCluster";
/// A member cluster's Secret cannot be used (malformed, duplicated, or naming a non-https server).
pub const CLUSTER_REFUSED: &str = "ClusterRefused";
/// A member cluster did not answer (or refused the operator's credentials) for the health timeout.
pub const CLUSTER_UNREACHABLE: &str = "ClusterUnreachable";
/// A member cluster answered again; its targets are changed and checked.
pub const CLUSTER_REACHABLE: &str = "ClusterReachable";
/// Planning waits for member clusters the selector picks that do not answer (up to the health timeout).
pub const WAITING_FOR_CLUSTERS: &str = "WaitingForClusters";

// Metric analysis of a batch.
/// Measuring began: the batch's targets are healthy.
pub const ANALYSIS_STARTED: &str = "AnalysisStarted";
/// Measurements of the batch are due (status reason while it is measured).
pub const ANALYSIS_RUNNING: &str = "AnalysisRunning";
/// A measurement was taken (or not, for an error).
pub const ANALYSIS_MEASURED: &str = "AnalysisMeasured";
/// Every metric that decides passed.
pub const ANALYSIS_PASSED: &str = "AnalysisPassed";
/// A metric failed more measurements than its failureLimit: the batch failed.
pub const ANALYSIS_FAILED: &str = "AnalysisFailed";
/// A metric was inconclusive more often than its inconclusiveLimit: held until a person or agent acts.
pub const ANALYSIS_INCONCLUSIVE: &str = "AnalysisInconclusive";
/// Errors in a row past a metric's consecutiveErrorLimit: paused, measuring on until the backend answers.
pub const ANALYSIS_ERROR: &str = "AnalysisError";
/// The backend answered again after AnalysisError.
pub const ANALYSIS_RECOVERED: &str = "AnalysisRecovered";
/// spec.resumeToken changed: the metrics holding the rollout are accepted.
pub const ANALYSIS_ACCEPTED: &str = "AnalysisAccepted";

// Why the scope rules refuse a target (the whole plan, or one target right before it changes).
/// The target's namespace is neither the rollout's own nor one it may reach.
pub const OUT_OF_SCOPE: &str = "OutOfScope";
/// The target's namespace is not (or no longer) labelled `fleetroll.dev/rollouts: enabled`.
pub const NAMESPACE_NOT_OPTED_IN: &str = "NamespaceNotOptedIn";
/// The operator's own workload, or one in a protected namespace.
pub const TARGET_PROTECTED: &str = "TargetProtected";
/// Another rollout that is still running changed the target last.
pub const TARGET_HELD: &str = "TargetHeldByAnotherRollout";
/// Every reason a target is refused for.
pub const REFUSALS: [&str; 4] = [OUT_OF_SCOPE, NAMESPACE_NOT_OPTED_IN, TARGET_PROTECTED, TARGET_HELD];

/// The static reason for a refusal read back as text (event reasons are static); unknown ones are
/// reported as [`OUT_OF_SCOPE`].
pub fn refusal(reason: &str) -> &'static str {
    REFUSALS.into_iter().find(|r| *r == reason).unwrap_or(OUT_OF_SCOPE)
}
