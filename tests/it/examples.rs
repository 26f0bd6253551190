//! Every example manifest reaches the outcome its comments promise, and the GitOps flow behaves: `kubectl
//! apply`, re-applying an unchanged manifest, changing the image mid-rollout, `kubectl wait`.

use std::{collections::BTreeMap, time::Duration};

use fleetroll::api::{FleetRollout, Phase};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Namespace};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use testkit::{
    cli::{kubectl, repo_path},
    fleet::{Fleet, NEXT_IMAGE, READY_IMAGE, deployment, image_of, phase, with_fleet},
    operator::Operator,
};

const DEADLINE: Duration = Duration::from_secs(180);
const PART_OF: (&str, &str) = ("app.kubernetes.io/part-of", "storefront");

async fn storefront(fleet: &Fleet, ns: &str, n: usize) {
    let api: Api<Deployment> = Api::namespaced(fleet.client.clone(), ns);
    for i in 0..n {
        api.create(&PostParams::default(), &deployment(&format!("shop-{i:02}"), READY_IMAGE, &[PART_OF]))
            .await
            .unwrap();
    }
    for i in 0..n {
        testkit::wait_for(&api, &format!("shop-{i:02}"), "the Deployment to be available", DEADLINE, |d| {
            d.status.as_ref().and_then(|s| s.available_replicas) == Some(1)
        })
        .await;
    }
}

async fn storefront_state(fleet: &Fleet, ns: &str) -> BTreeMap<String, (i64, String)> {
    let api: Api<Deployment> = Api::namespaced(fleet.client.clone(), ns);
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|d| (d.name_any(), (d.metadata.generation.unwrap(), image_of(d))))
        .collect()
}

fn example(name: &str) -> String {
    repo_path(&format!("manifests/examples/{name}"))
}

#[tokio::test]
async fn basic_succeeds_and_kubectl_wait_sees_it_and_reapplying_changes_nothing() {
    with_fleet("ex-basic", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        storefront(&fleet, &ns, 8).await;
        let op = Operator::start(&ns, &[], &[]);
        kubectl(&["apply", "-n", &ns, "-f", &example("basic.yaml")]).await.ok();
        kubectl(&[
            "wait",
            "-n",
            &ns,
            "--for=condition=Complete",
            "fleetrollout/storefront",
            "--timeout=180s",
        ])
        .await
        .ok();
        let state = storefront_state(&fleet, &ns).await;
        assert!(state.values().all(|(g, i)| *g == 2 && i == NEXT_IMAGE), "{state:?}");
        let got = kubectl(&["get", "fro", "-n", &ns]).await.ok().stdout;
        assert!(got.contains("Succeeded") && got.contains("8/8") && got.contains("4/4"), "{got}");
        let wide = kubectl(&["get", "fleetrollouts", "-n", &ns, "-o", "wide"]).await.ok().stdout;
        assert!(wide.contains("FAILED") && wide.contains("MESSAGE"), "{wide}");
        let by_category = kubectl(&["get", "fleetroll", "-n", &ns]).await.ok().stdout;
        assert!(by_category.contains("storefront"), "{by_category}");

        // GitOps re-applies the same manifest: nothing changes, nothing is written.
        let before = fleet.rollouts().get("storefront").await.unwrap();
        let writes = testkit::operator::metric(&op.metrics().await, "fleetroll_status_writes_total");
        let again = kubectl(&["apply", "-n", &ns, "-f", &example("basic.yaml")]).await.ok();
        assert!(again.stdout.contains("fleetrollout.fleetroll.dev/storefront unchanged"), "{}", again.stdout);
        let after = fleet.rollouts().get("storefront").await.unwrap();
        assert_eq!(after.resource_version(), before.resource_version());
        assert_eq!(after.status.unwrap().revision.unwrap().number, 1);
        assert_eq!(testkit::operator::metric(&op.metrics().await, "fleetroll_status_writes_total"), writes);
        assert_eq!(storefront_state(&fleet, &ns).await, state);
    })
    .await;
}

#[tokio::test]
async fn canary_with_approval_waits_for_the_plan_to_be_approved() {
    with_fleet("ex-canary", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        storefront(&fleet, &ns, 8).await;
        let _op = Operator::start(&ns, &[], &[]);
        kubectl(&["apply", "-n", &ns, "-f", &example("canary-with-approval.yaml")]).await.ok();
        let fr = fleet
            .wait_rollout("storefront-canary", "the approval gate", DEADLINE, |f| {
                phase(f) == Phase::WaitingForApproval
            })
            .await;
        let s = fr.status.clone().unwrap();
        let plan = fleet.plan(&fr).await;
        assert_eq!(s.pending_approval.unwrap().plan_hash, plan.hash);
        let sizes: Vec<usize> = plan.batches.iter().map(Vec::len).collect();
        assert_eq!(sizes, [1, 2, 4, 1], "canary, 25%, then 50% waves");
        assert!(
            storefront_state(&fleet, &ns).await.values().all(|(g, _)| *g == 1),
            "nothing before approval"
        );

        let shown = kubectl(&["fleetroll", "plan", "storefront-canary", "-n", &ns]).await.ok().stdout;
        assert!(shown.contains(&plan.hash) && shown.contains("batch   1  (  1)"), "{shown}");
        kubectl(&["fleetroll", "approve", "storefront-canary", "-n", &ns]).await.ok();
        let fr = fleet
            .wait_rollout("storefront-canary", "the rollout to succeed", DEADLINE, |f| {
                phase(f) == Phase::Succeeded
            })
            .await;
        let s = fr.status.unwrap();
        assert_eq!(
            s.approvals[0].approved_by.as_deref(),
            Some("fleetroll-admin"),
            "who approved, from the kubeconfig"
        );
        assert!(s.batches.iter().all(|b| b.healthy_since.is_some()), "every batch soaked");
        assert!(storefront_state(&fleet, &ns).await.values().all(|(g, i)| *g == 2 && i == NEXT_IMAGE));
    })
    .await;
}

/// The windows example: held with the opening the core computes when its windows are closed (and an
/// approver's override lets it go), rolled at once when they are open.
#[tokio::test]
async fn windows_hold_outside_the_weeknights_and_an_override_lets_it_go() {
    use fleetroll::core::window::{self, Owner, OwnerWindows, Verdict};
    with_fleet("ex-windows", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        storefront(&fleet, &ns, 2).await;
        let fr: FleetRollout =
            serde_saphyr::from_str(&std::fs::read_to_string(example("windows.yaml")).unwrap()).unwrap();
        let owners = OwnerWindows::compile(Owner::Rollout, &fr.spec.strategy.windows).unwrap();
        let judged = || window::judge(&[&owners], k8s_openapi::jiff::Timestamp::now());
        let before = judged();
        let _op = Operator::start(&ns, &[], &[]);
        kubectl(&["apply", "-n", &ns, "-f", &example("windows.yaml")]).await.ok();
        let judged_by_operator = |f: &FleetRollout| {
            let reason = f.status.as_ref().and_then(|s| s.reason.as_deref());
            reason == Some("OutsideWindow") || phase(f) == Phase::Succeeded
        };
        let fr = fleet
            .wait_rollout("storefront-nightly", "the windows judged", DEADLINE, judged_by_operator)
            .await;
        if judged() != before {
            eprintln!("a window opened or closed while the test ran: {before:?}, now {:?}", judged());
            return;
        }
        match before {
            Verdict::Open => assert_eq!(phase(&fr), Phase::Succeeded),
            Verdict::Closed { hold, opens, .. } => {
                let held = fr.status.clone().unwrap().window_hold.unwrap();
                assert_eq!((held.window.as_str(), held.opens_at.map(|t| t.0)), (hold.window.as_str(), opens));
                assert!(
                    storefront_state(&fleet, &ns).await.values().all(|(g, _)| *g == 1),
                    "nothing changed"
                );
                let o =
                    kubectl(&["fleetroll", "approve", "storefront-nightly", "-n", &ns, "--override-windows"])
                        .await
                        .ok();
                assert!(o.stdout.contains("approved batch 1"), "{}", o.stdout);
                let fr = fleet
                    .wait_rollout("storefront-nightly", "the override", DEADLINE, |f| {
                        phase(f) == Phase::Succeeded
                    })
                    .await;
                assert_eq!(
                    fr.status.unwrap().window_overrides[0].overridden_by.as_deref(),
                    Some("fleetroll-admin")
                );
            }
        }
        assert!(storefront_state(&fleet, &ns).await.values().all(|(g, i)| *g == 2 && i == NEXT_IMAGE));
    })
    .await;
}

#[tokio::test]
async fn rollback_on_failure_restores_the_changed_targets() {
    with_fleet("ex-rollback", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        storefront(&fleet, &ns, 4).await;
        let _op = Operator::start(&ns, &[], &[]);
        kubectl(&["apply", "-n", &ns, "-f", &example("rollback-on-failure.yaml")]).await.ok();
        let fr = fleet
            .wait_rollout("storefront-bad-release", "the rollback", DEADLINE, |f| {
                phase(f) == Phase::RolledBack
            })
            .await;
        let s = fr.status.unwrap();
        assert_eq!(s.reason.as_deref(), Some("FailureBudgetExceeded"));
        assert_eq!((s.rollback.as_ref().unwrap().restored, s.counts.failed), (2, 2));
        assert!(s.failures.iter().all(|f| f.reason == "Timeout"));
        let state = storefront_state(&fleet, &ns).await;
        assert!(state.values().all(|(_, i)| i == READY_IMAGE), "{state:?}");
        assert_eq!(
            state.values().filter(|(g, _)| *g == 3).count(),
            2,
            "the first batch: changed and restored"
        );
        assert_eq!(state.values().filter(|(g, _)| *g == 1).count(), 2, "the second batch: never touched");
    })
    .await;
}

#[tokio::test]
async fn cross_namespace_rolls_every_opted_in_tenant() {
    with_fleet("ex-tenants", 3, |fleet| async move {
        let namespaces: Api<Namespace> = Api::all(fleet.client.clone());
        for t in &fleet.tenants {
            namespaces
                .patch(
                    t,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"tier": "tenant"}}})),
                )
                .await
                .unwrap();
            storefront(&fleet, t, 4).await;
        }
        let _op = Operator::start(&fleet.ns, &[], &[]);
        // The example names the default fleet namespace; this test's operator uses its own.
        let mut fr: FleetRollout =
            serde_saphyr::from_str(&std::fs::read_to_string(example("cross-namespace.yaml")).unwrap())
                .unwrap();
        assert_eq!(fr.metadata.namespace.as_deref(), Some("fleetroll-system"));
        fr.metadata.namespace = Some(fleet.ns.clone());
        fleet.rollouts().create(&PostParams::default(), &fr).await.unwrap();
        let fr = fleet
            .wait_rollout("tenants", "the rollout to succeed", DEADLINE, |f| phase(f) == Phase::Succeeded)
            .await;
        let s = fr.status.unwrap();
        assert_eq!((s.counts.total, s.counts.healthy), (12, 12));
        assert_eq!(s.plan.unwrap().batches.iter().map(Vec::len).collect::<Vec<_>>(), [10, 2]);
        for t in &fleet.tenants {
            assert!(storefront_state(&fleet, t).await.values().all(|(g, i)| *g == 2 && i == NEXT_IMAGE));
        }
    })
    .await;
}

#[tokio::test]
async fn gitops_changing_the_image_mid_rollout_supersedes_the_revision() {
    const THIRD: &str = "registry.k8s.io/pause:3.8";
    with_fleet("ex-gitops", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        storefront(&fleet, &ns, 4).await;
        let _op = Operator::start(&ns, &[], &[]);
        let manifest = |image: &str| {
            format!(
                "apiVersion: fleetroll.dev/v1alpha1\nkind: FleetRollout\nmetadata:\n  name: storefront\nspec:\n  image: {image}\n  \
                 targets:\n    kind: Deployment\n    selector:\n      matchLabels:\n        app.kubernetes.io/part-of: storefront\n  \
                 strategy:\n    batchSize: 2\n    approval: EveryBatch\n"
            )
        };
        let file = std::env::temp_dir().join(format!("{ns}-storefront.yaml"));
        let path = file.display().to_string();
        std::fs::write(&file, manifest(NEXT_IMAGE)).unwrap();
        kubectl(&["apply", "-n", &ns, "-f", &path]).await.ok();
        fleet.wait_rollout("storefront", "the first approval", DEADLINE, |f| phase(f) == Phase::WaitingForApproval).await;
        kubectl(&["fleetroll", "approve", "storefront", "-n", &ns]).await.ok();
        fleet
            .wait_rollout("storefront", "the second approval", DEADLINE, |f| {
                f.status.as_ref().and_then(|s| s.pending_approval.as_ref()).is_some_and(|p| p.batch == 1)
            })
            .await;

        // The repository now says v3: apply it mid-rollout.
        std::fs::write(&file, manifest(THIRD)).unwrap();
        let applied = kubectl(&["apply", "-n", &ns, "-f", &path]).await.ok();
        assert!(applied.stdout.contains("configured"), "{}", applied.stdout);
        let fr = fleet
            .wait_rollout("storefront", "revision 2", DEADLINE, |f| {
                f.status.as_ref().is_some_and(|s| s.revision.as_ref().is_some_and(|r| r.number == 2) && s.phase == Phase::WaitingForApproval)
            })
            .await;
        let s = fr.status.unwrap();
        assert_eq!((s.superseded[0].number, s.superseded[0].updated), (1, 2));
        // The new plan needs its own approvals: batch 1, then batch 2.
        kubectl(&["fleetroll", "approve", "storefront", "-n", &ns]).await.ok();
        fleet
            .wait_rollout("storefront", "revision 2's second gate", DEADLINE, |f| {
                f.status.as_ref().and_then(|s| s.pending_approval.as_ref()).is_some_and(|p| p.batch == 1)
            })
            .await;
        kubectl(&["fleetroll", "approve", "storefront", "-n", &ns]).await.ok();
        kubectl(&["wait", "-n", &ns, "--for=condition=Complete", "fleetrollout/storefront", "--timeout=120s"]).await.ok();
        let state = storefront_state(&fleet, &ns).await;
        assert!(state.values().all(|(_, i)| i == THIRD), "{state:?}");
        assert_eq!(state.values().filter(|(g, _)| *g == 3).count(), 2, "the first batch went v1 -> v2 -> v3: {state:?}");
        assert_eq!(state.values().filter(|(g, _)| *g == 2).count(), 2, "the rest went v1 -> v3: {state:?}");
    })
    .await;
}

#[tokio::test]
async fn node_by_node_replaces_the_daemonsets_pod_on_each_edge_node() {
    with_fleet("ex-nodes", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        let client = fleet.client.clone();
        testkit::nodes::with_pool(client.clone(), ns.clone(), 12, |names| async move {
            for node in &names {
                kubectl(&["label", "node", node, "node-role.kubernetes.io/edge=true"]).await.ok();
            }
            testkit::nodes::daemonset(&client, &ns, &ns, READY_IMAGE, 12).await;
            let _op = Operator::start(&ns, &[], &[]);
            kubectl(&["apply", "-n", &ns, "-f", &example("node-by-node.yaml")]).await.ok();
            kubectl(&[
                "wait",
                "-n",
                &ns,
                "--for=condition=Complete",
                "fleetrollout/edge-agent",
                "--timeout=180s",
            ])
            .await
            .ok();
            let fr = fleet.rollouts().get("edge-agent").await.unwrap();
            let s = fr.status.unwrap();
            assert_eq!((s.counts.total, s.counts.healthy, s.batches.len()), (12, 12, 2));
            let pods = testkit::nodes::pods_by_node(&client, &ns).await;
            for node in &names {
                assert_eq!(testkit::nodes::pod_image(&pods[node][0]), NEXT_IMAGE, "{node}");
            }
            let got = kubectl(&["get", "fro", "-n", &ns]).await.ok().stdout;
            assert!(got.contains("Succeeded") && got.contains("12/12") && got.contains("2/2"), "{got}");
        })
        .await;
    })
    .await;
}

/// The notifications example, its sinks' addresses pointed at a receiver and a real Alertmanager here:
/// the webhook hears Started and Succeeded, signed; Alertmanager hears nothing of a rollout that succeeds.
#[tokio::test]
async fn notifications_reach_the_webhook_and_alertmanager_hears_only_trouble() {
    use testkit::{alertmanager::Alertmanager, receiver::Receiver};
    with_fleet("ex-notify", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        storefront(&fleet, &ns, 4).await;
        let receiver = Receiver::start();
        let am = Alertmanager::start(&receiver.url("alertmanager")).await;
        let manifest = std::fs::read_to_string(example("notifications.yaml")).unwrap();
        let local = manifest
            .replace("https://hooks.example.com/fleetroll", &receiver.url("hook"))
            .replace("http://alertmanager.monitoring:9093", &am.url());
        assert_ne!(local, manifest, "the example names the sinks this test replaces");
        let path = std::env::temp_dir().join(format!("{ns}-notifications.yaml"));
        std::fs::write(&path, local).unwrap();
        let _op = Operator::start(&ns, &["--notify-allow=*=127.0.0.0/8"], &[]);
        kubectl(&["apply", "-n", &ns, "-f", path.to_str().unwrap()]).await.ok();
        fleet
            .wait_rollout("storefront-notified", "success", DEADLINE, |f| phase(f) == Phase::Succeeded)
            .await;
        let kinds = |r: &[testkit::receiver::Request]| -> Vec<String> {
            let hooks = r.iter().filter(|r| r.path.ends_with("/hook")).filter_map(|r| r.json.clone());
            let mut kinds: Vec<String> =
                hooks.map(|b| b["kind"].as_str().unwrap_or_default().to_string()).collect();
            kinds.dedup();
            kinds
        };
        let got = receiver.wait_for(DEADLINE, |r| kinds(r).len() >= 2).await;
        assert_eq!(kinds(&got), ["Started", "Succeeded"]);
        assert!(got.iter().all(|r| !r.path.ends_with("/hook") || r.header("webhook-signature").is_some()));
        let empty = |f: &FleetRollout| {
            f.status.as_ref().and_then(|s| s.notifications.as_ref()).is_none_or(|o| o.pending.is_empty())
        };
        fleet.wait_rollout("storefront-notified", "an empty outbox", DEADLINE, empty).await;
        assert!(am.alerts().await.is_empty(), "a rollout that succeeds raises no alert");
        let _ = std::fs::remove_file(path);
    })
    .await;
}
