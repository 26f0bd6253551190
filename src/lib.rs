//! fleetroll: durable, batched image rollouts across a fleet of Kubernetes workloads.
//!
//! A `FleetRollout` resource describes the rollout; its status subresource is the durable checkpoint, so
//! etcd, not any process, knows where a rollout stands. See ARCHITECTURE.md for the map of this crate.

pub mod api;
mod controller;
pub mod core;
pub mod edge;
pub mod error;
pub mod failpoint;
pub mod mcp;
pub(crate) mod metrics;
pub mod plugin;
pub mod runtime;
