//! Two replicas: only the lease holder acts; SIGKILL it mid-batch and the other carries the rollout to the
//! end without changing any target twice.
#![allow(clippy::unwrap_used)]

mod common;

use std::{collections::HashMap, time::Duration};

use common::{
    fleet::{NEXT_IMAGE, READY_IMAGE, image_of, phase, with_fleet},
    operator::{Operator, metric},
};
use fleetroll::api::Phase;
use kube::ResourceExt;
use serde_json::json;

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
        let mut a = Operator::start(&fleet.ns, &[], &[]);
        assert!(
            a.wait_for_line("became the leader", Duration::from_secs(30)).await,
            "see {}",
            a.log.display()
        );
        let b = Operator::start(&fleet.ns, &[], &[]);
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
