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
    assert_eq!(open.check(rollout("kube-system", false), &target("kube-system", "coredns"), seen), Ok(()));
}

#[test]
fn only_a_workload_a_rollout_could_target_wakes_it() {
    let r = rules();
    let own = Rollout { namespace: "t1", kind: TargetKind::Deployment, cross_namespace: false };
    let fleet = Rollout { namespace: "fleet", kind: TargetKind::Deployment, cross_namespace: true };
    let opted_in = BTreeMap::from([(OPT_IN_LABEL.to_string(), OPT_IN_VALUE.to_string())]);
    let not_opted_in = BTreeMap::new();
    assert!(r.may_wake(own, "t1", None), "its own namespace");
    assert!(!r.may_wake(own, "t2", Some(&opted_in)), "another tenant's workload");
    assert!(r.may_wake(fleet, "t2", Some(&opted_in)), "a namespace the fleet rollout may span");
    assert!(!r.may_wake(fleet, "t3", Some(&not_opted_in)), "one that never opted in");
    assert!(!r.may_wake(fleet, "t3", None), "one not known");
    let elsewhere = Rollout { namespace: "t9", ..fleet };
    assert!(!r.may_wake(elsewhere, "t2", Some(&opted_in)), "only the fleet namespace spans namespaces");
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
    assert_eq!(r.refuse_plan(rollout("fleet", false), None, &mixed), None, "refused one by one at its batch");
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
    assert_eq!(w, WorkloadRef { kind: TargetKind::StatefulSet, namespace: "db".into(), name: "pg".into() });
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
