//! fleetroll: durable, batched image rollouts across a fleet of Kubernetes workloads.
//!
//! A `FleetRollout` resource describes the rollout; its status subresource is the durable checkpoint, so
//! etcd, not any process, knows where a rollout stands.

pub mod cli;
