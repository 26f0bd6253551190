//! Prometheus metrics, served at `/metrics`.

use std::sync::Mutex;

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: String,
}

/// Which status write: `intent` (a batch's, persisted before any of its targets changes: each transition
/// waits on one) or `other`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabel {
    pub write: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    pub error: String,
}

/// A measurement's outcome, and the metric it belongs to.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MeasurementLabel {
    pub metric: String,
    pub phase: String,
    pub dry_run: String,
}

#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    /// FleetRollouts by phase.
    pub rollouts: Family<PhaseLabel, Gauge>,
    /// Targets of all rollouts by state (updated, healthy, failed, pending).
    pub targets: Family<StateLabel, Gauge>,
    /// From a batch's start (intent) to its end.
    pub batch_duration: Histogram,
    /// From the reconcile that saw a batch settle to the next batch's changes being sent (the next batch's
    /// intent persisted in between).
    pub batch_transition: Histogram,
    pub reconciles: Counter,
    pub reconcile_errors: Family<ErrorLabel, Counter>,
    /// Reconciles that panicked: caught, so only that rollout's step failed.
    pub reconcile_panics: Counter,
    pub reconcile_duration: Histogram,
    pub status_writes: Counter,
    /// One status write's round trip: the floor a batch transition cannot go below (it persists the next
    /// batch's intent before changing any target of it).
    pub status_write_duration: Family<WriteLabel, Histogram, fn() -> Histogram>,
    pub target_patches: Counter,
    /// Notifications delivered to one subscription (a receiver answered 2xx), and attempts that failed.
    pub notifications_delivered: Counter,
    pub notification_failures: Counter,
    /// Status writes made only to take delivered notifications out of an outbox.
    pub notification_ack_writes: Counter,
    /// Analysis measurements recorded in status, by metric name, outcome and dry run.
    pub analysis_measurements: Family<MeasurementLabel, Counter>,
    /// The metric names labelled so far: tenants name their metrics, so past [`METRIC_NAMES_LABELLED`] of
    /// them the rest share one label, and a series is never made per name a tenant invents.
    metric_names: Mutex<std::collections::HashSet<String>>,
    /// 1 while this replica holds the lease.
    pub leader: Gauge,
}

/// Distinct analysis metric names with series of their own.
pub const METRIC_NAMES_LABELLED: usize = 256;
/// The label of measurements of every later metric name.
pub const OTHER_METRICS: &str = "(other)";

impl Metrics {
    fn register_notifications(&self, r: &mut Registry) {
        let delivered = self.notifications_delivered.clone();
        r.register("notifications_delivered", "Notifications delivered to one subscription", delivered);
        let failures = self.notification_failures.clone();
        r.register(
            "notification_failures",
            "Notification deliveries that failed (sent again with backoff)",
            failures,
        );
        r.register(
            "notification_ack_writes",
            "Status writes made only to take delivered notifications out of an outbox",
            self.notification_ack_writes.clone(),
        );
    }
}

impl Metrics {
    /// The `metric` label a measurement of `name` is counted under.
    pub fn measured_metric(&self, name: &str) -> String {
        let Ok(mut names) = self.metric_names.lock() else { return OTHER_METRICS.into() };
        if names.contains(name) {
            return name.into();
        }
        if names.len() < METRIC_NAMES_LABELLED {
            names.insert(name.into());
            return name.into();
        }
        OTHER_METRICS.into()
    }
}

/// Buckets a quarter apart from 1 ms to 6 s, for the two the benchmark reads medians from: a transition is
/// judged against one status write's round trip, a few milliseconds.
fn fine_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 1.25, 40))
}

impl Default for Metrics {
    fn default() -> Self {
        let m = Self {
            registry: Mutex::new(Registry::with_prefix("fleetroll")),
            rollouts: Family::default(),
            targets: Family::default(),
            batch_duration: Histogram::new(exponential_buckets(0.5, 2.0, 14)),
            batch_transition: fine_histogram(),
            reconciles: Counter::default(),
            reconcile_errors: Family::default(),
            reconcile_panics: Counter::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            status_writes: Counter::default(),
            status_write_duration: Family::new_with_constructor(fine_histogram),
            target_patches: Counter::default(),
            notifications_delivered: Counter::default(),
            notification_failures: Counter::default(),
            notification_ack_writes: Counter::default(),
            analysis_measurements: Family::default(),
            metric_names: Mutex::default(),
            leader: Gauge::default(),
        };
        if let Ok(mut r) = m.registry.lock() {
            r.register("rollouts", "FleetRollouts by phase", m.rollouts.clone());
            r.register("targets", "Targets of all FleetRollouts by state", m.targets.clone());
            r.register(
                "batch_duration_seconds",
                "Time from a batch's start to its end",
                m.batch_duration.clone(),
            );
            r.register(
                "batch_transition_seconds",
                "Time from the reconcile that saw a batch settle to the next batch's changes being sent",
                m.batch_transition.clone(),
            );
            r.register("reconciles", "Reconciles run", m.reconciles.clone());
            r.register(
                "reconcile_errors",
                "Reconciles that failed, by error kind",
                m.reconcile_errors.clone(),
            );
            r.register(
                "reconcile_panics",
                "Reconciles that panicked (caught: the rollout's step failed, the process kept running)",
                m.reconcile_panics.clone(),
            );
            r.register("reconcile_duration_seconds", "Time per reconcile", m.reconcile_duration.clone());
            r.register("status_writes", "FleetRollout status writes", m.status_writes.clone());
            m.register_notifications(&mut r);
            r.register(
                "status_write_duration_seconds",
                "Round trip of one FleetRollout status write, by write: a batch's intent (each transition waits on one) or other",
                m.status_write_duration.clone(),
            );
            r.register(
                "target_patches",
                "Target workload patches (image changes and restores)",
                m.target_patches.clone(),
            );
            r.register(
                "analysis_measurements",
                "Analysis measurements recorded, by metric, outcome (Successful, Failed, Inconclusive, Error) and dry run",
                m.analysis_measurements.clone(),
            );
            r.register("leader", "1 while this replica holds the leader lease", m.leader.clone());
        }
        m
    }
}

impl Metrics {
    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Ok(r) = self.registry.lock() {
            // Writing into a String cannot fail.
            let _ = encode(&mut out, &r);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_cannot_make_a_series_per_metric_name_they_invent() {
        let m = Metrics::default();
        for i in 0..10_000 {
            m.measured_metric(&format!("renamed-{i}"));
        }
        assert_eq!(m.measured_metric("renamed-0"), "renamed-0", "names labelled first keep their label");
        assert_eq!(m.measured_metric("renamed-9999"), OTHER_METRICS);
        assert_eq!(m.metric_names.lock().unwrap().len(), METRIC_NAMES_LABELLED);
    }
}
