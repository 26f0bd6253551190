//! The integration tests, one binary (matklad's layout: one link, one process sharing the fixtures' one-time
//! setup). Most need the real control plane (`make cluster`, or `make integration` which starts one); the
//! fixtures are the `testkit` crate (crates/fleetroll-testkit), which the harness-less targets (bench, chaos,
//! security) use too.
//!
//!   cargo test --features conformance --test it                 all of them
//!   cargo test --features conformance --test it -- members::     one module
//!
//! Tests run side by side, so each works in namespaces, node pools and cluster-scoped objects of its own
//! (see testkit's `with_namespace`, `nodes::with_pool`, `policy::govern`).
#![allow(clippy::unwrap_used)]

mod alertmanager_env;
mod analysis;
mod architecture;
mod browser_env;
mod chart;
mod coexistence;
mod crash;
mod dashboard;
mod demo;
mod docs;
mod examples;
mod gitops;
mod helm_install;
mod install;
mod leader;
mod manual;
mod mcp;
#[cfg(feature = "conformance")]
mod mcp_conformance;
mod mcp_inprocess;
mod members;
mod members_env;
mod nodes;
mod notifications;
mod operator;
mod plugin;
mod prometheus_env;
mod testenv;
mod validation;
mod windows;
