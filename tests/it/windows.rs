//! Change windows on the real control plane: a freeze applied mid-rollout lets the batch in flight finish
//! and holds the next; someone without the approve verb cannot override it; an approver can, and the
//! override is recorded with who made it.

use std::time::Duration;

use fleetroll::api::{BatchState, Phase, WindowKind};
use serde_json::json;
use testkit::{
    cli::kubectl,
    fleet::{NEXT_IMAGE, READY_IMAGE, phase, with_fleet},
    operator::Operator,
    people::Person,
    tenant::{self, APPROVER_ROLE},
};

const DEADLINE: Duration = Duration::from_secs(180);

#[tokio::test]
async fn a_freeze_holds_the_next_batch_until_an_approver_overrides_it() {
    with_fleet("windows-freeze", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        fleet.deployments(&ns, 4, READY_IMAGE).await;
        let (carol, dave) = tokio::join!(
            Person::x509(&fleet.client, "carol", &["window-approvers"]),
            Person::x509(&fleet.client, "dave", &["window-developers"]),
        );
        tenant::bind(&fleet.client, &ns, "approvers", "Group", "window-approvers", APPROVER_ROLE).await;
        tenant::bind(&fleet.client, &ns, "developers", "Group", "window-developers", "edit").await;
        carol.wait_allowed(&fleet.client, &ns, "fleetroll.dev", "fleetrollouts", "approve").await;
        dave.wait_allowed(&fleet.client, &ns, "fleetroll.dev", "fleetrollouts", "patch").await;
        let _op = Operator::start(&ns, &[], &[]);
        let targets = json!({"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}});
        // The soak keeps batch 1 in flight long enough for the freeze to arrive while it is.
        fleet
            .rollout("web", json!({"image": NEXT_IMAGE, "targets": targets, "strategy": {"batchSize": 2}, "health": {"soak": "8s"}}))
            .await;
        let in_flight = |f: &fleetroll::api::FleetRollout| {
            f.status.as_ref().and_then(|s| s.current()).is_some_and(|b| b.index == 0 && b.state == BatchState::Verifying)
        };
        fleet.wait_rollout("web", "batch 1 in flight", DEADLINE, in_flight).await;

        // A freeze with no end in sight, opened now.
        let freeze = json!([{"name": "incident", "kind": "Deny", "schedule": "* * * * *", "duration": "1h"}]);
        fleet.patch_spec("web", json!({"strategy": {"windows": freeze}})).await;
        let held = |f: &fleetroll::api::FleetRollout| {
            f.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("OutsideWindow")
        };
        let fr = fleet.wait_rollout("web", "the freeze to hold batch 2", DEADLINE, held).await;
        let status = fr.status.clone().unwrap();
        assert_eq!(status.batches.len(), 1, "no batch started in the freeze: {:?}", status.batches);
        assert_eq!(status.batches[0].state, BatchState::Succeeded, "the batch in flight finished");
        assert_eq!(phase(&fr), Phase::Paused);
        let hold = status.window_hold.clone().unwrap();
        assert_eq!((hold.window.as_str(), hold.kind, hold.opens_at), ("incident", WindowKind::Deny, None));
        let shown = kubectl(&["fleetroll", "status", "web", "-n", &ns, "--no-follow"]).await.ok();
        assert!(shown.stdout.contains("deny window incident of the rollout is open"), "{}", shown.stdout);

        // dave may edit the rollout but holds no approve verb: his override is refused, and nothing moves.
        let refused = dave.kubectl(&["fleetroll", "approve", "web", "-n", &ns, "--override-windows"]).await;
        assert_eq!(refused.code, 3, "refused: {}", refused.stdout);
        assert!(refused.stderr.contains("dave may not approve fleetrollouts"), "{}", refused.stderr);
        let still = fleet.rollouts().get("web").await.unwrap();
        assert!(still.spec.approvals.is_empty(), "{:?}", still.spec.approvals);

        // carol overrides: batch 2 starts in the freeze, and the rollout finishes.
        let overridden = carol.kubectl(&["fleetroll", "approve", "web", "-n", &ns, "--override-windows"]).await.ok();
        assert!(overridden.stdout.contains("approved batch 2") && overridden.stdout.contains("as carol"), "{}", overridden.stdout);
        let done = fleet.wait_rollout("web", "success", DEADLINE, |f| phase(f) == Phase::Succeeded).await;
        let status = done.status.unwrap();
        let o = &status.window_overrides;
        assert_eq!((o.len(), o[0].batch, o[0].overridden_by.as_deref()), (1, 1, Some("carol")), "{o:?}");
        assert!(o[0].overrode.contains("deny window incident"), "{}", o[0].overrode);
        let events = fleet.wait_events("web", &["OutsideWindow", "WindowOverridden"], DEADLINE).await;
        let told = events.iter().find(|(r, _)| r == "WindowOverridden").map(|(_, m)| m.as_str()).unwrap_or_default();
        assert!(told.contains("batch 2/2") && told.contains("overridden by carol"), "{events:?}");
    })
    .await;
}
