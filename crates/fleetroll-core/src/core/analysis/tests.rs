use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

use super::{
    provider::{Backends, check},
    *,
};
use crate::{
    api::{Analysis, AnalysisProvider, PrometheusProvider, SecretRef},
    core::reason,
};

fn metric(query: &str) -> Metric {
    serde_json::from_value(serde_json::json!({
        "name": "error-rate", "query": query, "thresholdRange": {"max": 0.01},
    }))
    .unwrap()
}

fn target(ns: &str, name: &str) -> PlannedTarget {
    PlannedTarget {
        namespace: ns.into(),
        name: name.into(),
        previous_image: "old".into(),
        ..Default::default()
    }
}

fn sample(deployment: &str, value: f64) -> Sample {
    Sample { labels: BTreeMap::from([("deployment".to_string(), deployment.to_string())]), value }
}

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

#[test]
fn batch_queries_match_exactly_the_batch_regex_escaped() {
    let m = metric(
        r#"sum(rate(errors{deployment=~"{{targets}}", namespace=~"{{ namespaces }}"}[{{interval}}]))"#,
    );
    let q = queries(&m, &[target("b", "web.v2"), target("a", "api"), target("a", "web.v2")]);
    assert_eq!(q.len(), 1);
    // Sorted, each once, the dot escaped for RE2 and the backslash for the PromQL string.
    assert_eq!(q[0].promql, r#"sum(rate(errors{deployment=~"api|web\\.v2", namespace=~"a|b"}[30s]))"#);
    assert_eq!(q[0].target, None);
}

#[test]
fn target_queries_name_each_target() {
    let mut m = metric(r#"up{namespace="{{namespace}}", deployment="{{name}}"}"#);
    m.scope = MetricScope::Target;
    let q = queries(&m, &[target("t1", "web"), target("t2", "api")]);
    let promql: Vec<&str> = q.iter().map(|q| q.promql.as_str()).collect();
    assert_eq!(
        promql,
        [r#"up{namespace="t1", deployment="web"}"#, r#"up{namespace="t2", deployment="api"}"#]
    );
    assert_eq!(q[1].target.as_deref(), Some("t2/api"));
}

#[test]
fn across_member_clusters_queries_name_the_clusters_too() {
    let in_cluster = |c: &str, ns: &str, name: &str| PlannedTarget { cluster: c.into(), ..target(ns, name) };
    let batch = [in_cluster("eu-1", "t", "web"), in_cluster("us.2", "t", "web")];
    let m = metric(r#"sum(errors{cluster=~"{{clusters}}", deployment=~"{{targets}}"})"#);
    assert_eq!(queries(&m, &batch)[0].promql, r#"sum(errors{cluster=~"eu-1|us\\.2", deployment=~"web"})"#);
    let mut m = metric(r#"up{cluster="{{cluster}}", deployment="{{name}}"}"#);
    m.scope = MetricScope::Target;
    let q = queries(&m, &batch);
    assert_eq!(q[0].promql, r#"up{cluster="eu-1", deployment="web"}"#);
    // The same workload in two clusters is two targets, measured apart.
    assert_eq!((q[0].target.as_deref(), q[1].target.as_deref()), (Some("eu-1/t/web"), Some("us.2/t/web")));
}

#[test]
fn regex_escape_covers_every_metacharacter() {
    assert_eq!(regex_escape(r"a.b+c*d?(e)|[f]{g}^$\"), r"a\.b\+c\*d\?\(e\)\|\[f\]\{g\}\^\$\\");
}

#[test]
fn unknown_and_unclosed_placeholders_are_named() {
    assert!(check_query(&metric("x{a=~\"{{targets}}\"}")).is_ok());
    let e = check_query(&metric("x{a=\"{{name}}\"}")).unwrap_err();
    assert!(e.contains("unknown placeholder {{name}}") && e.contains("{{targets}}"), "{e}");
    let mut m = metric("x{a=\"{{targets}}\"}");
    m.scope = MetricScope::Target;
    assert!(check_query(&m).unwrap_err().contains("{{targets}}"));
    assert!(check_query(&metric("x{a=\"{{targets\"}")).unwrap_err().contains("not closed"));
}

#[test]
fn every_sample_must_be_inside_the_range() {
    let m = metric("q");
    let ok = judge(&m, &Ok(vec![sample("a", 0.0), sample("b", 0.01)]));
    assert_eq!(ok.phase, MeasurementPhase::Successful);
    let bad = judge(&m, &Ok(vec![sample("a", 0.0), sample("b", 0.2)]));
    assert_eq!(bad.phase, MeasurementPhase::Failed);
    let message = bad.message.unwrap();
    assert!(message.contains(r#"{deployment="b"} 0.2"#) && message.contains("1 of 2"), "{message}");
    assert_eq!(bad.value.as_deref(), Some("0.2, 0"));
}

#[test]
fn infinities_are_values_and_nan_is_no_data() {
    let m = metric("q");
    let inf = judge(&m, &Ok(vec![sample("a", f64::INFINITY)]));
    assert_eq!((inf.phase, inf.value.as_deref()), (MeasurementPhase::Failed, Some("+Inf")));
    let nan = judge(&m, &Ok(vec![sample("a", f64::NAN)]));
    assert_eq!(nan.phase, MeasurementPhase::Inconclusive);
    assert!(nan.message.unwrap().contains("NaN"));
    let mixed = judge(&m, &Ok(vec![sample("a", f64::NAN), sample("b", 0.001)]));
    assert_eq!(mixed.phase, MeasurementPhase::Successful);
    let mut with_min = metric("q");
    with_min.threshold_range = ThresholdRange { min: Some(0.5), max: None };
    assert_eq!(judge(&with_min, &Ok(vec![sample("a", f64::NEG_INFINITY)])).phase, MeasurementPhase::Failed);
}

#[test]
fn no_data_follows_on_no_data() {
    let mut m = metric("q");
    for (policy, phase) in [
        (NoData::Inconclusive, MeasurementPhase::Inconclusive),
        (NoData::Fail, MeasurementPhase::Failed),
        (NoData::Pass, MeasurementPhase::Successful),
    ] {
        m.on_no_data = policy;
        assert_eq!(judge(&m, &Ok(Vec::new())).phase, phase);
    }
    assert_eq!(judge(&m, &Err("connection refused".into())).phase, MeasurementPhase::Error);
}

#[test]
fn a_target_measurement_is_as_bad_as_its_worst_target() {
    let m = metric("q");
    let answers = vec![
        (Some("t/a".to_string()), Ok(vec![sample("a", 0.0)])),
        (Some("t/b".to_string()), Ok(vec![sample("b", 0.5)])),
        (Some("t/c".to_string()), Ok(Vec::new())),
    ];
    let v = judge_all(&m, &answers);
    assert_eq!(v.phase, MeasurementPhase::Failed);
    assert!(v.message.as_deref().unwrap().starts_with("t/b: "), "{v:?}");
    let mut with_error = answers.clone();
    with_error.push((Some("t/d".into()), Err("HTTP 503".into())));
    let v = judge_all(&m, &with_error);
    assert_eq!((v.phase, v.message.as_deref()), (MeasurementPhase::Error, Some("t/d: HTTP 503")));
}

#[test]
fn limits_decide_the_run_and_errors_do_not_count() {
    let mut m = metric("q");
    m.count = 3;
    m.failure_limit = 1;
    m.consecutive_error_limit = 1;
    let mut run = start(&m);
    let verdict = |phase| Verdict { phase, value: None, message: None };
    record(&m, &mut run, verdict(MeasurementPhase::Failed), at(0));
    assert_eq!(run.phase, MetricPhase::Running, "one failure is within failureLimit 1");
    record(&m, &mut run, verdict(MeasurementPhase::Error), at(1));
    record(&m, &mut run, verdict(MeasurementPhase::Error), at(2));
    assert!(erroring(&m, &run));
    assert_eq!((taken(&run), run.errors), (1, 2));
    record(&m, &mut run, verdict(MeasurementPhase::Successful), at(3));
    assert!(!erroring(&m, &run), "a measurement taken ends the errors in a row");
    assert_eq!(run.measurements.len(), 3, "status keeps the last three");
    record(&m, &mut run, verdict(MeasurementPhase::Failed), at(4));
    assert_eq!(run.phase, MetricPhase::Failed);

    let mut run = start(&m);
    for s in 0..3 {
        record(&m, &mut run, verdict(MeasurementPhase::Successful), at(s));
    }
    assert_eq!(run.phase, MetricPhase::Successful);
    m.inconclusive_limit = 0;
    let mut run = start(&m);
    record(&m, &mut run, verdict(MeasurementPhase::Inconclusive), at(0));
    assert_eq!(run.phase, MetricPhase::Inconclusive);
}

#[test]
fn measurements_are_due_after_the_initial_delay_then_every_interval() {
    let mut m = metric("q");
    m.initial_delay = "30s".into();
    m.interval = "1m".into();
    m.count = 2;
    let mut run = start(&m);
    assert_eq!(due(&m, &run, at(0)), Some(at(30)));
    record(&m, &mut run, Verdict { phase: MeasurementPhase::Successful, value: None, message: None }, at(31));
    assert_eq!(due(&m, &run, at(0)), Some(at(91)));
    record(&m, &mut run, Verdict { phase: MeasurementPhase::Successful, value: None, message: None }, at(91));
    assert_eq!(due(&m, &run, at(0)), None, "done");
}

fn analysis(address: Option<&str>) -> Analysis {
    Analysis {
        provider: Some(AnalysisProvider {
            prometheus: Some(PrometheusProvider {
                address: address.map(str::to_string),
                secret_ref: Some(SecretRef { name: "prom".into() }),
                timeout: "5s".into(),
            }),
        }),
        metrics: vec![metric("q")],
    }
}

fn entries<T: std::str::FromStr<Err = String>>(list: &[&str]) -> Vec<T> {
    list.iter().map(|e| e.parse().unwrap()).collect()
}

#[test]
fn a_rollout_queries_only_backends_the_operator_allows() {
    let mut backends = Backends::default();
    let missing = backends.resolve(&analysis(None), "team").unwrap_err();
    assert_eq!(missing.reason, reason::ANALYSIS_PROVIDER_MISSING);
    backends.defaults = entries(&["http://prometheus.monitoring:9090/"]);
    let b = backends.resolve(&analysis(None), "team").unwrap();
    assert_eq!(b.address, "http://prometheus.monitoring:9090");
    assert_eq!((b.secret.as_deref(), b.timeout.as_secs(), b.namespace_header), (Some("prom"), 5, None));
    assert!(backends.resolve(&analysis(Some("http://prometheus.monitoring:9090")), "team").is_ok());
    // Not even a Service of its own namespace (its endpoints could point anywhere), not another port of
    // the default's host, not an address.
    for refused in [
        "http://prom.team.svc:9090",
        "http://prom.other.svc:9090",
        "http://prometheus.monitoring:9091",
        "http://10.0.0.7:9090",
        "http://evil.example.com",
    ] {
        let e = backends.resolve(&analysis(Some(refused)), "team").unwrap_err();
        assert_eq!(e.reason, reason::ANALYSIS_ADDRESS_REFUSED, "{refused}");
    }
    backends.allow = entries(&["*=10.0.0.0/8", "*=thanos.example.com"]);
    assert!(backends.resolve(&analysis(Some("http://10.0.0.7:9090")), "team").is_ok());
    assert!(backends.resolve(&analysis(Some("https://thanos.example.com/prometheus")), "team").is_ok());
    assert!(backends.resolve(&analysis(Some("https://THANOS.example.com./prometheus")), "team").is_ok());
    // The host judged is the one the HTTP client would reach, whatever a lenient reading makes of it.
    for refused in [
        "http://thanos.example.com@evil.example.com",
        "http://evil.example.com\\@thanos.example.com",
        "http://thanos.example.com.evil.example.com",
        "http://evil.example.com#@thanos.example.com",
    ] {
        let e = backends.resolve(&analysis(Some(refused)), "team").unwrap_err();
        assert_eq!(e.reason, reason::ANALYSIS_ADDRESS_REFUSED, "{refused}");
    }
    // A Secret name goes into a URL path: only object names pass.
    let mut a = analysis(None);
    a.provider.as_mut().unwrap().prometheus.as_mut().unwrap().secret_ref =
        Some(SecretRef { name: "?labelSelector=x".into() });
    assert_eq!(backends.resolve(&a, "team").unwrap_err().reason, reason::INVALID_ANALYSIS);
}

#[test]
fn a_backend_bound_to_a_tenant_serves_only_that_tenant() {
    let backends = Backends {
        defaults: entries(&["team-a=http://prom-a.monitoring.svc:9090", "http://prometheus.monitoring:9090"]),
        allow: entries(&[
            "team-a=prom-a.monitoring.svc:9090",
            "team-b=prom-b.monitoring.svc:9090",
            "shop-*=10.0.5.0/24",
            "team-b=127.0.0.1:9092",
            "team-a=127.0.0.1:9091",
            "*=thanos.example.com",
        ]),
        namespace_header: Some("X-Scope-OrgID".into()),
        ..Default::default()
    };
    let resolve = |address: &str, ns: &str| backends.resolve(&analysis(Some(address)), ns);
    let refused = |address: &str, ns: &str| resolve(address, ns).unwrap_err();
    // Each tenant its own backend, never the other's: by name, by port, by address.
    assert!(resolve("http://prom-a.monitoring.svc:9090", "team-a").is_ok());
    assert!(resolve("http://prom-b.monitoring.svc:9090", "team-b").is_ok());
    for (address, ns) in [
        ("http://prom-b.monitoring.svc:9090", "team-a"),
        ("http://prom-a.monitoring.svc:9090", "team-b"),
        ("http://prom-a.monitoring.svc:9091", "team-a"),
        ("http://prom-a.monitoring.svc", "team-a"),
        ("http://127.0.0.1:9092", "team-a"),
        ("http://10.0.5.3:9090", "team-a"),
        // The other's backend however spelled: a trailing dot, decimal, hex and short addresses, a slash.
        ("http://127.0.0.1.:9092", "team-a"),
        ("http://2130706433:9092", "team-a"),
        ("http://0x7f.1:9092/", "team-a"),
        ("http://127.1:9092", "team-a"),
        ("http://PROM-B.monitoring.svc.:9090/", "team-a"),
    ] {
        let e = refused(address, ns);
        assert_eq!(e.reason, reason::ANALYSIS_ADDRESS_REFUSED, "{address} from {ns}");
        // The refusal names the rule and the rollout's own namespace, never another's backend.
        assert!(e.message.contains(&format!("namespace {ns} may query")), "{}", e.message);
        assert!(!e.message.contains("prom-b") || address.contains("prom-b"), "{}", e.message);
    }
    assert!(resolve("http://127.0.0.1:9091", "team-a").is_ok());
    assert!(resolve("http://127.0.0.1:9092/", "team-b").is_ok());
    // Its own, however spelled.
    for own in ["http://2130706433:9091", "http://127.0.0.1.:9091/", "http://Prom-A.Monitoring.svc.:9090/"] {
        assert!(resolve(own, "team-a").is_ok(), "{own}");
    }
    // A pattern binds every namespace it matches; `*` every namespace.
    assert!(resolve("http://10.0.5.3:9090", "shop-eu").is_ok());
    assert_eq!(refused("http://10.0.5.3:9090", "shopping").reason, reason::ANALYSIS_ADDRESS_REFUSED);
    assert!(resolve("https://thanos.example.com", "team-a").is_ok());
    // Defaults: the namespace's own, else the unbound one; a rollout may name only its own.
    let own = |ns: &str| backends.resolve(&analysis(None), ns).unwrap();
    assert_eq!(own("team-a").address, "http://prom-a.monitoring.svc:9090");
    assert_eq!(own("team-c").address, "http://prometheus.monitoring:9090");
    assert!(resolve("http://prometheus.monitoring:9090", "team-c").is_ok());
    assert!(
        resolve("http://Prometheus.monitoring.:80/", "team-c").is_err(),
        "another port is another backend"
    );
    assert!(resolve("HTTP://Prometheus.monitoring.:9090/", "team-c").is_ok(), "the default, however spelled");
    assert_eq!(
        refused("http://prometheus.monitoring:9090", "team-a").reason,
        reason::ANALYSIS_ADDRESS_REFUSED
    );
    // Every query carries the rollout's namespace, for a backend shared by tenants.
    assert_eq!(own("team-a").namespace_header, Some(("X-Scope-OrgID".into(), "team-a".into())));
}

#[test]
fn bound_entries_parse_strictly() {
    use super::binding::{AllowEntry, DefaultBackend, Namespaces};
    for bad in ["Team=prom", "a b=prom", "team=", "=prom", "team=prom:0", "team=prom:x", "prom:99999", ""] {
        assert!(bad.parse::<AllowEntry>().is_err(), "{bad:?}");
    }
    // No entry is global by omission: the refusal says how to bind it, and how to share it on purpose.
    let unbound = "prom-b.monitoring.svc:9090".parse::<AllowEntry>().unwrap_err();
    assert!(
        unbound.contains("bound to no namespace") && unbound.contains("*=prom-b.monitoring.svc:9090"),
        "{unbound}"
    );
    // Hosts a URL parser reads as addresses are no host names.
    for bad in ["team=2130706433", "team=127.1", "team=0.0.0.0.", "team=."] {
        assert!(bad.parse::<AllowEntry>().is_err(), "{bad:?}");
    }
    let dotted: AllowEntry = "team=prom.monitoring.svc.".parse().unwrap();
    assert!(dotted.place.holds(&url::Url::parse("http://PROM.monitoring.svc:9090").unwrap()));
    for bad in ["team=prom.svc", "team=ftp://prom", "http://u:p@prom", "http://prom/?q=1", "team-*=http://"] {
        assert!(bad.parse::<DefaultBackend>().is_err(), "{bad:?}");
    }
    let entry: AllowEntry = "*=[::1]:9090".parse().unwrap();
    assert_eq!((entry.namespaces.to_string(), entry.place.port), ("*".to_string(), Some(9090)));
    // An '=' inside a URL is no binding.
    let url: DefaultBackend = "http://prom/a=b".parse().unwrap();
    assert_eq!((url.namespaces, url.address.as_str()), (None, "http://prom/a=b"));
    let glob = |p: &str, ns: &str| p.parse::<Namespaces>().unwrap().matches(ns);
    assert!(glob("team-*", "team-a") && glob("team-*", "team-") && glob("*", "x") && glob("a*b*c", "aXbYbc"));
    assert!(!glob("team-*", "team") && !glob("team-a", "team-ab") && !glob("*-prod", "prod"));
}

proptest::proptest! {
    #[test]
    fn entries_parse_or_refuse_without_panicking(text in "\\PC{0,80}", ns in "[a-z0-9*-]{0,70}") {
        let _ = text.parse::<super::binding::AllowEntry>();
        let _ = text.parse::<super::binding::DefaultBackend>();
        if let Ok(pattern) = ns.parse::<super::binding::Namespaces>() {
            let _ = pattern.matches(&text);
        }
    }
}

#[test]
fn an_analysis_that_cannot_decide_is_refused() {
    let backends = Backends { defaults: entries(&["http://p:9090"]), ..Default::default() };
    let mut a = analysis(None);
    a.metrics[0].dry_run = true;
    assert_eq!(check(&backends, &a, "team").unwrap_err().reason, reason::INVALID_ANALYSIS);
    a.metrics[0].dry_run = false;
    a.metrics[0].query = "x{{bogus}}".into();
    let e = check(&backends, &a, "team").unwrap_err();
    assert!(e.message.contains("{{bogus}}"), "{}", e.message);
}
