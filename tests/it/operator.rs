//! The operator on the real control plane: whole rollouts, failure policies, gates, spec changes and specs
//! it cannot act on. Each test runs the real binary against its own namespaces.

use std::{collections::HashMap, time::Duration};

use fleetroll::api::{APPLIED_ANNOTATION, Phase};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, ResourceExt, api::ListParams};
use serde_json::json;
use testkit::{
    fleet::{
        Fleet, NEXT_IMAGE, READY_IMAGE, UNREADY_IMAGE, condition, image_of, observe_fleet, phase, with_fleet,
    },
    operator::Operator,
};

const DEADLINE: Duration = Duration::from_secs(180);

#[tokio::test]
async fn forty_deployments_in_four_namespaces_roll_ten_at_a_time_each_changed_once() {
    with_fleet("forty", 4, |fleet| async move {
        fleet.tenant_deployments(10).await;
        let before: HashMap<String, i64> = fleet
            .all_deployments()
            .await
            .iter()
            .map(|d| (format!("{}/{}", d.namespace().unwrap(), d.name_any()), d.metadata.generation.unwrap()))
            .collect();
        assert_eq!(before.len(), 40);
        let (seen, watch) = observe_fleet(&fleet, NEXT_IMAGE);
        let _op = Operator::start(&fleet.ns, &[], &[]);
        fleet
            .rollout(
                "tenants",
                json!({
                    "image": NEXT_IMAGE,
                    "targets": {
                        "kind": "Deployment",
                        "selector": {"matchLabels": {"fleet": "web"}},
                        "namespaceSelector": {"matchLabels": {"fleetroll.dev/test-fleet": fleet.ns}},
                    },
                    "strategy": {"batchSize": 10},
                }),
            )
            .await;
        let fr = fleet
            .wait_rollout("tenants", "the rollout to succeed", DEADLINE, |f| phase(f) == Phase::Succeeded)
            .await;
        watch.abort();

        let status = fr.status.clone().unwrap();
        assert_eq!(
            (status.counts.total, status.counts.updated, status.counts.healthy, status.counts.failed),
            (40, 40, 40, 0)
        );
        assert_eq!(status.batch.as_deref(), Some("4/4"));
        assert_eq!(condition(&fr, "Complete").map(|c| c.status.as_str()), Some("True"));

        // Every Deployment's generation rose by exactly one, and each carries its batch's key.
        let plan = fleet.plan(&fr).await;
        let batch_of: HashMap<String, usize> = plan
            .batches
            .iter()
            .enumerate()
            .flat_map(|(i, b)| b.iter().map(move |t| (format!("{}/{}", t.namespace, t.name), i)))
            .collect();
        let uid = fr.uid().unwrap();
        for d in fleet.all_deployments().await {
            let key = format!("{}/{}", d.namespace().unwrap(), d.name_any());
            assert_eq!(image_of(&d), NEXT_IMAGE, "{key}");
            assert_eq!(d.metadata.generation, Some(before[&key] + 1), "{key} was changed more than once");
            let applied = d.annotations().get(APPLIED_ANNOTATION).cloned().unwrap_or_default();
            assert_eq!(applied, format!("{uid}/1/{}", batch_of[&key]), "{key}");
        }

        let reasons = ["Planned", "BatchStarted", "BatchApplied", "BatchSucceeded", "Succeeded"];
        fleet.wait_events("tenants", &reasons, DEADLINE).await;

        // Batches ran in order: no target of batch k changed before every target of batch k-1 rolled out.
        let o = seen.lock().unwrap();
        assert_eq!(o.changed.len(), 40);
        assert!(o.max_in_flight <= 10, "{} targets were in flight at once", o.max_in_flight);
        for k in 1..plan.batches.len() {
            let members = |b: usize| batch_of.iter().filter(move |(_, i)| **i == b).map(|(t, _)| t.clone());
            let first_change = members(k).map(|t| o.changed[&t]).min().unwrap();
            let last_rolled = members(k - 1).map(|t| o.rolled[&t]).max().unwrap();
            assert!(first_change >= last_rolled, "batch {k} started before batch {} was healthy", k - 1);
        }
    })
    .await;
}

/// Six targets, batches of two, an image whose pods never become ready.
fn failing_spec(on_failure: &str) -> serde_json::Value {
    json!({
        "image": UNREADY_IMAGE,
        "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
        "strategy": {"batchSize": 2, "onFailure": on_failure},
        "health": {"timeout": "5s"},
    })
}

async fn generations(fleet: &Fleet) -> HashMap<String, (i64, String)> {
    fleet
        .all_deployments()
        .await
        .iter()
        .map(|d| (d.name_any(), (d.metadata.generation.unwrap(), image_of(d))))
        .collect()
}

#[tokio::test]
async fn a_failing_batch_pauses_the_rollout_and_abort_ends_it() {
    with_fleet("fail-pause", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 6, READY_IMAGE).await;
        let _op = Operator::start(&fleet.ns, &[], &[]);
        fleet.rollout("bad", failing_spec("Pause")).await;
        let fr = fleet
            .wait_rollout("bad", "the rollout to pause on failures", DEADLINE, |f| phase(f) == Phase::Paused)
            .await;
        let s = fr.status.clone().unwrap();
        assert_eq!(s.reason.as_deref(), Some("FailureBudgetExceeded"));
        assert_eq!((s.counts.updated, s.counts.failed), (2, 2));
        assert!(s.failures.iter().all(|f| f.reason == "Timeout" && f.batch == 0), "{:?}", s.failures);
        let degraded = condition(&fr, "Degraded").unwrap();
        assert_eq!((degraded.status.as_str(), degraded.reason.as_str()), ("True", "FailureBudgetExceeded"));
        let gens = generations(&fleet).await;
        assert_eq!(gens.values().filter(|(g, i)| *g == 2 && i == UNREADY_IMAGE).count(), 2);
        assert_eq!(gens.values().filter(|(g, i)| *g == 1 && i == READY_IMAGE).count(), 4, "{gens:?}");
        fleet.wait_events("bad", &["BatchFailed", "FailureBudgetExceeded"], DEADLINE).await;

        fleet.patch_spec("bad", json!({"abort": true})).await;
        let fr = fleet
            .wait_rollout("bad", "the rollout to be aborted", DEADLINE, |f| phase(f) == Phase::Aborted)
            .await;
        assert_eq!(fr.status.unwrap().reason.as_deref(), Some("AbortRequested"));
        assert_eq!(generations(&fleet).await, gens, "abort changed a target");
    })
    .await;
}

#[tokio::test]
async fn the_rollback_policy_restores_each_changed_target_once() {
    with_fleet("fail-rollback", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 6, READY_IMAGE).await;
        let _op = Operator::start(&fleet.ns, &[], &[]);
        fleet.rollout("bad", failing_spec("Rollback")).await;
        let fr = fleet
            .wait_rollout("bad", "the rollout to roll back", DEADLINE, |f| phase(f) == Phase::RolledBack)
            .await;
        let s = fr.status.unwrap();
        let rb = s.rollback.unwrap();
        assert_eq!((rb.reason.as_str(), rb.restored, rb.skipped), ("FailureBudgetExceeded", 2, 0));
        // Changed twice (forward, then back), the rest never touched; everyone on the old image.
        let gens = generations(&fleet).await;
        assert_eq!(gens.values().filter(|(g, _)| *g == 3).count(), 2, "{gens:?}");
        assert_eq!(gens.values().filter(|(g, _)| *g == 1).count(), 4, "{gens:?}");
        assert!(gens.values().all(|(_, i)| i == READY_IMAGE), "{gens:?}");
        fleet.wait_events("bad", &["RolledBack"], DEADLINE).await;
    })
    .await;
}

#[tokio::test]
async fn the_abort_policy_fails_the_rollout_and_leaves_targets_as_they_are() {
    with_fleet("fail-abort", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 6, READY_IMAGE).await;
        let _op = Operator::start(&fleet.ns, &[], &[]);
        fleet.rollout("bad", failing_spec("Abort")).await;
        let fr =
            fleet.wait_rollout("bad", "the rollout to fail", DEADLINE, |f| phase(f) == Phase::Failed).await;
        assert_eq!(fr.status.as_ref().unwrap().reason.as_deref(), Some("FailureBudgetExceeded"));
        assert_eq!(condition(&fr, "Complete").map(|c| c.status.as_str()), Some("False"));
        let gens = generations(&fleet).await;
        assert_eq!(gens.values().filter(|(g, i)| *g == 2 && i == UNREADY_IMAGE).count(), 2, "{gens:?}");
        assert_eq!(gens.values().filter(|(g, _)| *g == 1).count(), 4, "{gens:?}");
    })
    .await;
}

#[tokio::test]
async fn approvals_gate_batches_and_pause_holds_them() {
    with_fleet("gates", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 4, READY_IMAGE).await;
        let _op = Operator::start(&fleet.ns, &[], &[]);
        fleet
            .rollout(
                "gated",
                json!({
                    "image": NEXT_IMAGE,
                    "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
                    "strategy": {"batchSize": 2, "approval": "EveryBatch"},
                }),
            )
            .await;
        let waiting = |batch: u32| {
            move |f: &fleetroll::api::FleetRollout| {
                phase(f) == Phase::WaitingForApproval
                    && f.status
                        .as_ref()
                        .and_then(|s| s.pending_approval.as_ref())
                        .is_some_and(|p| p.batch == batch)
            }
        };
        let fr = fleet.wait_rollout("gated", "approval of batch 1", DEADLINE, waiting(0)).await;
        let hash = fr.status.as_ref().unwrap().plan.as_ref().unwrap().hash.clone();
        assert_eq!(fr.status.as_ref().unwrap().pending_approval.as_ref().unwrap().plan_hash, hash);
        assert_eq!(condition(&fr, "Paused").map(|c| c.status.as_str()), Some("True"));
        assert!(
            fleet.all_deployments().await.iter().all(|d| image_of(d) == READY_IMAGE),
            "nothing changes before approval"
        );

        // An approval of another plan does not count.
        fleet.approve("gated", &[0], "0000000000000000").await;
        fleet.patch_spec("gated", json!({"paused": true})).await;
        fleet
            .wait_rollout("gated", "the status to see the new generation", DEADLINE, |f| {
                f.status.as_ref().and_then(|s| s.observed_generation) == f.metadata.generation
            })
            .await;
        assert!(fleet.all_deployments().await.iter().all(|d| image_of(d) == READY_IMAGE));

        // The right approval while paused: pause wins. An approval may name only the user who writes it (the
        // admission policy).
        let gates = fleet.gates("gated").await;
        let approval =
            json!({"batch": 0, "planHash": hash, "gatesHash": gates, "approvedBy": "fleetroll-admin"});
        fleet.patch_spec("gated", json!({ "approvals": [approval] })).await;
        let fr = fleet
            .wait_rollout("gated", "the rollout to be paused", DEADLINE, |f| phase(f) == Phase::Paused)
            .await;
        assert_eq!(fr.status.unwrap().reason.as_deref(), Some("PausedBySpec"));

        fleet.patch_spec("gated", json!({"paused": false})).await;
        let fr = fleet.wait_rollout("gated", "approval of batch 2", DEADLINE, waiting(1)).await;
        let s = fr.status.unwrap();
        assert_eq!(s.approvals[0].approved_by.as_deref(), Some("fleetroll-admin"));
        assert_eq!(fleet.all_deployments().await.iter().filter(|d| image_of(d) == NEXT_IMAGE).count(), 2);

        // A matching Deployment created after planning is reported, never added.
        let api: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(fleet.client.clone(), &fleet.ns);
        let late = testkit::fleet::deployment("web-late", READY_IMAGE, &[("fleet", "web")]);
        api.create(&Default::default(), &late).await.unwrap();
        // Available means the operator's own watch has long seen it too.
        testkit::wait_for(&api, "web-late", "web-late to be available", DEADLINE, |d| {
            d.status.as_ref().and_then(|s| s.available_replicas) == Some(1)
        })
        .await;
        fleet.approve("gated", &[0, 1], &hash).await;
        let fr = fleet
            .wait_rollout("gated", "the rollout to succeed", DEADLINE, |f| phase(f) == Phase::Succeeded)
            .await;
        let unplanned = fr.status.unwrap().unplanned.unwrap();
        assert_eq!((unplanned.count, unplanned.sample), (1, vec![format!("{}/web-late", fleet.ns)]));
        assert_eq!(image_of(&api.get("web-late").await.unwrap()), READY_IMAGE);
        let planned: Vec<_> =
            fleet.all_deployments().await.into_iter().filter(|d| d.name_any() != "web-late").collect();
        assert!(planned.iter().all(|d| image_of(d) == NEXT_IMAGE));
    })
    .await;
}

#[tokio::test]
async fn a_new_image_mid_rollout_supersedes_the_revision_and_rollback_restores_the_original() {
    const THIRD: &str = "registry.k8s.io/pause:3.8";
    with_fleet("supersede", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 4, READY_IMAGE).await;
        let _op = Operator::start(&fleet.ns, &[], &[]);
        fleet
            .rollout(
                "web",
                json!({
                    "image": NEXT_IMAGE,
                    "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
                    "strategy": {"batchSize": 2, "approval": "EveryBatch"},
                }),
            )
            .await;
        let fr = fleet
            .wait_rollout("web", "the first approval", DEADLINE, |f| phase(f) == Phase::WaitingForApproval)
            .await;
        let hash = fr.status.unwrap().plan.unwrap().hash;
        fleet.approve("web", &[0], &hash).await;
        fleet
            .wait_rollout("web", "the second approval", DEADLINE, |f| {
                f.status.as_ref().and_then(|s| s.pending_approval.as_ref()).is_some_and(|p| p.batch == 1)
            })
            .await;

        // Mid-rollout, the image changes: revision 2 is planned afresh, and needs its own approvals.
        fleet.patch_spec("web", json!({"image": THIRD})).await;
        let fr = fleet
            .wait_rollout("web", "revision 2 to wait for approval", DEADLINE, |f| {
                f.status.as_ref().is_some_and(|s| {
                    s.revision.as_ref().is_some_and(|r| r.number == 2) && s.phase == Phase::WaitingForApproval
                })
            })
            .await;
        let s = fr.status.unwrap();
        assert_eq!(
            (s.superseded[0].number, s.superseded[0].updated, s.superseded[0].image.as_str()),
            (1, 2, NEXT_IMAGE)
        );
        let hash2 = s.plan.unwrap().hash;
        assert_ne!(hash, hash2, "a changed plan needs a new approval");
        fleet.approve("web", &[0, 1], &hash2).await;
        fleet.wait_rollout("web", "revision 2 to succeed", DEADLINE, |f| phase(f) == Phase::Succeeded).await;
        let gens = generations(&fleet).await;
        assert!(gens.values().all(|(_, i)| i == THIRD), "{gens:?}");
        // Two targets went v1 -> v2 -> v3, two went v1 -> v3.
        assert_eq!(gens.values().filter(|(g, _)| *g == 3).count(), 2, "{gens:?}");
        assert_eq!(gens.values().filter(|(g, _)| *g == 2).count(), 2, "{gens:?}");
        fleet.wait_events("web", &["Superseded"], DEADLINE).await;

        // Rollback restores what each target had before this rollout first touched it.
        fleet.patch_spec("web", json!({"rollback": true})).await;
        fleet.wait_rollout("web", "the rollback", DEADLINE, |f| phase(f) == Phase::RolledBack).await;
        assert!(generations(&fleet).await.values().all(|(_, i)| i == READY_IMAGE));
    })
    .await;
}

#[tokio::test]
async fn large_plans_are_stored_in_owned_immutable_configmaps() {
    with_fleet("shards", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 12, READY_IMAGE).await;
        let _op =
            Operator::start(&fleet.ns, &["--plan-inline-max-bytes", "0", "--plan-shard-targets", "5"], &[]);
        fleet
            .rollout(
                "big",
                json!({
                    "image": NEXT_IMAGE,
                    "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
                    "strategy": {"batchSize": 4},
                }),
            )
            .await;
        let fr = fleet
            .wait_rollout("big", "the rollout to succeed", DEADLINE, |f| phase(f) == Phase::Succeeded)
            .await;
        let plan = fr.status.as_ref().unwrap().plan.clone().unwrap();
        assert!(plan.batches.is_empty(), "the plan is not in status");
        assert_eq!(plan.shards.len(), 3);
        let cms: Api<ConfigMap> = Api::namespaced(fleet.client.clone(), &fleet.ns);
        for name in &plan.shards {
            let cm = cms.get(name).await.unwrap();
            assert_eq!(cm.immutable, Some(true));
            let owner = &cm.owner_references()[0];
            assert_eq!(
                (owner.kind.as_str(), owner.uid.as_str()),
                ("FleetRollout", fr.uid().unwrap().as_str())
            );
        }
        assert!(fleet.all_deployments().await.iter().all(|d| image_of(d) == NEXT_IMAGE));
        let listed = cms
            .list(&ListParams::default().labels(&format!("fleetroll.dev/plan={}", plan.hash)))
            .await
            .unwrap();
        assert_eq!(listed.items.len(), 3);
    })
    .await;
}

#[tokio::test]
async fn a_failing_http_check_fails_its_target() {
    // Every target answers 200 except web-01, which answers 503.
    let app = axum::Router::new().route(
        "/{namespace}/{name}",
        axum::routing::get(
            |axum::extract::Path((_ns, name)): axum::extract::Path<(String, String)>| async move {
                if name == "web-01" {
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                } else {
                    axum::http::StatusCode::OK
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    with_fleet("http", 0, move |fleet| async move {
        fleet.deployments(&fleet.ns, 4, READY_IMAGE).await;
        // The check server listens on loopback, which health checks reach only when the operator allows it.
        let _op = Operator::start(&fleet.ns, &["--http-check-allow", "127.0.0.1"], &[]);
        fleet
            .rollout(
                "checked",
                json!({
                    "image": NEXT_IMAGE,
                    "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
                    "strategy": {"batchSize": 2, "maxFailures": 0},
                    "health": {"timeout": "5s", "http": {"url": format!("http://127.0.0.1:{port}/{{namespace}}/{{name}}")}},
                }),
            )
            .await;
        let fr = fleet.wait_rollout("checked", "the rollout to pause", DEADLINE, |f| phase(f) == Phase::Paused).await;
        let s = fr.status.unwrap();
        assert_eq!((s.counts.healthy, s.counts.failed), (1, 1));
        let f = &s.failures[0];
        assert_eq!((f.name.as_str(), f.reason.as_str()), ("web-01", "HttpCheckFailed"));
        assert!(f.message.contains("returned 503, expected 200"), "{}", f.message);
    })
    .await;
    server.abort();
}

#[tokio::test]
async fn statefulsets_and_daemonsets_roll_with_their_own_health_rules() {
    with_fleet("kinds", 0, |fleet| async move {
        let sts: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(fleet.client.clone(), &fleet.ns);
        let ds: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::namespaced(fleet.client.clone(), &fleet.ns);
        for i in 0..2 {
            let name = format!("db-{i}");
            let s = serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": name, "labels": {"fleet": "db"}},
                "spec": {
                    "replicas": 2, "serviceName": name, "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "db", "image": READY_IMAGE}]}}
                }
            }))
            .unwrap();
            sts.create(&Default::default(), &s).await.unwrap();
            let name = format!("agent-{i}");
            let d = serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": name, "labels": {"fleet": "agent"}},
                "spec": {
                    "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "agent", "image": READY_IMAGE}]}}
                }
            }))
            .unwrap();
            ds.create(&Default::default(), &d).await.unwrap();
        }
        let _op = Operator::start(&fleet.ns, &[], &[]);
        for (name, kind, fleet_label) in [("dbs", "StatefulSet", "db"), ("agents", "DaemonSet", "agent")] {
            fleet
                .rollout(
                    name,
                    json!({
                        "image": NEXT_IMAGE,
                        "targets": {"kind": kind, "selector": {"matchLabels": {"fleet": fleet_label}}},
                        "strategy": {"batchSize": 1},
                    }),
                )
                .await;
        }
        for name in ["dbs", "agents"] {
            let fr = fleet.wait_rollout(name, "the rollout to succeed", DEADLINE, |f| phase(f) == Phase::Succeeded).await;
            assert_eq!(fr.status.unwrap().counts.healthy, 2);
        }
        // Succeeded means each workload's own rollout finished on the new image.
        for s in sts.list(&ListParams::default()).await.unwrap() {
            let st = s.status.clone().unwrap();
            assert_eq!(s.spec.template.spec.as_ref().unwrap().containers[0].image.as_deref(), Some(NEXT_IMAGE));
            assert_eq!((st.updated_replicas, st.ready_replicas), (Some(2), Some(2)));
            assert_eq!(st.current_revision, st.update_revision);
        }
        for d in ds.list(&ListParams::default()).await.unwrap() {
            let st = d.status.clone().unwrap();
            assert_eq!(d.spec.template.spec.as_ref().unwrap().containers[0].image.as_deref(), Some(NEXT_IMAGE));
            assert!(st.desired_number_scheduled >= 10, "one pod per kwok node");
            assert_eq!(st.updated_number_scheduled, Some(st.desired_number_scheduled));
            assert_eq!(st.number_available, Some(st.desired_number_scheduled));
        }
    })
    .await;
}

#[tokio::test]
async fn a_finished_rollout_is_deleted_after_its_ttl() {
    with_fleet("ttl", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 2, READY_IMAGE).await;
        let _op = Operator::start(&fleet.ns, &[], &[]);
        let created = fleet
            .rollout(
                "short-lived",
                json!({
                    "image": NEXT_IMAGE,
                    "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
                    "ttlSecondsAfterFinished": 2,
                }),
            )
            .await;
        fleet
            .wait_rollout("short-lived", "the rollout to succeed", DEADLINE, |f| phase(f) == Phase::Succeeded)
            .await;
        let uid = created.uid().unwrap();
        assert!(
            fleet.wait_deleted("short-lived", &uid, DEADLINE).await,
            "the rollout was not deleted after its TTL"
        );
        assert!(fleet.all_deployments().await.iter().all(|d| image_of(d) == NEXT_IMAGE));
    })
    .await;
}
