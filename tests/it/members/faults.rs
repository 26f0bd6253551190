//! Faults across member clusters: a member frozen at planning, mid-batch or during a rollback, a token rotated and the
//! old one revoked mid-rollout, the operator SIGKILLed 20 times.

use std::{collections::HashMap, time::Duration};

use fleetroll::{
    api::{APPLIED_ANNOTATION, BatchState, FleetRollout, Phase},
    failpoint,
};
use kube::ResourceExt;
use serde_json::json;

use super::support::{self, DEADLINE, OPERATOR_ACCOUNT, Site, refused, register, site, spec, tidy, unique};
use testkit::{
    Rng,
    fleet::{Fleet, NEXT_IMAGE, READY_IMAGE, phase, with_fleet},
    members::{revoke_tokens, service_account_token, write_capi_secret},
    operator::Operator,
    poll_until,
};

fn in_trouble(fr: &FleetRollout, cluster: &str) -> bool {
    let trouble = fr.status.as_ref().and_then(|s| s.clusters.as_ref()).map(|c| c.trouble.clone());
    trouble.unwrap_or_default().iter().any(|t| t.name == cluster && t.reason == "ClusterUnreachable")
}

/// Every Deployment of `site` has the new image, changed exactly once since `before`.
async fn changed_once(site: &Site, before: &HashMap<String, (String, i64)>) {
    let after = site.state().await;
    assert_eq!(after.len(), before.len());
    for (name, (image, generation)) in &after {
        assert_eq!(image, NEXT_IMAGE, "{}/{name}", site.member.name);
        assert_eq!(*generation, before[name].1 + 1, "{}/{name} was changed more than once", site.member.name);
    }
}

#[tokio::test]
async fn a_member_frozen_mid_batch_is_not_taken_for_healthy_and_the_rollout_goes_on_once_it_thaws() {
    if !support::members_up() {
        return;
    }
    let _alone = support::FREEZE.write().await;
    with_fleet("frozen", 0, |fleet| async move {
        let team = unique("frozen");
        let one = site("member-1", &team, &team, 1, READY_IMAGE, true).await;
        let two = site("member-2", &team, &team, 2, READY_IMAGE, true).await;
        let before = two.state().await;
        register(&fleet, &[&one, &two], OPERATOR_ACCOUNT).await;
        let _op = Operator::start(&fleet.ns, &[], &[]);
        // A soak long enough to freeze member-2 while its batch soaks.
        let mut s = spec(NEXT_IMAGE, &team, 2);
        s["health"] = json!({"soak": "6s", "timeout": "5m"});
        fleet.rollout("frozen", s).await;
        fleet
            .wait_rollout("frozen", "member-2's batch to soak", DEADLINE, |fr| {
                let s = fr.status.clone().unwrap_or_default();
                s.current_batch == Some(1) && s.current().is_some_and(|b| b.healthy_since.is_some())
            })
            .await;
        let frozen = two.member.freeze();
        let fr = fleet
            .wait_rollout("frozen", "member-2 in trouble", DEADLINE, |fr| in_trouble(fr, "member-2"))
            .await;
        let s = fr.status.clone().unwrap();
        let batch = s.current().unwrap();
        assert_eq!((batch.index, batch.state, phase(&fr)), (1, BatchState::Verifying, Phase::Progressing));
        assert!(batch.healthy_since.is_none(), "the soak stopped: a frozen member is not healthy");
        frozen.thaw();
        let fr = fleet
            .wait_rollout("frozen", "the rollout to succeed", DEADLINE, |fr| phase(fr) == Phase::Succeeded)
            .await;
        assert!(!in_trouble(&fr, "member-2"), "member-2 out of trouble once it answers");
        changed_once(&two, &before).await;
        tidy(&[&one, &two]).await;
    })
    .await;
}

#[tokio::test]
async fn a_member_frozen_when_the_rollout_is_created_is_waited_for_and_planned_once_it_thaws() {
    if !support::members_up() {
        return;
    }
    let _alone = support::FREEZE.write().await;
    with_fleet("frozen-plan", 0, |fleet| async move {
        let team = unique("frozen-plan");
        let one = site("member-1", &team, &team, 1, READY_IMAGE, true).await;
        let two = site("member-2", &team, &team, 2, READY_IMAGE, true).await;
        let (before_one, before_two) = (one.state().await, two.state().await);
        register(&fleet, &[&one, &two], OPERATOR_ACCOUNT).await;
        let frozen = two.member.freeze();
        let _op = Operator::start(&fleet.ns, &[], &[]);
        fleet.rollout("late", spec(NEXT_IMAGE, &team, 2)).await;
        let fr = fleet
            .wait_rollout("late", "planning to wait for member-2", DEADLINE, |fr| {
                fr.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("WaitingForClusters")
            })
            .await;
        let s = fr.status.clone().unwrap();
        assert_eq!((phase(&fr), s.plan.is_none()), (Phase::Pending, true), "no plan while it waits");
        assert!(s.message.unwrap_or_default().contains("member-2"), "the message names the cluster");
        assert!(in_trouble(&fr, "member-2"));
        assert_eq!(one.state().await, before_one, "nothing changes anywhere while planning waits");
        frozen.thaw();
        let fr = fleet
            .wait_rollout("late", "the rollout to succeed", DEADLINE, |fr| phase(fr) == Phase::Succeeded)
            .await;
        let clusters = fr.status.clone().unwrap().clusters.unwrap();
        assert!(clusters.left_out.is_empty(), "member-2 is in the plan: {:?}", clusters.left_out);
        assert_eq!(fr.status.unwrap().counts.updated, 3);
        changed_once(&one, &before_one).await;
        changed_once(&two, &before_two).await;
        tidy(&[&one, &two]).await;
    })
    .await;
}

#[tokio::test]
async fn a_rollback_waits_for_a_frozen_member_and_is_rolled_back_only_once_it_restored_it() {
    if !support::members_up() {
        return;
    }
    let _alone = support::FREEZE.write().await;
    with_fleet("frozen-back", 0, |fleet| async move {
        let team = unique("frozen-back");
        let one = site("member-1", &team, &team, 1, READY_IMAGE, true).await;
        let two = site("member-2", &team, &team, 1, READY_IMAGE, true).await;
        let before = two.state().await;
        register(&fleet, &[&one, &two], OPERATOR_ACCOUNT).await;
        let _op = Operator::start(&fleet.ns, &[], &[]);
        fleet.rollout("back", spec(NEXT_IMAGE, &team, 1)).await;
        fleet
            .wait_rollout("back", "the rollout to succeed", DEADLINE, |fr| phase(fr) == Phase::Succeeded)
            .await;
        let frozen = two.member.freeze();
        fleet.patch_spec("back", json!({"rollback": true})).await;
        let fr = fleet
            .wait_rollout("back", "the rollback to wait for member-2", DEADLINE, |fr| {
                let rb = fr.status.as_ref().and_then(|s| s.rollback.clone());
                rb.is_some_and(|rb| rb.unreached == ["member-2"])
            })
            .await;
        let s = fr.status.clone().unwrap();
        assert_eq!((phase(&fr), s.reason.as_deref()), (Phase::RollingBack, Some("ClusterUnreachable")));
        assert!(in_trouble(&fr, "member-2"));
        let message = s.message.unwrap_or_default();
        assert!(message.contains("member-2") && message.contains("delete the rollout"), "{message}");
        let restored: Vec<String> = one.state().await.into_values().map(|(image, _)| image).collect();
        assert_eq!(restored, [READY_IMAGE], "member-1, which answers, is restored meanwhile");
        frozen.thaw();
        let fr = fleet
            .wait_rollout("back", "the rollback to finish", DEADLINE, |fr| phase(fr) == Phase::RolledBack)
            .await;
        let rb = fr.status.clone().unwrap().rollback.unwrap();
        assert_eq!((rb.restored, rb.skipped, rb.unreached.len()), (2, 0, 0));
        assert!(!in_trouble(&fr, "member-2"));
        for (name, (image, generation)) in two.state().await {
            assert_eq!(image, READY_IMAGE, "member-2/{name} restored once it answered");
            assert_eq!(generation, before[&name].1 + 2, "member-2/{name}: changed once, restored once");
        }
        tidy(&[&one, &two]).await;
    })
    .await;
}

#[tokio::test]
async fn a_member_token_rotated_and_the_old_one_revoked_mid_rollout_needs_no_restart() {
    if !support::members_up() {
        return;
    }
    let _shared = support::FREEZE.read().await;
    with_fleet("rotate", 0, |fleet| async move {
        let team = unique("rotate");
        let one = site("member-1", &team, &team, 1, READY_IMAGE, true).await;
        let two = site("member-2", &team, &team, 2, READY_IMAGE, true).await;
        let before = two.state().await;
        register(&fleet, &[&one], OPERATOR_ACCOUNT).await;
        // member-2's credential is a token of an account of this test's own, so it can be revoked.
        let (old_account, new_account) = (format!("{team}-old"), format!("{team}-new"));
        let old = service_account_token(&two.admin, OPERATOR_ACCOUNT.0, &old_account).await;
        write_capi_secret(&fleet.client, &fleet.ns, &two.member, &old, &[("env", "prod")]).await;
        let mut op = Operator::start(&fleet.ns, &[], &[]);
        let mut s = spec(NEXT_IMAGE, &team, 1);
        s["strategy"]["pauseBetweenBatches"] = json!("3s");
        fleet.rollout("rotate", s).await;
        // Member-2's first batch done with the old token, the rollout is held before its second.
        fleet
            .wait_rollout("rotate", "member-2's first batch", DEADLINE, |fr| {
                let s = fr.status.clone().unwrap_or_default();
                s.current_batch == Some(1) && s.current().is_some_and(|b| b.state == BatchState::Succeeded)
            })
            .await;
        fleet.patch_spec("rotate", json!({"paused": true})).await;
        fleet.wait_rollout("rotate", "the pause", DEADLINE, |fr| phase(fr) == Phase::Paused).await;
        revoke_tokens(&two.admin, OPERATOR_ACCOUNT.0, &old_account).await;
        poll_until("the old token to be refused", DEADLINE, || refused(&two.member, &old)).await;
        // Going on with the revoked token: member-2 refuses it, and the rollout says so.
        fleet.patch_spec("rotate", json!({"paused": false})).await;
        fleet.wait_rollout("rotate", "member-2 in trouble", DEADLINE, |fr| in_trouble(fr, "member-2")).await;
        // The new credential, written where the old one was: used without a restart.
        let new = service_account_token(&two.admin, OPERATOR_ACCOUNT.0, &new_account).await;
        write_capi_secret(&fleet.client, &fleet.ns, &two.member, &new, &[("env", "prod")]).await;
        fleet
            .wait_rollout("rotate", "the rollout to succeed", DEADLINE, |fr| phase(fr) == Phase::Succeeded)
            .await;
        assert!(op.is_running(), "the operator was not restarted");
        changed_once(&two, &before).await;
        tidy(&[&one, &two]).await;
    })
    .await;
}

#[derive(Debug)]
enum Kill {
    At(&'static str),
    After(Duration),
}

#[tokio::test]
async fn twenty_sigkills_across_members_change_every_target_exactly_once() {
    if !support::members_up() {
        return;
    }
    let _shared = support::FREEZE.read().await;
    with_fleet("members-crash", 0, |fleet| async move {
        let team = unique("crash");
        // 18 batches of 2, so that kills that let a batch or two through leave room for 20.
        let one = site("member-1", &team, &team, 18, READY_IMAGE, true).await;
        let two = site("member-2", &team, &team, 18, READY_IMAGE, true).await;
        let before = (one.state().await, two.state().await);
        register(&fleet, &[&one, &two], OPERATOR_ACCOUNT).await;
        fleet.rollout("crashy", spec(NEXT_IMAGE, &team, 2)).await;
        let kills = sigkills(&fleet, 20).await;
        assert!(kills.len() >= 20, "only {} kills before the rollout finished: {kills:?}", kills.len());
        let _op = Operator::start(&fleet.ns, &["--identity", "members-crash"], &[]);
        let fr = fleet
            .wait_rollout("crashy", "the rollout to succeed", DEADLINE, |fr| phase(fr) == Phase::Succeeded)
            .await;
        let s = fr.status.clone().unwrap();
        assert_eq!((s.counts.total, s.counts.updated, s.counts.failed), (36, 36, 0));
        changed_once(&one, &before.0).await;
        changed_once(&two, &before.1).await;
        let uid = fr.uid().unwrap();
        for site in [&one, &two] {
            for d in site.deployments().list(&Default::default()).await.unwrap().items {
                let key = d.annotations().get(APPLIED_ANNOTATION).cloned().unwrap_or_default();
                assert!(
                    key.starts_with(&format!("{uid}/1/")),
                    "{}/{}: {key}",
                    site.member.name,
                    d.name_any()
                );
            }
        }
        tidy(&[&one, &two]).await;
    })
    .await;
}

/// SIGKILLs operators at seeded random points until `kills` happened or the rollout finished; the kills.
async fn sigkills(fleet: &Fleet, kills: usize) -> Vec<String> {
    let seed = std::env::var("FLEETROLL_CRASH_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(20261130u64);
    let mut rng = Rng(seed.max(1));
    let identity = ["--identity", "members-crash"];
    let mut log = Vec::new();
    while log.len() < kills {
        let kill = match rng.below(4) {
            0 => Kill::At(failpoint::AFTER_INTENT),
            1 => Kill::At(failpoint::BETWEEN_PATCHES),
            2 => Kill::At(failpoint::AFTER_APPLY),
            _ => Kill::After(Duration::from_millis(100 + rng.below(400))),
        };
        let mut op = match &kill {
            Kill::At(point) => {
                Operator::start(&fleet.ns, &identity, &[("FLEETROLL_FAILPOINT", &format!("{point}:1"))])
            }
            Kill::After(_) => Operator::start(&fleet.ns, &identity, &[]),
        };
        match &kill {
            Kill::At(point) => {
                if !op.wait_for_line(&format!("FAILPOINT {point} reached"), Duration::from_secs(30)).await {
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
        log.push(format!("{kill:?}"));
        if phase(&fleet.rollouts().get("crashy").await.unwrap()) == Phase::Succeeded {
            break;
        }
    }
    eprintln!("kills (seed {seed}): {}", log.join(", "));
    log
}
