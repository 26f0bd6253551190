//! The plugin's command line, following kubectl's conventions (`-n`, `--context`, `--kubeconfig`,
//! `-o json|yaml`).

use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand, ValueEnum};

/// Watch and control FleetRollouts.
#[derive(Debug, Parser)]
#[command(name = "kubectl fleetroll", bin_name = "kubectl fleetroll", version, about = "Watch and control FleetRollouts.", long_about = None, after_help = super::error::EXIT_CODES)]
pub(super) struct PluginCli {
    #[command(subcommand)]
    pub command: PluginCommand,

    /// Namespace of the FleetRollout (default: the context's namespace).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,

    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,

    /// Path to the kubeconfig file (default: KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,

    /// Output format: print the object (or plan) instead of the human view.
    #[arg(short = 'o', long, global = true, value_enum)]
    pub output: Option<Output>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(super) enum Output {
    Json,
    Yaml,
}

#[derive(Debug, Subcommand)]
pub(super) enum PluginCommand {
    /// Show where a rollout stands, live, until it ends (exit 0 if it succeeded, 1 otherwise).
    Status {
        name: String,
        /// Print the current state once instead of following the rollout.
        #[arg(long)]
        no_follow: bool,
        /// Stop following after this long (e.g. 10m); exit 1 if it has not ended.
        #[arg(long, value_parser = crate::core::duration::parse)]
        timeout: Option<Duration>,
    },
    /// Show the plan: the frozen one of a rollout, or the one a manifest would get (nothing is written).
    Plan {
        /// A FleetRollout in the cluster.
        name: Option<String>,
        /// A FleetRollout manifest to preview instead.
        #[arg(short = 'f', long = "filename", conflicts_with = "name")]
        file: Option<PathBuf>,
        /// The fleet namespace the operator honours cross-namespace rollouts in (for previews).
        #[arg(long, default_value = "fleetroll-system")]
        fleet_namespace: String,
        /// Run the exec credential plugins member Secrets name (those the operator allows by default), on
        /// this machine, with your environment and cloud credentials. Without it a member whose Secret
        /// needs one is left out of a preview, with a note saying so.
        #[arg(long)]
        run_exec_plugins: bool,
    },
    /// List the rollouts waiting for an approval you may give (the API server judges a dry run of each).
    Inbox {
        /// In every namespace you can read (default: the current namespace only).
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
    /// Hold the rollout before its next batch.
    Pause { name: String },
    /// Let a paused rollout go on.
    Resume { name: String },
    /// Approve the batch the rollout waits for (or the one named), bound to its plan.
    Approve {
        name: String,
        /// The batch (1-based, as shown by `status`); the waiting one when absent.
        #[arg(long)]
        batch: Option<u32>,
        /// The plan being approved; the current plan when absent.
        #[arg(long)]
        plan_hash: Option<String>,
        /// The gates being approved (health, analysis, maxFailures, onFailure, approval, resumeToken and
        /// who may approve: status.pendingApproval.gatesHash); the current ones when absent.
        #[arg(long)]
        gates_hash: Option<String>,
        /// Also let the batch the change windows hold now start, outside its windows or in a freeze (an
        /// override of that hold only, recorded with your name).
        #[arg(long)]
        override_windows: bool,
    },
    /// Become the creator of a rollout created without one (before fleetroll recorded creators): the
    /// operator then changes its targets as you, with your rights.
    Adopt { name: String },
    /// Serve a live web view of every rollout you can read, on this machine, acting as you (nothing runs
    /// in the cluster). Prints the address to open, with its session token.
    Dashboard {
        /// The address to listen on; one that is not loopback needs --allow-remote.
        #[arg(long, default_value = "127.0.0.1")]
        address: std::net::IpAddr,
        /// The port (0: any free one).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Do not open a browser.
        #[arg(long)]
        no_open: bool,
        /// Listen on an address other machines can reach (anyone holding the printed token acts as you).
        #[arg(long)]
        allow_remote: bool,
        /// The fleet namespace the operator honours cross-namespace rollouts in (for plan previews).
        #[arg(long, default_value = "fleetroll-system")]
        fleet_namespace: String,
    },
    /// Stop the rollout for good (changed targets keep the new image).
    Abort { name: String },
    /// Restore the previous image of every target the rollout changed.
    Rollback { name: String },
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{PluginCli, PluginCommand};

    #[test]
    fn a_timeout_is_a_duration_as_the_spec_writes_them() {
        let cli = PluginCli::try_parse_from(["kubectl fleetroll", "status", "web", "--timeout", "1m30s"])
            .expect("valid arguments");
        assert!(matches!(
            cli.command,
            PluginCommand::Status { timeout: Some(t), .. } if t == std::time::Duration::from_secs(90)
        ));
        let bad = PluginCli::try_parse_from(["kubectl fleetroll", "status", "web", "--timeout", "90"])
            .expect_err("a bare number is not a duration");
        assert!(bad.to_string().contains("is not a duration"), "{bad}");
    }
}
