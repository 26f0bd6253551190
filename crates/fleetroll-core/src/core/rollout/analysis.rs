//! A batch's metric analysis in the state machine. Measuring starts once every target of the batch is
//! healthy and runs alongside the soak; it says the batch may count (every metric that decides passed),
//! that it failed (`onFailure` applies), that a person or agent must decide (a metric inconclusive, or
//! failed under `onFailure: Pause`: a hold that `spec.resumeToken` releases), or that the backend is not
//! answering (paused, measuring on every interval until it does). Measurements are counted only by the
//! status write that records them, and only when the status they were taken against says they are due: a
//! replay after a crash or a conflict measures again, never counts twice.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::{Event, Facts, Step, start_rollback, until, write, write_if_changed};
use crate::{
    api::{
        AnalysisHold, BatchAnalysis, BatchState, BatchStatus, FailurePolicy, FleetRolloutSpec,
        FleetRolloutStatus, MeasurementPhase, Metric, MetricPhase, MetricRun, Phase, time,
    },
    core::{
        analysis::{self, Query},
        plan::Plan,
        reason,
    },
};

/// What the analysis says of a batch whose targets are healthy.
pub(super) enum Gate {
    /// Nothing to wait for: no analysis, or every metric that decides passed (or was accepted).
    Passed,
    /// Measurements are still due; the next one after this long.
    Wait(Option<Duration>),
    /// A person or agent must decide (inconclusive): nothing more happens until then.
    Held,
    /// A metric that decides failed: why.
    Failed(String),
}

/// Runs the analysis of batch `index`: starts it, records the measurements the edge took, and decides.
pub(super) fn gate(f: &Facts<'_>, s: &mut FleetRolloutStatus, index: u32, events: &mut Vec<Event>) -> Gate {
    let Some(spec) = &f.spec.analysis else { return Gate::Passed };
    let mut phase_change = None;
    let gate = {
        let Some(batch) = s.batch_mut(index) else { return Gate::Passed };
        let a = batch.analysis.get_or_insert_with(|| {
            let names: Vec<&str> = spec.metrics.iter().map(|m| m.name.as_str()).collect();
            let message = format!("batch {}: targets healthy, measuring {}", index + 1, names.join(", "));
            events.push(Event::normal(reason::ANALYSIS_STARTED, Some(index), message));
            BatchAnalysis { started_at: time(f.now), hold: None, metrics: Vec::new() }
        });
        // Runs follow the spec: a metric removed is dropped, one whose dryRun changed starts again (it decides,
        // or stops deciding, from its next measurement).
        a.metrics.retain(|r| spec.metrics.iter().any(|m| m.name == r.name));
        for metric in &spec.metrics {
            match a.metrics.iter_mut().find(|r| r.name == metric.name) {
                Some(run) if run.dry_run != metric.dry_run => *run = analysis::start(metric),
                Some(_) => {}
                None => a.metrics.push(analysis::start(metric)),
            }
        }
        let passed_before = all_passed(&spec.metrics, &a.metrics);
        record_measured(f, a, index, events);
        release(f, a, index, events, &mut phase_change);
        decide(f, a, index, events, &mut phase_change, passed_before)
    };
    // A hold is told every step, whatever else touched the phase meanwhile (a halt, say).
    let held =
        s.batch(index).and_then(|b| b.analysis.as_ref()).and_then(|a| a.hold.as_ref()).map(hold_reason);
    if let (Gate::Held, Some(why), None) = (&gate, held, phase_change) {
        phase_change = Some((Phase::Paused, why));
    }
    if let Some((phase, why)) = phase_change {
        s.phase = phase;
        s.reason = Some(why.into());
    } else if matches!(gate, Gate::Wait(_)) && s.phase == Phase::Progressing {
        s.reason = Some(reason::ANALYSIS_RUNNING.into());
    }
    gate
}

/// A hold beginning now, released by any `spec.resumeToken` other than the present one.
fn hold(f: &Facts<'_>, why: &str) -> AnalysisHold {
    AnalysisHold { reason: why.into(), since: time(f.now), resume_token: f.spec.resume_token.clone() }
}

/// The reason a hold gives, as the static text events and status take.
fn hold_reason(hold: &AnalysisHold) -> &'static str {
    if hold.reason == reason::ANALYSIS_FAILED {
        reason::ANALYSIS_FAILED
    } else {
        reason::ANALYSIS_INCONCLUSIVE
    }
}

/// Counts the measurements the edge took for this batch that the status says are due.
fn record_measured(f: &Facts<'_>, a: &mut BatchAnalysis, index: u32, events: &mut Vec<Event>) {
    let Some(spec) = &f.spec.analysis else { return };
    for measured in f.measured.iter().filter(|m| m.batch == index) {
        let Some(metric) = spec.metrics.iter().find(|m| m.name == measured.metric) else { continue };
        let Some(run) = a.metrics.iter_mut().find(|r| r.name == measured.metric) else { continue };
        // Taken against an older status, or already counted: dropped, never counted twice.
        if analysis::due(metric, run, a.started_at.0).is_none_or(|due| due > f.now) {
            continue;
        }
        let verdict = analysis::combine(&measured.verdicts);
        analysis::record(metric, run, verdict, f.now);
        events.push(measurement_event(metric, run, index));
    }
}

fn measurement_event(metric: &Metric, run: &MetricRun, index: u32) -> Event {
    let Some(last) = run.measurements.last() else {
        return Event::normal(reason::ANALYSIS_MEASURED, Some(index), String::new());
    };
    let dry = if metric.dry_run { " (dry run)" } else { "" };
    let mut message = format!(
        "batch {}: {}{dry} {}: {}/{} taken, {} failed, {} inconclusive, {} errors",
        index + 1,
        metric.name,
        last.phase.as_str(),
        analysis::taken(run),
        metric.count,
        run.failed,
        run.inconclusive,
        run.errors
    );
    for part in
        [last.value.as_deref().map(|v| format!("value {v}")), last.message.clone()].into_iter().flatten()
    {
        message.push_str("; ");
        message.push_str(&part);
    }
    match last.phase {
        MeasurementPhase::Successful => Event::normal(reason::ANALYSIS_MEASURED, Some(index), message),
        _ => Event::warning(reason::ANALYSIS_MEASURED, Some(index), message),
    }
}

/// A changed `spec.resumeToken` releases a hold: the metrics holding the batch are accepted.
fn release(
    f: &Facts<'_>,
    a: &mut BatchAnalysis,
    index: u32,
    events: &mut Vec<Event>,
    phase_change: &mut Option<(Phase, &'static str)>,
) {
    let Some(hold) = &a.hold else { return };
    if f.spec.resume_token == hold.resume_token {
        return;
    }
    let mut accepted = Vec::new();
    for run in a.metrics.iter_mut().filter(|r| !r.dry_run) {
        if matches!(run.phase, MetricPhase::Failed | MetricPhase::Inconclusive) {
            run.phase = MetricPhase::Accepted;
            accepted.push(run.name.clone());
        }
    }
    a.hold = None;
    let message = format!("batch {}: {} accepted (spec.resumeToken changed)", index + 1, accepted.join(", "));
    events.push(Event::normal(reason::ANALYSIS_ACCEPTED, Some(index), message));
    *phase_change = Some((Phase::Progressing, reason::ANALYSIS_ACCEPTED));
}

/// Whether every metric that decides has passed or been accepted.
fn all_passed(metrics: &[Metric], runs: &[MetricRun]) -> bool {
    deciding(metrics, runs).all(|(_, r)| matches!(r.phase, MetricPhase::Successful | MetricPhase::Accepted))
}

/// The runs of the metrics that decide (in the spec now, without dryRun).
fn deciding<'a>(
    metrics: &'a [Metric],
    runs: &'a [MetricRun],
) -> impl Iterator<Item = (&'a Metric, &'a MetricRun)> {
    metrics
        .iter()
        .filter(|m| !m.dry_run)
        .filter_map(|m| runs.iter().find(|r| r.name == m.name).map(|r| (m, r)))
}

fn decide(
    f: &Facts<'_>,
    a: &mut BatchAnalysis,
    index: u32,
    events: &mut Vec<Event>,
    phase_change: &mut Option<(Phase, &'static str)>,
    passed_before: bool,
) -> Gate {
    let Some(spec) = &f.spec.analysis else { return Gate::Passed };
    if let Some((m, r)) = deciding(&spec.metrics, &a.metrics).find(|(_, r)| r.phase == MetricPhase::Failed) {
        let last = r.measurements.last().and_then(|x| x.message.clone()).unwrap_or_default();
        return Gate::Failed(format!(
            "metric {} failed {} of {} measurements (failureLimit {}): {last}",
            m.name,
            r.failed,
            analysis::taken(r),
            m.failure_limit
        ));
    }
    if a.hold.is_some() {
        return Gate::Held;
    }
    if let Some((m, r)) =
        deciding(&spec.metrics, &a.metrics).find(|(_, r)| r.phase == MetricPhase::Inconclusive)
    {
        a.hold = Some(hold(f, reason::ANALYSIS_INCONCLUSIVE));
        let message = format!(
            "batch {}: metric {} was inconclusive {} times (inconclusiveLimit {}); paused until resumed \
             (spec.resumeToken), aborted or rolled back",
            index + 1,
            m.name,
            r.inconclusive,
            m.inconclusive_limit
        );
        events.push(Event::warning(reason::ANALYSIS_INCONCLUSIVE, Some(index), message));
        *phase_change = Some((Phase::Paused, reason::ANALYSIS_INCONCLUSIVE));
        return Gate::Held;
    }
    errors(f, a, index, events, phase_change);
    if all_passed(&spec.metrics, &a.metrics) {
        if !passed_before {
            let message = format!("batch {}: every metric passed", index + 1);
            events.push(Event::normal(reason::ANALYSIS_PASSED, Some(index), message));
        }
        return Gate::Passed;
    }
    let next = spec
        .metrics
        .iter()
        .filter_map(|m| {
            a.metrics.iter().find(|r| r.name == m.name).and_then(|r| analysis::due(m, r, a.started_at.0))
        })
        .min();
    Gate::Wait(next.map(|at| until(f.now, at).max(Duration::from_millis(100))))
}

/// Errors in a row past a limit pause the rollout; the first measurement taken after them resumes it.
fn errors(
    f: &Facts<'_>,
    a: &BatchAnalysis,
    index: u32,
    events: &mut Vec<Event>,
    phase_change: &mut Option<(Phase, &'static str)>,
) {
    let Some(spec) = &f.spec.analysis else { return };
    let failing = deciding(&spec.metrics, &a.metrics).find(|(m, r)| analysis::erroring(m, r));
    let paused =
        f.status.phase == Phase::Paused && f.status.reason.as_deref() == Some(reason::ANALYSIS_ERROR);
    match failing {
        Some((m, r)) if !paused => {
            let last = r.measurements.last().and_then(|x| x.message.clone()).unwrap_or_default();
            let message = format!(
                "batch {}: metric {} could not be measured {} times in a row (consecutiveErrorLimit {}): {last}; \
                 paused, measuring on every {} until the backend answers",
                index + 1,
                m.name,
                r.consecutive_errors,
                m.consecutive_error_limit,
                m.interval
            );
            events.push(Event::warning(reason::ANALYSIS_ERROR, Some(index), message));
            *phase_change = Some((Phase::Paused, reason::ANALYSIS_ERROR));
        }
        None if paused => {
            let message =
                format!("batch {}: the metrics backend answers again; measuring goes on", index + 1);
            events.push(Event::normal(reason::ANALYSIS_RECOVERED, Some(index), message));
            *phase_change = Some((Phase::Progressing, reason::ANALYSIS_RECOVERED));
        }
        _ => {}
    }
}

/// The batch failed its analysis: `onFailure` applies. Pause holds it until `spec.resumeToken` changes
/// (or an abort or rollback arrives).
pub(super) fn fail(
    f: &Facts<'_>,
    mut s: FleetRolloutStatus,
    b: &BatchStatus,
    mut events: Vec<Event>,
    why: &str,
) -> Step {
    let why_event = format!("batch {}: {why}", b.index + 1);
    match f.spec.strategy.on_failure {
        FailurePolicy::Pause => {
            if let Some(a) = s.batch_mut(b.index).and_then(|x| x.analysis.as_mut()) {
                a.hold = Some(hold(f, reason::ANALYSIS_FAILED));
            }
            s.phase = Phase::Paused;
            s.reason = Some(reason::ANALYSIS_FAILED.into());
            let message = format!(
                "{why_event}: paused; resume (spec.resumeToken) to go on anyway, or abort or roll back"
            );
            events.push(Event::warning(reason::ANALYSIS_FAILED, Some(b.index), message));
            write(f, s, events)
        }
        FailurePolicy::Abort => {
            s.phase = Phase::Failed;
            s.reason = Some(reason::ANALYSIS_FAILED.into());
            s.finished_at = Some(time(f.now));
            events.push(Event::warning(
                reason::ANALYSIS_FAILED,
                Some(b.index),
                format!("{why_event}: stopped (onFailure: Abort)"),
            ));
            write(f, s, events)
        }
        FailurePolicy::Rollback => {
            events.push(Event::warning(
                reason::ANALYSIS_FAILED,
                Some(b.index),
                format!("{why_event}: rolling back"),
            ));
            match start_rollback(f, s, reason::ANALYSIS_FAILED) {
                Step::Write(mut t) => {
                    events.append(&mut t.events);
                    t.events = events;
                    Step::Write(t)
                }
                other => other,
            }
        }
    }
}

/// A batch that failed its analysis under `onFailure: Pause` is held until `spec.resumeToken` changes;
/// then the rollout goes on, unless its failure budget is exceeded too.
pub(super) fn held_failure(f: &Facts<'_>, mut s: FleetRolloutStatus, b: &BatchStatus) -> Step {
    let token = b.analysis.as_ref().and_then(|a| a.hold.as_ref()).map(|h| &h.resume_token);
    if token.is_none_or(|t| *t == f.spec.resume_token) {
        s.phase = Phase::Paused;
        s.reason = Some(reason::ANALYSIS_FAILED.into());
        return write_if_changed(f, s, Vec::new(), None);
    }
    let mut events = Vec::new();
    let mut phase_change = None;
    if let Some(a) = s.batch_mut(b.index).and_then(|x| x.analysis.as_mut()) {
        release(f, a, b.index, &mut events, &mut phase_change);
    }
    if super::failure::over_budget(f, &s) {
        s.reason = Some(reason::FAILURE_BUDGET_EXCEEDED.into());
        return write(f, s, events);
    }
    s.phase = Phase::Progressing;
    s.reason = Some(reason::ANALYSIS_ACCEPTED.into());
    super::gates::next_batch(f, s, events)
}

/// The measurements due now for the batch in flight: the queries for the edge to send. Nothing while the
/// batch is not verifying, its analysis has not started (its targets were not healthy yet) or is held.
pub fn due_queries(
    spec: &FleetRolloutSpec,
    status: &FleetRolloutStatus,
    plan: &Plan,
    now: Timestamp,
) -> Option<(u32, Vec<Query>)> {
    let metrics = &spec.analysis.as_ref()?.metrics;
    // Nothing to measure for a rollout that stopped, or is asked to.
    let running = matches!(status.phase, Phase::Progressing | Phase::Paused);
    if !running || spec.abort || spec.rollback {
        return None;
    }
    let b = status.current().filter(|b| b.state == BatchState::Verifying)?;
    let a = b.analysis.as_ref().filter(|a| a.hold.is_none())?;
    let targets = plan.batch(b.index);
    let queries: Vec<Query> = metrics
        .iter()
        .filter(|m| {
            let run = a.metrics.iter().find(|r| r.name == m.name);
            run.and_then(|r| analysis::due(m, r, a.started_at.0)).is_some_and(|due| due <= now)
        })
        .flat_map(|m| analysis::queries(m, targets))
        .collect();
    (!queries.is_empty()).then_some((b.index, queries))
}
