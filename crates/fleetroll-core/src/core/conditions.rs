//! Status conditions in the standard Kubernetes shape: one per type, `lastTransitionTime` moves only when
//! the status flips.

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Condition, jiff::Timestamp};

pub const PROGRESSING: &str = "Progressing";
pub const PAUSED: &str = "Paused";
pub const DEGRADED: &str = "Degraded";
pub const COMPLETE: &str = "Complete";
// The three kstatus reads (Flux, kpt, cli-utils); see `rollout::summary::gitops_state` for the mapping.
pub const READY: &str = "Ready";
pub const RECONCILING: &str = "Reconciling";
pub const STALLED: &str = "Stalled";

/// The desired state of one condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired<'a> {
    pub type_: &'a str,
    pub status: bool,
    pub reason: &'a str,
    pub message: String,
}

/// Sets a condition, keeping its transition time unless the status flips.
pub fn set(conditions: &mut Vec<Condition>, desired: Desired<'_>, generation: i64, now: Timestamp) {
    let status = if desired.status { "True" } else { "False" };
    let last_transition_time = conditions
        .iter()
        .find(|c| c.type_ == desired.type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
    let condition = Condition {
        type_: desired.type_.to_string(),
        status: status.to_string(),
        reason: desired.reason.to_string(),
        message: desired.message,
        observed_generation: Some(generation),
        last_transition_time,
    };
    match conditions.iter_mut().find(|c| c.type_ == desired.type_) {
        Some(existing) => *existing = condition,
        None => conditions.push(condition),
    }
}

/// Test helpers: the controller only ever sets conditions; people and tools read them.
#[cfg(test)]
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    #[test]
    fn transition_time_moves_only_when_the_status_flips() {
        let mut cs = Vec::new();
        let d = |status: bool, reason: &'static str| Desired {
            type_: PAUSED,
            status,
            reason,
            message: reason.to_string(),
        };
        set(&mut cs, d(true, "PausedBySpec"), 1, at(10));
        set(&mut cs, d(true, "WaitingForApproval"), 2, at(20));
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].last_transition_time.0, at(10));
        assert_eq!(cs[0].reason, "WaitingForApproval");
        assert_eq!(cs[0].observed_generation, Some(2));
        set(&mut cs, d(false, "Resumed"), 2, at(30));
        assert_eq!(cs[0].last_transition_time.0, at(30));
        assert!(!is_true(&cs, PAUSED));
    }
}
