//! The command line: one binary, one subcommand per role.

use clap::Parser;

/// Durable, batched image rollouts across a fleet of Kubernetes workloads.
#[derive(Debug, Parser)]
#[command(name = "fleetroll", version, about, long_about = None)]
pub struct Cli {}

/// Parses the command line and runs the chosen subcommand.
pub fn run() -> std::process::ExitCode {
    let _cli = Cli::parse();
    std::process::ExitCode::SUCCESS
}
