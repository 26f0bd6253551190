//! Change windows on the real control plane: tenants' own windows order and hold a fleet-wide rollout,
//! seen the same in status, kubectl, MCP and Argo CD; a freeze applied mid-rollout lets the batch in flight
//! finish and holds the next; someone without the approve verb cannot override it; an approver can, and
//! the override is recorded with who made it.

use std::time::Duration;

use fleetroll::api::{BatchState, FleetRollout, Phase, WINDOWS_ANNOTATION, WindowKind};
use k8s_openapi::{api::core::v1::Namespace, jiff::Timestamp};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use testkit::{
    cli::{gitops_judge, kubectl, repo_path},
    fleet::{FLEET_LABEL, NEXT_IMAGE, READY_IMAGE, phase, with_fleet},
    mcp::drive,
    operator::Operator,
    people::Person,
    tenant::{self, APPROVER_ROLE},
};

const DEADLINE: Duration = Duration::from_secs(180);

/// A fleet-wide rollout over four tenants, two of which declare a window opening 20 s after the rollout
/// starts: the other two are changed first, the two only once their window opens; meanwhile status,
/// `kubectl fleetroll status`, MCP and Argo CD's health say OutsideWindow with the opening.
#[tokio::test]
async fn tenants_are_changed_only_inside_their_own_windows() {
    with_fleet("windows-tenants", 4, |fleet| async move {
        fleet.tenant_deployments(1).await;
        // A window opening at a whole second 20 s from now (UTC), for a minute.
        let (opening, schedule) = testkit::fleet::opening_in(20);
        let windows = json!([{"name": "tenant-hours", "schedule": schedule, "duration": "1m"}]).to_string();
        let namespaces: Api<Namespace> = Api::all(fleet.client.clone());
        let windowed = [fleet.tenants[0].clone(), fleet.tenants[2].clone()];
        for ns in &windowed {
            let annotate = json!({"metadata": {"annotations": {WINDOWS_ANNOTATION: windows}}});
            namespaces.patch(ns, &PatchParams::default(), &Patch::Merge(annotate)).await.unwrap();
        }
        let op = Operator::start(&fleet.ns, &[], &[]);
        let spec = json!({"image": NEXT_IMAGE,
            "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}},
                        "namespaceSelector": {"matchLabels": {FLEET_LABEL: fleet.ns}}},
            "strategy": {"batchSize": 1}});
        fleet.rollout("tenants", spec).await;
        let held =
            |f: &FleetRollout| f.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("OutsideWindow");
        let fr = fleet.wait_rollout("tenants", "the tenants' windows to hold it", DEADLINE, held).await;
        let now = Timestamp::now();
        assert!(now < opening, "held before the opening ({now} < {opening})");
        let status = fr.status.clone().unwrap();
        let plan: Vec<String> =
            fleet.plan(&fr).await.batches.iter().flatten().map(|t| t.namespace.clone()).collect();
        assert_eq!(&plan[2..], &windowed[..], "the windowed tenants are planned last: {plan:?}");
        assert_eq!(status.counts.updated, 2, "the other two were changed first");
        let hold = status.window_hold.clone().unwrap();
        assert_eq!(hold.owner, format!("namespace {}", windowed[0]));
        assert_eq!(hold.opens_at.map(|t| t.0), Some(opening));

        // Everyone who asks is told the same.
        let said = format!("outside the change windows of namespace {}; opens at {opening}", windowed[0]);
        let shown = kubectl(&["fleetroll", "status", "tenants", "-n", &fleet.ns, "--no-follow"]).await.ok();
        assert!(shown.stdout.contains(&said), "{}", shown.stdout);
        let asked = json!({"namespace": fleet.ns, "name": "tenants"}).to_string();
        let answer = drive(&["call", &op.mcp_url(), "get_rollout", &asked, "--no-tasks"]).await;
        assert!(
            answer.to_string().contains("OutsideWindow") && answer.to_string().contains(&said),
            "{answer}"
        );
        let object = serde_json::to_value(&fr).unwrap();
        let health = gitops_judge(
            &[
                "lua-health",
                &repo_path("manifests/argocd/resource_customizations/fleetroll.dev/FleetRollout/health.lua"),
            ],
            &object,
        )
        .await;
        assert_eq!(health["status"], "Suspended", "{health}");
        assert!(health["message"].as_str().unwrap_or_default().contains(&said), "{health}");
        let kstatus = gitops_judge(&["kstatus"], &object).await;
        assert_eq!(
            kstatus.pointer("/cliUtils/status").and_then(|v| v.as_str()),
            Some("InProgress"),
            "{kstatus}"
        );

        // Once the window opens, the two go, each inside it.
        let done = fleet.wait_rollout("tenants", "success", DEADLINE, |f| phase(f) == Phase::Succeeded).await;
        let batches = done.status.unwrap().batches;
        for b in batches.iter().filter(|b| b.index >= 2) {
            let started = b.started_at.as_ref().unwrap().0;
            assert!(
                started >= opening,
                "batch {} started at {started}, before the opening {opening}",
                b.index + 1
            );
        }
    })
    .await;
}

/// A namespace owner who lifts the windows holding a rollout lets it go at once: the namespace's change
/// wakes the rollouts its windows hold (otherwise they would look again only after five minutes).
#[tokio::test]
async fn lifting_a_namespaces_windows_wakes_the_rollout_it_holds() {
    with_fleet("windows-lift", 1, |fleet| async move {
        fleet.tenant_deployments(1).await;
        let tenant = fleet.tenants[0].clone();
        let namespaces: Api<Namespace> = Api::all(fleet.client.clone());
        let set = |value: serde_json::Value| {
            let namespaces = namespaces.clone();
            let tenant = tenant.clone();
            async move {
                let patch = json!({"metadata": {"annotations": {WINDOWS_ANNOTATION: value}}});
                namespaces.patch(&tenant, &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
            }
        };
        // New Year's Day only.
        set(json!(r#"[{"name": "new-year", "schedule": "0 0 1 1 *", "duration": "24h"}]"#)).await;
        let _op = Operator::start(&fleet.ns, &[], &[]);
        let spec = json!({"image": NEXT_IMAGE,
            "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}},
                        "namespaceSelector": {"matchLabels": {FLEET_LABEL: fleet.ns}}}});
        fleet.rollout("lift", spec).await;
        let held =
            |f: &FleetRollout| f.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("OutsideWindow");
        fleet.wait_rollout("lift", "the tenant's window to hold it", DEADLINE, held).await;
        set(serde_json::Value::Null).await;
        let prompt = Duration::from_secs(60);
        fleet
            .wait_rollout("lift", "success once the window is lifted", prompt, |f| {
                phase(f) == Phase::Succeeded
            })
            .await;
    })
    .await;
}

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
