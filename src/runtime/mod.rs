//! The process: command line, and the operator's tasks (leader election, controller, MCP, metrics) and
//! their listeners. The fault-injection points the crash tests use are `crate::failpoint`.

use std::{fmt::Display, process::ExitCode};

pub mod cli;
pub(crate) mod http;
pub use http::raise_descriptor_limit;
pub(crate) mod leader;
pub(crate) mod operator;

/// Runs a command of the binary (the operator's or the plugin's) to its end on a multi-threaded tokio
/// runtime. An error, or a runtime that cannot start, is printed as kubectl prints one (`error: …`) and
/// exits 1; it is also logged, for an operator whose logs are collected rather than its stderr.
pub(crate) fn block_on<E: Display>(command: impl Future<Output = Result<ExitCode, E>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => return fail(format!("cannot start the async runtime: {e}")),
    };
    runtime.block_on(command).unwrap_or_else(fail)
}

fn fail(error: impl Display) -> ExitCode {
    tracing::error!(error = %error, "fatal");
    eprintln!("error: {error}");
    ExitCode::FAILURE
}
