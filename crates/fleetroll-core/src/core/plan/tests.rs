use super::*;
use crate::api::TargetKind;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use proptest::prelude::*;

fn int(n: i32) -> IntOrString {
    IntOrString::Int(n)
}
fn pct(s: &str) -> IntOrString {
    IntOrString::String(s.into())
}

fn inputs(batch: IntOrString, steps: Vec<IntOrString>) -> RevisionInputs {
    RevisionInputs {
        image: "web:v2".into(),
        container: None,
        kind: TargetKind::Deployment,
        selector: LabelSelector::default(),
        namespace_selector: None,
        batch_size: batch,
        steps,
        daemon_set: None,
        node_selector: None,
        clusters: None,
        waves: Vec::new(),
    }
}

fn fleet(n: usize) -> Vec<Candidate> {
    (0..n)
        .map(|i| Candidate {
            cluster: String::new(),
            namespace: format!("tenant-{}", i % 4),
            name: format!("web-{i:03}"),
            current_image: "web:v1".into(),
        })
        .collect()
}

#[test]
fn forty_targets_ten_at_a_time_make_four_batches() {
    assert_eq!(batch_sizes(40, &[], &int(10)), Ok(vec![10, 10, 10, 10]));
}

#[test]
fn canary_steps_come_first_then_batch_size() {
    assert_eq!(batch_sizes(40, &[int(1), pct("10%")], &int(10)), Ok(vec![1, 4, 10, 10, 10, 5]));
}

#[test]
fn percentages_round_up_and_never_give_empty_batches() {
    assert_eq!(batch_sizes(10, &[], &pct("25%")), Ok(vec![3, 3, 3, 1]));
    assert_eq!(batch_sizes(3, &[], &pct("1%")), Ok(vec![1, 1, 1]));
    assert_eq!(batch_sizes(0, &[int(1)], &int(10)), Ok(vec![]));
}

#[test]
fn invalid_sizes_are_errors_not_panics() {
    assert!(batch_sizes(10, &[], &int(0)).is_err());
    assert!(batch_sizes(10, &[pct("0%")], &int(1)).is_err());
    assert!(batch_sizes(10, &[], &pct("abc")).is_err());
}

#[test]
fn failure_budget_rounds_percentages_down() {
    assert_eq!(failure_budget(&int(0), 40), 0);
    assert_eq!(failure_budget(&int(3), 40), 3);
    assert_eq!(failure_budget(&pct("5%"), 40), 2);
    assert_eq!(failure_budget(&pct("10%"), 9), 0);
    assert_eq!(failure_budget(&pct("100%"), 9), 9);
}

#[test]
fn plan_is_ordered_by_namespace_then_name() {
    let plan = build(fleet(8), &inputs(int(3), vec![]), "h", &HashMap::new(), &Order::default()).unwrap();
    let order: Vec<String> =
        plan.batches.iter().flatten().map(|t| format!("{}/{}", t.namespace, t.name)).collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted);
    assert_eq!(plan.batches.iter().map(Vec::len).collect::<Vec<_>>(), vec![3, 3, 2]);
}

#[test]
fn targets_whose_windows_open_sooner_go_first_and_a_batch_never_spans_two_openings() {
    use k8s_openapi::jiff::Timestamp;
    let at = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
    // tenant-1 opens in 20 s, tenant-3 in an hour; tenant-0 and tenant-2 declare no windows.
    let opens = HashMap::from([
        ((String::new(), "tenant-1".to_string()), at(20)),
        ((String::new(), "tenant-3".to_string()), at(3600)),
    ]);
    let order = Order::default().with_openings(opens);
    let plan = build(fleet(8), &inputs(int(3), vec![]), "h", &HashMap::new(), &order).unwrap();
    let namespaces: Vec<Vec<&str>> =
        plan.batches.iter().map(|b| b.iter().map(|t| t.namespace.as_str()).collect()).collect();
    assert_eq!(
        namespaces,
        [
            vec!["tenant-0", "tenant-0", "tenant-2"],
            vec!["tenant-2"],
            vec!["tenant-1", "tenant-1"],
            vec!["tenant-3", "tenant-3"]
        ]
    );
}

#[test]
fn previous_images_carry_over_from_a_superseded_revision() {
    let mut first = fleet(2);
    first[0].current_image = "web:v2".into(); // changed by the superseded revision
    let previous = HashMap::from([("tenant-0/web-000".to_string(), "web:v1".to_string())]);
    let plan = build(first, &inputs(int(10), vec![]), "h", &previous, &Order::default()).unwrap();
    assert!(plan.batches[0].iter().all(|t| t.previous_image == "web:v1"));
}

#[test]
fn a_plan_edited_after_it_was_frozen_is_not_authentic() {
    let plan = build(fleet(6), &inputs(int(2), vec![]), "h", &HashMap::new(), &Order::default()).unwrap();
    assert!(plan.is_authentic("h"));
    assert!(!plan.is_authentic("another revision"));
    let mut retargeted = plan.clone();
    retargeted.batches[1][0].namespace = "kube-system".into();
    assert!(!retargeted.is_authentic("h"));
    let mut reimaged = plan.clone();
    reimaged.batches[0][0].previous_image = "evil:latest".into();
    assert!(!reimaged.is_authentic("h"));
    let mut reordered = plan.clone();
    reordered.batches.swap(0, 1);
    assert!(!reordered.is_authentic("h"));
    let mut padded = plan;
    let extra = padded.batches[0][0].clone();
    padded.batches[2].push(extra);
    assert!(!padded.is_authentic("h"));
}

#[test]
fn the_hash_identifies_the_plan() {
    let a = build(fleet(5), &inputs(int(2), vec![]), "h", &HashMap::new(), &Order::default()).unwrap();
    let b = build(fleet(5), &inputs(int(2), vec![]), "h", &HashMap::new(), &Order::default()).unwrap();
    let c = build(fleet(5), &inputs(int(3), vec![]), "h", &HashMap::new(), &Order::default()).unwrap();
    let d =
        build(fleet(5), &inputs(int(2), vec![]), "other-spec", &HashMap::new(), &Order::default()).unwrap();
    assert_eq!(a.hash, b.hash);
    assert_ne!(a.hash, c.hash);
    assert_ne!(a.hash, d.hash);
}

proptest! {
    #[test]
    fn every_target_is_in_exactly_one_batch_in_a_deterministic_order(
        n in 0usize..300,
        batch in 1i32..50,
        steps in proptest::collection::vec(1i32..20, 0..4),
        shuffle_seed in any::<u64>(),
    ) {
        let steps: Vec<IntOrString> = steps.into_iter().map(int).collect();
        let inputs = inputs(int(batch), steps.clone());
        let mut shuffled = fleet(n);
        // A different discovery order must not change the plan.
        let len = shuffled.len();
        if len > 1 {
            for i in 0..len {
                let j = ((shuffle_seed.wrapping_mul(i as u64 + 1)) % len as u64) as usize;
                shuffled.swap(i, j);
            }
        }
        let a = build(fleet(n), &inputs, "h", &HashMap::new(), &Order::default()).unwrap();
        let b = build(shuffled, &inputs, "h", &HashMap::new(), &Order::default()).unwrap();
        prop_assert_eq!(&a, &b);

        let mut seen: Vec<(String, String)> =
            a.batches.iter().flatten().map(|t| (t.namespace.clone(), t.name.clone())).collect();
        prop_assert_eq!(seen.len(), n);
        seen.sort();
        seen.dedup();
        prop_assert_eq!(seen.len(), n, "a target appears twice");
        prop_assert!(a.batches.iter().all(|b| !b.is_empty()), "an empty batch");
        // Wave sizes: the steps first (capped by what remains), then batchSize.
        let sizes: Vec<usize> = a.batches.iter().map(Vec::len).collect();
        for (i, size) in sizes.iter().enumerate() {
            let expected = steps.get(i).map_or(batch as usize, |s| match s { IntOrString::Int(v) => *v as usize, _ => 0 });
            if i + 1 < sizes.len() { prop_assert_eq!(*size, expected); } else { prop_assert!(*size <= expected); }
        }
    }

    #[test]
    fn percentage_batches_cover_the_fleet(n in 1u32..5000, p in 1u32..=100) {
        let sizes = batch_sizes(n, &[], &pct(&format!("{p}%"))).unwrap();
        prop_assert_eq!(sizes.iter().sum::<u32>(), n);
        let expected = (n * p).div_ceil(100).max(1);
        prop_assert!(sizes.iter().all(|&s| s <= expected));
    }
}
