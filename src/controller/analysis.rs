//! Takes the measurements the core says are due (the backend, its credentials and the queries are the
//! edge's), and counts the ones a status write recorded, for `/metrics`.

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::Context;
use crate::{
    api::{FleetRollout, FleetRolloutStatus, MetricRun},
    core::{
        analysis::{self, Measured, measured},
        plan::Plan,
        rollout,
    },
    edge::prometheus,
    failpoint,
    metrics::MeasurementLabel,
};

/// The measurements due now for the batch in flight, taken. A backend or Secret that cannot be used makes
/// every due measurement an Error (the core counts it against consecutiveErrorLimit).
pub(super) async fn measure(
    ctx: &Context,
    fr: &FleetRollout,
    status: &FleetRolloutStatus,
    plan: &Plan,
    now: Timestamp,
) -> Vec<Measured> {
    let Some((batch, queries)) = rollout::due_queries(&fr.spec, status, plan, now) else { return Vec::new() };
    let Some(spec) = fr.spec.analysis.as_ref() else { return Vec::new() };
    let failed = |why: &str| queries.iter().map(|q| (q.clone(), analysis::not_taken(why))).collect();
    let namespace = fr.namespace().unwrap_or_default();
    let backend = match ctx.settings.analysis.resolve(spec, &namespace) {
        Ok(b) => b,
        Err(blocked) => return measured(batch, failed(&blocked.message)),
    };
    let credentials = match &backend.secret {
        None => None,
        Some(name) => match prometheus::read_credentials(&ctx.client, &namespace, name).await {
            Ok(c) => Some(c),
            Err(e) => return measured(batch, failed(&e)),
        },
    };
    let judge = |q: &analysis::Query, answer: analysis::Answer| match spec
        .metrics
        .iter()
        .find(|m| m.name == q.metric)
    {
        Some(metric) => analysis::judge(metric, &answer),
        None => analysis::not_taken("the metric is no longer in the spec"),
    };
    let verdicts = ctx.querier.measure(&backend, credentials.as_ref(), queries, &judge).await;
    failpoint::hit(failpoint::AFTER_MEASURE).await;
    measured(batch, verdicts)
}

/// The measurements a status about to be written adds, by metric, outcome and dry run.
pub(super) fn recorded(
    before: &FleetRolloutStatus,
    after: &FleetRolloutStatus,
) -> Vec<(MeasurementLabel, u32)> {
    let mut out = Vec::new();
    for b in &after.batches {
        let Some(a) = &b.analysis else { continue };
        let old = before.batch(b.index).and_then(|x| x.analysis.as_ref());
        for run in &a.metrics {
            let was = old.and_then(|o| o.metrics.iter().find(|r| r.name == run.name));
            for (phase, n) in added(was, run).into_iter().filter(|(_, n)| *n > 0) {
                let label = MeasurementLabel {
                    metric: run.name.clone(),
                    phase: phase.into(),
                    dry_run: run.dry_run.to_string(),
                };
                out.push((label, n));
            }
        }
    }
    out
}

/// Counts measurements a status write recorded.
pub(super) fn observe(ctx: &Context, recorded: Vec<(MeasurementLabel, u32)>) {
    for (mut label, n) in recorded {
        label.metric = ctx.metrics.measured_metric(&label.metric);
        ctx.metrics.analysis_measurements.get_or_create(&label).inc_by(u64::from(n));
    }
}

fn added(was: Option<&MetricRun>, now: &MetricRun) -> [(&'static str, u32); 4] {
    let before = was.cloned().unwrap_or_default();
    [
        ("Successful", now.successful.saturating_sub(before.successful)),
        ("Failed", now.failed.saturating_sub(before.failed)),
        ("Inconclusive", now.inconclusive.saturating_sub(before.inconclusive)),
        ("Error", now.errors.saturating_sub(before.errors)),
    ]
}
