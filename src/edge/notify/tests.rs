use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::*;

fn notification(kind: NotificationKind) -> Notification {
    Notification {
        id: "u1/2/7".into(),
        kind,
        at: Time("2026-12-04T10:00:00Z".parse().unwrap()),
        revision: Some(2),
        batch: Some(1),
        reason: "BatchFailed".into(),
        message: "batch 2 failed".into(),
        to: vec!["rollout/team".into()],
    }
}

fn about() -> About {
    About { namespace: "shop".into(), name: "web".into(), uid: "u1".into() }
}

fn secret(labelled: bool, data: &[(&str, &str)]) -> Secret {
    let labels = labelled.then(|| BTreeMap::from([(NOTIFY_SECRET_LABEL.to_string(), "true".to_string())]));
    Secret {
        metadata: ObjectMeta {
            name: Some("hook".into()),
            namespace: Some("shop".into()),
            labels,
            ..Default::default()
        },
        data: Some(data.iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect()),
        ..Default::default()
    }
}

#[test]
fn the_signature_is_the_standard_webhooks_one() {
    // Computed independently, with Python's hmac: base64(HMAC-SHA256(key, "<id>.<timestamp>.<body>")).
    assert_eq!(
        signature(b"k3y-for-tests", "u1/1/0", "1764842400", br#"{"a":1}"#),
        "o8toqcO2d8fMU13RG6ZD+saEdqMGuSZp9J1VdTgOSx4="
    );
    let sink =
        sink(&secret(true, &[("url", "https://hooks.example/x"), ("hmacKey", "k3y-for-tests")])).unwrap();
    let headers = signed(
        &sink,
        vec![("webhook-id", "u1/1/0".into()), ("webhook-timestamp", "1764842400".into())],
        br#"{"a":1}"#,
    );
    assert_eq!(headers[2], ("webhook-signature", "v1,o8toqcO2d8fMU13RG6ZD+saEdqMGuSZp9J1VdTgOSx4=".into()));
    assert!(!format!("{sink:?}").contains("k3y"), "Debug never shows the key");
}

#[test]
fn only_a_labelled_secret_with_a_plain_url_is_a_sink() {
    let refused = sink(&secret(false, &[("url", "https://hooks.example/x")])).unwrap_err();
    assert!(refused.contains("not labelled") && refused.contains(NOTIFY_SECRET_LABEL), "{refused}");
    assert!(sink(&secret(true, &[])).unwrap_err().contains("no url"));
    assert!(sink(&secret(true, &[("url", "file:///etc/passwd")])).unwrap_err().contains("http"));
    assert!(sink(&secret(true, &[("url", "https://a\r\nX-Evil: 1")])).unwrap_err().contains("control"));
    let long = "x".repeat(MAX_VALUE_BYTES + 1);
    assert!(sink(&secret(true, &[("url", "https://a"), ("token", &long)])).unwrap_err().contains("larger"));
    let ok = sink(&secret(true, &[("url", "https://hooks.example/x\n"), ("token", "t")])).unwrap();
    assert_eq!(ok.url, "https://hooks.example/x");
}

#[test]
fn an_alert_is_told_apart_by_its_id_and_a_cloud_event_says_what_it_is() {
    let now = "2026-12-04T10:05:00Z".parse().unwrap();
    let alert = alert(&notification(NotificationKind::BatchFailed), &about(), now);
    let labels = &alert[0]["labels"];
    assert_eq!(labels["fleetroll_event_id"], "u1/2/7");
    assert_eq!(
        (labels["alertname"].as_str(), labels["severity"].as_str()),
        (Some("FleetRolloutBatchFailed"), Some("warning"))
    );
    assert_eq!(alert[0]["startsAt"], "2026-12-04T10:00:00Z");
    assert_eq!(alert[0]["endsAt"], "2026-12-04T10:15:00Z", "it fires for a while after it is sent");
    let headers: BTreeMap<_, _> =
        cloud_event(&notification(NotificationKind::Started), &about(), now).into_iter().collect();
    assert_eq!(headers["ce-type"], "dev.fleetroll.rollout.started");
    assert_eq!(headers["ce-id"], "u1/2/7");
    assert_eq!(headers["ce-source"], "/apis/fleetroll.dev/v1alpha1/namespaces/shop/fleetrollouts/web");
    let body = event(&notification(NotificationKind::Started), &about());
    assert_eq!((body["kind"].as_str(), body["rollout"]["name"].as_str()), (Some("Started"), Some("web")));
}
