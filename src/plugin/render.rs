//! The human view of a rollout, as pure functions of its status: a header, one line with a progress bar per
//! batch, the approval it waits for, and its latest failures.

use kube::ResourceExt;

use crate::api::{BatchState, BatchStatus, FleetRollout, FleetRolloutStatus, Phase};

const BAR: usize = 24;
/// Rollouts with more batches than this list the ones with checkpoints, then say how many remain.
const LISTED_BATCHES: u32 = 100;
/// The latest failures shown under the batches.
const LISTED_FAILURES: usize = 5;

/// How many targets of a batch being verified are healthy now, read live (status counts them only once the
/// batch ends).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BatchHealth {
    pub batch: u32,
    pub healthy: u32,
}

fn bar(done: u32, total: u32) -> String {
    let filled = if total == 0 { BAR } else { (done as usize * BAR) / total as usize };
    // More done than the batch holds cannot be drawn; clamp rather than panic on odd data.
    let filled = filled.min(BAR);
    format!("[{}{}]", "#".repeat(filled), "-".repeat(BAR - filled))
}

/// The view of `fr`, with the live health of the batch being verified when known.
pub(super) fn render(fr: &FleetRollout, health: Option<BatchHealth>) -> String {
    let s = fr.status.clone().unwrap_or_default();
    let creator =
        fr.spec.creator.as_ref().map(|c| format!("  created by {}", c.username)).unwrap_or_default();
    let mut out = format!(
        "FleetRollout {}/{}  image {}{creator}\n{}: {}\n",
        fr.namespace().unwrap_or_default(),
        fr.name_any(),
        fr.spec.image,
        s.phase,
        s.message.clone().unwrap_or_default()
    );
    out.push_str(&batch_lines(&s, health));
    out.push_str(&cluster_lines(&s));
    if let Some(p) = &s.pending_approval {
        let by = Some(&p.approvers)
            .filter(|a| !a.is_empty())
            .map(|a| format!(" by {}", crate::core::policy::describe_approvers(a)))
            .unwrap_or_default();
        out.push_str(&format!(
            "Waiting for approval of batch {} (plan {}){by}: kubectl fleetroll approve {}\n",
            p.batch + 1,
            p.plan_hash,
            fr.name_any()
        ));
    }
    out.push_str(&analysis_lines(&s, &fr.name_any()));
    out.push_str(&failure_lines(&s));
    out
}

/// The metric analysis of the batch in flight (or last finished): a line per metric, and what to do
/// when it holds the rollout.
fn analysis_lines(s: &FleetRolloutStatus, name: &str) -> String {
    let Some((index, a)) = s.current().and_then(|b| b.analysis.as_ref().map(|a| (b.index, a))) else {
        return String::new();
    };
    let mut out = format!("  analysis of batch {}:\n", index + 1);
    for r in &a.metrics {
        let dry = if r.dry_run { " (dry run)" } else { "" };
        let mut line = format!(
            "    {}{dry}  {}  {} taken: {} successful, {} failed, {} inconclusive; {} errors",
            r.name,
            r.phase.as_str(),
            crate::core::analysis::taken(r),
            r.successful,
            r.failed,
            r.inconclusive,
            r.errors
        );
        if let Some(last) = r.measurements.last() {
            line.push_str(&format!("; last {}", last.phase.as_str()));
            for part in [&last.value, &last.message].into_iter().flatten() {
                line.push_str(&format!(" {part}"));
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    if let Some(hold) = a.hold.as_ref().filter(|_| s.phase == Phase::Paused) {
        out.push_str(&format!(
            "Held ({}): kubectl fleetroll resume {name} to go on anyway, or abort or rollback\n",
            hold.reason
        ));
    }
    out
}

/// One line per batch: those with checkpoints, then the pending ones (or how many remain, when they are
/// too many to list).
fn batch_lines(s: &FleetRolloutStatus, health: Option<BatchHealth>) -> String {
    let total = s.plan.as_ref().map_or(0, |p| p.total_batches);
    // Batch sizes follow from the revision's inputs and the fleet's size, as the plan's did.
    let sizes: Vec<u32> = match (&s.plan, &s.revision) {
        (Some(p), Some(r)) if total <= LISTED_BATCHES => {
            crate::core::plan::batch_sizes(p.total_targets, &r.inputs.steps, &r.inputs.batch_size)
                .unwrap_or_default()
        }
        _ => Vec::new(),
    };
    let mut out = String::new();
    let first_shown = s.batches.first().map_or(0, |b| b.index);
    if first_shown > 0 {
        out.push_str(&format!(
            "  batches 1-{first_shown}: succeeded (earlier checkpoints are summarised in counts)\n"
        ));
    }
    // A batch still in flight when the rollout was stopped is shown as stopped.
    let ended = s.phase.is_terminal() || s.phase == Phase::RollingBack;
    for index in first_shown..total {
        let checkpoint = s.batch(index);
        let size = checkpoint.map(|b| b.size).or_else(|| sizes.get(index as usize).copied()).unwrap_or(0);
        let healthy = health.filter(|h| h.batch == index).map_or(0, |h| h.healthy);
        out.push_str(&batch_line(index, total, size, checkpoint, ended, healthy));
        if sizes.is_empty() && checkpoint.is_none() {
            // Many batches: say how many remain instead of listing them.
            let left = total - index;
            if left > 1 {
                out.push_str(&format!("  … {} more batches pending\n", left - 1));
            }
            break;
        }
    }
    out
}

fn batch_line(
    index: u32,
    total: u32,
    size: u32,
    checkpoint: Option<&BatchStatus>,
    ended: bool,
    healthy: u32,
) -> String {
    let (done, state) = match checkpoint.map(|b| b.state) {
        Some(BatchState::Applying | BatchState::Verifying) if ended => (0, "Stopped"),
        Some(BatchState::Succeeded) => (size, "Succeeded"),
        Some(BatchState::Failed) => (size, "Failed"),
        Some(BatchState::Verifying) => (healthy, "Verifying"),
        Some(BatchState::Applying) => (0, "Applying"),
        Some(BatchState::Pending) | None => (0, "Pending"),
    };
    let failed = checkpoint.map_or(0, |b| b.failed);
    let failed = if failed > 0 { format!("  {failed} failed") } else { String::new() };
    let healthy = match checkpoint.map(|b| b.state) {
        Some(BatchState::Verifying) if !ended => format!(" ({done}/{size} healthy)"),
        _ => String::new(),
    };
    format!(
        "  batch {:>3}/{total}  {}  {size:>4} targets  {state}{healthy}{failed}\n",
        index + 1,
        bar(done, size)
    )
}

/// Across member clusters: a bar per wave, its clusters' counts, and the clusters in trouble.
fn cluster_lines(s: &FleetRolloutStatus) -> String {
    let Some(c) = &s.clusters else { return String::new() };
    let mut out = String::new();
    for w in &c.waves {
        let members: Vec<String> = c
            .members
            .iter()
            .filter(|m| m.wave == w.name)
            .map(|m| {
                let failed = if m.failed > 0 { format!(" {} failed", m.failed) } else { String::new() };
                format!("{} {}/{}{failed}", m.name, m.updated, m.total)
            })
            .collect();
        out.push_str(&format!(
            "  wave {:<12} {} {}/{} (batches {}-{}): {}\n",
            w.name,
            bar(w.updated, w.total),
            w.updated,
            w.total,
            w.first_batch + 1,
            w.last_batch + 1,
            members.join(", ")
        ));
    }
    for t in &c.left_out {
        out.push_str(&format!(
            "  cluster {}: left out of the plan, not reachable when it was made: {}\n",
            t.name, t.message
        ));
    }
    for t in &c.trouble {
        out.push_str(&format!("  cluster {}: {} since {}: {}\n", t.name, t.reason, t.since.0, t.message));
    }
    out
}

/// The latest failures, newest first. Refused and vanished targets are reported with failures but are not
/// failures.
fn failure_lines(s: &FleetRolloutStatus) -> String {
    let mut out = String::new();
    for f in s.failures.iter().rev().take(LISTED_FAILURES) {
        let what = match f.reason.as_str() {
            r if crate::core::reason::REFUSALS.contains(&r) => "refused",
            crate::core::reason::TARGET_MISSING => "skipped",
            _ => "failed",
        };
        out.push_str(&format!(
            "  {what}: {} (batch {}): {}: {}\n",
            f.key(),
            f.batch + 1,
            f.reason,
            f.message
        ));
    }
    out
}

#[cfg(test)]
mod tests;
