use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

fn cluster(name: &str, labels: &[(&str, &str)]) -> Cluster {
    Cluster {
        name: name.into(),
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        server: format!("https://{name}.example.com:6443"),
        tls_server_name: None,
    }
}

fn matching(labels: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..Default::default()
    }
}

fn wave(name: &str, labels: &[(&str, &str)], max: Option<u32>) -> Wave {
    Wave { name: name.into(), cluster_selector: matching(labels), max_concurrency: max }
}

fn fleet() -> Vec<Cluster> {
    vec![
        cluster("us-2", &[("env", "prod"), ("region", "us")]),
        cluster("canary", &[("env", "canary"), ("region", "eu")]),
        cluster("eu-1", &[("env", "prod"), ("region", "eu")]),
        cluster("us-1", &[("env", "prod"), ("region", "us")]),
        cluster("lab", &[("env", "dev")]),
    ]
}

fn target(cluster: &str, name: &str) -> PlannedTarget {
    PlannedTarget { cluster: cluster.into(), namespace: "t".into(), name: name.into(), ..Default::default() }
}

#[test]
fn the_selector_picks_clusters_by_their_labels_in_name_order() {
    let all = fleet();
    let prod: Vec<&str> =
        select(&all, &matching(&[("env", "prod")])).unwrap().iter().map(|c| c.name.as_str()).collect();
    assert_eq!(prod, ["eu-1", "us-1", "us-2"]);
    assert_eq!(select(&all, &LabelSelector::default()).unwrap().len(), 5, "empty selects every member");
    let none = select(&all, &matching(&[("env", "staging")])).unwrap_err();
    assert_eq!(none.reason, reason::NO_CLUSTERS);
    assert!(none.message.contains("5 member cluster(s) known"), "{}", none.message);
    let bad = LabelSelector {
        match_expressions: Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                key: "env".into(),
                operator: "Sometimes".into(),
                values: None,
            },
        ]),
        ..Default::default()
    };
    assert_eq!(select(&all, &bad).unwrap_err().reason, reason::INVALID_SELECTOR);
}

#[test]
fn one_api_server_picked_under_two_names_blocks_the_plan() {
    let mut all = fleet();
    // The canary cluster registered again, by Cluster API, under another name and spelling of its URL.
    all.push(Cluster {
        server: "HTTPS://Canary.Example.com:6443/".into(),
        ..cluster("canary-capi", &[("env", "dev")])
    });
    let twice = select(&all, &LabelSelector::default()).unwrap_err();
    assert_eq!(twice.reason, reason::DUPLICATE_CLUSTER);
    assert!(twice.message.contains("canary and canary-capi are the same API server"), "{}", twice.message);
    // Picking one of them is fine; so are two clusters behind one host on different paths (a proxy).
    assert_eq!(select(&all, &matching(&[("env", "canary")])).unwrap().len(), 1);
    let proxied = |name: &str| Cluster {
        server: format!("https://rancher.example.com/k8s/clusters/{name}"),
        ..cluster(name, &[("env", "edge")])
    };
    let edge = [proxied("c-1"), proxied("c-2")];
    assert_eq!(select(&edge, &LabelSelector::default()).unwrap().len(), 2);
    // One endpoint routing to two API servers by TLS server name.
    let routed = |name: &str| Cluster {
        server: "https://gateway.example.com".into(),
        tls_server_name: Some(format!("{name}.clusters.internal")),
        ..cluster(name, &[])
    };
    assert_eq!(select(&[routed("x"), routed("y")], &LabelSelector::default()).unwrap().len(), 2);
    // The same default port, said or not.
    let implicit = [
        Cluster { server: "https://api.example.com".into(), ..cluster("a", &[]) },
        Cluster { server: "https://api.example.com:443".into(), ..cluster("b", &[]) },
    ];
    assert_eq!(select(&implicit, &LabelSelector::default()).unwrap_err().reason, reason::DUPLICATE_CLUSTER);
}

#[test]
fn each_cluster_goes_to_the_first_wave_that_selects_it_and_the_rest_come_last() {
    let all = fleet();
    let chosen: Vec<&Cluster> = all.iter().collect();
    let waves = [
        wave("canary", &[("env", "canary")], None),
        wave("eu", &[("region", "eu")], Some(1)),
        wave("empty", &[("region", "mars")], None),
        wave("prod", &[("env", "prod")], Some(2)),
    ];
    let planned = assign(&waves, &chosen).unwrap();
    let shape: Vec<(&str, Vec<&str>)> =
        planned.iter().map(|w| (w.name.as_str(), w.clusters.iter().map(String::as_str).collect())).collect();
    assert_eq!(
        shape,
        [
            ("canary", vec!["canary"]),
            ("eu", vec!["eu-1"]),
            ("prod", vec!["us-2", "us-1"]),
            (UNASSIGNED_WAVE, vec!["lab"]),
        ]
    );
    assert_eq!(planned[2].max_concurrency, Some(2));
}

#[test]
fn a_batch_ends_at_a_wave_boundary_and_at_max_concurrency() {
    let waves = vec![
        PlannedWave { name: "canary".into(), clusters: vec!["a".into()], max_concurrency: None },
        PlannedWave {
            name: "rest".into(),
            clusters: vec!["b".into(), "c".into(), "d".into()],
            max_concurrency: Some(2),
        },
    ];
    let order = Order::new(&waves);
    assert_eq!(order.wave("a"), 0);
    assert_eq!(order.wave("d"), 1);
    assert!(!order.must_cut(&[], &target("a", "x")));
    assert!(!order.must_cut(&[target("a", "x")], &target("a", "y")));
    assert!(order.must_cut(&[target("a", "x")], &target("b", "x")), "another wave");
    assert!(!order.must_cut(&[target("b", "x")], &target("c", "x")), "two clusters of at most 2");
    assert!(order.must_cut(&[target("b", "x"), target("c", "x")], &target("d", "x")), "a third cluster");
    assert!(!order.must_cut(&[target("b", "x"), target("c", "x")], &target("c", "y")), "same cluster");
}

#[test]
fn planned_status_counts_targets_per_wave_and_cluster_and_tally_keeps_them() {
    let waves = vec![
        PlannedWave { name: "canary".into(), clusters: vec!["a".into()], max_concurrency: None },
        PlannedWave { name: "rest".into(), clusters: vec!["b".into(), "c".into()], max_concurrency: None },
    ];
    let batches = vec![
        vec![target("a", "1")],
        vec![target("a", "2")],
        vec![target("b", "1"), target("b", "2"), target("c", "1")],
    ];
    let mut status = planned_status(&waves, &batches);
    let w: Vec<(&str, u32, u32, u32, u32)> = status
        .waves
        .iter()
        .map(|w| (w.name.as_str(), w.first_batch, w.last_batch, w.clusters, w.total))
        .collect();
    assert_eq!(w, [("canary", 0, 1, 1, 2), ("rest", 2, 2, 2, 3)]);
    let m: Vec<(&str, &str, u32)> =
        status.members.iter().map(|m| (m.name.as_str(), m.wave.as_str(), m.total)).collect();
    assert_eq!(m, [("a", "canary", 2), ("b", "rest", 2), ("c", "rest", 1)]);
    assert_eq!(
        describe(&status),
        "waves: canary: a (2 targets, batches 1-2); rest: b, c (3 targets, batches 3-3)"
    );
    assert_eq!(progress(&status), "waves: canary 0/2 updated (a 0/2); rest 0/3 updated (b 0/2, c 0/1)");

    tally(&mut status, 2, ["b", "b", "c"], Count::Updated, 1);
    tally(&mut status, 2, ["c"], Count::Failed, 1);
    tally(&mut status, 2, ["b"], Count::Updated, -1);
    assert_eq!((status.members[1].updated, status.members[2].updated, status.members[2].failed), (1, 1, 1));
    assert_eq!((status.waves[1].updated, status.waves[1].failed, status.waves[0].updated), (2, 1, 0));
    tally(&mut status, 0, ["a"], Count::Failed, -5);
    // A cluster beyond those listed still counts in its wave.
    tally(&mut status, 2, ["unlisted"], Count::Updated, 1);
    assert_eq!(status.waves[1].updated, 3);
    assert_eq!(status.members[0].failed, 0, "counts saturate, never wrap");
    assert_eq!(
        progress(&status),
        "waves: canary 0/2 updated (a 0/2); rest 3/3 updated, 1 failed (b 1/2, c 1/1, 1 failed)"
    );
}

#[test]
fn a_wave_without_targets_is_credited_with_no_batch() {
    // A status whose first wave has a cluster but no target (written by an older plan, or hostile): its
    // batch range is 0-0, which must not take batch 0 from the wave that holds it.
    let waves = vec![
        PlannedWave { name: "canary".into(), clusters: vec!["empty".into()], max_concurrency: None },
        PlannedWave { name: "prod".into(), clusters: vec!["b".into()], max_concurrency: None },
    ];
    let mut status = planned_status(&waves, &[vec![target("b", "1")], vec![target("b", "2")]]);
    assert_eq!(status.waves[0].total, 0);
    assert_eq!(wave_of(&status, 0).map(|w| w.name.as_str()), Some("prod"));
    tally(&mut status, 0, ["b"], Count::Updated, 1);
    assert_eq!((status.waves[0].updated, status.waves[1].updated), (0, 1));
    assert_eq!(progress(&status), "waves: canary 0/0 updated (1 more); prod 1/2 updated (b 1/2)");
}

#[test]
fn trouble_keeps_when_it_began_and_is_capped() {
    let t0 = k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap();
    let t1 = k8s_openapi::jiff::Timestamp::from_second(1_800_000_060).unwrap();
    let down = BTreeMap::from([("b".to_string(), "connection refused".to_string())]);
    let first = trouble(&[], &down, t0);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].reason, reason::CLUSTER_UNREACHABLE);
    let later = trouble(&first, &down, t1);
    assert_eq!(later[0].since, crate::api::time(t0), "the trouble began at t0");
    assert!(trouble(&later, &BTreeMap::new(), t1).is_empty(), "an answering cluster is out of trouble");
    let many: BTreeMap<String, String> = (0..50).map(|i| (format!("c{i:02}"), "x".repeat(1000))).collect();
    let capped = trouble(&[], &many, t0);
    assert_eq!(capped.len(), TROUBLE_LISTED);
    assert!(capped.iter().all(|t| t.message.len() <= 256));
}

#[test]
fn only_a_rollout_across_members_of_the_kind_is_concerned_by_a_member_workload() {
    use crate::api::{FleetRollout, FleetRolloutStatus, Revision, RevisionInputs};
    let rollout = |kind: &str, clusters: bool| -> FleetRollout {
        let mut targets = serde_json::json!({"kind": kind, "selector": {}});
        if clusters {
            targets["clusters"] = serde_json::json!({"selector": {}});
        }
        serde_json::from_value(serde_json::json!({"apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
            "metadata": {"name": "r", "namespace": "fleet"}, "spec": {"image": "web:v2", "targets": targets}}))
        .unwrap()
    };
    assert!(reads_member_workloads(&rollout("Deployment", true), "east", TargetKind::Deployment));
    assert!(!reads_member_workloads(&rollout("Deployment", true), "east", TargetKind::StatefulSet));
    assert!(!reads_member_workloads(&rollout("Deployment", false), "east", TargetKind::Deployment));
    // The spec left members behind, the revision it still runs did not.
    let mut moved = rollout("Deployment", false);
    let inputs = RevisionInputs::of(&rollout("StatefulSet", true).spec);
    let started_at = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH);
    let revision = Revision { number: 1, spec_hash: String::new(), inputs, started_at };
    moved.status = Some(FleetRolloutStatus { revision: Some(revision), ..Default::default() });
    assert!(reads_member_workloads(&moved, "east", TargetKind::StatefulSet));
    assert!(!reads_member_workloads(&moved, "east", TargetKind::DaemonSet));
}

#[test]
fn a_member_workload_concerns_only_a_rollout_whose_plan_may_reach_its_cluster() {
    use crate::api::{ClusterCount, FleetRollout, FleetRolloutStatus, Revision, RevisionInputs};
    let mut fr: FleetRollout = serde_json::from_value(serde_json::json!({"apiVersion": "fleetroll.dev/v1alpha1",
        "kind": "FleetRollout", "metadata": {"name": "r", "namespace": "fleet", "generation": 3},
        "spec": {"image": "web:v2", "targets": {"kind": "Deployment", "selector": {}, "clusters": {"selector": {}}}}}))
    .unwrap();
    let reads = |fr: &FleetRollout, cluster| reads_member_workloads(fr, cluster, TargetKind::Deployment);
    assert!(reads(&fr, "west"), "not planned yet: any member may be in its plan");
    let inputs = RevisionInputs::of(&fr.spec);
    let started_at = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH);
    let revision = Revision { number: 1, spec_hash: String::new(), inputs, started_at };
    let member = |name: &str| ClusterCount { name: name.into(), wave: "all".into(), ..Default::default() };
    let wave = WaveStatus { name: "all".into(), clusters: 2, ..Default::default() };
    let clusters = ClustersStatus {
        waves: vec![wave],
        members: vec![member("east"), member("north")],
        ..Default::default()
    };
    fr.status = Some(FleetRolloutStatus {
        observed_generation: Some(3),
        revision: Some(revision),
        clusters: Some(clusters),
        ..Default::default()
    });
    assert!(reads(&fr, "east"));
    assert!(!reads(&fr, "west"), "planned, and not in its plan");
    // More clusters planned than listed: an unlisted one may be among them.
    fn waves(fr: &mut FleetRollout) -> &mut Vec<WaveStatus> {
        &mut fr.status.as_mut().unwrap().clusters.as_mut().unwrap().waves
    }
    waves(&mut fr)[0].clusters = 300;
    assert!(reads(&fr, "west"));
    // A new spec, not planned yet: its plan may reach any member.
    waves(&mut fr)[0].clusters = 2;
    fr.metadata.generation = Some(4);
    assert!(reads(&fr, "west"));
}
