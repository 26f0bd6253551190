//! `kubectl fleetroll`: the same binary, installed as `kubectl-fleetroll`. A live status view with a
//! progress bar per batch, the plan, and the controls — following kubectl's conventions (`-n`, `--context`,
//! `--kubeconfig`, `-o json|yaml`; exit 0 on success, 1 on failure, 2 on a usage error).

use std::{
    io::{IsTerminal, Write},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use clap::{Parser, Subcommand, ValueEnum};
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::{
    Api, Client, Config, ResourceExt,
    api::PostParams,
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{WatchStreamExt, watcher},
};
use serde::Serialize;
use serde_json::json;

use crate::{
    api::{BatchState, FleetRollout, Phase},
    core::plan::Plan,
    edge::control,
    edge::{discovery, plans::PlanStore},
};

const FIELD_MANAGER: &str = "kubectl-fleetroll";

/// Watch and control FleetRollouts.
#[derive(Debug, Parser)]
#[command(name = "kubectl fleetroll", bin_name = "kubectl fleetroll", version, about = "Watch and control FleetRollouts.", long_about = None)]
pub struct PluginCli {
    #[command(subcommand)]
    command: PluginCommand,

    /// Namespace of the FleetRollout (default: the context's namespace).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,

    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    context: Option<String>,

    /// Path to the kubeconfig file (default: KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,

    /// Output format: print the object (or plan) instead of the human view.
    #[arg(short = 'o', long, global = true, value_enum)]
    output: Option<Output>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Output {
    Json,
    Yaml,
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
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
    },
    /// Stop the rollout for good (changed targets keep the new image).
    Abort { name: String },
    /// Restore the previous image of every target the rollout changed.
    Rollback { name: String },
}

/// Runs the plugin with the process's arguments.
pub fn run() -> ExitCode {
    let cli = PluginCli::parse();
    crate::runtime::block_on(execute(cli))
}

async fn connect(cli: &PluginCli) -> Result<(Client, String), String> {
    let options = KubeConfigOptions { context: cli.context.clone(), ..Default::default() };
    let config = match &cli.kubeconfig {
        Some(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &options).await
        }
        None => Config::from_kubeconfig(&options).await,
    }
    .map_err(|e| format!("no usable kubeconfig: {e}"))?;
    let namespace = cli.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).map_err(|e| e.to_string())?;
    Ok((client, namespace))
}

async fn execute(cli: PluginCli) -> Result<ExitCode, String> {
    let (client, ns) = connect(&cli).await?;
    match &cli.command {
        PluginCommand::Status { name, no_follow, timeout } => {
            status(&client, &ns, name, !no_follow && cli.output.is_none(), *timeout, cli.output).await
        }
        PluginCommand::Plan { name, file, fleet_namespace } => {
            plan(&client, &ns, name.as_deref(), file.as_deref(), fleet_namespace, cli.output).await
        }
        PluginCommand::Pause { name } => {
            set(&client, &ns, name, json!({"paused": true}), "paused", cli.output).await
        }
        PluginCommand::Resume { name } => {
            set(&client, &ns, name, json!({"paused": false}), "resumed", cli.output).await
        }
        PluginCommand::Abort { name } => {
            set(&client, &ns, name, json!({"abort": true}), "abort requested", cli.output).await
        }
        PluginCommand::Rollback { name } => {
            set(&client, &ns, name, json!({"rollback": true}), "rollback requested", cli.output).await
        }
        PluginCommand::Approve { name, batch, plan_hash } => {
            approve(&client, &ns, name, *batch, plan_hash.as_deref(), cli.output).await
        }
    }
}

fn print(value: &impl Serialize, output: Output) -> Result<(), String> {
    let text = match output {
        Output::Json => serde_json::to_string_pretty(value).map_err(|e| e.to_string())? + "\n",
        Output::Yaml => serde_saphyr::to_string(value).map_err(|e| e.to_string())?,
    };
    print!("{text}");
    Ok(())
}

async fn set(
    client: &Client,
    ns: &str,
    name: &str,
    spec: serde_json::Value,
    done: &str,
    output: Option<Output>,
) -> Result<ExitCode, String> {
    let fr = control::set(client, ns, name, spec, FIELD_MANAGER).await?;
    match output {
        Some(o) => print(&fr, o)?,
        None => println!("fleetrollout.fleetroll.dev/{name} {done}"),
    }
    Ok(ExitCode::SUCCESS)
}

async fn approve(
    client: &Client,
    ns: &str,
    name: &str,
    batch: Option<u32>,
    plan_hash: Option<&str>,
    output: Option<Output>,
) -> Result<ExitCode, String> {
    let who = whoami(client).await;
    let batch = match batch {
        Some(0) => return Err("batches are numbered from 1".into()),
        b => b.map(|b| b - 1),
    };
    let fr = control::approve(client, ns, name, batch, plan_hash, who.as_deref(), FIELD_MANAGER).await?;
    match output {
        Some(o) => print(&fr, o)?,
        None => {
            let a = fr.spec.approvals.iter().max_by_key(|a| a.batch).cloned();
            let what =
                a.map(|a| format!("batch {} of plan {}", a.batch + 1, a.plan_hash)).unwrap_or_default();
            let as_who = who.map(|w| format!(" as {w}")).unwrap_or_default();
            println!("fleetrollout.fleetroll.dev/{name} approved {what}{as_who}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Who the kubeconfig authenticates as (SelfSubjectReview), for the approval record.
/// Who the API server says the user is (None when it will not say: the approval then names no one).
async fn whoami(client: &Client) -> Option<String> {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    let reviewed = api.create(&PostParams::default(), &SelfSubjectReview::default()).await.ok()?;
    reviewed.status?.user_info?.username
}

/// A plan as the plugin prints it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PlanView {
    plan_hash: String,
    total_targets: u32,
    batches: Vec<BatchView>,
    /// True when this is what the rollout would get (nothing frozen or written yet).
    preview: bool,
}

#[derive(Serialize)]
struct BatchView {
    batch: u32,
    targets: Vec<String>,
}

fn plan_view(plan: &Plan, preview: bool) -> PlanView {
    PlanView {
        plan_hash: plan.hash.clone(),
        total_targets: plan.total_targets(),
        batches: plan
            .batches
            .iter()
            .enumerate()
            .map(|(i, b)| BatchView {
                batch: i as u32 + 1,
                targets: b.iter().map(|t| crate::api::target_key(&t.namespace, &t.name)).collect(),
            })
            .collect(),
        preview,
    }
}

async fn plan(
    client: &Client,
    ns: &str,
    name: Option<&str>,
    file: Option<&std::path::Path>,
    fleet_namespace: &str,
    output: Option<Output>,
) -> Result<ExitCode, String> {
    let (fr, frozen) = match (name, file) {
        (Some(name), _) => {
            let fr = control::get(client, ns, name).await?;
            let frozen = match fr.status.as_ref().and_then(|s| s.plan.clone()) {
                Some(plan_ref) => Some(
                    PlanStore::default()
                        .load(client, &fr, &plan_ref)
                        .await
                        .map_err(|e| e.to_string())?
                        .map_err(|refused| format!("{}: {}", refused.reason, refused.message))?
                        .plan
                        .clone(),
                ),
                None => None,
            };
            (fr, frozen)
        }
        (None, Some(path)) => {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
            let mut fr: FleetRollout = serde_saphyr::from_str(&text)
                .map_err(|e| format!("{} is not a FleetRollout: {e}", path.display()))?;
            if fr.metadata.namespace.is_none() {
                fr.metadata.namespace = Some(ns.to_string());
            }
            (fr, None)
        }
        (None, None) => return Err("name a FleetRollout, or give a manifest with -f".into()),
    };
    let (plan, preview) = match frozen {
        Some(p) => (p, false),
        None => match discovery::preview(client, fleet_namespace, &fr).await.map_err(|e| e.to_string())? {
            Ok(p) => (p, true),
            Err(blocked) => {
                return Err(format!(
                    "this rollout could not be planned ({}): {}",
                    blocked.reason, blocked.message
                ));
            }
        },
    };
    let view = plan_view(&plan, preview);
    match output {
        Some(o) => print(&view, o)?,
        None => {
            let kind = if preview { "would roll" } else { "rolls" };
            println!(
                "FleetRollout {}/{} {kind} {} targets in {} batches to {} (plan {}):",
                fr.namespace().unwrap_or_default(),
                fr.name_any(),
                view.total_targets,
                view.batches.len(),
                fr.spec.image,
                view.plan_hash
            );
            for b in &view.batches {
                println!("  batch {:>3}  ({:>3})  {}", b.batch, b.targets.len(), b.targets.join(", "));
            }
            if preview {
                println!("Nothing was written.");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn status(
    client: &Client,
    ns: &str,
    name: &str,
    follow: bool,
    timeout: Option<Duration>,
    output: Option<Output>,
) -> Result<ExitCode, String> {
    let fr = control::get(client, ns, name).await?;
    if let Some(o) = output {
        print(&fr, o)?;
        return Ok(ExitCode::SUCCESS);
    }
    if !follow {
        print!("{}", render(&fr));
        return Ok(exit_for(&fr));
    }
    let tty = std::io::stdout().is_terminal();
    let api: Api<FleetRollout> = Api::namespaced(client.clone(), ns);
    let mut updates = watcher(api, watcher::Config::default().fields(&format!("metadata.name={name}")))
        .applied_objects()
        .boxed();
    let deadline = tokio::time::Instant::now() + timeout.unwrap_or(Duration::from_secs(365 * 24 * 3600));
    let mut last = String::new();
    let mut current = fr;
    let plans = PlanStore::default();
    loop {
        let view = render_with(&current, batch_health(client, &plans, &current).await);
        if view != last {
            let mut out = std::io::stdout().lock();
            if tty {
                // Redraw in place.
                let _ = write!(out, "\x1b[H\x1b[2J");
            } else if !last.is_empty() {
                let _ = writeln!(out, "---");
            }
            let _ = write!(out, "{view}");
            let _ = out.flush();
            last = view;
        }
        if current.status.as_ref().is_some_and(|s| s.phase.is_terminal()) {
            return Ok(exit_for(&current));
        }
        // Targets become healthy without the rollout's status changing: look again every 2s too.
        tokio::select! {
            next = updates.next() => match next {
                Some(Ok(fr)) => current = fr,
                Some(Err(e)) => return Err(format!("watching {ns}/{name}: {e}")),
                None => return Err("the watch ended".into()),
            },
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            _ = tokio::time::sleep_until(deadline) => {
                eprintln!("timed out; the rollout is still {}", phase_of(&current));
                return Ok(ExitCode::FAILURE);
            }
        }
    }
}

/// How many targets of the batch being verified are healthy now: (batch index, healthy). The plan is read
/// from status or its ConfigMaps (once per plan, through `plans`); a caller who may not read those
/// ConfigMaps sees no count.
async fn batch_health(client: &Client, plans: &PlanStore, fr: &FleetRollout) -> Option<(u32, u32)> {
    let s = fr.status.as_ref()?;
    let current =
        s.batches.iter().find(|b| Some(b.index) == s.current_batch && b.state == BatchState::Verifying)?;
    let plan = plans.load(client, fr, s.plan.as_ref()?).await.ok()?.ok()?;
    let image = s.revision.as_ref().map_or(fr.spec.image.as_str(), |r| r.inputs.image.as_str());
    let container = s.revision.as_ref().and_then(|r| r.inputs.container.as_deref());
    let mut healthy = 0;
    for t in plan.plan.batch(current.index).iter().take(100) {
        if let Ok(Some(f)) = crate::edge::targets::live_facts(client, fr.spec.targets.kind, t).await
            && f.container_image(container).is_ok_and(|(_, i)| i == image)
            && f.readiness() == crate::core::workload::Readiness::Ready
        {
            healthy += 1;
        }
    }
    Some((current.index, healthy))
}

fn phase_of(fr: &FleetRollout) -> Phase {
    fr.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

fn exit_for(fr: &FleetRollout) -> ExitCode {
    match phase_of(fr) {
        Phase::Succeeded => ExitCode::SUCCESS,
        p if p.is_terminal() => ExitCode::FAILURE,
        _ => ExitCode::SUCCESS,
    }
}

const BAR: usize = 24;
/// Rollouts with more batches than this list the ones with checkpoints, then say how many remain.
const LISTED_BATCHES: u32 = 100;

fn bar(done: u32, total: u32) -> String {
    let filled = if total == 0 { BAR } else { (done as usize * BAR) / total as usize };
    format!("[{}{}]", "#".repeat(filled), "-".repeat(BAR - filled))
}

/// The human view of a rollout: a header, then one line with a progress bar per batch.
pub fn render(fr: &FleetRollout) -> String {
    render_with(fr, None)
}

/// [`render`], with the number of healthy targets of the batch being verified, when known.
fn render_with(fr: &FleetRollout, health: Option<(u32, u32)>) -> String {
    let s = fr.status.clone().unwrap_or_default();
    let mut out = format!(
        "FleetRollout {}/{}  image {}\n{}: {}\n",
        fr.namespace().unwrap_or_default(),
        fr.name_any(),
        fr.spec.image,
        s.phase,
        s.message.clone().unwrap_or_default()
    );
    let total = s.plan.as_ref().map_or(0, |p| p.total_batches);
    // Batch sizes follow from the revision's inputs and the fleet's size, as the plan's did.
    let sizes: Vec<u32> = match (&s.plan, &s.revision) {
        (Some(p), Some(r)) if total <= LISTED_BATCHES => {
            crate::core::plan::batch_sizes(p.total_targets, &r.inputs.steps, &r.inputs.batch_size)
                .unwrap_or_default()
        }
        _ => Vec::new(),
    };
    let first_shown = s.batches.first().map_or(0, |b| b.index);
    if first_shown > 0 {
        out.push_str(&format!(
            "  batches 1-{first_shown}: succeeded (earlier checkpoints are summarised in counts)\n"
        ));
    }
    for index in first_shown..total {
        let checkpoint = s.batches.iter().find(|b| b.index == index);
        let size = checkpoint.map(|b| b.size).or_else(|| sizes.get(index as usize).copied()).unwrap_or(0);
        let ended = s.phase.is_terminal() || s.phase == Phase::RollingBack;
        let (done, state) = match checkpoint.map(|b| b.state) {
            // A batch still in flight when the rollout was stopped.
            Some(BatchState::Applying | BatchState::Verifying) if ended => (0, "Stopped"),
            Some(BatchState::Succeeded) => (size, "Succeeded"),
            Some(BatchState::Failed) => (size, "Failed"),
            Some(BatchState::Verifying) => {
                (health.filter(|(i, _)| *i == index).map_or(0, |(_, h)| h), "Verifying")
            }
            Some(BatchState::Applying) => (0, "Applying"),
            Some(BatchState::Pending) | None => (0, "Pending"),
        };
        let failed = checkpoint.map_or(0, |b| b.failed);
        let failed = if failed > 0 { format!("  {failed} failed") } else { String::new() };
        let healthy = match checkpoint.map(|b| b.state) {
            Some(BatchState::Verifying) if !ended => format!(" ({done}/{size} healthy)"),
            _ => String::new(),
        };
        out.push_str(&format!(
            "  batch {:>3}/{total}  {}  {size:>4} targets  {state}{healthy}{failed}\n",
            index + 1,
            bar(done, size)
        ));
        if sizes.is_empty() && checkpoint.is_none() {
            // Many batches: say how many remain instead of listing them.
            let left = total - index;
            if left > 1 {
                out.push_str(&format!("  … {} more batches pending\n", left - 1));
            }
            break;
        }
    }
    if let Some(p) = &s.pending_approval {
        out.push_str(&format!(
            "Waiting for approval of batch {} (plan {}): kubectl fleetroll approve {}\n",
            p.batch + 1,
            p.plan_hash,
            fr.name_any()
        ));
    }
    for f in s.failures.iter().rev().take(5) {
        // Refused and vanished targets are reported with failures but are not failures.
        let what = match f.reason.as_str() {
            r if crate::core::scope::reason::ALL.contains(&r) => "refused",
            crate::core::rollout::reason::TARGET_MISSING => "skipped",
            _ => "failed",
        };
        out.push_str(&format!(
            "  {what}: {} (batch {}): {}: {}\n",
            crate::api::target_key(&f.namespace, &f.name),
            f.batch + 1,
            f.reason,
            f.message
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{BatchStatus, FleetRolloutStatus, PendingApproval, PlanRef, PlanStorage, Revision};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    #[test]
    fn the_view_has_a_bar_per_batch_and_says_what_to_do() {
        let mut fr: FleetRollout = serde_json::from_value(json!({
            "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"image": "web:v2", "targets": {"kind": "Deployment", "selector": {"matchLabels": {"a": "b"}}}}
        }))
        .unwrap();
        // Sizes come from the revision (one, then twos), not from a plan kept in status.
        let mut inputs = crate::api::RevisionInputs::of(&fr.spec);
        inputs.steps = vec![IntOrString::Int(1)];
        inputs.batch_size = IntOrString::Int(2);
        fr.status = Some(FleetRolloutStatus {
            phase: Phase::WaitingForApproval,
            message: Some("batch 2/3 waits".into()),
            revision: Some(Revision {
                number: 1,
                spec_hash: "h".into(),
                inputs,
                started_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            }),
            plan: Some(PlanRef {
                hash: "abc".into(),
                total_targets: 5,
                total_batches: 3,
                storage: PlanStorage::ConfigMaps,
                batches: vec![],
                shards: vec!["web-plan-abc-0".into()],
            }),
            batches: vec![BatchStatus {
                index: 0,
                size: 1,
                state: BatchState::Succeeded,
                ..Default::default()
            }],
            pending_approval: Some(PendingApproval {
                batch: 1,
                plan_hash: "abc".into(),
                since: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            }),
            ..Default::default()
        });
        let view = render(&fr);
        assert!(view.contains("batch   1/3  [########################]     1 targets  Succeeded"), "{view}");
        assert!(view.contains("batch   2/3  [------------------------]     2 targets  Pending"), "{view}");
        assert!(view.contains("kubectl fleetroll approve web"), "{view}");
        assert_eq!(view.lines().filter(|l| l.starts_with("  batch ")).count(), 3);
    }
}
