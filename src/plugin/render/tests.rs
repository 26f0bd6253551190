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
    s.pending_approval = Some(PendingApproval {
        batch: 1,
        plan_hash: "abc".into(),
        gates_hash: "def".into(),
        since: Time(Timestamp::UNIX_EPOCH),
        approvers: vec![],
    });
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
fn a_rollout_across_clusters_shows_a_bar_per_wave_its_clusters_and_those_in_trouble() {
    use crate::api::{ClusterCount, ClusterTrouble, ClustersStatus, WaveStatus};
    let mut fr = rollout();
    let mut s = status(&fr, 6, 2, |_| {});
    let count = |name: &str, wave: &str, total, updated, failed| ClusterCount {
        name: name.into(),
        wave: wave.into(),
        total,
        updated,
        failed,
    };
    s.clusters = Some(ClustersStatus {
        waves: vec![
            WaveStatus {
                name: "canary".into(),
                first_batch: 0,
                last_batch: 0,
                clusters: 1,
                total: 2,
                updated: 2,
                failed: 0,
            },
            WaveStatus {
                name: "prod".into(),
                first_batch: 1,
                last_batch: 2,
                clusters: 2,
                total: 4,
                updated: 1,
                failed: 1,
            },
        ],
        members: vec![
            count("m1", "canary", 2, 2, 0),
            count("m2", "prod", 2, 1, 1),
            count("m3", "prod", 2, 0, 0),
        ],
        trouble: vec![ClusterTrouble {
            name: "m3".into(),
            reason: "ClusterUnreachable".into(),
            message: "connection refused".into(),
            since: Time(Timestamp::from_second(1_800_000_000).unwrap()),
        }],
        ..Default::default()
    });
    fr.status = Some(s);
    let view = render(&fr, None);
    assert!(
        view.contains("  wave canary       [########################] 2/2 (batches 1-1): m1 2/2\n"),
        "{view}"
    );
    assert!(
        view.contains(
            "  wave prod         [######------------------] 1/4 (batches 2-3): m2 1/2 1 failed, m3 0/2\n"
        ),
        "{view}"
    );
    assert!(
        view.contains("  cluster m3: ClusterUnreachable since 2027-01-15T08:00:00Z: connection refused\n"),
        "{view}"
    );
}

#[test]
fn a_bar_is_filled_in_proportion_and_never_overflows() {
    assert_eq!(bar(1, 2), format!("[{}{}]", "#".repeat(12), "-".repeat(12)));
    assert_eq!(bar(0, 0), format!("[{}]", "#".repeat(BAR)), "an empty batch has nothing left to do");
    assert_eq!(bar(3, 2), format!("[{}]", "#".repeat(BAR)));
}
