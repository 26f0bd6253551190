//! The kube edge: the controller's IO. It gathers facts for the core (discovery, stored plans, targets,
//! nodes and pods, member clusters), carries out what the core decides (image patches, pod deletions,
//! status writes, spec controls), and sends health checks, analysis queries and notifications out. The
//! controller's watches, the leader lease and the reads and reviews of MCP and the plugin call the API
//! server from their own modules (ARCHITECTURE.md lists them).

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
