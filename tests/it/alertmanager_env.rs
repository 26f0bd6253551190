//! The Alertmanager of the test environment (crates/fleetroll-testkit/src/alertmanager.rs) and the HTTP
//! receiver the notification sinks' tests send to (crates/fleetroll-testkit/src/receiver.rs): what the
//! sink's tests rely on. A POSTed alert reaches the webhook as a version-4 message with its labels; alerts are
//! deduplicated by label set; Alertmanager retries a failing webhook; it forgets its alerts in an outage and
//! works after a restart on the same port; the receiver answers, fails and hangs as told. No cluster needed.

use std::time::Duration;

use serde_json::{Value, json};
use testkit::{
    alertmanager::Alertmanager,
    receiver::{Mode, Receiver, Request},
};

/// group_wait is 1 s and retries back off from 0.5 s: every delivery here comes within a few seconds.
const DEADLINE: Duration = Duration::from_secs(15);

fn alert(event: &str, annotations: Value) -> Value {
    json!({
        "labels": {"alertname": "FleetrollTest", "fleetroll_event_id": event, "severity": "info"},
        "annotations": annotations,
    })
}

/// The alerts of every webhook message delivered so far, in order.
fn webhook_alerts(requests: &[Request]) -> Vec<Value> {
    requests
        .iter()
        .flat_map(|r| r.json.as_ref().and_then(|m| m["alerts"].as_array()).cloned().unwrap_or_default())
        .collect()
}

fn with_event<'a>(alerts: &'a [Value], event: &str) -> Vec<&'a Value> {
    alerts.iter().filter(|a| a["labels"]["fleetroll_event_id"] == event).collect()
}

#[tokio::test]
async fn a_posted_alert_reaches_the_webhook_as_a_version_4_message() {
    let receiver = Receiver::start();
    let alertmanager = Alertmanager::start(&receiver.url("hook")).await;
    let posted = alertmanager.post_alerts(&json!([alert("one", json!({"summary": "hello"}))])).await;
    assert_eq!(posted.status(), 200, "{}", posted.text().await.unwrap());

    let requests = receiver.wait_for(DEADLINE, |r| !r.is_empty()).await;
    let message = &requests[0];
    assert_eq!((message.method.as_str(), message.path.as_str()), ("POST", "/hook"));
    assert!(message.header("Content-Type").is_some_and(|t| t.starts_with("application/json")), "{message:?}");
    assert!(message.header("user-agent").is_some_and(|a| a.starts_with("Alertmanager/")), "{message:?}");
    let body = message.json.as_ref().unwrap_or_else(|| panic!("not JSON: {}", message.text()));
    assert_eq!(body["version"], "4", "{body}");
    assert_eq!(body["status"], "firing", "{body}");
    assert_eq!(body["receiver"], "hook", "{body}");
    let alerts = body["alerts"].as_array().unwrap();
    assert_eq!(alerts.len(), 1, "{body}");
    assert_eq!(
        alerts[0]["labels"],
        json!({"alertname": "FleetrollTest", "fleetroll_event_id": "one", "severity": "info"}),
        "exactly the labels posted"
    );
    assert_eq!(alerts[0]["annotations"]["summary"], "hello", "{body}");
    assert_eq!(alerts[0]["status"], "firing", "{body}");

    // An alert without labels is refused, naming why: by the OpenAPI validation when the field is missing
    // (422), by Alertmanager's own when it is empty or only has empty values (400, those are dropped).
    for (alert, status, why) in [
        (json!({"annotations": {"summary": "no labels"}}), 422, "labels in body is required"),
        (json!({"labels": {}}), 400, "at least one label pair required"),
        (json!({"labels": {"alertname": ""}}), 400, "at least one label pair required"),
    ] {
        let refused = alertmanager.post_alerts(&json!([alert])).await;
        assert_eq!(refused.status(), status, "{alert}");
        let body = refused.text().await.unwrap();
        assert!(body.contains(why), "{alert}: {body}");
    }
    assert_eq!(alertmanager.alerts().await.len(), 1, "only the valid alert is held");
}

#[tokio::test]
async fn the_same_labels_posted_three_times_are_one_alert() {
    let receiver = Receiver::start();
    let alertmanager = Alertmanager::start(&receiver.url("hook")).await;
    let post = |attempt: u32| {
        let alertmanager = &alertmanager;
        async move {
            let body = json!([alert("dup", json!({"attempt": attempt.to_string()}))]);
            assert_eq!(alertmanager.post_alerts(&body).await.status(), 200);
        }
    };
    post(1).await;
    receiver.wait_for(DEADLINE, |r| !with_event(&webhook_alerts(r), "dup").is_empty()).await;
    // Retries of the same event, as a sink makes them: other annotations, the same labels.
    post(2).await;
    post(3).await;
    testkit::poll_until("Alertmanager to hold attempt 3", DEADLINE, || {
        let alertmanager = &alertmanager;
        async move {
            let held = alertmanager.alerts().await;
            held.len() == 1 && held[0]["annotations"]["attempt"] == "3"
        }
    })
    .await;
    let held = alertmanager.alerts().await;
    assert_eq!(held.len(), 1, "one alert per label set: {held:?}");
    assert_eq!(held[0]["labels"]["fleetroll_event_id"], "dup");

    // Two flushes of the group after the merge: whatever they would send has arrived.
    let flushed = alertmanager.flushes("dup");
    testkit::poll_until("two more flushes of the group", DEADLINE, || {
        let alertmanager = &alertmanager;
        async move { alertmanager.flushes("dup") >= flushed + 2 }
    })
    .await;
    let requests = receiver.requests();
    let alerts = webhook_alerts(&requests);
    assert_eq!(requests.len(), 1, "one webhook message:\n{}", testkit::receiver::describe(&requests));
    assert_eq!(alerts.len(), 1, "one webhook alert: {alerts:?}");
    assert_eq!(alerts[0]["annotations"]["attempt"], "1", "the one sent before the retries");
}

#[tokio::test]
async fn a_failing_webhook_is_retried_until_it_answers() {
    let receiver = Receiver::start();
    receiver.set_mode(Mode::Fail(500));
    let alertmanager = Alertmanager::start(&receiver.url("hook")).await;
    assert_eq!(alertmanager.post_alerts(&json!([alert("retried", json!({}))])).await.status(), 200);
    testkit::poll_until("three refused attempts", DEADLINE, || {
        let receiver = &receiver;
        async move { receiver.attempts() >= 3 }
    })
    .await;
    assert!(receiver.requests().is_empty(), "a 500 is not a delivery");

    receiver.set_mode(Mode::Ok);
    let requests = receiver.wait_for(DEADLINE, |r| !r.is_empty()).await;
    let alerts = webhook_alerts(&requests);
    assert_eq!(with_event(&alerts, "retried").len(), 1, "{alerts:?}");
    assert!(receiver.attempts() > requests.len(), "the refused attempts count too");
}

#[tokio::test]
async fn after_an_outage_it_forgets_its_alerts_and_delivers_new_ones() {
    let receiver = Receiver::start();
    let mut alertmanager = Alertmanager::start(&receiver.url("hook")).await;
    let port = alertmanager.port();
    assert_eq!(alertmanager.post_alerts(&json!([alert("before", json!({}))])).await.status(), 200);
    receiver.wait_for(DEADLINE, |r| !with_event(&webhook_alerts(r), "before").is_empty()).await;

    alertmanager.stop();
    let down = alertmanager.try_post_alerts(&json!([alert("during", json!({}))])).await;
    assert!(down.as_ref().is_err_and(|e| e.is_connect()), "a stopped Alertmanager refuses: {down:?}");

    alertmanager.start_again().await;
    assert_eq!(alertmanager.port(), port, "the same port after a restart");
    assert_eq!(alertmanager.alerts().await, Vec::<Value>::new(), "alerts are kept in memory only");
    assert_eq!(alertmanager.post_alerts(&json!([alert("after", json!({}))])).await.status(), 200);
    let requests = receiver.wait_for(DEADLINE, |r| !with_event(&webhook_alerts(r), "after").is_empty()).await;
    let alerts = webhook_alerts(&requests);
    assert_eq!(with_event(&alerts, "before").len(), 1, "{alerts:?}");
    assert!(with_event(&alerts, "during").is_empty(), "{alerts:?}");
}

#[tokio::test]
async fn the_receiver_answers_fails_and_hangs_as_told() {
    let receiver = Receiver::start();
    let http = reqwest::Client::builder().timeout(Duration::from_millis(300)).build().unwrap();
    let send =
        |body: &'static str| http.post(receiver.url("/in?x=1")).header("X-Test", "a").body(body).send();

    assert_eq!(send(r#"{"n": 1}"#).await.unwrap().status(), 200);
    receiver.set_mode(Mode::Fail(503));
    assert_eq!(send("refused").await.unwrap().status(), 503);
    receiver.set_mode(Mode::Hang);
    let hung = send("hung").await;
    assert!(hung.as_ref().is_err_and(|e| e.is_timeout()), "no answer while hanging: {hung:?}");
    receiver.set_mode(Mode::Ok);
    assert_eq!(send("plain text").await.unwrap().status(), 200);

    let requests = receiver.requests();
    assert_eq!(receiver.attempts(), 4);
    assert_eq!(requests.len(), 2, "only the 2xx answers:\n{}", testkit::receiver::describe(&requests));
    let first = &requests[0];
    assert_eq!((first.method.as_str(), first.path.as_str(), first.query.as_str()), ("POST", "/in", "x=1"));
    assert_eq!(first.headers["x-test"], ["a"]);
    assert_eq!(first.json, Some(json!({"n": 1})));
    assert_eq!((requests[1].text().as_str(), requests[1].json.as_ref()), ("plain text", None));
    assert!(requests[0].at <= requests[1].at);

    // A request hung when the receiver stops does not hold the stop up: its connection is closed.
    receiver.set_mode(Mode::Hang);
    let patient = reqwest::Client::new();
    let pending = tokio::spawn(patient.post(receiver.url("late")).body("x").send());
    testkit::poll_until("the hung request to arrive", DEADLINE, || {
        let receiver = &receiver;
        async move { receiver.attempts() == 5 }
    })
    .await;
    drop(receiver);
    let late = tokio::time::timeout(DEADLINE, pending).await.expect("released by the stop").unwrap();
    assert!(late.is_err(), "a closed connection, not an answer: {late:?}");
}
