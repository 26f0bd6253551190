//! The process: command line, the operator's tasks (leader election, controller, MCP, metrics), and the
//! fault-injection points the crash tests use.

pub mod cli;
pub mod failpoint;
pub(crate) mod http;
pub(crate) mod leader;
pub(crate) mod metrics;
pub(crate) mod operator;
