//! Metric analysis: queries against a Prometheus-compatible backend that decide whether a healthy batch
//! counts. The spec (`spec.analysis`) and what status records of it (per batch and metric: counters and
//! the last few measurements, so status stays small however long the analysis runs).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube_derive::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How many measurements of a metric a batch's status keeps (the counters are exact).
pub const MEASUREMENTS_KEPT: usize = 3;

/// Metric analysis: after a batch is healthy, each metric is measured `count` times, `interval` apart,
/// alongside the soak; the batch counts only when every metric that decides has passed.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.metrics.exists(m, !has(m.dryRun) || !m.dryRun)").message("analysis needs at least one metric without dryRun: dry-run metrics are only reported, so an analysis of them alone would never decide anything"))]
pub struct Analysis {
    /// Where the metrics are. Absent: the operator's default Prometheus address for the rollout's namespace
    /// (--analysis-prometheus-address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<AnalysisProvider>,

    /// The metrics measured for every batch, 1 to 10, each with a unique name.
    #[schemars(length(min = 1, max = 10))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub metrics: Vec<Metric>,
}

/// The metrics backend.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct AnalysisProvider {
    /// Any backend that speaks the Prometheus HTTP query API: Prometheus, Thanos, Mimir, VictoriaMetrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusProvider>,
}

/// A Prometheus-compatible backend; queries are sent to `<address>/api/v1/query` as POST form bodies.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct PrometheusProvider {
    /// The backend's base URL, e.g. http://prometheus.monitoring:9090 (a path prefix such as Mimir's
    /// /prometheus is kept). Absent: the operator's default for the rollout's namespace. It must be that
    /// default (however spelled), or a backend the operator allows for the rollout's namespace
    /// (--analysis-allow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    #[x_kube(validation = Rule::new("self.matches('^https?://[^\\\\s/?#@]+(/[^\\\\s?#]*)?$')").message("prometheus.address must be an http:// or https:// base URL without user information, query or fragment, such as http://prometheus.monitoring:9090"))]
    pub address: Option<String>,

    /// A Secret in the rollout's namespace with credentials for the backend: `token` (a bearer token), or
    /// `username` and `password` (basic auth); optionally `ca.crt` (a CA to trust), and `tls.crt` with
    /// `tls.key` (a client certificate). The Secret must be labelled `fleetroll.dev/analysis-credentials:
    /// "true"`, so a rollout cannot send other Secrets of its namespace anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretRef>,

    /// How long one query may take, at most 30s. Default 10s.
    #[serde(default = "default_query_timeout")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(TIMEOUT_RULE).message("prometheus.timeout must be a duration from 1ms to 30s, such as 10s"))]
    pub timeout: String,
}

/// A Secret in the rollout's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("secretRef.name must be a Secret's name (lower-case letters, digits, '-' and '.')"))]
    pub name: String,
}

/// The label that lets a Secret's credentials be used by a rollout's analysis.
pub const ANALYSIS_SECRET_LABEL: &str = "fleetroll.dev/analysis-credentials";

/// One metric: a query, the range its every sample must be in, and how many measurements decide.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(BATCH_PLACEHOLDERS_RULE).message("a Batch metric's query may use only the placeholders {{targets}}, {{namespaces}}, {{clusters}} and {{interval}}"))]
#[x_kube(validation = Rule::new(TARGET_PLACEHOLDERS_RULE).message("a Target metric's query may use only the placeholders {{name}}, {{namespace}}, {{cluster}} and {{interval}}"))]
pub struct Metric {
    /// The metric's name, unique in the analysis: a DNS label such as error-rate.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("metric names must be DNS labels: lower-case letters, digits and '-', such as error-rate"))]
    pub name: String,

    /// Batch (default): one query per measurement for the whole batch, with {{targets}} (and
    /// {{namespaces}}, and across member clusters {{clusters}}) replaced by a regular expression matching
    /// exactly its workloads' names (and namespaces, and clusters). Target: one query per target, with
    /// {{name}}, {{namespace}} and {{cluster}} (its member cluster's name, empty in the rollout's own)
    /// replaced by its own.
    #[serde(default)]
    pub scope: MetricScope,

    /// A PromQL query; placeholders are replaced before it is sent, and {{interval}} by `interval`. Every
    /// sample it returns must be inside `thresholdRange`.
    #[schemars(length(min = 1, max = 4096))]
    pub query: String,

    /// The range every returned sample must be inside: min, max or both (inclusive).
    pub threshold_range: ThresholdRange,

    /// How long after the batch is healthy the first measurement waits, at most 720h. Default 0s.
    #[serde(default = "zero_duration")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(DURATION_RULE).message("initialDelay must be a duration of at most 720h (30 days), such as 0s, 30s or 5m"))]
    pub initial_delay: String,

    /// The time between measurements, at least 1s and at most 720h. Default 30s.
    #[serde(default = "default_interval")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(INTERVAL_RULE).message("interval must be a duration from 1s to 720h (30 days), such as 30s or 1m"))]
    pub interval: String,

    /// Measurements per batch (errors are retried and not counted), 1 to 100. Default 1.
    #[serde(default = "default_count")]
    #[schemars(range(min = 1, max = 100))]
    pub count: u32,

    /// Failed measurements tolerated; one more fails the batch (strategy.onFailure applies). Default 0.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub failure_limit: u32,

    /// Inconclusive measurements tolerated; one more pauses the rollout (AnalysisInconclusive) until a
    /// person or agent resumes (spec.resumeToken) or aborts it. Default 0.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub inconclusive_limit: u32,

    /// Errors in a row tolerated (the backend unreachable, an HTTP error, a bad query); one more pauses the
    /// rollout (AnalysisError) until a measurement succeeds again. Default 4.
    #[serde(default = "default_error_limit")]
    #[schemars(range(min = 0, max = 100))]
    pub consecutive_error_limit: u32,

    /// What a query that returns no sample means: Inconclusive (default), Fail or Pass.
    #[serde(default)]
    pub on_no_data: NoData,

    /// true: measured and reported, never decides (to try a query safely). Default false.
    #[serde(default)]
    pub dry_run: bool,
}

/// Whether a metric is measured once for the batch or once per target.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MetricScope {
    /// One query for the batch.
    #[default]
    Batch,
    /// One query per target of the batch.
    Target,
}

/// What an empty query result means.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NoData {
    /// The measurement is Inconclusive.
    #[default]
    Inconclusive,
    /// The measurement Failed.
    Fail,
    /// The measurement is Successful.
    Pass,
}

/// Inclusive bounds; at least one is set.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.min) || has(self.max)").message("thresholdRange needs min, max or both, such as {max: 0.01}"))]
#[x_kube(validation = Rule::new("!has(self.min) || !has(self.max) || self.min <= self.max").message("thresholdRange.min must not be greater than thresholdRange.max"))]
pub struct ThresholdRange {
    /// The smallest value a sample may have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    /// The largest value a sample may have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
}

const DURATION_RULE: &str = crate::core::duration::SCHEMA_RULE;
const INTERVAL_RULE: &str = "self != '' && self.matches('^([0-9]{1,6}h)?([0-9]{1,6}m)?([0-9]{1,6}s)?([0-9]{1,6}ms)?$') && duration(self) >= duration('1s') && duration(self) <= duration('720h')";
const TIMEOUT_RULE: &str = "self != '' && self.matches('^([0-9]{1,6}h)?([0-9]{1,6}m)?([0-9]{1,6}s)?([0-9]{1,6}ms)?$') && duration(self) > duration('0s') && duration(self) <= duration('30s')";
const BATCH_PLACEHOLDERS_RULE: &str = "has(self.scope) && self.scope == 'Target' || self.query.findAll('\\\\{\\\\{[^}]*\\\\}\\\\}').all(p, p.matches('^\\\\{\\\\{\\\\s*(targets|namespaces|clusters|interval)\\\\s*\\\\}\\\\}$'))";
const TARGET_PLACEHOLDERS_RULE: &str = "!has(self.scope) || self.scope != 'Target' || self.query.findAll('\\\\{\\\\{[^}]*\\\\}\\\\}').all(p, p.matches('^\\\\{\\\\{\\\\s*(name|namespace|cluster|interval)\\\\s*\\\\}\\\\}$'))";

fn default_query_timeout() -> String {
    "10s".into()
}
fn zero_duration() -> String {
    "0s".into()
}
fn default_interval() -> String {
    "30s".into()
}
fn default_count() -> u32 {
    1
}
fn default_error_limit() -> u32 {
    4
}

/// A batch's analysis, from the moment its targets were first healthy together.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchAnalysis {
    /// When the batch was first healthy, and measuring began (after each metric's initialDelay).
    pub started_at: Time,
    /// The rollout waits for a person or agent: a metric was inconclusive, or failed under
    /// `onFailure: Pause`. Changing spec.resumeToken lets it go on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<AnalysisHold>,
    /// Each metric's measurements so far.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<MetricRun>,
}

/// A pause only a person or agent ends (spec.resumeToken, abort or rollback).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisHold {
    /// AnalysisInconclusive or AnalysisFailed.
    pub reason: String,
    /// Since when (RFC 3339).
    pub since: Time,
    /// spec.resumeToken when the hold began: any other value ends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_token: Option<String>,
}

/// One metric's measurements in one batch.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricRun {
    /// The metric's name.
    pub name: String,
    /// Running, Successful, Failed, Inconclusive, or Accepted (inconclusive or failed, and let go on by a
    /// person or agent).
    pub phase: MetricPhase,
    /// Whether it only reports (dryRun), as measured.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// Successful measurements.
    #[serde(default)]
    pub successful: u32,
    /// Failed measurements.
    #[serde(default)]
    pub failed: u32,
    /// Inconclusive measurements.
    #[serde(default)]
    pub inconclusive: u32,
    /// Measurements that could not be taken (not counted in `count`).
    #[serde(default)]
    pub errors: u32,
    /// Errors since the last measurement that was taken.
    #[serde(default)]
    pub consecutive_errors: u32,
    /// The last three measurements, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measurements: Vec<Measurement>,
}

/// Where one metric's measurements are.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum MetricPhase {
    /// Measurements are still due.
    #[default]
    Running,
    /// Every measurement was taken within the limits.
    Successful,
    /// More failed measurements than failureLimit.
    Failed,
    /// More inconclusive measurements than inconclusiveLimit.
    Inconclusive,
    /// Failed or inconclusive, and let go on by a person or agent (spec.resumeToken).
    Accepted,
}

/// One measurement.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Measurement {
    /// Successful, Failed, Inconclusive or Error.
    pub phase: MeasurementPhase,
    /// The samples' values (the worst first when several), as text: NaN and +Inf are values too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// What was wrong: the offending label sets, no data, or the error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When it was taken (RFC 3339).
    pub at: Time,
}

/// What one measurement said.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum MeasurementPhase {
    /// Every sample inside the range (or no data with onNoData: Pass).
    Successful,
    /// A sample outside the range (or no data with onNoData: Fail).
    Failed,
    /// No data, with onNoData: Inconclusive.
    Inconclusive,
    /// Not taken: the backend unreachable or answering an error, a bad query.
    Error,
}

impl MetricPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            MetricPhase::Running => "Running",
            MetricPhase::Successful => "Successful",
            MetricPhase::Failed => "Failed",
            MetricPhase::Inconclusive => "Inconclusive",
            MetricPhase::Accepted => "Accepted",
        }
    }
}

impl MeasurementPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            MeasurementPhase::Successful => "Successful",
            MeasurementPhase::Failed => "Failed",
            MeasurementPhase::Inconclusive => "Inconclusive",
            MeasurementPhase::Error => "Error",
        }
    }
}
