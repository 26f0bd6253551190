//! Metric analysis gates against a real Prometheus (built by tests/testenv) scraping an exporter the test
//! controls: a rising error rate fails a batch and rolls back; a healthy fleet passes (a failing dry-run
//! metric changes nothing); no data pauses as Inconclusive until resumed, or fails with onNoData: Fail (and
//! Argo CD's resume action lets it go on); GitOps tools read each hold as documented; a
//! backend outage pauses as AnalysisError and measuring resumes when it returns; credentials come from a
//! labelled Secret; a SIGKILL mid-analysis never counts a measurement twice; an analysis the operator
//! cannot run is Degraded before anything changes; a backend bound to another namespace is never asked.

mod support;

use std::collections::BTreeMap;

use fleetroll::api::{MetricPhase, Phase};
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use support::{DEADLINE, argo_resume, capture, judged, lab, reason, spec};
use testkit::{
    cli::{kubectl, repo_path},
    fleet::{NEXT_IMAGE, READY_IMAGE, condition, image_of, metric_run, phase, with_fleet},
    operator::{Operator, metric},
    prometheus::{
        ERRORS, Exporter, Options, PASSWORD, Prometheus, REQUESTS, REQUESTS_PER_SEC, USER, error_ratio_query,
        errors_after_change,
    },
};

#[tokio::test]
async fn a_batch_whose_error_rate_rises_fails_and_rolls_back() {
    with_fleet("an-fail", 0, |fleet| async move {
        let lab = lab(&fleet, 6, Options::default(), &[]).await;
        let analysis = json!({"metrics": [{
            "name": "error-rate", "query": error_ratio_query(), "thresholdRange": {"max": 0.05},
            "initialDelay": "3s", "interval": "1s", "count": 2,
        }]});
        fleet.rollout("bad-release", spec(2, "Rollback", analysis)).await;
        let fr = fleet.wait_rollout("bad-release", "planned", DEADLINE, testkit::fleet::has_plan).await;
        let plan = fleet.plan(&fr).await;
        let second: Vec<&str> = plan.batch(1).iter().map(|t| t.name.as_str()).collect();
        let deployments = Api::namespaced(fleet.client.clone(), &fleet.ns);
        let _errors = errors_after_change(deployments, lab.exporter.clone(), &fleet.ns, &second, 0.5);

        let fr =
            fleet.wait_rollout("bad-release", "rolled back", DEADLINE, |fr| phase(fr).is_terminal()).await;
        let status = fr.status.clone().unwrap();
        assert_eq!(status.phase, Phase::RolledBack, "{status:?}");
        assert_eq!(status.rollback.as_ref().unwrap().reason, "AnalysisFailed");
        let first = metric_run(&fr, 0, "error-rate");
        assert_eq!((first.phase, first.successful, first.failed), (MetricPhase::Successful, 2, 0));
        let failed = metric_run(&fr, 1, "error-rate");
        assert_eq!((failed.phase, failed.failed), (MetricPhase::Failed, 1), "{failed:?}");
        let message = failed.measurements.last().unwrap().message.clone().unwrap();
        assert!(
            second.iter().any(|d| message.contains(&format!("deployment=\"{d}\""))),
            "names the offender: {message}"
        );
        // Every target is back on its previous image; the third batch was never touched.
        for d in fleet.all_deployments().await {
            assert_eq!(image_of(&d), READY_IMAGE);
        }
        fleet
            .wait_events("bad-release", &["AnalysisStarted", "AnalysisPassed", "AnalysisFailed"], DEADLINE)
            .await;
        let failed_measurements = metric(
            &lab.operator.metrics().await,
            "fleetroll_analysis_measurements_total{metric=\"error-rate\",phase=\"Failed\",dry_run=\"false\"}",
        );
        assert_eq!(failed_measurements, Some(1.0));
    })
    .await;
}

/// The example manifest, pointed at the test's backend and metric names, in batches of two.
fn example(address: &str) -> Value {
    let text = std::fs::read_to_string(repo_path("manifests/examples/analysis.yaml"))
        .unwrap()
        .replace("http://prometheus.monitoring:9090", address)
        .replace("http_errors_total", ERRORS)
        .replace("http_requests_total", REQUESTS);
    let mut fr: Value = serde_saphyr::from_str(&text).unwrap();
    let spec = &mut fr["spec"];
    spec["targets"]["selector"] = json!({"matchLabels": {"fleet": "web"}});
    spec["health"]["soak"] = json!("2s");
    let metrics = spec["analysis"]["metrics"].as_array_mut().unwrap();
    metrics[0]["interval"] = json!("2s");
    // The example's dry run reads a latency histogram the exporter does not serve: read the request rate
    // instead, against a range it is outside of, so the dry run fails.
    metrics[1]["query"] = json!(format!(
        "sum(rate({REQUESTS}{{namespace=\"{{{{namespace}}}}\", deployment=\"{{{{name}}}}\"}}[5s]))"
    ));
    metrics[1]["interval"] = json!("1s");
    metrics[1]["count"] = json!(1);
    spec.clone()
}

#[tokio::test]
async fn a_healthy_fleet_passes_every_batch_and_a_failing_dry_run_changes_nothing() {
    with_fleet("an-pass", 0, |fleet| async move {
        let lab = lab(&fleet, 4, Options::default(), &[]).await;
        fleet.rollout("good-release", example(&lab.prometheus.address())).await;
        let fr = fleet.wait_rollout("good-release", "finished", DEADLINE, |fr| phase(fr).is_terminal()).await;
        assert_eq!(phase(&fr), Phase::Succeeded, "{:?}", fr.status);
        for batch in 0..2 {
            let r = metric_run(&fr, batch, "error-rate");
            assert_eq!(
                (r.phase, r.successful, r.failed, r.inconclusive),
                (MetricPhase::Successful, 3, 0, 0),
                "{r:?}"
            );
            let dry = metric_run(&fr, batch, "p99-latency");
            assert!(
                dry.dry_run && dry.phase == MetricPhase::Failed,
                "the dry run failed and was reported: {dry:?}"
            );
            assert!(
                dry.measurements[0].message.as_deref().unwrap().contains(&fleet.ns),
                "names the targets: {dry:?}"
            );
        }
        for d in fleet.all_deployments().await {
            assert_eq!(image_of(&d), NEXT_IMAGE);
        }
        let dry_failures = metric(
            &lab.operator.metrics().await,
            "fleetroll_analysis_measurements_total{metric=\"p99-latency\",phase=\"Failed\",dry_run=\"true\"}",
        );
        assert_eq!(dry_failures, Some(2.0));
    })
    .await;
}

#[tokio::test]
async fn no_data_pauses_as_inconclusive_until_resumed_and_on_no_data_fail_fails() {
    with_fleet("an-nodata", 0, |fleet| async move {
        let _lab = lab(&fleet, 2, Options::default(), &[]).await;
        let absent = "sum(rate(fleetroll_test_absent_total{deployment=~\"{{targets}}\"}[5s]))";
        let analysis = json!({"metrics": [{"name": "absent", "query": absent, "thresholdRange": {"max": 1}, "interval": "1s", "count": 2}]});
        fleet.rollout("quiet", spec(2, "Rollback", analysis.clone())).await;
        let fr = fleet.wait_rollout("quiet", "held", DEADLINE, |fr| phase(fr) == Phase::Paused).await;
        assert_eq!(reason(&fr), "AnalysisInconclusive");
        assert!(fr.status.as_ref().unwrap().message.as_deref().unwrap().contains("analysis inconclusive"));
        assert!(condition(&fr, "Reconciling").is_some_and(|c| c.status == "True"), "kstatus: InProgress");
        let held = metric_run(&fr, 0, "absent");
        assert_eq!((held.phase, held.inconclusive), (MetricPhase::Inconclusive, 1));
        // The plugin shows the hold and how to release it.
        let status = kubectl(&["fleetroll", "status", "quiet", "-n", &fleet.ns, "--no-follow"]).await.ok().stdout;
        assert!(status.contains("Held (AnalysisInconclusive)") && status.contains("absent  Inconclusive"), "{status}");
        assert_eq!(judged(&fr).await, ("InProgress".into(), "InProgress".into(), "Suspended".into()), "a person decides: not a failure");
        capture(&fr, "analysis-inconclusive");
        // The resume the plugin sends releases it.
        kubectl(&["fleetroll", "resume", "quiet", "-n", &fleet.ns]).await.ok();
        let fr = fleet.wait_rollout("quiet", "finished", DEADLINE, |fr| phase(fr).is_terminal()).await;
        assert_eq!(phase(&fr), Phase::Succeeded);
        assert_eq!(metric_run(&fr, 0, "absent").phase, MetricPhase::Accepted);

        // onNoData: Fail fails the batch, and onFailure applies: Pause holds it as a failure.
        let mut analysis = analysis;
        analysis["metrics"][0]["onNoData"] = json!("Fail");
        let mut strict = spec(2, "Pause", analysis);
        strict["image"] = json!(READY_IMAGE);
        fleet.rollout("strict", strict).await;
        let fr = fleet.wait_rollout("strict", "held", DEADLINE, |fr| phase(fr) == Phase::Paused).await;
        assert_eq!(reason(&fr), "AnalysisFailed");
        assert_eq!(metric_run(&fr, 0, "absent").failed, 1);
        assert_eq!(judged(&fr).await, ("Failed".into(), "Failed".into(), "Degraded".into()), "stopped short");
        capture(&fr, "analysis-failed");
        // Argo CD's resume action lets it go on anyway.
        argo_resume(&fleet, "strict").await;
        let fr = fleet.wait_rollout("strict", "finished", DEADLINE, |fr| phase(fr).is_terminal()).await;
        assert_eq!(phase(&fr), Phase::Succeeded, "{:?}", fr.status);
        assert_eq!(metric_run(&fr, 0, "absent").phase, MetricPhase::Accepted);
    })
    .await;
}

#[tokio::test]
async fn a_backend_outage_pauses_as_analysis_error_and_measuring_resumes_when_it_returns() {
    with_fleet("an-outage", 0, |fleet| async move {
        let mut lab = lab(&fleet, 2, Options::default(), &[]).await;
        let analysis = json!({"metrics": [{
            "name": "error-rate", "query": error_ratio_query(), "thresholdRange": {"max": 0.05},
            "interval": "1s", "count": 4, "consecutiveErrorLimit": 1,
            // Right after the outage its [5s] window may hold no new scrape yet: no data is not the point here.
            "onNoData": "Pass",
        }]});
        fleet.rollout("outage", spec(2, "Rollback", analysis)).await;
        fleet
            .wait_rollout("outage", "a first measurement", DEADLINE, |fr| {
                fr.status
                    .as_ref()
                    .and_then(|s| s.batch(0))
                    .and_then(|b| b.analysis.as_ref())
                    .is_some_and(|a| a.metrics.iter().any(|r| r.successful >= 1))
            })
            .await;
        lab.prometheus.stop();
        let fr = fleet
            .wait_rollout("outage", "paused by errors", DEADLINE, |fr| reason(fr) == "AnalysisError")
            .await;
        assert_eq!(phase(&fr), Phase::Paused);
        let r = metric_run(&fr, 0, "error-rate");
        assert!(r.consecutive_errors >= 2 && r.successful < 4, "{r:?}");
        assert_eq!(
            judged(&fr).await,
            ("InProgress".into(), "InProgress".into(), "Suspended".into()),
            "an outage says nothing of the image"
        );
        lab.prometheus.start_again().await;
        let fr = fleet.wait_rollout("outage", "finished", DEADLINE, |fr| phase(fr).is_terminal()).await;
        assert_eq!(phase(&fr), Phase::Succeeded, "{:?}", fr.status);
        let r = metric_run(&fr, 0, "error-rate");
        assert_eq!((r.successful, r.consecutive_errors), (4, 0), "errors are retried, not counted: {r:?}");
        assert!(r.errors >= 2);
        fleet.wait_events("outage", &["AnalysisError", "AnalysisRecovered"], DEADLINE).await;
    })
    .await;
}

#[tokio::test]
async fn credentials_come_from_a_labelled_secret_only() {
    with_fleet("an-auth", 0, |fleet| async move {
        let lab = lab(&fleet, 2, Options { basic_auth: true, tls: true }, &[]).await;
        let secrets: Api<Secret> = Api::namespaced(fleet.client.clone(), &fleet.ns);
        let data = BTreeMap::from([
            ("username".to_string(), USER.to_string()),
            ("password".to_string(), format!("{PASSWORD}\n")),
            ("ca.crt".to_string(), lab.prometheus.ca_pem().unwrap().to_string()),
        ]);
        let secret = Secret { metadata: kube::api::ObjectMeta { name: Some("prom-auth".into()), ..Default::default() }, string_data: Some(data), ..Default::default() };
        secrets.create(&PostParams::default(), &secret).await.unwrap();
        let analysis = json!({
            "provider": {"prometheus": {"secretRef": {"name": "prom-auth"}}},
            "metrics": [{"name": "error-rate", "query": error_ratio_query(), "thresholdRange": {"max": 0.05}, "interval": "1s", "count": 2, "consecutiveErrorLimit": 0}],
        });
        fleet.rollout("authed", spec(2, "Rollback", analysis)).await;
        // Unlabelled, the Secret is not used, and the error says why.
        let fr = fleet.wait_rollout("authed", "paused by errors", DEADLINE, |fr| reason(fr) == "AnalysisError").await;
        let last = metric_run(&fr, 0, "error-rate").measurements.last().unwrap().message.clone().unwrap();
        assert!(last.contains("fleetroll.dev/analysis-credentials"), "{last}");
        assert!(!last.contains(PASSWORD), "no secret in a message: {last}");
        let label = json!({"metadata": {"labels": {"fleetroll.dev/analysis-credentials": "true"}}});
        secrets.patch("prom-auth", &PatchParams::default(), &Patch::Merge(label)).await.unwrap();
        let fr = fleet.wait_rollout("authed", "finished", DEADLINE, |fr| phase(fr).is_terminal()).await;
        assert_eq!(phase(&fr), Phase::Succeeded, "{:?}", fr.status);
        assert_eq!(metric_run(&fr, 0, "error-rate").successful, 2);
    })
    .await;
}

#[tokio::test]
async fn a_sigkill_during_analysis_never_counts_a_measurement_twice() {
    with_fleet("an-crash", 0, |fleet| async move {
        let mut lab = lab(&fleet, 4, Options::default(), &[("FLEETROLL_FAILPOINT", "after-measure:2")]).await;
        let analysis = json!({"metrics": [{"name": "error-rate", "query": error_ratio_query(), "thresholdRange": {"max": 0.05}, "interval": "1s", "count": 3}]});
        fleet.rollout("crashy", spec(2, "Rollback", analysis)).await;
        assert!(lab.operator.wait_for_line("FAILPOINT after-measure reached", DEADLINE).await, "the failpoint was reached");
        lab.operator.kill();
        let taken = fleet.rollouts().get("crashy").await.unwrap();
        assert_eq!(metric_run(&taken, 0, "error-rate").successful, 1, "the second measurement was taken, never recorded");
        let address = format!("--analysis-prometheus-address={}", lab.prometheus.address());
        // The same replica back (its identity): it takes its lease again at once.
        let _operator = Operator::start(&fleet.ns, &[&address, "--identity", &lab.operator.identity], &[]);
        let fr = fleet.wait_rollout("crashy", "finished", DEADLINE, |fr| phase(fr).is_terminal()).await;
        assert_eq!(phase(&fr), Phase::Succeeded, "{:?}", fr.status);
        for batch in 0..2 {
            let r = metric_run(&fr, batch, "error-rate");
            assert_eq!((r.successful, r.failed, r.inconclusive, r.errors), (3, 0, 0, 0), "batch {batch}: {r:?}");
            // A measurement counted twice (replayed after the write that recorded it) would sit less than an
            // interval after the one before it, and the run would have reached its count early.
            let at: Vec<_> = r.measurements.iter().map(|m| m.at.0).collect();
            let spaced = at.windows(2).all(|w| w[1].duration_since(w[0]).as_secs_f64() >= 1.0);
            assert!(spaced, "measurements at least an interval apart: {at:?}");
        }
    })
    .await;
}

#[tokio::test]
async fn an_analysis_the_operator_cannot_run_is_degraded_before_anything_changes() {
    with_fleet("an-refused", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 2, READY_IMAGE).await;
        let _operator = Operator::start(&fleet.ns, &[], &[]);
        let metric = json!({"name": "m", "query": "up", "thresholdRange": {"min": 1}});
        let cases = [
            ("no-provider", json!({"metrics": [metric]}), "AnalysisProviderMissing"),
            ("elsewhere", json!({"provider": {"prometheus": {"address": "http://10.1.2.3:9090"}}, "metrics": [metric]}), "AnalysisAddressRefused"),
            ("own-service", json!({"provider": {"prometheus": {"address": format!("http://prometheus.{}.svc:9090", fleet.ns)}}, "metrics": [metric]}), "AnalysisAddressRefused"),
        ];
        for (name, analysis, why) in cases {
            fleet.rollout(name, spec(2, "Rollback", analysis)).await;
            let fr = fleet.wait_rollout(name, why, DEADLINE, |fr| reason(fr) == why).await;
            assert_eq!(phase(&fr), Phase::Pending);
            assert!(condition(&fr, "Degraded").is_some_and(|c| c.status == "True" && c.reason == why));
        }
        for d in fleet.all_deployments().await {
            assert_eq!(image_of(&d), READY_IMAGE, "nothing changed");
        }
    })
    .await;
}

#[tokio::test]
async fn a_rollout_queries_only_the_backends_bound_to_its_namespace() {
    with_fleet("an-bound", 0, |fleet| async move {
        let names = fleet.deployments(&fleet.ns, 2, READY_IMAGE).await;
        let exporter = Exporter::start();
        for name in &names {
            exporter.set_rate(&fleet.ns, name, REQUESTS_PER_SEC, 0.0);
        }
        // One backend per tenant, as the analysis chapter advises: this namespace's, and another tenant's.
        let own = Prometheus::start(&exporter, Options::default()).await;
        let other = Prometheus::start(&exporter, Options::default()).await;
        own.wait_for_series(&format!("min(count_over_time({REQUESTS}[1h])) >= 7")).await;
        other.wait_for_series(REQUESTS).await;
        let bound = |ns: &str, p: &Prometheus| format!("--analysis-allow={ns}=127.0.0.1:{}", p.port());
        let _operator =
            Operator::start(&fleet.ns, &[&bound(&fleet.ns, &own), &bound("another-tenant", &other)], &[]);
        let (own_before, other_before) = (own.queries_served().await, other.queries_served().await);
        let analysis = |p: &Prometheus| {
            json!({"provider": {"prometheus": {"address": p.address()}}, "metrics": [{
                "name": "error-rate", "query": error_ratio_query(), "thresholdRange": {"max": 0.05},
                "interval": "1s", "count": 2,
            }]})
        };

        // Naming the other tenant's backend: refused before anything changes or any query is sent.
        fleet.rollout("names-another", spec(2, "Rollback", analysis(&other))).await;
        let why = "AnalysisAddressRefused";
        let fr = fleet.wait_rollout("names-another", why, DEADLINE, |fr| reason(fr) == why).await;
        let message = fr.status.as_ref().and_then(|s| s.message.clone()).unwrap_or_default();
        assert!(message.contains(&format!("rollouts in namespace {} may query", fleet.ns)), "{message}");
        assert!(!message.contains("another-tenant"), "names another tenant's binding: {message}");
        fleet.rollouts().delete("names-another", &Default::default()).await.unwrap();

        // Its own backend: measured there, and the rollout passes.
        fleet.rollout("own", spec(2, "Rollback", analysis(&own))).await;
        let fr = fleet.wait_rollout("own", "finished", DEADLINE, |fr| phase(fr).is_terminal()).await;
        assert_eq!(phase(&fr), Phase::Succeeded, "{:?}", fr.status);
        assert_eq!(metric_run(&fr, 0, "error-rate").successful, 2);
        let (own_after, other_after) = (own.queries_served().await, other.queries_served().await);
        assert!(own_after >= own_before + 2.0, "own backend: {own_before} -> {own_after} queries");
        assert_eq!(other_after, other_before, "the other tenant's backend was asked");
        eprintln!(
            "queries: own backend +{}, the other tenant's +{}",
            own_after - own_before,
            other_after - other_before
        );
    })
    .await;
}
