//! Durable notifications on the real control plane: a rollout that fails, rolls back, is re-run and
//! succeeds is told, every event once per id, to a signed webhook, a CloudEvents receiver and a real
//! Alertmanager (which routes it on to its own webhook); receivers that hang or answer 500 hold nothing
//! up and lose nothing; SIGKILLs of the operator lose nothing, and what is sent twice carries the same id.

use std::{collections::BTreeMap, time::Duration};

use fleetroll::api::{FleetRollout, NOTIFY_SECRET_LABEL, Phase};
use hmac::Mac;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use testkit::{
    alertmanager::Alertmanager,
    fleet::{Fleet, NEXT_IMAGE, READY_IMAGE, UNREADY_IMAGE, phase, with_fleet},
    operator::Operator,
    receiver::{Mode, Receiver, Request},
};

const DEADLINE: Duration = Duration::from_secs(180);
const KEY: &str = "a-shared-secret-for-signatures";
/// Receivers are on loopback, which notifications may reach only when allowed.
const ALLOW_LOOPBACK: &str = "--notify-allow=*=127.0.0.0/8";

async fn sink_secret(fleet: &Fleet, name: &str, url: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {NOTIFY_SECRET_LABEL: "true"}},
        "stringData": {"url": url, "hmacKey": KEY},
    }))
    .unwrap();
    Api::<Secret>::namespaced(fleet.client.clone(), &fleet.ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

fn spec(image: &str, notify: Value) -> Value {
    json!({
        "image": image,
        "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
        "strategy": {"batchSize": 1, "onFailure": "Rollback"},
        "health": {"timeout": "5s"},
        "notify": notify,
    })
}

fn subscription(name: &str, sink: &str) -> Value {
    json!({"name": name, "sink": sink, "secretRef": {"name": name}})
}

/// (id, kind) of each webhook or CloudEvent received, in order of arrival.
fn events(requests: &[Request], path: &str) -> Vec<(String, String)> {
    let body = |r: &Request| r.json.clone().unwrap_or_default();
    let of = |r: &Request| {
        (body(r)["id"].as_str().unwrap_or("").to_string(), body(r)["kind"].as_str().unwrap_or("").to_string())
    };
    requests.iter().filter(|r| r.path.ends_with(path)).map(of).collect()
}

/// (id, kind) of each alert Alertmanager passed on to its webhook.
fn alerts(requests: &[Request]) -> Vec<(String, String)> {
    let alerts = requests
        .iter()
        .filter_map(|r| r.json.clone())
        .flat_map(|m| m["alerts"].as_array().cloned().unwrap_or_default());
    alerts
        .map(|a| {
            let label = |k: &str| a["labels"][k].as_str().unwrap_or_default().to_string();
            (label("fleetroll_event_id"), label("fleetroll_event"))
        })
        .collect()
}

/// The kinds, once per id, in the order first seen; and whether any id came with two kinds.
fn distinct(seen: &[(String, String)]) -> Vec<String> {
    let mut first: BTreeMap<&str, &str> = BTreeMap::new();
    let mut order = Vec::new();
    for (id, kind) in seen {
        match first.get(id.as_str()) {
            Some(k) => assert_eq!(k, kind, "id {id} came as two kinds: {seen:?}"),
            None => {
                first.insert(id, kind);
                order.push(kind.clone());
            }
        }
    }
    order
}

fn outbox_empty(f: &FleetRollout) -> bool {
    f.status.as_ref().and_then(|s| s.notifications.as_ref()).is_none_or(|o| o.pending.is_empty())
}

/// Criterion 4: every event of a rollout that fails, rolls back, is re-run and succeeds reaches a signed
/// webhook, a CloudEvents receiver and a real Alertmanager, and the outbox empties.
#[tokio::test]
async fn every_event_of_a_failed_then_rerun_rollout_reaches_every_sink() {
    with_fleet("notify-sinks", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 2, READY_IMAGE).await;
        let receiver = Receiver::start();
        let am = Alertmanager::start(&receiver.url("alertmanager")).await;
        sink_secret(&fleet, "hook", &receiver.url("hook")).await;
        sink_secret(&fleet, "ce", &receiver.url("ce")).await;
        sink_secret(&fleet, "am", &am.url()).await;
        let _op = Operator::start(&fleet.ns, &[ALLOW_LOOPBACK], &[]);
        let notify = json!([
            subscription("hook", "Webhook"),
            subscription("ce", "CloudEvents"),
            subscription("am", "Alertmanager")
        ]);
        fleet.rollout("web", spec(UNREADY_IMAGE, notify.clone())).await;
        fleet.wait_rollout("web", "a rollback", DEADLINE, |f| phase(f) == Phase::RolledBack).await;
        // Re-run: the image that works, a second revision.
        fleet.patch_spec("web", json!({"image": NEXT_IMAGE})).await;
        fleet.wait_rollout("web", "success", DEADLINE, |f| phase(f) == Phase::Succeeded).await;

        let expected = ["Started", "BatchFailed", "RolledBack", "Started", "Succeeded"];
        let complete =
            |path: &'static str| move |r: &[Request]| distinct(&events(r, path)).len() >= expected.len();
        let got = receiver.wait_for(DEADLINE, complete("/hook")).await;
        assert_eq!(distinct(&events(&got, "/hook")), expected, "webhook");
        // Without a crash nothing is sent twice: what was delivered is not sent again from a stale cache.
        fleet.wait_rollout("web", "an empty outbox", DEADLINE, outbox_empty).await;
        let sent = events(&receiver.requests(), "/hook");
        assert_eq!(sent.len(), expected.len(), "each once: {sent:?}");
        let got = receiver.wait_for(DEADLINE, complete("/ce")).await;
        assert_eq!(distinct(&events(&got, "/ce")), expected, "CloudEvents");
        let got = receiver.wait_for(DEADLINE, |r| distinct(&alerts(r)).len() >= expected.len()).await;
        let mut routed = distinct(&alerts(&got));
        let mut want: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
        // Alertmanager groups and sends as it likes: the same set, not the same order.
        routed.sort();
        want.sort();
        assert_eq!(routed, want, "Alertmanager");

        // Each webhook is signed as Standard Webhooks say, and says which rollout and revision.
        for r in got.iter().filter(|r| r.path.ends_with("/hook")) {
            let (id, timestamp) = (r.header("webhook-id").unwrap(), r.header("webhook-timestamp").unwrap());
            let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(KEY.as_bytes()).unwrap();
            mac.update(format!("{id}.{timestamp}.").as_bytes());
            mac.update(&r.body);
            use base64::Engine;
            let want = format!(
                "v1,{}",
                base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
            );
            assert_eq!(r.header("webhook-signature"), Some(want.as_str()), "signature of {id}");
            let body = r.json.clone().unwrap();
            assert_eq!((body["rollout"]["name"].as_str(), body["id"].as_str()), (Some("web"), Some(id)));
        }
        let ce = got.iter().find(|r| r.path.ends_with("/ce")).unwrap();
        assert_eq!(ce.header("ce-type"), Some("dev.fleetroll.rollout.started"));
        assert_eq!(ce.header("ce-specversion"), Some("1.0"));
        let started = &events(&got, "/hook")[0];
        assert!(started.0.ends_with("/1/0"), "ids are <uid>/<revision>/<sequence>: {started:?}");
        // What was delivered leaves the outbox.
        fleet.wait_rollout("web", "an empty outbox", DEADLINE, outbox_empty).await;
    })
    .await;
}

/// A receiver that hangs for 30 s, then answers 500 for 30 s more, holds no batch up and loses nothing:
/// the rollout (four batches, 15 s apart) goes on and succeeds while nothing has been delivered, and every
/// event arrives once the receiver answers again. (How long transitions take with it is measured, side by
/// side with no sink, in `make bench`.)
#[tokio::test]
async fn a_receiver_that_hangs_then_fails_for_a_minute_holds_nothing_up_and_loses_nothing() {
    const OUTAGE: Duration = Duration::from_secs(60);
    with_fleet("notify-hang", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 4, READY_IMAGE).await;
        let receiver = Receiver::start();
        receiver.set_mode(Mode::Hang);
        sink_secret(&fleet, "hook", &receiver.url("hook")).await;
        let _op = Operator::start(&fleet.ns, &[ALLOW_LOOPBACK], &[]);
        let mut spec = spec(NEXT_IMAGE, json!([subscription("hook", "Webhook")]));
        spec["strategy"]["pauseBetweenBatches"] = json!("15s");
        let outage = tokio::time::Instant::now();
        fleet.rollout("web", spec).await;
        // The outage itself, not a wait for anything: it hangs for its first half, fails for its second.
        tokio::time::sleep_until(outage + OUTAGE / 2).await;
        let hung = receiver.attempts();
        assert!(hung >= 1, "a delivery was tried while it hung");
        receiver.set_mode(Mode::Fail(500));
        let done = fleet.wait_rollout("web", "success", DEADLINE, |f| phase(f) == Phase::Succeeded).await;
        tokio::time::sleep_until(outage + OUTAGE).await;
        assert!(receiver.requests().is_empty(), "nothing was delivered, and the rollout went on");
        assert!(receiver.attempts() > hung, "it was tried again while it answered 500");
        let owed = done.status.unwrap().notifications.unwrap().pending.len();
        assert_eq!(owed, 2, "Started and Succeeded are owed");
        receiver.set_mode(Mode::Ok);
        let got = receiver.wait_for(DEADLINE, |r| distinct(&events(r, "/hook")).len() >= 2).await;
        assert_eq!(distinct(&events(&got, "/hook")), ["Started", "Succeeded"]);
        fleet.wait_rollout("web", "an empty outbox", DEADLINE, outbox_empty).await;
    })
    .await;
}

/// SIGKILLs of the operator, after each notification and each approval: every event still arrives, and
/// one sent twice carries the same id.
#[tokio::test]
async fn sigkills_lose_no_notification_and_repeats_carry_the_same_id() {
    with_fleet("notify-kill", 0, |fleet| async move {
        fleet.deployments(&fleet.ns, 3, READY_IMAGE).await;
        let receiver = Receiver::start();
        sink_secret(&fleet, "hook", &receiver.url("hook")).await;
        // A short lease, so that each operator started after a SIGKILL takes over soon.
        let start = || Operator::start(&fleet.ns, &[ALLOW_LOOPBACK, "--lease-duration", "4s"], &[]);
        let mut op = start();
        let mut spec = spec(NEXT_IMAGE, json!([subscription("hook", "Webhook")]));
        spec["strategy"]["approval"] = json!("EveryBatch");
        fleet.rollout("web", spec).await;
        for batch in 0..3u32 {
            let waiting = |f: &FleetRollout| {
                f.status.as_ref().and_then(|s| s.pending_approval.as_ref()).is_some_and(|p| p.batch == batch)
            };
            let fr = fleet.wait_rollout("web", "the next approval", DEADLINE, waiting).await;
            // Killed as soon as the wait is told, before its delivery can be taken out of the outbox (or
            // later: what matters is that it comes, once per id).
            receiver.wait_for(DEADLINE, |r| told_waiting(r, batch)).await;
            op.kill();
            op = start();
            let plan = fr.status.and_then(|s| s.pending_approval).map(|p| p.plan_hash).unwrap();
            fleet.approve("web", &(0..=batch).collect::<Vec<_>>(), &plan).await;
            op.kill();
            op = start();
        }
        fleet.wait_rollout("web", "success", DEADLINE, |f| phase(f) == Phase::Succeeded).await;
        let expected =
            ["Started", "WaitingForApproval", "WaitingForApproval", "WaitingForApproval", "Succeeded"];
        let got =
            receiver.wait_for(DEADLINE, |r| distinct(&events(r, "/hook")).len() >= expected.len()).await;
        let seen = events(&got, "/hook");
        let kinds = distinct(&seen);
        // Started and the first WaitingForApproval may arrive in either order after a kill between them.
        let mut sorted = kinds.clone();
        sorted.sort();
        let mut want: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(sorted, want, "every event, once per id: {seen:?}");
        fleet.wait_rollout("web", "an empty outbox", DEADLINE, outbox_empty).await;
        drop(op);
    })
    .await;
}

/// Whether the webhook was told that `batch` waits for approval.
fn told_waiting(requests: &[Request], batch: u32) -> bool {
    requests
        .iter()
        .filter_map(|r| r.json.as_ref())
        .any(|b| b["kind"] == "WaitingForApproval" && b["batch"].as_u64() == Some(u64::from(batch)))
}
