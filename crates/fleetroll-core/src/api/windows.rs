//! Change windows: the hours in which a rollout's targets may be changed (Allow) or must not be (Deny, a
//! freeze). A rollout declares its own (`spec.strategy.windows`); a namespace's owner declares the
//! namespace's (the [`WINDOWS_ANNOTATION`], in the rollout's own cluster), a member cluster's Secret the
//! member's (the same annotation); a FleetRolloutPolicy the platform's. The rules that judge them are in `core::window`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube_derive::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The annotation on a Namespace holding its windows: a JSON list of
/// [`ChangeWindow`]s, e.g. `[{"schedule": "0 22 * * Mon-Fri", "duration": "4h", "timeZone": "Europe/Berlin"}]`.
pub const WINDOWS_ANNOTATION: &str = "fleetroll.dev/windows";

/// The most windows one owner declares.
pub const WINDOWS_MAX: usize = 16;

/// The CEL rule on a schedule: five fields (minute hour day-of-month month day-of-week) of cron's
/// characters, six with seconds first, or one of the @ names. The operator parses it in full; what passes this and not that holds
/// the rollout with reason InvalidWindow.
const SCHEDULE_RULE: &str = "self.matches('^@(yearly|annually|monthly|weekly|daily|midnight|hourly)$') || self.matches('^[0-9A-Za-z*,/?#-]+( [0-9A-Za-z*,/?#-]+){4,5}$')";
const DURATION_RULE: &str = crate::core::duration::SCHEMA_RULE;
const TIME_ZONE_RULE: &str = "self.matches('^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$')";

/// A recurring window: it opens at each time `schedule` names, read in `timeZone`, and stays open for
/// `duration`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[x_kube(crates(kube_core = "::kube_core"))]
// An annotation is not pruned by a schema: a misspelt field (timezone, type) is an error, not a default.
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChangeWindow {
    /// A name people see in status and events, e.g. weeknights or year-end-freeze. Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub name: Option<String>,

    /// Allow (default): targets are changed only while a window of this kind is open. Deny: no batch
    /// starts while it is open (a freeze).
    #[serde(default)]
    pub kind: WindowKind,

    /// When it opens: a cron schedule of five fields, minute hour day-of-month month day-of-week, as
    /// crontab(5) reads them (0 or 7 is Sunday; names such as Mon-Fri and Jan; L, # and W as croner reads
    /// them), six with seconds first, or @daily, @weekly and the like. Read in `timeZone`: an opening that a clock change skips
    /// happens at the first minute after it; one that a clock change repeats happens once, the first time.
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = Rule::new(SCHEDULE_RULE).message("schedule must be a cron schedule of five fields (minute hour day-of-month month day-of-week), such as \"0 22 * * Mon-Fri\", six with seconds first, or @daily, @weekly and the like"))]
    pub schedule: String,

    /// How long it stays open after each opening, in elapsed time, e.g. 4h or 90m (at most 720h).
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(DURATION_RULE).message("duration must be a duration of at most 720h (30 days), such as 30m, 4h or 1h30m"))]
    pub duration: String,

    /// The IANA time zone the schedule is read in, e.g. Europe/Berlin or America/New_York. Default UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = Rule::new(TIME_ZONE_RULE).message("timeZone must be an IANA time zone name, such as UTC, Europe/Berlin or America/New_York"))]
    pub time_zone: Option<String>,
}

/// Whether a window allows changes or forbids them.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
pub enum WindowKind {
    /// Changes only while it (or another Allow window of the same owner) is open.
    #[default]
    Allow,
    /// No batch starts while it is open: a freeze.
    Deny,
}

/// A change window holding a rollout's next batch.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WindowHold {
    /// Whose window: the rollout, a FleetRolloutPolicy or a namespace.
    #[schemars(length(max = 320))]
    pub owner: String,
    /// The window, by name or schedule.
    #[schemars(length(max = 128))]
    pub window: String,
    /// Deny: the window is open, a freeze. Allow: none of the owner's Allow windows is open.
    pub kind: WindowKind,
    /// When every window next allows the batch (RFC 3339). Absent when none was found (windows that never
    /// meet, a freeze without end) or the windows cannot be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opens_at: Option<Time>,
    /// What an override of this hold cites (spec.approvals[].overrideWindows): a hash of the plan, the
    /// batch, and the owner, window and kind of every window holding it (those in `also` included).
    #[schemars(length(max = 64))]
    #[serde(default)]
    pub hash: String,
    /// Why the windows cannot be read (reason InvalidWindow): the batch waits until they are fixed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub invalid: Option<String>,
    /// The other windows holding the batch now, in words (the first few): an override lifts them too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 9), inner(length(max = 512)))]
    pub also: Vec<String>,
}

/// A batch started outside its change windows by an override.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WindowOverride {
    /// The index (0-based) of the batch.
    pub batch: u32,
    /// The plan it was given for (status.plan.hash at the time).
    #[schemars(length(max = 64))]
    pub plan_hash: String,
    /// Who overrode, as admission recorded them (spec.approvals[].approvedBy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub overridden_by: Option<String>,
    /// What held the batch then, in words.
    #[schemars(length(max = 1024))]
    pub overrode: String,
    /// When the batch was let go (RFC 3339).
    pub at: Time,
}
