//! fleetroll: durable, batched image rollouts across a fleet of Kubernetes workloads.
//!
//! A `FleetRollout` resource describes the rollout; its status subresource is the durable checkpoint, so
//! etcd, not any process, knows where a rollout stands. See ARCHITECTURE.md for the map of this crate.

/// The API types and the pure core live in the `fleetroll-core` crate, which cannot reach a kube client,
/// tokio or reqwest (it does not depend on them); re-exported so that `crate::api` and `crate::core` keep
/// their paths.
pub use fleetroll_core::{api, core};

mod controller;
pub mod edge;
pub mod error;
pub mod failpoint;
pub mod mcp;
pub(crate) mod metrics;
pub mod plugin;
pub mod runtime;
