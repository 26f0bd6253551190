//! Gates work across member clusters as in one: each batch waits for its approval, a Target metric told
//! each target's cluster by `{{cluster}}` judges it against a real Prometheus, and a failing member batch
//! rolls both members back.

use std::sync::Arc;

use fleetroll::api::{FleetRollout, MetricPhase, Phase};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use serde_json::json;

use super::support::{self, DEADLINE, OPERATOR_ACCOUNT, Site, register, site, spec, tidy, unique};
use testkit::{
    fleet::{NEXT_IMAGE, READY_IMAGE, metric_run, phase, with_fleet},
    operator::Operator,
    poll_until,
    prometheus::{ERRORS, Exporter, Options, Prometheus, REQUESTS, REQUESTS_PER_SEC, errors_after_change},
};

/// The exporter's `namespace` label of a member's namespace: the same namespace and Deployment names exist
/// in both members, so only the cluster tells their series apart.
fn series_namespace(site: &Site) -> String {
    format!("{}/{}", site.member.name, site.ns)
}

fn waiting_for_approval(batch: u32) -> impl Fn(&FleetRollout) -> bool {
    move |fr| {
        phase(fr) == Phase::WaitingForApproval
            && fr.status.as_ref().and_then(|s| s.pending_approval.as_ref()).is_some_and(|p| p.batch == batch)
    }
}

fn images(state: &std::collections::HashMap<String, (String, i64)>) -> Vec<&str> {
    let mut images: Vec<&str> = state.values().map(|(image, _)| image.as_str()).collect();
    images.sort();
    images
}

#[tokio::test]
async fn approvals_and_a_metric_per_cluster_gate_each_member_batch_and_a_failing_member_rolls_both_back() {
    if !support::members_up() {
        return;
    }
    let _shared = support::FREEZE.read().await;
    with_fleet("gates", 0, |fleet| async move {
        let team = unique("gates");
        let one = site("member-1", &team, &team, 2, READY_IMAGE, true).await;
        let two = site("member-2", &team, &team, 2, READY_IMAGE, true).await;
        let exporter = Arc::new(Exporter::start());
        for site in [&one, &two] {
            for name in site.state().await.keys() {
                exporter.set_rate(&series_namespace(site), name, REQUESTS_PER_SEC, 0.0);
            }
        }
        let prometheus = Prometheus::start(&exporter, Options::default()).await;
        prometheus.wait_for_series(&format!("min(count_over_time({REQUESTS}[1h])) >= 7")).await;
        register(&fleet, &[&one, &two], OPERATOR_ACCOUNT).await;
        let address = format!("--analysis-prometheus-address={}", prometheus.address());
        let _op = Operator::start(&fleet.ns, &[&address], &[]);

        let selector = r#"namespace="{{cluster}}/{{namespace}}", deployment="{{name}}""#;
        let query =
            format!("sum(rate({ERRORS}{{{selector}}}[5s])) / sum(rate({REQUESTS}{{{selector}}}[5s]))");
        let mut rollout = spec(NEXT_IMAGE, &team, 2);
        rollout["strategy"]["approval"] = json!("EveryBatch");
        rollout["strategy"]["onFailure"] = json!("Rollback");
        rollout["health"] = json!({"timeout": "2m"});
        rollout["analysis"] = json!({"metrics": [{
            "name": "error-rate", "scope": "Target", "query": query, "thresholdRange": {"max": 0.05},
            "initialDelay": "3s", "interval": "1s", "count": 2,
        }]});
        fleet.rollout("gated", rollout).await;

        // Nothing changes anywhere before the canary cluster's batch is approved.
        let fr = fleet.wait_rollout("gated", "approval of batch 1", DEADLINE, waiting_for_approval(0)).await;
        let hash = fr.status.as_ref().and_then(|s| s.plan.as_ref()).map(|p| p.hash.clone()).unwrap();
        assert_eq!(images(&one.state().await), [READY_IMAGE, READY_IMAGE]);
        assert_eq!(images(&two.state().await), [READY_IMAGE, READY_IMAGE]);

        // Approved: the canary cluster's batch changes, passes its analysis, and the next waits in turn.
        fleet.approve("gated", &[0], &hash).await;
        let fr = fleet.wait_rollout("gated", "approval of batch 2", DEADLINE, waiting_for_approval(1)).await;
        let canary = metric_run(&fr, 0, "error-rate");
        assert_eq!((canary.phase, canary.successful, canary.failed), (MetricPhase::Successful, 2, 0));
        assert_eq!(images(&one.state().await), [NEXT_IMAGE, NEXT_IMAGE]);
        assert_eq!(images(&two.state().await), [READY_IMAGE, READY_IMAGE], "member-2 waits for its approval");
        // Each measurement is an event of its own, read as it was said (not counted in the first's series).
        let events: Api<Event> = Api::namespaced(fleet.client.clone(), &fleet.ns);
        poll_until("an event for each of the canary batch's measurements", DEADLINE, || async {
            let notes: Vec<String> = events
                .list(&Default::default())
                .await
                .map(|l| l.items.into_iter().filter_map(|e| e.note).collect())
                .unwrap_or_default();
            ["1/2 taken", "2/2 taken"]
                .iter()
                .all(|taken| notes.iter().any(|n| n.starts_with("batch 1: error-rate") && n.contains(taken)))
        })
        .await;

        // member-2's web-00 fails once changed; its namesake on member-1 serves no errors, so only a query
        // told the cluster can tell them apart.
        let errors = errors_after_change(
            two.deployments(),
            exporter.clone(),
            &series_namespace(&two),
            &["web-00"],
            0.5,
        );
        fleet.approve("gated", &[0, 1], &hash).await;
        let fr =
            fleet.wait_rollout("gated", "the rollout to end", DEADLINE, |fr| phase(fr).is_terminal()).await;
        errors.abort();
        let status = fr.status.clone().unwrap();
        assert_eq!(status.phase, Phase::RolledBack, "{status:?}");
        assert_eq!(status.rollback.as_ref().map(|r| r.reason.as_str()), Some("AnalysisFailed"));
        let failed = metric_run(&fr, 1, "error-rate");
        assert_eq!((failed.phase, failed.failed), (MetricPhase::Failed, 1), "{failed:?}");
        let message = failed.measurements.last().and_then(|m| m.message.clone()).unwrap_or_default();
        assert!(message.contains(&format!("member-2/{team}/web-00")), "names the offender: {message}");
        assert!(!message.contains("member-1/"), "blames only member-2: {message}");

        // Both members are back on the old image.
        assert_eq!(images(&one.state().await), [READY_IMAGE, READY_IMAGE]);
        assert_eq!(images(&two.state().await), [READY_IMAGE, READY_IMAGE]);
        tidy(&[&one, &two]).await;
    })
    .await;
}
