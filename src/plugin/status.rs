//! `status`: where a rollout stands, printed once or followed live until it ends; the exit code is its
//! outcome.

use std::{
    io::{IsTerminal, Write},
    process::ExitCode,
    time::Duration,
};

use futures::StreamExt;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};

use super::{
    Exit, PluginError,
    args::Output,
    print,
    render::{BatchHealth, render},
};
use crate::{
    api::{BatchState, FleetRollout, Phase},
    edge::{
        control::{self, ControlError},
        live,
        plans::PlanStore,
    },
};

/// Targets become healthy without the rollout's status changing: the followed view looks again this often.
const LOOK_AGAIN: Duration = Duration::from_secs(2);
/// Following without a timeout: a year stands for "until it ends".
const FOREVER: Duration = Duration::from_secs(365 * 24 * 3600);

pub(super) async fn status(
    client: &Client,
    ns: &str,
    name: &str,
    follow: bool,
    timeout: Option<Duration>,
    output: Option<Output>,
) -> Result<ExitCode, PluginError> {
    let fr = control::get(client, ns, name).await?;
    if let Some(o) = output {
        print(&fr, o)?;
        return Ok(Exit::Done.into());
    }
    if !follow {
        print!("{}", render(&fr, batch_health(client, &PlanStore::default(), &fr).await));
        return Ok(exit_for(&fr));
    }
    follow_until_it_ends(client, ns, name, fr, timeout.unwrap_or(FOREVER)).await
}

/// Redraws the view whenever it changes (in place on a terminal; separated by `---` otherwise) until the
/// rollout ends or `timeout` passes.
async fn follow_until_it_ends(
    client: &Client,
    ns: &str,
    name: &str,
    mut current: FleetRollout,
    timeout: Duration,
) -> Result<ExitCode, PluginError> {
    let tty = std::io::stdout().is_terminal();
    let api: Api<FleetRollout> = Api::namespaced(client.clone(), ns);
    let mut updates = watcher(api, watcher::Config::default().fields(&format!("metadata.name={name}")))
        .applied_objects()
        .boxed();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = String::new();
    let plans = PlanStore::default();
    loop {
        let view = render(&current, batch_health(client, &plans, &current).await);
        if view != last {
            redraw(&view, tty, last.is_empty());
            last = view;
        }
        if current.status.as_ref().is_some_and(|s| s.phase.is_terminal()) {
            return Ok(exit_for(&current));
        }
        tokio::select! {
            next = updates.next() => match next {
                Some(Ok(fr)) => current = fr,
                Some(Err(e)) => {
                    let what = format!("watching FleetRollout {ns}/{name}");
                    return Err(ControlError::Unavailable { what, source: Box::new(e) }.into());
                }
                None => return Err(PluginError::Failed("the watch ended".into())),
            },
            _ = tokio::time::sleep(LOOK_AGAIN) => {}
            _ = tokio::time::sleep_until(deadline) => {
                eprintln!("timed out; the rollout is still {}", phase_of(&current));
                return Ok(Exit::TimedOut.into());
            }
        }
    }
}

fn redraw(view: &str, tty: bool, first: bool) {
    let mut out = std::io::stdout().lock();
    // A closed stdout is the reader's choice; the rollout is followed to its end regardless.
    if tty {
        // Redraw in place.
        let _ = write!(out, "\x1b[H\x1b[2J");
    } else if !first {
        let _ = writeln!(out, "---");
    }
    let _ = write!(out, "{view}");
    let _ = out.flush();
}

/// How many targets of the batch being verified are healthy now. The plan is read from status or its
/// ConfigMaps (once per plan, through `plans`); a caller who may not read those ConfigMaps, or the
/// targets, or whose targets are in member clusters, sees no count.
async fn batch_health(client: &Client, plans: &PlanStore, fr: &FleetRollout) -> Option<BatchHealth> {
    let s = fr.status.as_ref()?;
    let verifying = s.current().filter(|b| b.state == BatchState::Verifying)?;
    let loaded = plans.load(client, fr, s.plan.as_ref()?).await.ok()?.ok()?;
    let healthy = live::healthy(client, fr, &loaded.plan, verifying.index).await.ok()??;
    Some(BatchHealth { batch: verifying.index, healthy })
}

fn phase_of(fr: &FleetRollout) -> Phase {
    fr.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

/// Failed (1) for a rollout that ended without succeeding, else done (0).
fn exit_for(fr: &FleetRollout) -> ExitCode {
    match phase_of(fr) {
        Phase::Succeeded => Exit::Done.into(),
        p if p.is_terminal() => Exit::Failed.into(),
        _ => Exit::Done.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::FleetRolloutStatus;

    #[test]
    fn only_a_rollout_that_ended_without_succeeding_exits_1() {
        let mut fr: FleetRollout = serde_json::from_value(serde_json::json!({
            "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"image": "web:v2", "targets": {"kind": "Deployment", "selector": {}}}
        }))
        .unwrap();
        assert_eq!(exit_for(&fr), ExitCode::SUCCESS, "not started yet");
        for (phase, code) in [
            (Phase::Progressing, ExitCode::SUCCESS),
            (Phase::Succeeded, ExitCode::SUCCESS),
            (Phase::Aborted, ExitCode::FAILURE),
            (Phase::RolledBack, ExitCode::FAILURE),
            (Phase::Failed, ExitCode::FAILURE),
        ] {
            fr.status = Some(FleetRolloutStatus { phase, ..Default::default() });
            assert_eq!(exit_for(&fr), code, "{phase}");
        }
    }
}
