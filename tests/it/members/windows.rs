//! A member cluster's own change windows (its Secret's `fleetroll.dev/windows` annotation) hold the batches
//! that reach it, as a namespace's do in the rollout's own cluster: the other member goes first, this one
//! once its window opens, and status names the member and the opening meanwhile.

use fleetroll::api::{FleetRollout, Phase, WINDOWS_ANNOTATION};
use k8s_openapi::{api::core::v1::Secret, jiff::Timestamp};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::support::{self, DEADLINE, OPERATOR_ACCOUNT, register, site, spec, tidy, unique};
use testkit::{
    fleet::{NEXT_IMAGE, READY_IMAGE, phase, with_fleet},
    operator::Operator,
};

#[tokio::test]
async fn a_member_clusters_windows_hold_its_batches_until_they_open() {
    if !support::members_up() {
        return;
    }
    let _shared = support::FREEZE.read().await;
    with_fleet("member-windows", 0, |fleet| async move {
        let team = unique("mwin");
        let one = site("member-1", &team, &team, 1, READY_IMAGE, true).await;
        let two = site("member-2", &team, &team, 1, READY_IMAGE, true).await;
        register(&fleet, &[&one, &two], OPERATOR_ACCOUNT).await;
        // member-2's Secret declares a window opening at a whole second 20 s from now (UTC), for a minute.
        let (opening, schedule) = testkit::fleet::opening_in(20);
        let windows = json!([{"name": "prod-hours", "schedule": schedule, "duration": "1m"}]).to_string();
        let secrets: Api<Secret> = Api::namespaced(fleet.client.clone(), &fleet.ns);
        let listed = secrets.list(&Default::default()).await.unwrap().items;
        let name = listed
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .find(|n| n.contains("member-2"))
            .expect("member-2's Secret");
        let annotate = json!({"metadata": {"annotations": {WINDOWS_ANNOTATION: windows}}});
        secrets.patch(&name, &PatchParams::default(), &Patch::Merge(annotate)).await.unwrap();

        let _op = Operator::start(&fleet.ns, &[], &[]);
        fleet.rollout("web", spec(NEXT_IMAGE, &team, 1)).await;
        let held =
            |f: &FleetRollout| f.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("OutsideWindow");
        let fr = fleet.wait_rollout("web", "member-2's window to hold it", DEADLINE, held).await;
        assert!(Timestamp::now() < opening, "held before the opening");
        let status = fr.status.clone().unwrap();
        let hold = status.window_hold.clone().unwrap();
        assert_eq!(hold.owner, "member cluster member-2");
        assert_eq!(hold.opens_at.map(|t| t.0), Some(opening));
        assert_eq!(status.counts.updated, 1, "member-1 was changed first");

        let done = fleet.wait_rollout("web", "success", DEADLINE, |f| phase(f) == Phase::Succeeded).await;
        let last = done.status.unwrap().batches.into_iter().max_by_key(|b| b.index).unwrap();
        let started = last.started_at.unwrap().0;
        assert!(started >= opening, "member-2's batch started at {started}, before its opening {opening}");
        tidy(&[&one, &two]).await;
    })
    .await;
}
