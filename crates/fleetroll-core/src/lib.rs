//! fleetroll's pure core: the FleetRollout API types (`api`) and every decision the operator makes
//! (`core`), as functions from facts to answers.
//!
//! This crate depends on no kube client, no async runtime and no HTTP client (see its Cargo.toml), so
//! holding a `kube::Client`, awaiting a future or opening a connection here does not compile; its
//! clippy.toml forbids reading a clock, the environment or files, and starting threads, and the lints are
//! forbidden to be allowed anywhere in it. The `fleetroll` crate gathers the facts and carries out the
//! answers.

// `forbid`, not `deny`: an `#[allow]` of either, anywhere in the crate, is itself an error.
#![forbid(clippy::disallowed_methods, clippy::disallowed_types)]

pub mod api;
pub mod core;
