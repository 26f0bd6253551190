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
mod tests {
    use super::*;

    fn rules() -> Rules {
        Rules {
            fleet_namespace: "fleet".into(),
            protected_namespaces: vec!["kube-system".into()],
            self_workloads: vec!["Deployment/fleet/fleetroll".parse().unwrap()],
        }
    }

    fn target(ns: &str, name: &str) -> PlannedTarget {
        PlannedTarget {
            namespace: ns.into(),
            name: name.into(),
            previous_image: "web:v1".into(),
            ..Default::default()
        }
    }

    fn member(cluster: &str, ns: &str, name: &str) -> PlannedTarget {
        PlannedTarget { cluster: cluster.into(), ..target(ns, name) }
    }

    #[test]
    fn a_member_namespace_must_be_opted_in_there_and_only_fleet_rollouts_reach_members() {
        let opted = BTreeMap::from([(OPT_IN_LABEL.to_string(), OPT_IN_VALUE.to_string())]);
        let plain = BTreeMap::new();
        let fleet = rollout("fleet", true);
        let seen = |labels| Seen { namespace_labels: labels, held_by: None };
        // The same name as the rollout's own namespace gives no right in a member cluster.
        let same_name = member("member-1", "fleet", "web");
        assert_eq!(
            rules().check(fleet, &same_name, seen(Some(&plain))).unwrap_err().reason,
            reason::NAMESPACE_NOT_OPTED_IN
        );
        assert_eq!(
            rules().check(fleet, &same_name, seen(None)).unwrap_err().reason,
            reason::NAMESPACE_NOT_OPTED_IN
        );
        assert!(rules().check(fleet, &member("member-1", "tenant-a", "web"), seen(Some(&opted))).is_ok());
        let tenant = rollout("tenant-a", true);
        let refused =
            rules().check(tenant, &member("member-1", "tenant-a", "web"), seen(Some(&opted))).unwrap_err();
        assert_eq!(refused.reason, reason::OUT_OF_SCOPE);
        assert!(refused.message.contains("member-1/tenant-a/web"), "{}", refused.message);
        // Protected namespaces are protected in members too; the operator's own workload is only at home.
        let system = rules().check(fleet, &member("member-1", "kube-system", "dns"), seen(Some(&opted)));
        assert_eq!(system.unwrap_err().reason, reason::TARGET_PROTECTED);
        assert!(rules().check(fleet, &member("member-1", "fleet", "fleetroll"), seen(Some(&opted))).is_ok());
    }

    fn rollout(ns: &str, cross: bool) -> Rollout<'_> {
        Rollout { namespace: ns, kind: TargetKind::Deployment, cross_namespace: cross }
    }

    fn opted_in() -> BTreeMap<String, String> {
        BTreeMap::from([(OPT_IN_LABEL.to_string(), OPT_IN_VALUE.to_string())])
    }

    fn reason_of(r: Result<(), Refusal>) -> Option<&'static str> {
        r.err().map(|r| r.reason)
    }

    #[test]
    fn a_rollout_touches_its_own_namespace() {
        assert_eq!(rules().check(rollout("team", false), &target("team", "web"), Seen::default()), Ok(()));
    }

    #[test]
    fn another_namespace_is_out_of_scope_unless_spanned_from_the_fleet_namespace_and_opted_in_now() {
        let r = rules();
        let labels = opted_in();
        let seen = Seen { namespace_labels: Some(&labels), held_by: None };
        // A forged plan in a tenant's rollout naming another namespace, opted in or not.
        assert_eq!(
            reason_of(r.check(rollout("team", false), &target("other", "web"), seen)),
            Some(reason::OUT_OF_SCOPE)
        );
        assert_eq!(
            reason_of(r.check(rollout("team", true), &target("other", "web"), seen)),
            Some(reason::OUT_OF_SCOPE)
        );
        // The fleet namespace without a namespaceSelector stays at home.
        assert_eq!(
            reason_of(r.check(rollout("fleet", false), &target("t1", "web"), seen)),
            Some(reason::OUT_OF_SCOPE)
        );
        assert_eq!(r.check(rollout("fleet", true), &target("t1", "web"), seen), Ok(()));
        // Opted out since the plan was frozen, or gone.
        let out = BTreeMap::from([(OPT_IN_LABEL.to_string(), "disabled".to_string())]);
        let seen = Seen { namespace_labels: Some(&out), held_by: None };
        let refusal = r.check(rollout("fleet", true), &target("t1", "web"), seen).unwrap_err();
        assert_eq!(refusal.reason, reason::NAMESPACE_NOT_OPTED_IN);
        assert!(refusal.message.contains("t1/web"), "{}", refusal.message);
        assert_eq!(
            reason_of(r.check(rollout("fleet", true), &target("t1", "web"), Seen::default())),
            Some(reason::NAMESPACE_NOT_OPTED_IN)
        );
    }

    #[test]
    fn the_operator_and_protected_namespaces_are_never_touched() {
        let r = rules();
        let labels = opted_in();
        let seen = Seen { namespace_labels: Some(&labels), held_by: None };
        let own = r.check(rollout("fleet", false), &target("fleet", "fleetroll"), seen).unwrap_err();
        assert_eq!(own.reason, reason::TARGET_PROTECTED);
        assert!(own.message.contains("operator's own workload"), "{}", own.message);
        // Same name as the operator, other kind: not the operator.
        let ds = Rollout { kind: TargetKind::DaemonSet, ..rollout("fleet", false) };
        assert_eq!(r.check(ds, &target("fleet", "fleetroll"), seen), Ok(()));
        assert_eq!(
            reason_of(r.check(rollout("fleet", true), &target("kube-system", "coredns"), seen)),
            Some(reason::TARGET_PROTECTED)
        );
        assert_eq!(
            reason_of(r.check(rollout("kube-system", false), &target("kube-system", "coredns"), seen)),
            Some(reason::TARGET_PROTECTED)
        );
        // Configurable: with no protected namespaces, kube-system is a namespace like any other.
        let open = Rules { protected_namespaces: vec![], ..rules() };
        assert_eq!(
            open.check(rollout("kube-system", false), &target("kube-system", "coredns"), seen),
            Ok(())
        );
    }

    #[test]
    fn a_target_held_by_another_running_rollout_is_not_taken() {
        let seen = Seen { namespace_labels: None, held_by: Some("team/first") };
        let refusal = rules().check(rollout("team", false), &target("team", "web"), seen).unwrap_err();
        assert_eq!(refusal.reason, reason::TARGET_HELD);
        assert!(refusal.message.contains("team/first"), "{}", refusal.message);
    }

    #[test]
    fn a_plan_of_nothing_but_protected_targets_is_refused_whole() {
        let r = rules();
        let candidate = |ns: &str, name: &str| crate::core::plan::Candidate {
            cluster: String::new(),
            namespace: ns.into(),
            name: name.into(),
            current_image: "x".into(),
        };
        let own = [candidate("fleet", "fleetroll")];
        assert_eq!(
            r.refuse_plan(rollout("fleet", false), None, &own).map(|r| r.reason),
            Some(reason::TARGET_PROTECTED)
        );
        let mixed = [candidate("fleet", "fleetroll"), candidate("fleet", "web")];
        assert_eq!(
            r.refuse_plan(rollout("fleet", false), None, &mixed),
            None,
            "refused one by one at its batch"
        );
        let node = Rollout { kind: TargetKind::Node, ..rollout("kube-system", false) };
        assert_eq!(
            r.refuse_plan(node, Some("kube-proxy"), &[]).map(|r| r.reason),
            Some(reason::TARGET_PROTECTED)
        );
        let node = Rollout { kind: TargetKind::Node, ..rollout("fleet", false) };
        assert_eq!(r.refuse_plan(node, Some("agent"), &[]), None);
    }

    #[test]
    fn node_targets_are_machines_not_workloads() {
        let node = Rollout { kind: TargetKind::Node, ..rollout("fleet", false) };
        assert_eq!(rules().check(node, &target("", "node-1"), Seen::default()), Ok(()));
        let held = Seen { namespace_labels: None, held_by: Some("fleet/first") };
        assert_eq!(reason_of(rules().check(node, &target("", "node-1"), held)), Some(reason::TARGET_HELD));
    }

    #[test]
    fn a_member_node_target_is_judged_by_its_daemonsets_namespace_there() {
        let node = Rollout { kind: TargetKind::Node, ..rollout("fleet", true) };
        let opted = BTreeMap::from([(OPT_IN_LABEL.to_string(), OPT_IN_VALUE.to_string())]);
        let seen = |labels| Seen { namespace_labels: labels, held_by: None };
        let at = |ns: &str| member("member-1", ns, "node-1");
        assert_eq!(rules().check(node, &at("agents"), seen(Some(&opted))), Ok(()));
        let plain = BTreeMap::new();
        assert_eq!(
            reason_of(rules().check(node, &at("agents"), seen(Some(&plain)))),
            Some(reason::NAMESPACE_NOT_OPTED_IN)
        );
        assert_eq!(
            reason_of(rules().check(node, &at("kube-system"), seen(Some(&opted)))),
            Some(reason::TARGET_PROTECTED)
        );
        let held = Seen { namespace_labels: Some(&opted), held_by: Some("fleet/first") };
        assert_eq!(reason_of(rules().check(node, &at("agents"), held)), Some(reason::TARGET_HELD));
        let tenant = Rollout { kind: TargetKind::Node, ..rollout("tenant-a", true) };
        assert_eq!(
            reason_of(rules().check(tenant, &at("agents"), seen(Some(&opted)))),
            Some(reason::OUT_OF_SCOPE)
        );
        // A plan of nodes only in protected member namespaces is refused whole.
        let candidate = crate::core::plan::Candidate {
            cluster: "member-1".into(),
            namespace: "kube-system".into(),
            name: "node-1".into(),
            current_image: "agent:v1".into(),
        };
        let refused = rules().refuse_plan(node, Some("agent"), &[candidate]);
        assert_eq!(refused.map(|r| r.reason), Some(reason::TARGET_PROTECTED));
    }

    #[test]
    fn workload_refs_parse_strictly() {
        let w: WorkloadRef = "StatefulSet/db/pg".parse().unwrap();
        assert_eq!(
            w,
            WorkloadRef { kind: TargetKind::StatefulSet, namespace: "db".into(), name: "pg".into() }
        );
        for bad in
            ["", "Deployment/ns", "Deployment/ns/name/extra", "Pod/ns/name", "Deployment//name", "Node/x/y"]
        {
            assert!(bad.parse::<WorkloadRef>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_owner_of_a_key_is_its_uid() {
        assert_eq!(key_owner("0d4c/2/5"), "0d4c");
        assert_eq!(key_owner(""), "");
    }
}
