//! The pure core: every decision fleetroll makes, as functions from facts to answers. Nothing here holds a
//! kube `Client` or performs IO; the edge gathers the facts and carries out the answers.

pub mod analysis;
pub mod clusters;
pub mod conditions;
pub mod duration;
pub mod exec;
pub mod http_check;
pub mod identity;
pub mod namespaces;
pub mod nodes;
pub mod notify;
pub mod plan;
pub mod policy;
pub mod reason;
pub mod rollout;
pub mod scope;
pub mod task;
pub mod text;
pub mod window;
pub mod workload;

/// A length as a count in status, saturating: no fleet is 4 billion targets, and no input may panic.
pub fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Why a spec cannot be acted on: the rollout stays Pending with Degraded=True and nothing changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    pub reason: &'static str,
    pub message: String,
}
