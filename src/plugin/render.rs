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
    let mut out = format!(
        "FleetRollout {}/{}  image {}\n{}: {}\n",
        fr.namespace().unwrap_or_default(),
        fr.name_any(),
        fr.spec.image,
        s.phase,
        s.message.clone().unwrap_or_default()
    );
    out.push_str(&batch_lines(&s, health));
    out.push_str(&cluster_lines(&s));
    if let Some(p) = &s.pending_approval {
        out.push_str(&format!(
            "Waiting for approval of batch {} (plan {}): kubectl fleetroll approve {}\n",
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
mod tests {
    use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
    use serde_json::json;

    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    use super::*;
    use crate::api::{PendingApproval, PlanRef, PlanStorage, Revision, RevisionInputs, TargetFailure};

    fn rollout() -> FleetRollout {
        serde_json::from_value(json!({
            "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"image": "web:v2", "targets": {"kind": "Deployment", "selector": {"matchLabels": {"a": "b"}}}}
        }))
        .unwrap()
    }

    /// A status with a revision and a plan of `total_targets` in `total_batches`, with `inputs` changed
    /// by `edit`.
    fn status(
        fr: &FleetRollout,
        total_targets: u32,
        total_batches: u32,
        edit: impl FnOnce(&mut RevisionInputs),
    ) -> FleetRolloutStatus {
        let mut inputs = RevisionInputs::of(&fr.spec);
        edit(&mut inputs);
        FleetRolloutStatus {
            revision: Some(Revision {
                number: 1,
                spec_hash: "h".into(),
                inputs,
                started_at: Time(Timestamp::UNIX_EPOCH),
            }),
            plan: Some(PlanRef {
                hash: "abc".into(),
                total_targets,
                total_batches,
                storage: PlanStorage::ConfigMaps,
                batches: vec![],
                shards: vec!["web-plan-abc-0".into()],
            }),
            ..Default::default()
        }
    }

    fn checkpoint(index: u32, size: u32, state: BatchState) -> BatchStatus {
        BatchStatus { index, size, state, ..Default::default() }
    }

    fn batch_lines_of(view: &str) -> Vec<&str> {
        view.lines().filter(|l| l.starts_with("  batch ")).collect()
    }

    #[test]
    fn the_view_has_a_bar_per_batch_and_says_what_to_do() {
        let mut fr = rollout();
        // Sizes come from the revision (one, then twos), not from a plan kept in status.
        let mut s = status(&fr, 5, 3, |inputs| {
            inputs.steps = vec![IntOrString::Int(1)];
            inputs.batch_size = IntOrString::Int(2);
        });
        s.phase = Phase::WaitingForApproval;
        s.message = Some("batch 2/3 waits".into());
        s.batches = vec![checkpoint(0, 1, BatchState::Succeeded)];
        s.pending_approval =
            Some(PendingApproval { batch: 1, plan_hash: "abc".into(), since: Time(Timestamp::UNIX_EPOCH) });
        fr.status = Some(s);
        let view = render(&fr, None);
        assert!(view.contains("batch   1/3  [########################]     1 targets  Succeeded"), "{view}");
        assert!(view.contains("batch   2/3  [------------------------]     2 targets  Pending"), "{view}");
        assert!(view.contains("kubectl fleetroll approve web"), "{view}");
        assert_eq!(view.lines().filter(|l| l.starts_with("  batch ")).count(), 3);
    }

    #[test]
    fn a_batch_being_verified_shows_its_live_healthy_count_and_only_its_own() {
        let mut fr = rollout();
        let mut s = status(&fr, 4, 2, |inputs| inputs.batch_size = IntOrString::Int(2));
        s.phase = Phase::Progressing;
        s.batches = vec![checkpoint(0, 2, BatchState::Succeeded), checkpoint(1, 2, BatchState::Verifying)];
        fr.status = Some(s);

        let view = render(&fr, Some(BatchHealth { batch: 1, healthy: 1 }));
        assert!(
            view.contains("batch   2/2  [############------------]     2 targets  Verifying (1/2 healthy)"),
            "{view}"
        );
        // A count for another batch (the view moved on since it was read) is not this batch's.
        let stale = render(&fr, Some(BatchHealth { batch: 0, healthy: 2 }));
        assert!(stale.contains("Verifying (0/2 healthy)"), "{stale}");
        assert!(render(&fr, None).contains("Verifying (0/2 healthy)"));
    }

    #[test]
    fn a_batch_in_flight_when_the_rollout_stopped_is_shown_stopped_without_a_count() {
        let mut fr = rollout();
        let mut s = status(&fr, 2, 1, |inputs| inputs.batch_size = IntOrString::Int(2));
        s.phase = Phase::Aborted;
        s.batches = vec![checkpoint(0, 2, BatchState::Verifying)];
        fr.status = Some(s);
        let view = render(&fr, Some(BatchHealth { batch: 0, healthy: 2 }));
        let lines = batch_lines_of(&view);
        assert_eq!(lines, ["  batch   1/1  [------------------------]     2 targets  Stopped"], "{view}");
    }

    #[test]
    fn too_many_batches_to_list_end_with_how_many_remain() {
        let mut fr = rollout();
        let mut s = status(&fr, 300, LISTED_BATCHES + 50, |_| {});
        s.phase = Phase::Progressing;
        s.batches = vec![checkpoint(0, 2, BatchState::Succeeded), checkpoint(1, 2, BatchState::Applying)];
        fr.status = Some(s);
        let view = render(&fr, None);
        let lines = batch_lines_of(&view);
        assert_eq!(lines.len(), 3, "{view}");
        assert!(lines[2].starts_with("  batch   3/150  ") && lines[2].ends_with("Pending"), "{view}");
        assert!(view.contains("… 147 more batches pending"), "{view}");
    }

    #[test]
    fn checkpoints_summarised_away_are_named_as_succeeded() {
        let mut fr = rollout();
        let mut s = status(&fr, 6, 3, |inputs| inputs.batch_size = IntOrString::Int(2));
        s.phase = Phase::Progressing;
        s.batches = vec![checkpoint(2, 2, BatchState::Applying)];
        fr.status = Some(s);
        let view = render(&fr, None);
        assert!(view.contains("  batches 1-2: succeeded"), "{view}");
        assert_eq!(batch_lines_of(&view).len(), 1, "{view}");
    }

    #[test]
    fn the_latest_failures_are_listed_newest_first_refusals_and_vanished_targets_named_as_such() {
        let failure = |name: &str, reason: &str| TargetFailure {
            cluster: String::new(),
            namespace: "shop".into(),
            name: name.into(),
            batch: 0,
            reason: reason.into(),
            message: "why".into(),
        };
        let mut fr = rollout();
        let mut s = status(&fr, 2, 1, |_| {});
        s.failures = vec![failure("old", "Timeout"), failure("gone", crate::core::reason::TARGET_MISSING)];
        s.failures.extend((0..3).map(|i| failure(&format!("t{i}"), "Timeout")));
        s.failures.push(failure("kept-out", crate::core::reason::OUT_OF_SCOPE));
        fr.status = Some(s);
        let view = render(&fr, None);
        let listed: Vec<&str> = view.lines().filter(|l| l.contains("(batch 1)")).collect();
        assert_eq!(listed.len(), LISTED_FAILURES, "{view}");
        assert!(listed[0].starts_with("  refused: shop/kept-out (batch 1): OutOfScope: why"), "{view}");
        assert!(listed[4].starts_with("  skipped: shop/gone"), "{view}");
        assert!(!view.contains("shop/old"), "the oldest is left out:\n{view}");
        assert!(listed[1].starts_with("  failed: shop/t2"), "{view}");
    }

    #[test]
    fn the_analysis_of_the_batch_in_flight_is_shown_with_what_to_do_when_it_holds() {
        let mut fr = rollout();
        let mut s = status(&fr, 5, 1, |_| {});
        s.phase = Phase::Paused;
        s.current_batch = Some(0);
        s.batches = vec![checkpoint(0, 5, BatchState::Verifying)];
        s.reason = Some("AnalysisInconclusive".into());
        let at = Time(Timestamp::from_second(1_800_000_000).unwrap());
        s.batches[0].analysis = Some(crate::api::BatchAnalysis {
            started_at: at.clone(),
            hold: Some(crate::api::AnalysisHold {
                reason: "AnalysisInconclusive".into(),
                since: at.clone(),
                resume_token: None,
            }),
            metrics: vec![crate::api::MetricRun {
                name: "error-rate".into(),
                phase: crate::api::MetricPhase::Inconclusive,
                inconclusive: 1,
                measurements: vec![crate::api::Measurement {
                    phase: crate::api::MeasurementPhase::Inconclusive,
                    value: None,
                    message: Some("no data (onNoData: Inconclusive)".into()),
                    at,
                }],
                ..Default::default()
            }],
        });
        fr.status = Some(s);
        let view = render(&fr, None);
        assert!(view.contains("  analysis of batch 1:\n    error-rate  Inconclusive  1 taken: 0 successful, 0 failed, 1 inconclusive; 0 errors; last Inconclusive no data"), "{view}");
        assert!(view.contains("Held (AnalysisInconclusive): kubectl fleetroll resume"), "{view}");
    }

    #[test]
    fn a_bar_is_filled_in_proportion_and_never_overflows() {
        assert_eq!(bar(1, 2), format!("[{}{}]", "#".repeat(12), "-".repeat(12)));
        assert_eq!(bar(0, 0), format!("[{}]", "#".repeat(BAR)), "an empty batch has nothing left to do");
        assert_eq!(bar(3, 2), format!("[{}]", "#".repeat(BAR)));
    }
}
