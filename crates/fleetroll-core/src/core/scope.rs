//! What a rollout may touch, decided again for each target right before it is changed or restored, not only
//! when the plan was frozen: a plan can be stale (a namespace opted out since), forged (see
//! `edge::plans`), or aimed at something no rollout may touch (the operator itself, `kube-system`).
//!
//! Pure functions over what the operator sees of a target now.

use std::collections::BTreeMap;

use crate::{
    api::{OPT_IN_LABEL, OPT_IN_VALUE, PlannedTarget, TargetKind, target_key},
    core::reason,
};

/// A workload named on the command line: `Kind/namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadRef {
    pub kind: TargetKind,
    pub namespace: String,
    pub name: String,
}

impl std::str::FromStr for WorkloadRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid =
            || format!("{s:?} is not Kind/namespace/name, such as Deployment/fleetroll-system/fleetroll");
        let mut parts = s.split('/');
        let (kind, namespace, name) = (parts.next(), parts.next(), parts.next());
        let (Some(kind), Some(namespace), Some(name), None) = (kind, namespace, name, parts.next()) else {
            return Err(invalid());
        };
        let kind = match kind {
            "Deployment" => TargetKind::Deployment,
            "StatefulSet" => TargetKind::StatefulSet,
            "DaemonSet" => TargetKind::DaemonSet,
            _ => return Err(invalid()),
        };
        if namespace.is_empty() || name.is_empty() {
            return Err(invalid());
        }
        Ok(Self { kind, namespace: namespace.into(), name: name.into() })
    }
}

/// The operator's standing rules: which namespace may span namespaces, and what no rollout may touch.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    pub fleet_namespace: String,
    /// Namespaces whose workloads no rollout changes (default `kube-system`).
    pub protected_namespaces: Vec<String>,
    /// The operator's own workloads: a rollout that could change them could run any code with the
    /// operator's rights.
    pub self_workloads: Vec<WorkloadRef>,
}

/// A rollout, as far as its scope goes.
#[derive(Clone, Copy, Debug)]
pub struct Rollout<'a> {
    pub namespace: &'a str,
    pub kind: TargetKind,
    /// Planned with `targets.namespaceSelector`.
    pub cross_namespace: bool,
}

/// What the operator sees of a target now.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen<'a> {
    /// The labels of the target's namespace; None when it does not exist (or is not known).
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    /// Another rollout, still running, that changed the target last (`namespace/name`); for a node
    /// target, another rollout that holds the DaemonSet.
    pub held_by: Option<&'a str>,
}

/// Why a target is not touched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    pub message: String,
}

impl Rules {
    /// Whether a workload is one no rollout may change, and why.
    pub fn protects(&self, kind: TargetKind, namespace: &str, name: &str) -> Option<String> {
        if self.self_workloads.iter().any(|w| w.kind == kind && w.namespace == namespace && w.name == name) {
            return Some(format!("{} is the operator's own workload", target_key(namespace, name)));
        }
        self.protects_namespace(namespace)
    }

    fn protects_namespace(&self, namespace: &str) -> Option<String> {
        self.protected_namespaces
            .iter()
            .any(|p| p == namespace)
            .then(|| format!("namespace {namespace} is protected (the operator's --protected-namespaces)"))
    }

    /// Why a revision must not be planned at all: its node rollout's DaemonSet is protected, or every
    /// workload it matched is (a rollout with nothing it may touch is refused, not run hollow).
    pub fn refuse_plan(
        &self,
        rollout: Rollout<'_>,
        daemon_set: Option<&str>,
        candidates: &[crate::core::plan::Candidate],
    ) -> Option<Refusal> {
        // Across member clusters the DaemonSets are in the members' namespaces: judged as those below.
        let at_home = candidates.iter().all(|c| c.cluster.is_empty());
        if rollout.kind == TargetKind::Node && at_home {
            let ds = daemon_set.unwrap_or_default();
            let why = self.protects(TargetKind::DaemonSet, rollout.namespace, ds)?;
            return Some(Refusal {
                reason: reason::TARGET_PROTECTED,
                message: format!("{why}; no pod was replaced"),
            });
        }
        let protected: Vec<String> = candidates
            .iter()
            .filter_map(|c| match c.cluster.is_empty() {
                true => self.protects(rollout.kind, &c.namespace, &c.name),
                false => self.protects_namespace(&c.namespace),
            })
            .collect();
        (!candidates.is_empty() && protected.len() == candidates.len()).then(|| Refusal {
            reason: reason::TARGET_PROTECTED,
            message: format!(
                "every matching target is one no rollout may change ({}{}); no target was changed",
                protected[0],
                if protected.len() > 1 {
                    format!(" and {} more", protected.len() - 1)
                } else {
                    String::new()
                }
            ),
        })
    }

    /// Whether a change of a workload in `workload_namespace` may wake `rollout`: only when the rollout
    /// could target it (its own namespace, or, for a cross-namespace rollout of the fleet namespace, a
    /// namespace that has opted in; `namespace_labels` are its labels, None when not known). Whoever may
    /// write a workload may name any rollout in it; this keeps one tenant from making the operator work
    /// on another's.
    pub fn may_wake(
        &self,
        rollout: Rollout<'_>,
        workload_namespace: &str,
        namespace_labels: Option<&BTreeMap<String, String>>,
    ) -> bool {
        if workload_namespace == rollout.namespace {
            return true;
        }
        let spans = rollout.cross_namespace
            && !self.fleet_namespace.is_empty()
            && rollout.namespace == self.fleet_namespace;
        spans
            && namespace_labels.is_some_and(|l| l.get(OPT_IN_LABEL).map(String::as_str) == Some(OPT_IN_VALUE))
    }

    /// Whether `rollout` may change `target` now. Node targets are machines, not workloads: their scope is
    /// the DaemonSet's, checked when the DaemonSet is taken over; in a member cluster, that of the
    /// DaemonSet's namespace there (the target's), as for a workload.
    pub fn check(&self, rollout: Rollout<'_>, target: &PlannedTarget, seen: Seen<'_>) -> Result<(), Refusal> {
        let key = target.key();
        let refuse = |reason, message: String| {
            Err(Refusal { reason, message: format!("{key}: {message}; not changed") })
        };
        if rollout.kind == TargetKind::Node {
            if let Some(other) = seen.held_by {
                return refuse(reason::TARGET_HELD, format!("FleetRollout {other} holds the DaemonSet"));
            }
            if target.cluster.is_empty() {
                return Ok(());
            }
        }
        // The operator's own workloads are in its own cluster; protected namespaces are protected everywhere.
        let protected = match target.cluster.is_empty() {
            true => self.protects(rollout.kind, &target.namespace, &target.name),
            false => self.protects_namespace(&target.namespace),
        };
        if let Some(why) = protected {
            return refuse(reason::TARGET_PROTECTED, why);
        }
        // In a member cluster every namespace is another's: it must be opted in there.
        if !target.cluster.is_empty() || target.namespace != rollout.namespace {
            let may_span = rollout.cross_namespace && rollout.namespace == self.fleet_namespace;
            if !may_span {
                let why = match target.cluster.is_empty() {
                    true => format!(
                        "namespace {} is outside this rollout's namespace {}",
                        target.namespace, rollout.namespace
                    ),
                    false => format!(
                        "member cluster {} is reached only by rollouts in the fleet namespace, with \
                         targets.namespaceSelector",
                        target.cluster
                    ),
                };
                return refuse(reason::OUT_OF_SCOPE, why);
            }
            let opted_in = seen
                .namespace_labels
                .is_some_and(|labels| labels.get(OPT_IN_LABEL).map(String::as_str) == Some(OPT_IN_VALUE));
            if !opted_in {
                return refuse(
                    reason::NAMESPACE_NOT_OPTED_IN,
                    format!(
                        "namespace {} is not labelled {OPT_IN_LABEL}={OPT_IN_VALUE} now",
                        target.namespace
                    ),
                );
            }
        }
        if let Some(other) = seen.held_by {
            return refuse(
                reason::TARGET_HELD,
                format!("FleetRollout {other}, still running, changed it last"),
            );
        }
        Ok(())
    }
}

/// The uid of the rollout whose idempotency key (`<uid>/<revision>/<batch>`) a target carries.
pub fn key_owner(applied: &str) -> &str {
    applied.split('/').next().unwrap_or_default()
}

#[cfg(test)]
mod tests;
