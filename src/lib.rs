//! fleetroll: durable, batched image rollouts across a fleet of Kubernetes workloads.
//!
//! A `FleetRollout` resource describes the rollout; its status subresource is the durable checkpoint, so
//! etcd, not any process, knows where a rollout stands.

pub mod api;
pub mod cli;
pub mod conditions;
pub mod control;
pub mod controller;
pub mod duration;
pub mod engine;
pub mod error;
pub mod failpoint;
pub mod http;
pub mod http_check;
pub mod leader;
pub mod mcp;
pub mod metrics;
pub mod nodes;
pub mod operator;
pub mod own_writes;
pub mod plan;
pub mod plugin;
pub mod scope;
pub mod workload;
