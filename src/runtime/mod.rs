//! The process: command line, the operator's tasks (leader election, controller, MCP, metrics), and the
//! fault-injection points the crash tests use.

pub mod cli;
pub mod failpoint;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod operator;
