//! `kubectl fleetroll`: the same binary, installed as `kubectl-fleetroll`. A live status view with a
//! progress bar per batch, the plan, and the controls — following kubectl's conventions (`-n`, `--context`,
//! `--kubeconfig`, `-o json|yaml`; exit 0 on success, 2 on a usage error, and a distinct code for each
//! kind of failure: see [`error::EXIT_CODES`]).

mod args;
mod controls;
mod dashboard;
mod error;
mod inbox;
mod plan;
mod render;
mod status;

use std::process::ExitCode;

use clap::Parser;
use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};
use serde::Serialize;
use serde_json::json;

use args::{Output, PluginCli, PluginCommand};
use error::{Exit, PluginError};

/// Runs the plugin with the process's arguments.
pub fn run() -> ExitCode {
    let cli = PluginCli::parse();
    crate::runtime::block_on(async {
        Ok::<_, std::convert::Infallible>(execute(cli).await.unwrap_or_else(|e| {
            eprintln!("error: {e}");
            e.exit().into()
        }))
    })
}

/// A client for the kubeconfig and context named on the command line (else kubectl's defaults), and the
/// namespace to work in.
async fn connect(cli: &PluginCli) -> Result<(Client, String), PluginError> {
    let options = KubeConfigOptions { context: cli.context.clone(), ..Default::default() };
    let config = match &cli.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| PluginError::NoCluster(format!("reading {}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kubeconfig, &options).await
        }
        None => Config::from_kubeconfig(&options).await,
    }
    .map_err(|e| PluginError::NoCluster(format!("no usable kubeconfig: {e}")))?;
    let namespace = cli.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).map_err(|e| PluginError::NoCluster(e.to_string()))?;
    Ok((client, namespace))
}

async fn execute(cli: PluginCli) -> Result<ExitCode, PluginError> {
    let (client, ns) = connect(&cli).await?;
    let (client, ns, output) = (&client, ns.as_str(), cli.output);
    match &cli.command {
        PluginCommand::Status { name, no_follow, timeout } => {
            status::status(client, ns, name, !no_follow && output.is_none(), *timeout, output).await
        }
        PluginCommand::Plan { name, file, fleet_namespace, run_exec_plugins } => {
            let exec = plan::exec_policy(*run_exec_plugins);
            plan::plan(client, ns, name.as_deref(), file.as_deref(), fleet_namespace, exec, output).await
        }
        PluginCommand::Pause { name } => {
            controls::set(client, ns, name, json!({"paused": true}), "paused", output).await
        }
        PluginCommand::Resume { name } => {
            let resume =
                json!({"paused": false, "resumeToken": k8s_openapi::jiff::Timestamp::now().to_string()});
            controls::set(client, ns, name, resume, "resumed", output).await
        }
        PluginCommand::Abort { name } => {
            controls::set(client, ns, name, json!({"abort": true}), "abort requested", output).await
        }
        PluginCommand::Rollback { name } => {
            controls::set(client, ns, name, json!({"rollback": true}), "rollback requested", output).await
        }
        PluginCommand::Approve { name, batch, plan_hash, gates_hash, override_windows } => {
            let what = crate::edge::control::Approving {
                batch: *batch,
                plan_hash: plan_hash.as_deref(),
                gates_hash: gates_hash.as_deref(),
                override_windows: *override_windows,
            };
            controls::approve(client, ns, name, what, output).await
        }
        PluginCommand::Adopt { name } => controls::adopt(client, ns, name, output).await,
        PluginCommand::Inbox { all_namespaces } => inbox::inbox(client, ns, *all_namespaces, output).await,
        PluginCommand::Dashboard { address, port, no_open, allow_remote, fleet_namespace } => {
            let options = dashboard::Options {
                address: *address,
                port: *port,
                open: !no_open,
                allow_remote: *allow_remote,
                fleet_namespace,
            };
            dashboard::dashboard(client, ns, options).await
        }
    }
}

/// Prints `value` as `-o json` or `-o yaml` asked.
fn print(value: &impl Serialize, output: Output) -> Result<(), PluginError> {
    let failed = |e: &dyn std::fmt::Display| PluginError::Failed(format!("cannot print it: {e}"));
    let text = match output {
        Output::Json => serde_json::to_string_pretty(value).map_err(|e| failed(&e))? + "\n",
        Output::Yaml => serde_saphyr::to_string(value).map_err(|e| failed(&e))?,
    };
    print!("{text}");
    Ok(())
}

/// The plugin's command line, for the manual's generated reference (docs/src/reference/cli.md).
pub(crate) fn command() -> clap::Command {
    <PluginCli as clap::CommandFactory>::command()
}
