//! The kube edge: the only code that talks to the API server. It gathers facts for the core (discovery,
//! stored plans, targets, nodes and pods), and carries out what the core decides (image patches, pod
//! deletions, status writes, spec controls).

pub mod control;
pub mod daemonset_pods;
pub mod discovery;
pub mod live;
pub mod own_writes;
pub mod plans;
pub mod targets;
