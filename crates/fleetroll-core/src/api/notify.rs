//! Notifications: who hears about a rollout without polling it. A rollout subscribes sinks
//! (`spec.notify`), FleetRolloutPolicies subscribe the platform's; what happens is written to an outbox in
//! status in the same write as the change it tells of, and delivered from there at least once. The rules
//! are in `core::notify`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube_derive::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::SecretRef;

/// The label that lets a Secret's address and keys be used by notifications.
pub const NOTIFY_SECRET_LABEL: &str = "fleetroll.dev/notification-sink";

/// The most subscriptions a rollout, or a policy, has.
pub const SUBSCRIPTIONS_MAX: usize = 8;

/// The most notifications the outbox holds undelivered; older ones are dropped (and counted) beyond it.
pub const OUTBOX_MAX: usize = 32;

/// A sink and the events it hears.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct Subscription {
    /// Its name, unique among the subscriptions beside it: a DNS label such as team-chat.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("subscription names must be DNS labels: lower-case letters, digits and '-', such as team-chat"))]
    pub name: String,

    /// How notifications are sent: Webhook (a JSON POST, signed with HMAC-SHA256 when the Secret has
    /// `hmacKey`), CloudEvents (HTTP binary mode) or Alertmanager (its API v2: `url` is Alertmanager's
    /// base URL, and its routes take the alerts on to chat, paging or mail).
    pub sink: SinkKind,

    /// The Secret holding where to send (`url`) and, optionally, `hmacKey` (signatures) and `token` (a
    /// bearer token): in the rollout's namespace for a rollout's subscription, in the fleet namespace
    /// (--fleet-namespace) for a policy's. It must be labelled `fleetroll.dev/notification-sink: "true"`, so a rollout cannot
    /// send other Secrets of its namespace anywhere.
    pub secret_ref: SecretRef,

    /// The events it hears. Empty: all of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub events: Vec<NotificationKind>,
}

/// How a subscription's notifications are sent.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SinkKind {
    Webhook,
    CloudEvents,
    Alertmanager,
}

/// What a notification tells of.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NotificationKind {
    /// A revision was planned and its rollout starts: by whom, over which interface.
    Started,
    /// A batch waits for an approval: who may give it, and the commands that give it.
    WaitingForApproval,
    /// A batch failed (its targets, or its analysis).
    BatchFailed,
    /// Batches are held: by a change window, a policy, the failure budget, the analysis, the creator's
    /// rights or member clusters that do not answer.
    Held,
    /// Every batch succeeded.
    Succeeded,
    /// The rollout stopped as Failed.
    Failed,
    /// A rollback restored the previous images.
    RolledBack,
    /// Someone aborted the rollout (spec.abort): targets keep what they have.
    Aborted,
    /// After success, someone else changed targets the rollout had changed.
    ChangedByOthers,
    /// The rollout was deleted before it finished: targets keep what they have.
    Deleted,
}

impl NotificationKind {
    pub const ALL: [NotificationKind; 10] = [
        Self::Started,
        Self::WaitingForApproval,
        Self::BatchFailed,
        Self::Held,
        Self::Succeeded,
        Self::Failed,
        Self::RolledBack,
        Self::Aborted,
        Self::ChangedByOthers,
        Self::Deleted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Started => "Started",
            Self::WaitingForApproval => "WaitingForApproval",
            Self::BatchFailed => "BatchFailed",
            Self::Held => "Held",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
            Self::RolledBack => "RolledBack",
            Self::Aborted => "Aborted",
            Self::ChangedByOthers => "ChangedByOthers",
            Self::Deleted => "Deleted",
        }
    }
}

impl std::fmt::Display for NotificationKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Notifications written and not yet delivered everywhere.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Outbox {
    /// The sequence number the next notification gets.
    #[serde(default)]
    pub next: u64,
    /// Undelivered notifications, oldest first, at most 32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<Notification>,
    /// How many notifications were dropped undelivered because the outbox was full.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropped: u64,
    /// Whether the rollout's deletion was written as a notification (once, as it waits to go).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deletion_told: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One notification, with the subscriptions it is still owed to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Notification {
    /// Its idempotency id, `<rollout uid>/<revision>/<sequence>`: a receiver that sees it twice has seen
    /// one notification.
    pub id: String,
    /// What it tells of.
    pub kind: NotificationKind,
    /// When it happened (RFC 3339).
    pub at: Time,
    /// The revision it is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u32>,
    /// The batch (0-based) it is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u32>,
    /// The reason of the change it tells of, e.g. OutsideWindow for a Held.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// What happened, for people (at most 1,024 bytes).
    pub message: String,
    /// The subscriptions it is still owed to: `rollout/<name>` or `policy/<policy>/<name>`.
    pub to: Vec<String>,
}
