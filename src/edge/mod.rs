//! The kube edge: the only code that talks to the API server. It gathers facts for the core (discovery,
//! stored plans, targets, nodes and pods), and carries out what the core decides (image patches, pod
//! deletions, status writes, spec controls), and sends analysis queries to metrics backends.

pub(crate) mod answers;
pub(crate) mod cached;
pub(crate) mod control;
pub mod discovery;
pub(crate) mod egress;
pub(crate) mod events;
pub(crate) mod impersonation;
pub(crate) mod lists;
pub(crate) mod live;
pub(crate) mod members;
pub(crate) mod nodes;
pub(crate) mod notify;
pub(crate) mod own_writes;
pub mod plans;
pub(crate) mod probe;
pub(crate) mod prometheus;
pub(crate) mod rollouts;
pub(crate) mod workloads;
