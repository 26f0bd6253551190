//! The pure core: every decision fleetroll makes, as functions from facts to answers. Nothing here holds a
//! kube `Client` or performs IO; the edge gathers the facts and carries out the answers.

pub(crate) mod analysis;
pub(crate) mod clusters;
pub(crate) mod conditions;
pub(crate) mod duration;
pub mod exec;
pub(crate) mod http_check;
pub(crate) mod identity;
pub mod nodes;
pub mod plan;
pub(crate) mod policy;
pub(crate) mod reason;
pub(crate) mod rollout;
pub(crate) mod scope;
pub(crate) mod task;
pub(crate) mod text;
pub(crate) mod workload;

/// A length as a count in status, saturating: no fleet is 4 billion targets, and no input may panic.
pub(crate) fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Why a spec cannot be acted on: the rollout stays Pending with Degraded=True and nothing changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    pub reason: &'static str,
    pub message: String,
}
