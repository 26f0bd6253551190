use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::{
    api::{FleetRolloutSpec, Phase, SecretRef, SinkKind, Subscription},
    core::{notify::subscribers, policy::Guardrails},
};

fn subscription(name: &str, events: &[NotificationKind]) -> Subscription {
    Subscription {
        name: name.into(),
        sink: SinkKind::Webhook,
        secret_ref: SecretRef { name: name.into() },
        events: events.to_vec(),
    }
}

fn deleted_at() -> Timestamp {
    "2026-12-07T10:00:00Z".parse().unwrap()
}

fn after(seconds: i64) -> Timestamp {
    deleted_at().checked_add(SignedDuration::from_secs(seconds)).unwrap()
}

/// A rollout's own subscription `mine`, and the platform's `audit` hearing `platform_hears` (all: empty).
fn governed(platform_hears: &[NotificationKind]) -> (FleetRolloutSpec, Guardrails) {
    let spec = FleetRolloutSpec { notify: vec![subscription("mine", &[])], ..Default::default() };
    let guardrails = Guardrails {
        notify: vec![("audit-policy".into(), vec![subscription("audit", platform_hears)])],
        ..Default::default()
    };
    (spec, guardrails)
}

fn running() -> FleetRolloutStatus {
    FleetRolloutStatus { phase: Phase::Progressing, current_batch: Some(2), ..Default::default() }
}

fn deleted<'a>(
    status: &'a FleetRolloutStatus,
    subscribers: &'a [Subscriber<'a>],
    delivered: &'a BTreeSet<(String, String)>,
) -> Deleted<'a> {
    Deleted { uid: "u1", rollout: "shop/web", status, deleted_at: deleted_at(), subscribers, delivered }
}

#[test]
fn the_finalizer_is_carried_while_a_policy_subscription_hears_of_the_rollout() {
    let (spec, guardrails) = governed(&[]);
    let platform = subscribers(&spec, &guardrails);
    let ungoverned = Guardrails::default();
    let own_only = subscribers(&spec, &ungoverned);
    assert_eq!(finalizer_change(&platform, false), Some(true));
    assert_eq!(finalizer_change(&platform, true), None);
    assert_eq!(finalizer_change(&own_only, true), Some(false), "the policy's subscription went");
    assert_eq!(finalizer_change(&own_only, false), None, "the tenant's own subscriptions need none");
}

#[test]
fn a_rollout_deleted_mid_way_tells_the_platform_once_then_waits_for_the_platform_alone() {
    let (spec, guardrails) = governed(&[]);
    let subs = subscribers(&spec, &guardrails);
    let nothing = BTreeSet::new();
    let status = running();
    let Farewell::Write(written) = farewell(&deleted(&status, &subs, &nothing), after(1)) else {
        panic!("the deletion is told first")
    };
    let outbox = written.notifications.clone().unwrap();
    assert!(outbox.deletion_told);
    let told = &outbox.pending[0];
    assert_eq!(
        (told.kind, told.batch, told.reason.as_str()),
        (NotificationKind::Deleted, Some(2), "Deleted")
    );
    assert_eq!(told.to, ["rollout/mine", "policy/audit-policy/audit"]);
    assert!(told.message.contains("shop/web was deleted while Progressing"), "{}", told.message);
    // Told once: from the written status it waits, and not past the grace.
    assert_eq!(farewell(&deleted(&written, &subs, &nothing), after(2)), Farewell::Wait(RECHECK));
    assert_eq!(
        farewell(&deleted(&written, &subs, &nothing), after(598)),
        Farewell::Wait(Duration::from_secs(2))
    );
    assert_eq!(
        farewell(&deleted(&written, &subs, &nothing), after(600)),
        Farewell::Release { undelivered: 1 }
    );
    // Delivered to the platform: it goes, though the tenant's own subscription was not.
    let to_platform = BTreeSet::from([(told.id.clone(), "policy/audit-policy/audit".to_string())]);
    assert_eq!(
        farewell(&deleted(&written, &subs, &to_platform), after(3)),
        Farewell::Release { undelivered: 0 }
    );
}

#[test]
fn a_finished_rollout_or_one_the_platform_does_not_hear_deleted_of_only_waits_for_what_is_owed() {
    let (spec, guardrails) = governed(&[]);
    let subs = subscribers(&spec, &guardrails);
    let nothing = BTreeSet::new();
    let finished = FleetRolloutStatus { phase: Phase::Succeeded, ..Default::default() };
    assert_eq!(
        farewell(&deleted(&finished, &subs, &nothing), after(1)),
        Farewell::Release { undelivered: 0 }
    );
    let (spec, guardrails) = governed(&[NotificationKind::Started]);
    let subs = subscribers(&spec, &guardrails);
    let mut owing = running();
    let started = Happening {
        kind: NotificationKind::Started,
        batch: None,
        reason: reason::PLANNED.into(),
        message: "started".into(),
    };
    record("u1", vec![started], &running(), &mut owing, &subs, &nothing, deleted_at());
    assert_eq!(farewell(&deleted(&owing, &subs, &nothing), after(1)), Farewell::Wait(RECHECK));
    assert_eq!(farewell(&deleted(&owing, &subs, &nothing), after(601)), Farewell::Release { undelivered: 1 });
}

#[test]
fn a_written_deletion_survives_the_status_round_trip() {
    let (spec, guardrails) = governed(&[]);
    let subs = subscribers(&spec, &guardrails);
    let nothing = BTreeSet::new();
    let status = FleetRolloutStatus { finished_at: Some(Time(deleted_at())), ..running() };
    let Farewell::Write(written) = farewell(&deleted(&status, &subs, &nothing), after(1)) else {
        panic!("the deletion is told first")
    };
    let read_back: FleetRolloutStatus =
        serde_json::from_value(serde_json::to_value(&*written).unwrap()).unwrap();
    assert_eq!(read_back, *written);
    assert!(matches!(farewell(&deleted(&read_back, &subs, &nothing), after(2)), Farewell::Wait(_)));
}
