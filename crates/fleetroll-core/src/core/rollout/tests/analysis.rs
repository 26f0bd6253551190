//! Metric analysis in the state machine: passing, failing, inconclusive holds, backend outages, dry runs,
//! and measurements never counted twice.

use std::collections::BTreeMap;

use super::*;
use crate::{
    api::{Analysis, MetricPhase, MetricScope},
    core::analysis::{Measured, Sample},
};

fn with_analysis(n_batch: i32, count: u32) -> FleetRolloutSpec {
    let mut s = spec(n_batch);
    let metric = serde_json::json!({
        "name": "error-rate", "query": "sum(rate(errors{deployment=~\"{{targets}}\"}[{{interval}}]))",
        "thresholdRange": {"max": 0.01}, "interval": "10s", "count": count,
    });
    s.analysis = Some(serde_json::from_value(serde_json::json!({ "metrics": [metric] })).unwrap());
    s
}

fn metrics(s: &mut FleetRolloutSpec) -> &mut Vec<crate::api::Metric> {
    &mut s.analysis.as_mut().unwrap().metrics
}

fn value(v: f64) -> crate::core::analysis::Answer {
    Ok(vec![Sample { labels: BTreeMap::from([("deployment".into(), "web-00".into())]), value: v }])
}

/// Steps and lets time pass until the rollout ends or waits for someone; at most `limit` rounds.
fn drive(sim: &mut Sim, limit: usize) {
    for _ in 0..limit {
        let wait = sim.settle();
        if sim.status.phase.is_terminal() || sim.status.phase == Phase::Paused {
            return;
        }
        sim.pass(wait.unwrap_or(Duration::from_secs(1)));
    }
}

fn run<'a>(sim: &'a Sim, batch: u32, metric: &str) -> &'a crate::api::MetricRun {
    let a = sim.status.batch(batch).and_then(|b| b.analysis.as_ref()).expect("the batch has an analysis");
    a.metrics.iter().find(|r| r.name == metric).expect("the metric has a run")
}

#[test]
fn a_healthy_fleet_passes_every_batch_after_count_measurements_each() {
    let mut sim = Sim::new(with_analysis(5, 3), 15);
    sim.backend.insert("error-rate".into(), value(0.001));
    let started = sim.now;
    drive(&mut sim, 100);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    for batch in 0..3 {
        let r = run(&sim, batch, "error-rate");
        assert_eq!((r.phase, r.successful, r.failed, r.errors), (MetricPhase::Successful, 3, 0, 0));
        assert_eq!(r.measurements.len(), 3);
    }
    assert_eq!(sim.queries.get(), 9, "one query per measurement: 3 batches x 3");
    // Three measurements 10 s apart per batch: the rollout took at least 3 x 20 s.
    assert!(sim.now.duration_since(started).as_secs() >= 60);
}

#[test]
fn a_failing_metric_fails_the_batch_and_on_failure_applies() {
    let mut s = with_analysis(5, 3);
    s.strategy.on_failure = FailurePolicy::Rollback;
    let mut sim = Sim::new(s, 15);
    sim.backend.insert("error-rate".into(), value(0.2));
    drive(&mut sim, 100);
    assert_eq!(sim.status.phase, Phase::RolledBack);
    assert_eq!(sim.status.rollback.as_ref().unwrap().reason, reason::ANALYSIS_FAILED);
    let r = run(&sim, 0, "error-rate");
    assert_eq!((r.phase, r.failed), (MetricPhase::Failed, 1), "failureLimit 0: the first failure decides");
    let message = r.measurements[0].message.as_deref().unwrap();
    assert!(message.contains(r#"{deployment="web-00"} 0.2"#), "{message}");
    assert_eq!(sim.status.batch(0).unwrap().state, BatchState::Failed);
    assert_eq!(sim.changes.iter().filter(|(_, k)| k.ends_with("/rollback")).count(), 5);
}

#[test]
fn a_failure_under_pause_holds_until_the_resume_token_changes() {
    let mut sim = Sim::new(with_analysis(5, 1), 10);
    sim.backend.insert("error-rate".into(), value(0.2));
    sim.spec.resume_token = Some("before".into());
    drive(&mut sim, 50);
    assert_eq!(
        (sim.status.phase, sim.status.reason.as_deref()),
        (Phase::Paused, Some(reason::ANALYSIS_FAILED))
    );
    assert!(conditions::is_true(&sim.status.conditions, conditions::STALLED), "kstatus reads Failed");
    assert_eq!(sim.changes.len(), 5);
    // Still held however long it waits, and the same token releases nothing.
    sim.pass(Duration::from_secs(3600));
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.changes.len(), 5);
    sim.backend.insert("error-rate".into(), value(0.0));
    sim.spec.resume_token = Some("now".into());
    drive(&mut sim, 50);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert_eq!(run(&sim, 0, "error-rate").phase, MetricPhase::Accepted);
    assert_eq!(run(&sim, 1, "error-rate").phase, MetricPhase::Successful);
}

#[test]
fn no_data_pauses_as_inconclusive_until_resumed() {
    let mut sim = Sim::new(with_analysis(5, 2), 10);
    sim.backend.insert("error-rate".into(), Ok(Vec::new()));
    drive(&mut sim, 50);
    assert_eq!(
        (sim.status.phase, sim.status.reason.as_deref()),
        (Phase::Paused, Some(reason::ANALYSIS_INCONCLUSIVE))
    );
    assert!(
        conditions::is_true(&sim.status.conditions, conditions::RECONCILING),
        "waiting for a person is InProgress"
    );
    assert_eq!(run(&sim, 0, "error-rate").phase, MetricPhase::Inconclusive);
    let queries = sim.queries.get();
    sim.pass(Duration::from_secs(600));
    assert_eq!(sim.settle(), None);
    assert_eq!(sim.queries.get(), queries, "a held analysis sends no queries");
    sim.spec.resume_token = Some("go".into());
    sim.backend.insert("error-rate".into(), value(0.0));
    drive(&mut sim, 50);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert_eq!(run(&sim, 0, "error-rate").phase, MetricPhase::Accepted);
}

#[test]
fn on_no_data_fail_fails_the_batch() {
    let mut s = with_analysis(5, 2);
    metrics(&mut s)[0].on_no_data = crate::api::NoData::Fail;
    s.strategy.on_failure = FailurePolicy::Abort;
    let mut sim = Sim::new(s, 10);
    sim.backend.insert("error-rate".into(), Ok(Vec::new()));
    drive(&mut sim, 50);
    assert_eq!(
        (sim.status.phase, sim.status.reason.as_deref()),
        (Phase::Failed, Some(reason::ANALYSIS_FAILED))
    );
}

#[test]
fn a_backend_outage_pauses_and_measuring_resumes_when_it_answers() {
    let mut s = with_analysis(5, 2);
    metrics(&mut s)[0].consecutive_error_limit = 2;
    let mut sim = Sim::new(s, 10);
    // No answer configured: every query errors.
    drive(&mut sim, 50);
    assert_eq!(
        (sim.status.phase, sim.status.reason.as_deref()),
        (Phase::Paused, Some(reason::ANALYSIS_ERROR))
    );
    let r = run(&sim, 0, "error-rate");
    assert_eq!((r.errors, r.consecutive_errors, crate::core::analysis::taken(r)), (3, 3, 0));
    // Still measuring while paused: the next retry is an interval away.
    let wait = sim.settle().expect("retries after the interval");
    assert!(wait <= Duration::from_secs(10), "{wait:?}");
    sim.pass(wait);
    sim.settle();
    assert_eq!(run(&sim, 0, "error-rate").errors, 4);
    sim.backend.insert("error-rate".into(), value(0.0));
    sim.pass(Duration::from_secs(10));
    sim.settle();
    assert_eq!(sim.status.reason.as_deref(), Some(reason::ANALYSIS_RUNNING));
    assert_eq!(sim.status.phase, Phase::Progressing);
    drive(&mut sim, 50);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    let r = run(&sim, 0, "error-rate");
    assert_eq!(
        (r.successful, r.errors, r.consecutive_errors),
        (2, 4, 0),
        "errors are not counted as measurements"
    );
}

#[test]
fn a_failing_dry_run_metric_is_reported_and_changes_nothing() {
    let mut s = with_analysis(5, 1);
    let mut dry = metrics(&mut s)[0].clone();
    dry.name = "latency".into();
    dry.dry_run = true;
    dry.scope = MetricScope::Target;
    dry.query = "latency{deployment=\"{{name}}\"}".into();
    metrics(&mut s).push(dry);
    let mut sim = Sim::new(s, 10);
    sim.backend.insert("error-rate".into(), value(0.0));
    sim.backend.insert("latency".into(), value(99.0));
    drive(&mut sim, 50);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    let r = run(&sim, 0, "latency");
    assert_eq!((r.phase, r.dry_run), (MetricPhase::Failed, true));
    assert!(
        r.measurements[0].message.as_deref().unwrap().contains("tenant-"),
        "Target measurements name targets"
    );
    // Target scope: one query per target of the batch (5), per batch, plus one Batch query per batch.
    assert_eq!(sim.queries.get(), 2 * (5 + 1));
}

#[test]
fn a_measurement_is_never_counted_twice() {
    let mut sim = Sim::new(with_analysis(5, 3), 10);
    sim.backend.insert("error-rate".into(), value(0.0));
    // Up to the batch being healthy and the analysis started.
    while sim.status.batch(0).and_then(|b| b.analysis.as_ref()).is_none() {
        sim.step();
    }
    let before = sim.status.clone();
    let Step::Write(first) = sim.advance() else { panic!("the first measurement is recorded") };
    assert_eq!(run_of(&first.status).successful, 1);
    // The same measurement handed in again with the status that recorded it: not due, dropped.
    sim.status = first.status.clone();
    let metric = &sim.spec.analysis.as_ref().unwrap().metrics[0];
    let verdicts = vec![(None, crate::core::analysis::judge(metric, &value(0.0)))];
    let replay = vec![Measured { batch: 0, metric: "error-rate".into(), verdicts }];
    let step = decide_with(&sim, &replay);
    assert!(matches!(step, Step::Wait { .. }), "nothing to write: {step:?}");
    // The write that recorded it lost a race (409): the step is taken again from the old status, and the
    // measurement counts once.
    sim.status = before;
    let Step::Write(again) = sim.advance() else { panic!("recorded again") };
    assert_eq!(run_of(&again.status).successful, 1);
}

fn run_of(s: &FleetRolloutStatus) -> &crate::api::MetricRun {
    &s.batch(0).and_then(|b| b.analysis.as_ref()).unwrap().metrics[0]
}

fn decide_with(sim: &Sim, measured: &[Measured]) -> Step {
    let world = &sim.world;
    decide(&Facts {
        unreachable: &Default::default(),
        measured,
        now: sim.now,
        uid: UID,
        generation: sim.generation,
        namespace: super::NAMESPACE,
        guardrails: &sim.guardrails,
        nonce: "0123456789abcdef",
        cannot_act: None,
        spec: &sim.spec,
        status: &sim.status,
        plan: &sim.plan,
        holds_daemonset: false,
        target: &|t| world.get(&key(t)).cloned(),
        unplanned: &|| None,
        scope: &|_| Ok(()),
        declared_windows: &|_| None,
        carrying: &|_| Vec::new(),
    })
}

#[test]
fn analysis_defaults_are_those_documented() {
    let a: Analysis = serde_json::from_value(serde_json::json!({
        "metrics": [{"name": "m", "query": "q", "thresholdRange": {"min": 1}}]
    }))
    .unwrap();
    let m = &a.metrics[0];
    assert_eq!(
        (m.scope, m.count, m.failure_limit, m.inconclusive_limit, m.consecutive_error_limit),
        (MetricScope::Batch, 1, 0, 0, 4)
    );
    assert_eq!((m.interval.as_str(), m.initial_delay.as_str(), m.dry_run), ("30s", "0s", false));
}

#[test]
fn status_stays_bounded_however_long_and_wide_the_analysis() {
    // Ten metrics (the most the schema allows), nine of them dry runs failing every measurement with long
    // label sets, over 20 batches: the window of 16 batches, 3 measurements per metric, and capped values and
    // messages bound the status.
    let mut s = with_analysis(5, 3);
    for i in 0..9 {
        let mut m = metrics(&mut s)[0].clone();
        m.name = format!("dry-{i}");
        m.dry_run = true;
        m.scope = MetricScope::Target;
        m.query = "x{deployment=\"{{name}}\"}".into();
        m.failure_limit = 100;
        metrics(&mut s).push(m);
    }
    let mut sim = Sim::new(s, 100);
    sim.backend.insert("error-rate".into(), value(0.0));
    let long = |v: f64| {
        let labels = (0..20).map(|i| (format!("label_{i}"), "x".repeat(200))).collect();
        Ok(vec![Sample { labels, value: v }; 50])
    };
    for i in 0..9 {
        sim.backend.insert(format!("dry-{i}"), long(99.0));
    }
    drive(&mut sim, 2000);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert_eq!(sim.status.batches.len(), 16);
    for b in &sim.status.batches {
        let a = b.analysis.as_ref().unwrap();
        assert_eq!(a.metrics.len(), 10);
        for r in &a.metrics {
            assert!(r.measurements.len() <= 3);
            for m in &r.measurements {
                assert!(
                    m.message.as_ref().is_none_or(|x| x.len() <= 256)
                        && m.value.as_ref().is_none_or(|x| x.len() <= 96)
                );
            }
        }
    }
    let size = serde_json::to_vec(&sim.status).unwrap().len();
    assert!(size <= 256 * 1024, "status is {size} bytes");
    eprintln!("status of 20 batches x 10 metrics: {size} bytes");
}

#[test]
fn a_soak_does_not_hide_an_analysis_pause_and_the_recovery_is_told() {
    let mut s = with_analysis(5, 3);
    s.health.soak = "10m".into();
    metrics(&mut s)[0].consecutive_error_limit = 1;
    let mut sim = Sim::new(s, 5);
    drive(&mut sim, 50);
    assert_eq!(
        (sim.status.phase, sim.status.reason.as_deref()),
        (Phase::Paused, Some(reason::ANALYSIS_ERROR))
    );
    // Steps while paused keep the reason: no flapping, no new AnalysisError write.
    for _ in 0..3 {
        let wait = sim.settle().unwrap_or(Duration::from_secs(1));
        sim.pass(wait);
        assert_eq!(sim.status.reason.as_deref(), Some(reason::ANALYSIS_ERROR));
    }
    // The loop above ended at the next retry's time: the backend answers it.
    sim.backend.insert("error-rate".into(), value(0.0));
    let step = sim.step();
    let Step::Write(t) = step else { panic!("the recovery is written: {step:?}") };
    assert!(t.events.iter().any(|e| e.reason == reason::ANALYSIS_RECOVERED), "{:?}", t.events);
    assert_eq!(sim.status.phase, Phase::Progressing);
    drive(&mut sim, 100);
    assert_eq!(sim.status.phase, Phase::Succeeded);
}

#[test]
fn a_metric_that_starts_deciding_mid_batch_starts_again_and_a_resume_releases_it() {
    let mut s = with_analysis(5, 2);
    let mut quiet = metrics(&mut s)[0].clone();
    quiet.name = "quiet".into();
    quiet.dry_run = true;
    metrics(&mut s).push(quiet);
    let mut sim = Sim::new(s, 5);
    sim.backend.insert("error-rate".into(), Ok(Vec::new()));
    sim.backend.insert("quiet".into(), Ok(Vec::new()));
    metrics(&mut sim.spec)[0].on_no_data = crate::api::NoData::Pass;
    // The dry run is inconclusive (reported only); error-rate still needs a second measurement.
    sim.settle();
    assert_eq!(run(&sim, 0, "quiet").phase, MetricPhase::Inconclusive);
    // Now it decides: it starts again, is measured again, and its hold is one a resume releases.
    metrics(&mut sim.spec)[1].dry_run = false;
    drive(&mut sim, 50);
    assert_eq!(sim.status.reason.as_deref(), Some(reason::ANALYSIS_INCONCLUSIVE));
    let r = run(&sim, 0, "quiet");
    assert_eq!((r.dry_run, r.inconclusive), (false, 1), "{r:?}");
    sim.spec.resume_token = Some("go".into());
    drive(&mut sim, 50);
    assert_eq!(sim.status.phase, Phase::Succeeded);
    assert_eq!(run(&sim, 0, "quiet").phase, MetricPhase::Accepted);
}

#[test]
fn a_hold_is_told_again_after_something_else_touched_the_phase() {
    let mut sim = Sim::new(with_analysis(5, 1), 5);
    sim.backend.insert("error-rate".into(), Ok(Vec::new()));
    drive(&mut sim, 50);
    assert_eq!(sim.status.reason.as_deref(), Some(reason::ANALYSIS_INCONCLUSIVE));
    // A halt (say, the plan was refused for a while) leaves the rollout Pending; once it goes on, the hold
    // is Paused again, not in progress.
    sim.status.phase = Phase::Pending;
    sim.status.reason = Some(reason::PLAN_TAMPERED.into());
    sim.settle();
    assert_eq!(
        (sim.status.phase, sim.status.reason.as_deref()),
        (Phase::Paused, Some(reason::ANALYSIS_INCONCLUSIVE))
    );
    // And nothing is measured while aborting.
    sim.spec.abort = true;
    assert!(due_queries(&sim.spec, &sim.status, &sim.plan, sim.now).is_none());
}
