use super::*;

fn lane(ns: &str, rollout: usize, key: &str) -> LaneKey {
    (ns.into(), format!("uid-{rollout}"), key.into())
}

#[test]
fn a_tenant_whose_sinks_hang_fills_its_own_share_never_the_platforms_pool() {
    let (mut lanes, now) = (Lanes::default(), Instant::now());
    // 6 rollouts × 8 subscriptions of one tenant, all hanging: 8 lanes at once, no more.
    let hung: Vec<LaneKey> =
        (0..6).flat_map(|r| (0..8).map(move |s| lane("tenant", r, &format!("rollout/s{s}")))).collect();
    let taken = hung.iter().filter(|l| lanes.claim(l, now)).count();
    assert_eq!(taken, NAMESPACE_LANES_MAX);
    // Another tenant, and the platform's subscription about this tenant's rollouts, still send.
    assert!(lanes.claim(&lane("other", 9, "rollout/s0"), now));
    for r in 0..6 {
        let platform = lane("tenant", r, "policy/audit/sink");
        assert_eq!(lanes.claim(&platform, now), r < PLATFORM_NAMESPACE_LANES_MAX, "rollout {r}");
    }
    // The platform's pool has its own bound, shared by namespaces.
    let others = (0..20).filter(|i| lanes.claim(&lane(&format!("ns-{i}"), *i, "policy/audit/sink"), now));
    assert_eq!(others.count(), PLATFORM_LANES_MAX - PLATFORM_NAMESPACE_LANES_MAX);
}

#[test]
fn a_failed_lane_waits_out_its_backoff_without_holding_a_share() {
    let (mut lanes, now) = (Lanes::default(), Instant::now());
    let all: Vec<LaneKey> = (0..9).map(|s| lane("tenant", 0, &format!("rollout/s{s}"))).collect();
    assert!(all[..8].iter().all(|l| lanes.claim(l, now)));
    assert!(!lanes.claim(&all[8], now), "the share is full");
    assert_eq!(lanes.release(&all[0], true, now), 1);
    assert!(!lanes.claim(&all[0], now), "backing off");
    assert!(lanes.claim(&all[8], now), "its place in the share is free while it backs off");
    lanes.release(&all[8], false, now);
    assert!(lanes.claim(&all[0], now + backoff(1)), "and sends again once it is over");
}

#[test]
fn lanes_take_turns_the_longest_waiting_first() {
    let (mut lanes, now) = (Lanes::default(), Instant::now());
    let (a, b, c) = (lane("t", 0, "rollout/a"), lane("t", 1, "rollout/b"), lane("t", 2, "rollout/c"));
    for l in [&a, &b] {
        assert!(lanes.claim(l, now));
        lanes.release(l, false, now);
    }
    let mut owed = vec![(b.clone(), ()), (a.clone(), ()), (c.clone(), ())];
    lanes.by_turn(&mut owed);
    let order: Vec<&LaneKey> = owed.iter().map(|(k, _)| k).collect();
    assert_eq!(order, [&c, &a, &b], "never served, then served longest ago");
}

#[test]
fn a_failing_lane_backs_off_exponentially_up_to_a_cap() {
    let waits: Vec<Duration> = (1..=8).map(backoff).collect();
    assert_eq!(&waits[..3], &[Duration::from_secs(1), Duration::from_secs(2), Duration::from_secs(4)]);
    assert_eq!(waits[7], BACKOFF_MAX);
    assert_eq!(backoff(u32::MAX), BACKOFF_MAX, "no overflow, however long it fails");
}

#[test]
fn a_tenant_reads_its_own_failures_but_not_the_platforms_details() {
    let why = "the sink answered 503";
    let own = failure_event("rollout/hooks", why);
    assert!(own.contains("rollout/hooks") && own.contains(why), "{own}");
    let platform = failure_event("policy/acme-audit/audit", "Secret fleetroll-system/audit not found");
    assert!(!platform.contains("acme-audit") && !platform.contains("fleetroll-system"), "{platform}");
    assert!(platform.contains("FleetRolloutPolicy"), "{platform}");
}

#[test]
fn a_freed_lane_gives_its_place_back_to_its_pool_and_namespace() {
    let (mut lanes, now) = (Lanes::default(), Instant::now());
    let keys: Vec<LaneKey> = (0..=NAMESPACE_LANES_MAX).map(|r| lane("t", r, "rollout/s")).collect();
    let taken: Vec<bool> = keys.iter().map(|l| lanes.claim(l, now)).collect();
    assert_eq!(taken.iter().filter(|t| **t).count(), NAMESPACE_LANES_MAX);
    let last = &keys[NAMESPACE_LANES_MAX];
    // Freeing a lane twice, or one never taken, gives back no more than one place.
    lanes.release(&keys[0], false, now);
    lanes.release(&keys[0], false, now);
    lanes.release(last, false, now);
    assert!(lanes.claim(last, now), "the freed place is taken");
    assert!(!lanes.claim(&keys[0], now), "and there is no other");
    for l in &keys {
        lanes.release(l, false, now);
    }
    assert_eq!((lanes.busy, lanes.busy_by_namespace.len()), ([0, 0], 0));
}
