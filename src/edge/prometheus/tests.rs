use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicUsize, Ordering},
};

use axum::{Router, body::Bytes, http::HeaderMap, http::StatusCode, routing::post};
use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::api::ObjectMeta;

use super::{credentials::MAX_VALUE_BYTES, *};
use crate::{api::ANALYSIS_SECRET_LABEL, core::http_check::Allowed};

/// A throwaway self-signed certificate and its key, made for these tests only.
const TEST_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBiDCCAS+gAwIBAgIUallRJVbg28TK4WlTIkVLldCWy2EwCgYIKoZIzj0EAwIw
GTEXMBUGA1UEAwwOZmxlZXRyb2xsLXRlc3QwIBcNMjYxMTMwMTgyMDA4WhgPMjEy
NjExMDYxODIwMDhaMBkxFzAVBgNVBAMMDmZsZWV0cm9sbC10ZXN0MFkwEwYHKoZI
zj0CAQYIKoZIzj0DAQcDQgAEzVvlFdOT8vM6jItKnP3rUzzxvp+lNVgPqdSX4rjt
6w4AybZocIeTCIANvaPue5rM1eOqGejiCEHY0IfNz33sPKNTMFEwHQYDVR0OBBYE
FODFSB3NW32G/NuU0YoqcVgehkWqMB8GA1UdIwQYMBaAFODFSB3NW32G/NuU0Yoq
cVgehkWqMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDRwAwRAIgF86L4z8p
4QXRx4oZx7b8R0YaPrGxcCBA4HHvcjyXPZECIGQgz6x4E3bAdNoXPMyHDibQII3/
2PAOcG6wE5s35jUP
-----END CERTIFICATE-----
";
const TEST_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgu0vBHWlxKGng+1JP
8UJj+Aa7EsR0d/N49yTRfclXWS+hRANCAATNW+UV05Py8zqMi0qc/etTPPG+n6U1
WA+p1JfiuO3rDgDJtmhwh5MIgA29o+57mszV46oZ6OIIQdjQh83Pfew8
-----END PRIVATE KEY-----
";

fn secret(label: Option<&str>, data: &[(&str, &[u8])]) -> Secret {
    let labels = label.map(|v| BTreeMap::from([(ANALYSIS_SECRET_LABEL.to_string(), v.to_string())]));
    Secret {
        metadata: ObjectMeta {
            name: Some("prom".into()),
            namespace: Some("team".into()),
            labels,
            ..Default::default()
        },
        data: Some(data.iter().map(|(k, v)| (k.to_string(), ByteString(v.to_vec()))).collect()),
        ..Default::default()
    }
}

fn labelled(data: &[(&str, &[u8])]) -> Result<Credentials, String> {
    Credentials::from_secret(&secret(Some("true"), data))
}

#[test]
fn only_a_secret_labelled_for_analysis_is_used() {
    for label in [None, Some("false"), Some("True")] {
        let e = Credentials::from_secret(&secret(label, &[("token", b"hunter2")])).unwrap_err();
        assert!(
            e.contains("Secret team/prom") && e.contains("fleetroll.dev/analysis-credentials=true"),
            "{e}"
        );
        assert!(
            e.contains("cannot send the other Secrets of its namespace") && !e.contains("hunter2"),
            "{e}"
        );
    }
}

#[test]
fn credentials_are_a_token_or_a_username_and_password() {
    // Secrets made from files end in a newline, which no header may carry.
    let token = labelled(&[("token", b"hunter2\n")]).unwrap();
    // Auth has no Debug, which would show the secret.
    assert!(token.auth == Some(Auth::Bearer("hunter2".into())));
    let basic = labelled(&[("username", b"alice"), ("password", b"pa ss\r\n")]).unwrap();
    assert!(basic.auth == Some(Auth::Basic { username: "alice".into(), password: "pa ss".into() }));
    let big = vec![b'a'; MAX_VALUE_BYTES + 1];
    for (data, expected) in [
        (vec![("token", &b"hunter2"[..]), ("username", b"alice"), ("password", b"pw")], "keep one"),
        (vec![("token", b"hunter2"), ("password", b"pw")], "keep one"),
        (vec![("username", b"alice")], "no password"),
        (vec![("password", b"hunter2")], "no username"),
        (vec![("token", b"\n")], "token is empty"),
        (vec![("username", b""), ("password", b"hunter2")], "username is empty"),
        (vec![("token", b"hunter2\nX-Injected: 1")], "control characters or line breaks"),
        (vec![("token", b"hunter2\xff")], "not UTF-8"),
        (vec![("token", &big[..])], "larger than 64 KiB"),
        (vec![("unrelated", b"hunter2")], "holds none of the keys"),
    ] {
        let e = labelled(&data).unwrap_err();
        assert!(e.starts_with("Secret team/prom") && e.contains(expected), "{data:?}: {e}");
        assert!(!e.contains("hunter2"), "{e}");
    }
}

#[test]
fn certificates_are_checked_when_read_and_never_shown() {
    let (cert, key) = (TEST_CERT.as_bytes(), TEST_KEY.as_bytes());
    let full =
        labelled(&[("token", b"hunter2"), ("ca.crt", cert), ("tls.crt", cert), ("tls.key", key)]).unwrap();
    assert!(full.ca_pem.is_some() && full.identity_pem.is_some());
    let shown = format!("{full:?}");
    assert_eq!(shown, r#"Credentials { auth: "bearer token", ca: true, client_certificate: true }"#);
    assert!(
        labelled(&[("ca.crt", b"not a certificate")])
            .unwrap_err()
            .contains("ca.crt holds no PEM certificate")
    );
    assert!(labelled(&[("tls.crt", cert)]).unwrap_err().contains("both"));
    assert!(labelled(&[("tls.key", key)]).unwrap_err().contains("both"));
    let e = labelled(&[("tls.crt", cert), ("tls.key", b"hunter2")]).unwrap_err();
    assert!(e.contains("tls.crt and tls.key are not") && !e.contains("hunter2"), "{e}");
    // A client builds with them, and with the public roots for https without a CA.
    let querier = Querier::new(Policy::default(), None).unwrap();
    assert!(querier.client("https://prometheus.example:9090/api/v1/query", Some(&full)).is_ok());
    assert!(querier.client("https://prometheus.example:9090/api/v1/query", None).is_ok());
}

/// What these tests keep of an answer: all of it.
fn kept(_: &Query, answer: Answer) -> Answer {
    answer
}

fn query(promql: &str) -> Query {
    Query { metric: "errors".into(), target: None, promql: promql.into() }
}

fn backend(address: &str, timeout: Duration) -> Backend {
    Backend { address: address.into(), secret: None, timeout, namespace_header: None }
}

#[tokio::test]
async fn loopback_and_link_local_backends_are_refused_unless_allowed() {
    let querier = Querier::new(Policy::default(), None).unwrap();
    for (address, kind) in [("http://127.0.0.1:9090", "loopback"), ("http://169.254.169.254", "link-local")] {
        let answers =
            querier.measure(&backend(address, Duration::from_secs(1)), None, vec![query("up")], &kept).await;
        let e = answers[0].1.clone().unwrap_err();
        assert!(e.contains("refused") && e.contains(kind) && e.contains("--analysis-allow"), "{e}");
    }
}

/// How many queries a test backend has in flight, and the most it had at once.
#[derive(Default)]
struct InFlight {
    now: AtomicUsize,
    most: AtomicUsize,
}

/// A backend on loopback: answers a vector echoing the query it was sent, if the request is a form POST
/// with the expected Authorization; some queries misbehave on purpose.
async fn serve(authorization: &'static str) -> (String, Arc<InFlight>) {
    let in_flight = Arc::new(InFlight::default());
    let seen = in_flight.clone();
    let answer = move |headers: HeaderMap, body: Bytes| async move {
        let header =
            |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        if header("authorization") != authorization {
            return (StatusCode::UNAUTHORIZED, "who are you?".to_string());
        }
        assert_eq!(header("content-type"), "application/x-www-form-urlencoded");
        let form: Vec<(String, String)> = url::form_urlencoded::parse(&body).into_owned().collect();
        let [(key, promql)] = &form[..] else { panic!("unexpected form {form:?}") };
        assert_eq!(key, "query");
        match promql.as_str() {
            "slow" => tokio::time::sleep(Duration::from_secs(3)).await,
            "huge" => return (StatusCode::OK, " ".repeat(MAX_ANSWER_BYTES + 1)),
            // Under 4 MiB, but one series of 300,000 labels: tens of MiB once decoded.
            "labelled" => {
                let labels: Vec<String> = (0..300_000).map(|i| format!(r#""l{i}":"""#)).collect();
                let series = format!(r#"{{"metric":{{{}}},"value":[1,"0.5"]}}"#, labels.join(","));
                let data =
                    format!(r#"{{"status":"success","data":{{"resultType":"vector","result":[{series}]}}}}"#);
                return (StatusCode::OK, data);
            }
            "broken" => return (StatusCode::BAD_GATEWAY, "<html>upstream secret page</html>".into()),
            _ => {
                let now = seen.now.fetch_add(1, Ordering::SeqCst) + 1;
                seen.most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                seen.now.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let tenant = header("x-scope-orgid");
        let result = serde_json::json!([{"metric": {"query": promql, "tenant": tenant}, "value": [1712345678.9, "0.5"]}]);
        let data =
            serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": result}});
        (StatusCode::OK, data.to_string())
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = Router::new().route("/prom/api/v1/query", post(answer));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{address}/prom/"), in_flight)
}

fn loopback_querier() -> Querier {
    let allowed = vec![Allowed::Net("127.0.0.1/32".parse().unwrap())];
    Querier::new(Policy { allowed, ..Default::default() }, None).unwrap()
}

#[tokio::test]
async fn queries_are_posted_as_forms_with_the_credentials_and_answered_in_order() {
    let (address, in_flight) = serve("Basic YWxpY2U6cGEgc3M=").await;
    let querier = loopback_querier();
    let credentials = labelled(&[("username", b"alice"), ("password", b"pa ss\n")]).unwrap();
    let promql: Vec<String> = (0..20)
        .map(|i| format!(r#"sum(rate(http_requests_total{{code=~"5..",pod="web-{i}&x=1"}}[5m]))"#))
        .collect();
    let queries: Vec<Query> = promql.iter().map(|q| query(q)).collect();
    // The namespace header (--analysis-namespace-header) travels with every query.
    let scoped = ("X-Scope-OrgID".to_string(), "team-a".to_string());
    let backend = Backend { namespace_header: Some(scoped), ..backend(&address, Duration::from_secs(5)) };
    let answers = querier.measure(&backend, Some(&credentials), queries.clone(), &kept).await;
    assert_eq!(answers.len(), 20);
    for ((sent, answer), expected) in answers.into_iter().zip(&queries) {
        assert_eq!(&sent, expected);
        let samples = answer.unwrap();
        assert_eq!((samples[0].labels["query"].as_str(), samples[0].value), (sent.promql.as_str(), 0.5));
        assert_eq!(samples[0].labels["tenant"], "team-a");
    }
    // Concurrently, eight at most.
    let most = in_flight.most.load(Ordering::SeqCst);
    assert!((2..=CONCURRENCY).contains(&most), "{most} queries in flight at once");
    // Without the credentials, the backend's refusal is an error that echoes nothing of its body.
    let answers = querier.measure(&backend, None, vec![query("up")], &kept).await;
    assert_eq!(answers[0].1, Err("HTTP 401".into()));
}

#[tokio::test]
async fn slow_huge_and_failing_answers_are_errors() {
    let (address, _) = serve("Bearer hunter2").await;
    let credentials = labelled(&[("token", b"hunter2")]).unwrap();
    let mut querier = loopback_querier();
    // Deadlines half the slow answer's 3 s: a healthy answer has 1.5 s even on a loaded machine (at 300 ms,
    // `up` itself timed out under a parallel test run).
    let backend = backend(&address, Duration::from_millis(1500));
    let names = ["up", "slow", "huge", "broken", "labelled"];
    let answers =
        querier.measure(&backend, Some(&credentials), names.iter().map(|q| query(q)).collect(), &kept).await;
    let errors: Vec<String> = answers.iter().map(|(_, a)| a.clone().err().unwrap_or_default()).collect();
    assert_eq!(errors[0], "");
    assert!(errors[1].contains("no answer within 1.5s (provider.prometheus.timeout)"), "{}", errors[1]);
    assert_eq!(errors[2], "answer larger than 4 MiB");
    assert_eq!(errors[3], "HTTP 502");
    assert_eq!(errors[4], format!("answer of more than {MAX_ANSWER_VALUES} JSON values"));
    assert!(errors.iter().all(|e| !e.contains("hunter2")));
    // However long each query may take, the measurement ends within its budget.
    querier.budget = Duration::from_millis(1500);
    let backend = Backend { timeout: Duration::from_secs(10), ..backend };
    let answers =
        querier.measure(&backend, Some(&credentials), vec![query("slow"), query("up")], &kept).await;
    assert_eq!(answers[0].1, Err("not answered in time".into()));
    assert!(answers[1].1.is_ok());
    // Nothing listens there: the error says why, with its causes.
    let closed = Backend { address: "http://127.0.0.1:1".into(), ..backend };
    let e = querier.measure(&closed, Some(&credentials), vec![query("up")], &kept).await[0]
        .1
        .clone()
        .unwrap_err();
    assert!(e.starts_with("POST http://127.0.0.1:1/api/v1/query failed: ") && e.contains("onnect"), "{e}");
}
