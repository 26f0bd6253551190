//! Two replicas: only the lease holder acts; SIGKILL it mid-batch and the other carries the rollout to the
//! end without changing any target twice. Replicas whose wall clocks are a minute off (libfaketime) neither
//! take a live lease nor wait longer for a dead one.

use std::{collections::HashMap, time::Duration};

use fleetroll::api::Phase;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::{
    Api, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use testkit::{
    fleet::{NEXT_IMAGE, READY_IMAGE, image_of, phase, with_fleet},
    operator::{Operator, metric},
};

/// The lease the operators of a test namespace campaign for, and how long it lasts (`--lease-duration`, set
/// by each test: shorter than the harness's default, to keep takeovers quick).
const LEASE: &str = "fleetroll-operator";
const LEASE_DURATION: Duration = Duration::from_secs(4);
/// What another replica prints each time it sees the lease it waits for change.
const SAW_CHANGE: &str = "saw the lease of another replica change";

#[tokio::test]
async fn only_the_leader_acts_and_the_other_replica_takes_over_after_a_kill() {
    with_fleet("leader", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 20, READY_IMAGE).await;
        let before: HashMap<String, i64> = fleet
            .all_deployments()
            .await
            .iter()
            .map(|d| (d.name_any(), d.metadata.generation.unwrap()))
            .collect();
        let mut a = Operator::start(&fleet.ns, &["--lease-duration", "4s"], &[]);
        assert!(
            a.wait_for_line("became the leader", Duration::from_secs(30)).await,
            "see {}",
            a.log.display()
        );
        let b = Operator::start(&fleet.ns, &["--lease-duration", "4s"], &[]);
        assert!(
            b.wait_for_line("waiting for leadership", Duration::from_secs(30)).await,
            "see {}",
            b.log.display()
        );

        fleet
            .rollout(
                "web",
                json!({
                    "image": NEXT_IMAGE,
                    "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
                    "strategy": {"batchSize": 2},
                    "health": {"soak": "1s"},
                }),
            )
            .await;
        fleet
            .wait_rollout("web", "batch 3 to start", Duration::from_secs(120), |f| {
                f.status.as_ref().and_then(|s| s.current_batch).is_some_and(|b| b >= 2)
            })
            .await;

        // The standby has not written anything.
        let standby = b.metrics().await;
        assert_eq!(metric(&standby, "fleetroll_leader"), Some(0.0));
        assert_eq!(metric(&standby, "fleetroll_status_writes_total"), Some(0.0), "the standby wrote status");
        assert_eq!(
            metric(&standby, "fleetroll_target_patches_total"),
            Some(0.0),
            "the standby patched targets"
        );
        assert_eq!(metric(&a.metrics().await, "fleetroll_leader"), Some(1.0));

        a.kill();
        let killed_at = std::time::Instant::now();
        // Lease of 4s: the standby takes over once it expires (plus its 0.8s retry period).
        assert!(
            b.wait_for_line("became the leader", Duration::from_secs(30)).await,
            "see {}",
            b.log.display()
        );
        let takeover = killed_at.elapsed();
        assert!(takeover <= Duration::from_secs(4 + 2), "takeover took {takeover:?}");

        fleet
            .wait_rollout("web", "the rollout to succeed", Duration::from_secs(180), |f| {
                phase(f) == Phase::Succeeded
            })
            .await;
        for d in fleet.all_deployments().await {
            assert_eq!(image_of(&d), NEXT_IMAGE);
            assert_eq!(
                d.metadata.generation,
                Some(before[&d.name_any()] + 1),
                "{} changed twice",
                d.name_any()
            );
        }
        let new_leader = b.metrics().await;
        assert!(metric(&new_leader, "fleetroll_status_writes_total").unwrap_or(0.0) > 0.0);
    })
    .await;
}

#[tokio::test]
async fn a_clean_shutdown_hands_the_lease_over_at_once() {
    with_fleet("handover", 0, |fleet| async move {
        let mut a = Operator::start(&fleet.ns, &["--lease-duration", "30s"], &[]);
        assert!(a.wait_for_line("became the leader", Duration::from_secs(30)).await);
        let b = Operator::start(&fleet.ns, &["--lease-duration", "30s"], &[]);
        assert!(b.wait_for_line("waiting for leadership", Duration::from_secs(30)).await);
        // SIGTERM: the leader releases the lease, so the standby need not wait 30s for it to expire.
        let term = std::process::Command::new("kill").args(["-TERM", &a.pid().to_string()]).status().unwrap();
        assert!(term.success());
        let started = std::time::Instant::now();
        assert!(
            b.wait_for_line("became the leader", Duration::from_secs(20)).await,
            "see {}",
            b.log.display()
        );
        assert!(started.elapsed() < Duration::from_secs(5), "handover took {:?}", started.elapsed());
        assert!(a.wait_for_line("released the lease", Duration::from_secs(5)).await || !a.is_running());
    })
    .await;
}

/// How far the wall clock of the process that printed `line` was from ours when it printed it, in seconds
/// (a log line starts with its RFC 3339 time).
fn clock_offset(line: &str) -> f64 {
    let printed: Timestamp =
        line.split_whitespace().next().and_then(|t| t.parse().ok()).unwrap_or_else(|| {
            panic!("no timestamp at the start of {line:?}");
        });
    printed.duration_since(Timestamp::now()).as_secs_f64()
}

/// Starts a replica identified as `identity` with its wall clock `offset_s` seconds off ours, and waits
/// until it campaigns, checking that its clock is really that far off.
async fn skewed_standby(ns: &str, identity: &str, offset_s: i32) -> Operator {
    let offset = format!("{offset_s:+}s");
    let b = Operator::start_skewed(ns, &offset, &["--identity", identity, "--lease-duration", "4s"], &[]);
    let line = b.wait_for_line_text("waiting for leadership", Duration::from_secs(30)).await;
    let line = line.unwrap_or_else(|| panic!("the skewed replica did not start; see {}", b.log.display()));
    let measured = clock_offset(&line);
    assert!(
        (measured - f64::from(offset_s)).abs() < 5.0,
        "the replica's clock is {measured:.1}s off ours, not {offset_s}s: libfaketime did not take"
    );
    b
}

#[tokio::test]
async fn a_replica_whose_clock_runs_ahead_never_takes_a_live_lease() {
    with_fleet("skew-ahead", 0, |fleet| async move {
        let a = Operator::start(&fleet.ns, &["--identity", "on-time", "--lease-duration", "4s"], &[]);
        assert!(
            a.wait_for_line("became the leader", Duration::from_secs(30)).await,
            "see {}",
            a.log.display()
        );
        let leases: Api<Lease> = Api::namespaced(fleet.client.clone(), &fleet.ns);
        let mut events = watcher(leases.clone(), watcher::Config::default()).applied_objects().boxed();
        // The renewTime the leader writes is a minute behind this replica's clock: were it trusted, the
        // lease would look expired at once.
        let b = skewed_standby(&fleet.ns, "ahead", 60).await;

        // Four lease periods of renewals (one every fifth of the lease), each one seen on the Lease object
        // with the leader still holding it.
        let wanted = 20;
        let mut renewals = Vec::new();
        tokio::time::timeout(LEASE_DURATION * 10, async {
            while renewals.len() < wanted {
                let lease = events.try_next().await.unwrap().expect("the watch ended");
                let spec = lease.spec.unwrap_or_default();
                assert_eq!(
                    spec.holder_identity.as_deref(),
                    Some("on-time"),
                    "the lease changed hands: {spec:?}"
                );
                assert_eq!(spec.lease_transitions, Some(0), "the lease changed hands: {spec:?}");
                if renewals.last() != Some(&spec.renew_time) {
                    renewals.push(spec.renew_time);
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("saw {} renewals of the live lease, not {wanted}", renewals.len()));

        // Meanwhile the skewed replica saw many of those renewals (it looks as often as they come) and waited.
        for seen in 0..wanted / 2 {
            assert!(
                b.wait_for_line(SAW_CHANGE, LEASE_DURATION).await,
                "the skewed replica reported only {seen} changes of the lease; see {}",
                b.log.display()
            );
        }
        assert_eq!(metric(&b.metrics().await, "fleetroll_leader"), Some(0.0), "the skewed replica leads");
        assert_eq!(metric(&a.metrics().await, "fleetroll_leader"), Some(1.0), "the leader stepped down");
        let lease = leases.get(LEASE).await.unwrap().spec.unwrap();
        assert_eq!(lease.holder_identity.as_deref(), Some("on-time"));
        assert_eq!(lease.lease_transitions, Some(0));
    })
    .await;
}

#[tokio::test]
async fn a_replica_whose_clock_runs_behind_takes_over_from_a_killed_leader_within_the_lease() {
    with_fleet("skew-behind", 0, |fleet| async move {
        certificates_valid_a_minute_ago().await;
        let mut a = Operator::start(&fleet.ns, &["--identity", "on-time", "--lease-duration", "4s"], &[]);
        assert!(a.wait_for_line("became the leader", Duration::from_secs(30)).await, "see {}", a.log.display());
        // The renewTime the leader writes is a minute ahead of this replica's clock: were it trusted, this
        // replica would wait a minute more than the lease lasts.
        let b = skewed_standby(&fleet.ns, "behind", -60).await;
        // It has seen the leader renew (more than its first sight of the lease): the clock it times the
        // lease by started at a renewal.
        for _ in 0..2 {
            assert!(b.wait_for_line(SAW_CHANGE, LEASE_DURATION).await, "see {}", b.log.display());
        }
        // The leader dies just after a renewal, before the standby has read it: the latest it can take over.
        let leases: Api<Lease> = Api::namespaced(fleet.client.clone(), &fleet.ns);
        let renewed = |l: Lease| l.spec.and_then(|s| s.renew_time);
        let mut events = watcher(leases.clone(), watcher::Config::default()).applied_objects().boxed();
        let first = renewed(events.try_next().await.unwrap().expect("the watch ended"));
        tokio::time::timeout(LEASE_DURATION, async {
            while renewed(events.try_next().await.unwrap().expect("the watch ended")) == first {}
        })
        .await
        .expect("the leader did not renew the lease");
        a.kill();
        let killed_at = std::time::Instant::now();
        assert!(b.wait_for_line("became the leader", Duration::from_secs(90)).await, "see {}", b.log.display());
        let takeover = killed_at.elapsed();
        eprintln!("the replica 60 s behind took over {takeover:.2?} after the leader was killed (lease {LEASE_DURATION:?})");
        assert!(takeover <= LEASE_DURATION + Duration::from_secs(2), "takeover took {takeover:?}");

        let lease = leases.get(LEASE).await.unwrap().spec.unwrap();
        assert_eq!(lease.holder_identity.as_deref(), Some("behind"));
        assert_eq!(lease.lease_transitions, Some(1));
        // Still written, from the new holder's own clock, for the people and tools that read it.
        let renewed = lease.renew_time.unwrap().0.duration_since(Timestamp::now()).as_secs_f64();
        assert!((renewed + 60.0).abs() < 10.0, "renewTime is {renewed:.1}s from now");
        assert_eq!(metric(&b.metrics().await, "fleetroll_leader"), Some(1.0));
    })
    .await;
}

/// Waits until the test cluster's certificates, made when it started, are valid on a clock a minute behind
/// ours: they are valid from the second they were made, and a replica that cannot verify the API server
/// cannot campaign at all. Unknown (so not waited for) on a cluster of the user's own.
async fn certificates_valid_a_minute_ago() {
    let made = std::fs::metadata(testkit::testenv_dir().join("pki/apiserver.crt")).and_then(|m| m.modified());
    let (true, Ok(made)) = (testkit::cluster().local, made) else {
        return;
    };
    let valid_from = made + Duration::from_secs(60 + 2);
    if let Ok(left) = valid_from.duration_since(std::time::SystemTime::now()) {
        eprintln!("the cluster is new: waiting {left:.0?} until its certificates are valid a minute ago");
        tokio::time::sleep(left).await;
    }
}
