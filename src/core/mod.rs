//! The pure core: every decision fleetroll makes, as functions from facts to answers. Nothing here holds a
//! kube `Client` or performs IO; the edge gathers the facts and carries out the answers.

pub mod conditions;
pub mod duration;
pub mod http_check;
pub mod nodes;
pub mod plan;
pub mod rollout;
pub mod scope;
pub mod workload;
