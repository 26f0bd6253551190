//! The crash test: one rollout, the operator SIGKILLed again and again at seeded random points (between the
//! intent write and the first patch, between patches, after the patches and before the status write, and
//! at random instants), restarted each time. The rollout must complete with every target changed exactly
//! once and a consistent status.
//!
//! Repeat a run with FLEETROLL_CRASH_SEED=<seed>; FLEETROLL_CRASH_KILLS sets the number of kills (>= 20).

use std::{collections::HashMap, time::Duration};

use fleetroll::api::{APPLIED_ANNOTATION, BatchState, Phase};
use kube::ResourceExt;
use serde_json::json;
use testkit::{
    Rng,
    fleet::{NEXT_IMAGE, READY_IMAGE, image_of, observe_fleet, phase, with_fleet},
    operator::Operator,
};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[derive(Debug)]
enum Kill {
    /// Stop dead at the n-th hit of a failpoint, then SIGKILL.
    At(&'static str, u64),
    /// SIGKILL after this long (the delay is the point: a kill at an arbitrary instant).
    After(Duration),
}

#[tokio::test]
async fn sigkill_at_random_points_never_changes_a_target_twice() {
    let seed = env_or("FLEETROLL_CRASH_SEED", 20261129).max(1);
    let kills = env_or("FLEETROLL_CRASH_KILLS", 24).max(20);
    eprintln!("crash test: seed {seed}, {kills} kills (FLEETROLL_CRASH_SEED={seed} replays this run)");

    with_fleet("crash", 0, move |fleet| async move {
        // 30 batches of 2, so that even kills that let a batch or two through leave room for 20 more.
        let names = fleet.deployments(&fleet.ns, 60, READY_IMAGE).await;
        let before: HashMap<String, i64> = fleet
            .all_deployments()
            .await
            .iter()
            .map(|d| (d.name_any(), d.metadata.generation.unwrap()))
            .collect();
        let (seen, watch) = observe_fleet(&fleet, NEXT_IMAGE);
        fleet
            .rollout(
                "crashy",
                json!({
                    "image": NEXT_IMAGE,
                    "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
                    "strategy": {"batchSize": 2},
                }),
            )
            .await;

        let mut rng = Rng(seed);
        let mut done = 0u64;
        let mut log = Vec::new();
        // One identity across restarts, as a restarted container keeps its pod name: it renews its own
        // lease at once instead of waiting for it to expire.
        let identity = ["--identity", "crash-test-operator"];
        while done < kills {
            let kill = match rng.below(4) {
                0 => Kill::At(fleetroll::failpoint::AFTER_INTENT, 1),
                1 => Kill::At(fleetroll::failpoint::BETWEEN_PATCHES, 1),
                2 => Kill::At(fleetroll::failpoint::AFTER_APPLY, 1),
                _ => Kill::After(Duration::from_millis(100 + rng.below(700))),
            };
            let mut op = match &kill {
                Kill::At(point, n) => {
                    Operator::start(&fleet.ns, &identity, &[("FLEETROLL_FAILPOINT", &format!("{point}:{n}"))])
                }
                Kill::After(_) => Operator::start(&fleet.ns, &identity, &[]),
            };
            match &kill {
                Kill::At(point, _) => {
                    if !op.wait_for_line(&format!("FAILPOINT {point} reached"), Duration::from_secs(30)).await
                    {
                        // The rollout had no such point left to reach.
                        let fr = fleet.rollouts().get("crashy").await.unwrap();
                        assert_eq!(
                            phase(&fr),
                            Phase::Succeeded,
                            "failpoint {point} not reached; see {}",
                            op.log.display()
                        );
                        break;
                    }
                }
                Kill::After(d) => tokio::time::sleep(*d).await,
            }
            op.kill();
            done += 1;
            log.push(format!("{kill:?}"));
            let fr = fleet.rollouts().get("crashy").await.unwrap();
            if phase(&fr) == Phase::Succeeded {
                break;
            }
        }
        eprintln!("kills: {}", log.join(", "));
        assert!(done >= 20, "only {done} kills happened before the rollout finished; kills: {log:?}");

        // A last, undisturbed operator finishes the job.
        let _op = Operator::start(&fleet.ns, &identity, &[]);
        let fr = fleet
            .wait_rollout(
                "crashy",
                "the rollout to succeed after the crashes",
                Duration::from_secs(180),
                |f| phase(f) == Phase::Succeeded,
            )
            .await;
        let s = fr.status.clone().unwrap();
        watch.abort();
        assert_eq!((s.counts.total, s.counts.updated, s.counts.healthy, s.counts.failed), (60, 60, 60, 0));
        assert_eq!(s.current_batch, Some(29));
        let max_in_flight = seen.lock().unwrap().max_in_flight;
        assert!(max_in_flight <= 2, "{max_in_flight} targets in flight with batches of 2");
        assert!(
            s.batches.iter().all(|b| b.state == BatchState::Succeeded && b.finished_at.is_some()),
            "{:?}",
            s.batches
        );
        let uid = fr.uid().unwrap();
        let plan = fleet.plan(&fr).await;
        let deployments = fleet.all_deployments().await;
        for (i, batch) in plan.batches.iter().enumerate() {
            for t in batch {
                assert!(names.contains(&t.name));
                let d = deployments.iter().find(|d| d.name_any() == t.name).unwrap();
                assert_eq!(image_of(d), NEXT_IMAGE);
                assert_eq!(
                    d.metadata.generation,
                    Some(before[&t.name] + 1),
                    "{} was changed more than once (seed {seed})",
                    t.name
                );
                assert_eq!(d.annotations().get(APPLIED_ANNOTATION), Some(&format!("{uid}/1/{i}")));
            }
        }
    })
    .await;
}
