//! Metric analysis as pure functions: the queries a measurement sends (placeholders replaced, names
//! regex-escaped), what an answer says (every sample inside the range; no data; NaN and infinities), how
//! a metric's counters decide against its limits, and when its next measurement is due. The rollout's use
//! of it (when measuring starts, holds, pauses) is in `core::rollout::analysis`; the queries are sent by
//! `edge::prometheus`.

pub mod binding;
pub mod provider;

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use k8s_openapi::jiff::Timestamp;

use crate::{
    api::{
        MEASUREMENTS_KEPT, Measurement, MeasurementPhase, Metric, MetricPhase, MetricRun, MetricScope,
        NoData, PlannedTarget, ThresholdRange, time,
    },
    core::duration,
};

/// One sample of a query's answer: its label set and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// What the backend answered to one query: the samples, or why there are none to judge.
pub type Answer = Result<Vec<Sample>, String>;

/// One query of a measurement: for the batch, or for one target (`namespace/name`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    pub metric: String,
    pub target: Option<String>,
    pub promql: String,
}

/// A measurement the edge took: each of a metric's queries for one batch judged as its answer arrived
/// ([`judge`]), by target (None for a Batch metric). Only verdicts are kept: a measurement of a hundred
/// targets never holds a hundred answers at once.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    pub batch: u32,
    pub metric: String,
    pub verdicts: Vec<(Option<String>, Verdict)>,
}

/// The verdicts of one step's queries of batch `batch`, as one measurement per metric, in query order.
pub fn measured(batch: u32, verdicts: Vec<(Query, Verdict)>) -> Vec<Measured> {
    let mut out: Vec<Measured> = Vec::new();
    for (query, verdict) in verdicts {
        match out.iter_mut().find(|m| m.metric == query.metric) {
            Some(m) => m.verdicts.push((query.target, verdict)),
            None => {
                out.push(Measured { batch, metric: query.metric, verdicts: vec![(query.target, verdict)] })
            }
        }
    }
    out
}

/// The verdict for a query that could not be sent (or whose metric is gone): an error, as the core counts
/// any other.
pub fn not_taken(why: &str) -> Verdict {
    Verdict::new(MeasurementPhase::Error, None, Some(why.to_string()))
}

/// The placeholders each scope may use.
const BATCH_PLACEHOLDERS: [&str; 4] = ["targets", "namespaces", "clusters", "interval"];
const TARGET_PLACEHOLDERS: [&str; 4] = ["name", "namespace", "cluster", "interval"];
/// The longest message and value a measurement keeps, so that a status of 16 batches of 10 metrics of 3
/// measurements each stays within a few hundred KiB at the very worst.
const MESSAGE_MAX: usize = 256;
const VALUE_MAX: usize = 96;
/// How many offending label sets a message names.
const OFFENDERS_SHOWN: usize = 3;

/// The `{{...}}` placeholders of a query, trimmed, in order; Err names one that does not close.
fn placeholders(query: &str) -> Result<Vec<&str>, String> {
    let mut found = Vec::new();
    let mut rest = query;
    while let Some(open) = rest.find("{{") {
        let after = &rest[open + 2..];
        let close = after
            .find("}}")
            .ok_or_else(|| format!("a placeholder opened at {:?} is not closed", &rest[open..]))?;
        found.push(after[..close].trim());
        rest = &after[close + 2..];
    }
    Ok(found)
}

/// Whether a metric's query uses only the placeholders of its scope, or a message saying which it may.
pub fn check_query(metric: &Metric) -> Result<(), String> {
    let allowed: &[&str] = match metric.scope {
        MetricScope::Batch => &BATCH_PLACEHOLDERS,
        MetricScope::Target => &TARGET_PLACEHOLDERS,
    };
    let unknown = placeholders(&metric.query)
        .map_err(|e| format!("metric {}: {e}", metric.name))?
        .into_iter()
        .find(|p| !allowed.contains(p));
    match unknown {
        None => Ok(()),
        Some(p) => Err(format!(
            "metric {}: unknown placeholder {{{{{p}}}}}; a {:?} metric may use {}",
            metric.name,
            metric.scope,
            allowed.iter().map(|a| format!("{{{{{a}}}}}")).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// Escapes a literal for an RE2 regular expression (what PromQL's `=~` takes).
pub fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Escapes text for a double-quoted PromQL string, where placeholders stand.
fn promql_string(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}

/// A regular expression matching exactly these literals (sorted, each once), escaped for a PromQL string.
fn alternation<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let unique: std::collections::BTreeSet<&str> = items.collect();
    let regex = unique.into_iter().map(regex_escape).collect::<Vec<_>>().join("|");
    promql_string(&regex)
}

fn substitute(query: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(query.len());
    let mut rest = query;
    while let Some(open) = rest.find("{{") {
        let Some(close) = rest[open + 2..].find("}}") else { break };
        let name = rest[open + 2..open + 2 + close].trim();
        out.push_str(&rest[..open]);
        match values.iter().find(|(k, _)| *k == name) {
            Some((_, v)) => out.push_str(v),
            None => out.push_str(&rest[open..open + close + 4]),
        }
        rest = &rest[open + close + 4..];
    }
    out.push_str(rest);
    out
}

/// The queries one measurement of `metric` sends for a batch of `targets`.
pub fn queries(metric: &Metric, targets: &[PlannedTarget]) -> Vec<Query> {
    let interval = metric.interval.as_str();
    match metric.scope {
        MetricScope::Batch => {
            let names = alternation(targets.iter().map(|t| t.name.as_str()));
            let namespaces = alternation(targets.iter().map(|t| t.namespace.as_str()));
            let clusters = alternation(targets.iter().map(|t| t.cluster.as_str()));
            let values = [
                ("targets", names.as_str()),
                ("namespaces", namespaces.as_str()),
                ("clusters", clusters.as_str()),
                ("interval", interval),
            ];
            vec![Query {
                metric: metric.name.clone(),
                target: None,
                promql: substitute(&metric.query, &values),
            }]
        }
        MetricScope::Target => targets
            .iter()
            .map(|t| {
                let (name, namespace) = (promql_string(&t.name), promql_string(&t.namespace));
                let cluster = promql_string(&t.cluster);
                let values = [
                    ("name", name.as_str()),
                    ("namespace", namespace.as_str()),
                    ("cluster", cluster.as_str()),
                    ("interval", interval),
                ];
                Query {
                    metric: metric.name.clone(),
                    target: Some(t.key()),
                    promql: substitute(&metric.query, &values),
                }
            })
            .collect(),
    }
}

/// Whether a value is inside the range (inclusive). NaN is inside no range.
pub fn within(range: &ThresholdRange, value: f64) -> bool {
    range.min.is_none_or(|min| value >= min) && range.max.is_none_or(|max| value <= max)
}

/// A value as status shows it: NaN and the infinities as Prometheus writes them.
pub fn format_value(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else {
        format!("{value}")
    }
}

fn format_range(range: &ThresholdRange) -> String {
    let bound = |b: Option<f64>| b.map(format_value).unwrap_or_default();
    format!("[{}, {}]", bound(range.min), bound(range.max))
}

fn format_labels(labels: &BTreeMap<String, String>) -> String {
    // The backend names the labels too: keys are escaped like values, so no control character gets through.
    let inner: Vec<String> = labels.iter().map(|(k, v)| format!("{}={v:?}", k.escape_debug())).collect();
    format!("{{{}}}", inner.join(", "))
}

/// What one measurement said: its phase, the values, and what was wrong.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub phase: MeasurementPhase,
    pub value: Option<String>,
    pub message: Option<String>,
}

impl Verdict {
    fn new(phase: MeasurementPhase, value: Option<String>, message: Option<String>) -> Self {
        let cut = crate::core::text::cut;
        Self {
            phase,
            value: value.map(|v| cut(&v, VALUE_MAX)),
            message: message.map(|m| cut(&m, MESSAGE_MAX)),
        }
    }
}

/// Judges one answer. NaN samples (a ratio over no traffic, 0/0) are no data; what is left must all be
/// inside the range, infinities included.
pub fn judge(metric: &Metric, answer: &Answer) -> Verdict {
    let samples = match answer {
        Err(e) => return Verdict::new(MeasurementPhase::Error, None, Some(e.clone())),
        Ok(samples) => samples,
    };
    let with_data: Vec<&Sample> = samples.iter().filter(|s| !s.value.is_nan()).collect();
    if with_data.is_empty() {
        let phase = match metric.on_no_data {
            NoData::Inconclusive => MeasurementPhase::Inconclusive,
            NoData::Fail => MeasurementPhase::Failed,
            NoData::Pass => MeasurementPhase::Successful,
        };
        let what = if samples.is_empty() { "no data" } else { "no data (every sample is NaN)" };
        let message = format!("{what} (onNoData: {:?})", metric.on_no_data);
        return Verdict::new(phase, None, Some(message));
    }
    let (outside, inside): (Vec<&Sample>, Vec<&Sample>) =
        with_data.into_iter().partition(|s| !within(&metric.threshold_range, s.value));
    let shown: Vec<String> =
        outside.iter().chain(&inside).take(OFFENDERS_SHOWN).map(|s| format_value(s.value)).collect();
    let more = (outside.len() + inside.len()).saturating_sub(OFFENDERS_SHOWN);
    let mut value = shown.join(", ");
    if more > 0 {
        let _ = write!(value, " (+{more} more)");
    }
    if outside.is_empty() {
        return Verdict::new(MeasurementPhase::Successful, Some(value), None);
    }
    let mut message = format!(
        "{} of {} samples outside {}: ",
        outside.len(),
        outside.len() + inside.len(),
        format_range(&metric.threshold_range)
    );
    let offenders: Vec<String> = outside
        .iter()
        .take(OFFENDERS_SHOWN)
        .map(|s| format!("{} {}", format_labels(&s.labels), format_value(s.value)))
        .collect();
    message.push_str(&offenders.join("; "));
    Verdict::new(MeasurementPhase::Failed, Some(value), Some(message))
}

/// Judges a measurement of several answers (a Target metric: one per target): an error anywhere means it
/// was not taken; otherwise a failure anywhere fails it, and no data anywhere (as Inconclusive) makes it
/// inconclusive. Messages name the targets.
#[cfg(test)]
pub fn judge_all(metric: &Metric, answers: &[(Option<String>, Answer)]) -> Verdict {
    let verdicts: Vec<(Option<String>, Verdict)> =
        answers.iter().map(|(t, a)| (t.clone(), judge(metric, a))).collect();
    combine(&verdicts)
}

/// The verdict of a measurement from those of its queries (see [`judge_all`]).
pub fn combine(verdicts: &[(Option<String>, Verdict)]) -> Verdict {
    let verdicts: Vec<(Option<&String>, Verdict)> =
        verdicts.iter().map(|(t, v)| (t.as_ref(), v.clone())).collect();
    let order = [MeasurementPhase::Error, MeasurementPhase::Failed, MeasurementPhase::Inconclusive];
    let worst = order
        .into_iter()
        .find(|p| verdicts.iter().any(|(_, v)| v.phase == *p))
        .unwrap_or(MeasurementPhase::Successful);
    let named = |t: Option<&String>, text: &str| match t {
        Some(t) => format!("{t}: {text}"),
        None => text.to_string(),
    };
    let pick = |phase| verdicts.iter().filter(move |(_, v)| v.phase == phase);
    let values: Vec<String> =
        pick(worst).filter_map(|(t, v)| v.value.as_deref().map(|x| named(*t, x))).collect();
    let messages: Vec<String> =
        pick(worst).filter_map(|(t, v)| v.message.as_deref().map(|x| named(*t, x))).collect();
    let value = (!values.is_empty()).then(|| values.join("; "));
    let message = (!messages.is_empty()).then(|| messages.join("; "));
    if verdicts.len() == 1 {
        return verdicts.into_iter().next().map_or_else(|| Verdict::new(worst, value, message), |(_, v)| v);
    }
    Verdict::new(worst, value, message)
}

/// A new run of a metric, before its first measurement.
pub fn start(metric: &Metric) -> MetricRun {
    MetricRun { name: metric.name.clone(), dry_run: metric.dry_run, ..Default::default() }
}

/// Measurements that count toward `count`: taken, whatever they said (errors are not taken).
pub fn taken(run: &MetricRun) -> u32 {
    run.successful.saturating_add(run.failed).saturating_add(run.inconclusive)
}

/// Records a measurement in its run, and where the run is now by the metric's limits.
pub fn record(metric: &Metric, run: &mut MetricRun, verdict: Verdict, now: Timestamp) {
    match verdict.phase {
        MeasurementPhase::Error => {
            run.errors = run.errors.saturating_add(1);
            run.consecutive_errors = run.consecutive_errors.saturating_add(1);
        }
        phase => {
            run.consecutive_errors = 0;
            let counter = match phase {
                MeasurementPhase::Successful => &mut run.successful,
                MeasurementPhase::Failed => &mut run.failed,
                _ => &mut run.inconclusive,
            };
            *counter = counter.saturating_add(1);
        }
    }
    run.measurements.push(Measurement {
        phase: verdict.phase,
        value: verdict.value,
        message: verdict.message,
        at: time(now),
    });
    if run.measurements.len() > MEASUREMENTS_KEPT {
        run.measurements.drain(..run.measurements.len() - MEASUREMENTS_KEPT);
    }
    run.dry_run = metric.dry_run;
    run.phase = phase_of(metric, run);
}

/// Where a run is by its counters: past failureLimit, past inconclusiveLimit, done, or still running.
pub fn phase_of(metric: &Metric, run: &MetricRun) -> MetricPhase {
    if run.phase == MetricPhase::Accepted {
        MetricPhase::Accepted
    } else if run.failed > metric.failure_limit {
        MetricPhase::Failed
    } else if run.inconclusive > metric.inconclusive_limit {
        MetricPhase::Inconclusive
    } else if taken(run) >= metric.count {
        MetricPhase::Successful
    } else {
        MetricPhase::Running
    }
}

/// Whether errors in a row have gone past the metric's limit.
pub fn erroring(metric: &Metric, run: &MetricRun) -> bool {
    run.consecutive_errors > metric.consecutive_error_limit
}

/// When the run's next measurement is due: `initialDelay` after the batch was healthy, then every
/// `interval` after the last one (an error is retried after an interval too). None: nothing more is due.
pub fn due(metric: &Metric, run: &MetricRun, started: Timestamp) -> Option<Timestamp> {
    if run.phase != MetricPhase::Running {
        return None;
    }
    let (from, wait) = match run.measurements.last() {
        Some(last) => (last.at.0, duration::parse(&metric.interval).unwrap_or(Duration::from_secs(30))),
        None => (started, duration::parse(&metric.initial_delay).unwrap_or(Duration::ZERO)),
    };
    Some(crate::core::rollout::later(from, wait))
}

#[cfg(test)]
mod tests;
