//! The state machine driven against a simulated fleet: every transition, the exactly-once guarantee under
//! replays, the failure policies and the gates, without a cluster.

use std::collections::HashMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

mod analysis;
mod batches;
mod clusters;
mod failures;
mod gates;
mod gitops;
mod housekeeping;
mod prepare;
mod revisions;
mod rollbacks;
mod windows;

use super::{housekeeping::expires_at, *};
use crate::{
    api::{
        ApprovalMode, BATCH_WINDOW, FAILURE_DETAILS, FailurePolicy, PlanRef, PlanStorage, Strategy,
        TargetKind,
    },
    core::{conditions, duration, plan, workload::Readiness},
};

const UID: &str = "0d4c8f2e";
/// The namespace the simulated rollout lives in.
pub(super) const NAMESPACE: &str = "fleet";

pub(super) fn spec(n_batch: i32) -> FleetRolloutSpec {
    FleetRolloutSpec {
        image: "web:v2".into(),
        strategy: Strategy { batch_size: IntOrString::Int(n_batch), ..Strategy::default() },
        ..Default::default()
    }
}

/// The edge's answers about the rollout's creator.
#[derive(Default)]
pub(super) struct Creator {
    /// Why the operator cannot act as the creator (None: it can).
    pub(super) cannot_act: Option<String>,
    /// What the API server says of a denied change (an admission webhook's refusal by default).
    pub(super) denial: Option<String>,
}

/// A fleet whose targets follow the simulated cluster: a change makes a target NotReady until the test
/// (or `auto_ready`) marks it Ready.
pub(super) struct Sim {
    pub(super) spec: FleetRolloutSpec,
    pub(super) status: FleetRolloutStatus,
    pub(super) plan: Plan,
    pub(super) world: HashMap<String, TargetState>,
    pub(super) now: Timestamp,
    pub(super) generation: i64,
    /// Every (target, key) change the controller made, in order.
    pub(super) changes: Vec<(String, String)>,
    pub(super) writes: usize,
    pub(super) auto_ready: bool,
    /// Targets that never become ready.
    pub(super) broken: Vec<String>,
    /// Targets changed and not Ready yet (kept so a step need not scan the whole fleet).
    pub(super) not_ready: std::collections::HashSet<String>,
    pub(super) max_in_flight: usize,
    /// Targets the scope rules refuse now, and why.
    pub(super) refused: HashMap<String, &'static str>,
    /// Targets whose change the API server refuses.
    pub(super) denied: std::collections::HashSet<String>,
    /// Targets another rollout, still running, changes between a batch's start and its change (to that
    /// rollout's image and key), by the name of that rollout.
    pub(super) taken: HashMap<String, String>,
    /// Whether the rollout carries the finalizer of a node rollout.
    pub(super) holds_daemonset: bool,
    /// What the simulated metrics backend answers, per metric (absent: an error).
    pub(super) backend: HashMap<String, crate::core::analysis::Answer>,
    /// Queries sent to it.
    pub(super) queries: std::cell::Cell<usize>,
    /// Member clusters that do not answer now, and why.
    pub(super) unreachable: std::collections::BTreeMap<String, String>,
    /// What the platform policies governing the rollout require.
    pub(super) guardrails: crate::core::policy::Guardrails,
    /// What the edge says of acting as the rollout's creator.
    pub(super) creator: Creator,
    /// The fleetroll.dev/windows annotation of each namespace that has one.
    pub(super) namespace_windows: HashMap<String, String>,
}

pub(super) fn key(t: &PlannedTarget) -> String {
    t.key()
}

impl Sim {
    pub(super) fn new(spec: FleetRolloutSpec, n: usize) -> Self {
        Self::across(spec, &[("", n)], &[])
    }

    /// A fleet of `n` targets in each of `clusters` ("" is the rollout's own cluster), in `waves`.
    pub(super) fn across(
        spec: FleetRolloutSpec,
        clusters: &[(&str, usize)],
        waves: &[crate::core::clusters::PlannedWave],
    ) -> Self {
        let candidates: Vec<plan::Candidate> = clusters
            .iter()
            .flat_map(|&(cluster, n)| {
                (0..n).map(move |i| plan::Candidate {
                    cluster: cluster.into(),
                    namespace: format!("tenant-{}", i % 4),
                    name: format!("web-{i:02}"),
                    current_image: "web:v1".into(),
                })
            })
            .collect();
        let inputs = RevisionInputs::of(&spec);
        let order = crate::core::clusters::Order::new(waves);
        let plan = plan::build(candidates, &inputs, "spechash", &HashMap::new(), &order).unwrap();
        let untouched = || TargetState {
            image: Ok("web:v1".into()),
            applied: None,
            readiness: Readiness::Ready,
            http: None,
        };
        let world = plan.batches.iter().flatten().map(|t| (key(t), untouched())).collect();
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let plan_ref = PlanRef {
            hash: plan.hash.clone(),
            total_targets: plan.total_targets(),
            total_batches: plan.total_batches(),
            storage: PlanStorage::Status,
            batches: plan.batches.clone(),
            shards: Vec::new(),
        };
        let new = NewRevision {
            inputs,
            spec_hash: "spechash".into(),
            plan: &plan,
            plan_ref,
            waves,
            refused: &[],
            left_out: &[],
        };
        let t = start_revision(now, 1, &spec, &FleetRolloutStatus::default(), new);
        Sim {
            spec,
            status: t.status,
            plan,
            world,
            now,
            generation: 1,
            changes: Vec::new(),
            writes: 1,
            auto_ready: true,
            broken: Vec::new(),
            not_ready: Default::default(),
            max_in_flight: 0,
            refused: HashMap::new(),
            denied: Default::default(),
            taken: Default::default(),
            holds_daemonset: false,
            backend: HashMap::new(),
            queries: Default::default(),
            unreachable: Default::default(),
            guardrails: Default::default(),
            creator: Creator::default(),
            namespace_windows: HashMap::new(),
        }
    }

    /// The measurements the controller would take now, from the simulated backend.
    pub(super) fn measure(&self) -> Vec<crate::core::analysis::Measured> {
        let Some((batch, queries)) = due_queries(&self.spec, &self.status, &self.plan, self.now) else {
            return Vec::new();
        };
        self.queries.set(self.queries.get() + queries.len());
        // As the controller does: each answer judged for its metric as it arrives.
        let answered = |q: crate::core::analysis::Query| {
            let answer =
                self.backend.get(&q.metric).cloned().unwrap_or_else(|| Err("connection refused".into()));
            let metric = self.spec.analysis.iter().flat_map(|a| &a.metrics).find(|m| m.name == q.metric);
            let verdict = match metric {
                Some(metric) => crate::core::analysis::judge(metric, &answer),
                None => crate::core::analysis::not_taken("no such metric"),
            };
            (q, verdict)
        };
        crate::core::analysis::measured(batch, queries.into_iter().map(answered).collect())
    }

    pub(super) fn advance(&self) -> Step {
        let world = &self.world;
        let unreachable = &self.unreachable;
        // A cluster that does not answer shows nothing of its targets.
        let lookup =
            |t: &PlannedTarget| world.get(&key(t)).filter(|_| !unreachable.contains_key(&t.cluster)).cloned();
        let refused = &self.refused;
        let scope = |t: &PlannedTarget| match refused.get(&key(t)) {
            Some(reason) => Err(Refusal { reason, message: format!("{}: refused", key(t)) }),
            // As the edge: the namespace of a cluster that does not answer is not seen, so not opted in.
            None if unreachable.contains_key(&t.cluster) => {
                Err(Refusal { reason: reason::NAMESPACE_NOT_OPTED_IN, message: "not seen".into() })
            }
            None => Ok(()),
        };
        let measured = self.measure();
        // Different at each write, as the edge's random one is at each step.
        let nonce = format!("{:016x}", self.writes);
        decide(&Facts {
            nonce: &nonce,
            measured: &measured,
            now: self.now,
            uid: UID,
            generation: self.generation,
            namespace: NAMESPACE,
            guardrails: &self.guardrails,
            cannot_act: self.creator.cannot_act.as_deref(),
            spec: &self.spec,
            status: &self.status,
            plan: &self.plan,
            holds_daemonset: self.holds_daemonset,
            target: &lookup,
            unplanned: &|| None,
            scope: &scope,
            declared_windows: &|owner| match owner {
                crate::core::window::Owner::Namespace(ns) => self.namespace_windows.get(ns).cloned(),
                _ => None,
            },
            carrying: &|prefix| {
                let carries = |s: &TargetState| s.applied.as_deref().is_some_and(|k| k.starts_with(prefix));
                world
                    .iter()
                    .filter(|(_, s)| carries(s))
                    .map(|(t, s)| {
                        let (namespace, name) = t.split_once('/').unwrap_or_default();
                        Carrier { namespace: namespace.into(), name: name.into(), image: s.image.clone() }
                    })
                    .collect()
            },
            unreachable,
        })
    }

    /// As the edge carries out a batch: each target changed, held, denied or missed.
    fn apply_batch(&mut self, k: &str, image: &str, targets: &[PlannedTarget], after: &Transition) {
        let (mut refused, mut held) = (Vec::new(), Vec::new());
        let mut missed = std::collections::BTreeMap::new();
        for t in targets {
            if let Some(why) = self.unreachable.get(&t.cluster) {
                missed.insert(t.cluster.clone(), why.clone());
            } else if let Some(other) = self.taken.get(&key(t)).cloned() {
                // As the edge: the other's change came first; ours is not made.
                let state = self.world.get_mut(&key(t)).unwrap();
                (state.image, state.applied) = (Ok("web:other".into()), Some("other-uid/1/0".into()));
                held.push((t.clone(), super::HeldBy { rollout: other, running: true }));
            } else if self.denied.contains(&key(t)) {
                let said = self
                    .creator
                    .denial
                    .clone()
                    .unwrap_or_else(|| format!("admission webhook denied {}", key(t)));
                refused.push((t.clone(), said));
            } else {
                self.change(t, image, k);
            }
        }
        let batch = after.status.current_batch.unwrap_or_default();
        let after = unreached(after.clone(), batch, targets, &missed);
        let denied = denied(after, batch, refused, self.spec.resume_token.as_deref());
        self.status = super::held(denied, batch, held).status;
        self.writes += 1;
    }

    /// Performs one step like the controller would. Returns it for inspection.
    pub(super) fn step(&mut self) -> Step {
        let step = self.advance();
        match &step {
            Step::Write(t) => {
                self.status = t.status.clone();
                self.writes += 1;
            }
            Step::Apply { key: k, image, targets, after } => self.apply_batch(k, image, targets, after),
            Step::Restore { key: k, targets, refused, waiting } => {
                let mut restored = 0;
                let mut waiting = waiting.clone();
                for t in targets {
                    // As the edge: a cluster that does not answer is reported, its targets left as they are.
                    if let Some(why) = self.unreachable.get(&t.cluster) {
                        waiting.insert(t.cluster.clone(), why.clone());
                        continue;
                    }
                    self.change(t, &t.previous_image.clone(), k);
                    restored += 1;
                }
                self.status = super::restored(
                    self.now,
                    self.generation,
                    &self.status,
                    restored,
                    0,
                    refused.clone(),
                    &waiting,
                )
                .status;
                self.writes += 1;
            }
            Step::HoldDaemonSet => self.holds_daemonset = true,
            Step::ReleaseDaemonSet => self.holds_daemonset = false,
            Step::Delete | Step::Wait { .. } | Step::Retry { .. } => {}
        }
        self.max_in_flight = self.max_in_flight.max(self.not_ready.len());
        if self.auto_ready {
            let ready: Vec<String> =
                self.not_ready.iter().filter(|t| !self.broken.contains(t)).cloned().collect();
            for t in ready {
                self.not_ready.remove(&t);
                if let Some(s) = self.world.get_mut(&t) {
                    s.readiness = Readiness::Ready;
                }
            }
        }
        step
    }

    pub(super) fn change(&mut self, t: &PlannedTarget, image: &str, k: &str) {
        let Some(s) = self.world.get_mut(&key(t)) else {
            return;
        };
        if s.applied.as_deref() == Some(k) {
            return; // already carries the key: not changed again
        }
        s.image = Ok(image.to_string());
        s.applied = Some(k.to_string());
        s.readiness = Readiness::NotReady("rolling".into());
        self.not_ready.insert(key(t));
        self.changes.push((key(t), k.to_string()));
    }

    /// Steps until the machine waits; returns how long it wants to wait.
    pub(super) fn settle(&mut self) -> Option<Duration> {
        for _ in 0..10_000 {
            match self.step() {
                Step::Wait { after } => return after,
                Step::Delete => return None,
                _ => {}
            }
        }
        panic!("no wait after 10000 steps: a hot loop");
    }

    pub(super) fn pass(&mut self, d: Duration) {
        self.now = later(self.now, d);
    }

    pub(super) fn changes_of(&self, target: &str) -> usize {
        self.changes.iter().filter(|(t, _)| t == target).count()
    }
}
