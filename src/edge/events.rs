//! Events about rollouts, as events.k8s.io/v1 objects: what one reconcile step says of one thing (a type,
//! a reason and a batch) reads as one event, its notes joined; the same event again within [`SERIES_TTL`]
//! becomes a series of the first.
//!
//! Why not kube's `Recorder`: it keys a series as client-go does, by regarding, related, type, reason and
//! action, leaving the note out, and expects a distinct `action` or `related` object per fact. A rollout's
//! facts are in its notes (which measurement of a batch, which member cluster, which target failed), and
//! the objects they are about (a member's Secret, a metric) are not ones an event can usefully point at, so
//! under that key a second fact would be counted in the first's series and never read. Here the note is in
//! the key. Two more: the series remembered are capped ([`SERIES_KEPT`]; kube's cache grows with every
//! distinct event for six minutes), and a series whose event has expired is published anew rather than
//! failing with a 404 until its entry ages out.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event as KubeEvent, events::v1::EventSeries},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};

use tracing::warn;

use crate::{
    core::rollout::{Event as StepEvent, EventType},
    error::is_not_found,
};

/// How long a repeat of an event is counted in its series rather than published anew (kube's and
/// client-go's figure).
const SERIES_TTL: Duration = Duration::from_secs(6 * 60);
/// The most series remembered; the oldest are forgotten first (a repeat then starts a new event).
const SERIES_KEPT: usize = 4096;

/// One event to publish.
pub struct Event {
    pub warning: bool,
    pub reason: String,
    pub action: String,
    pub note: String,
}

/// What makes two events the same.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Key {
    regarding: (Option<String>, Option<String>, Option<String>),
    warning: bool,
    reason: String,
    action: String,
    note: String,
}

/// The event object a series lives in, how many it counts, and when it was last seen.
#[derive(Clone, Debug)]
struct Series {
    name: String,
    count: i32,
    last: Timestamp,
}

/// Publishes events as `controller` (replica `instance`).
pub struct Events {
    client: Client,
    controller: String,
    instance: String,
    series: Mutex<HashMap<Key, Series>>,
}

/// What to do with an event: create it under a new name, or count it in the series of an existing one.
#[derive(Debug, PartialEq, Eq)]
enum Publish {
    Create,
    Count { name: String, count: i32 },
}

/// Whether `key`, seen `now`, starts an event or repeats one of `known` (whose series are pruned of those
/// past [`SERIES_TTL`], and capped at [`SERIES_KEPT`]).
fn decide(known: &mut HashMap<Key, Series>, key: &Key, now: Timestamp) -> Publish {
    let ttl = k8s_openapi::jiff::SignedDuration::try_from(SERIES_TTL).unwrap_or_default();
    known.retain(|_, s| now.duration_since(s.last) < ttl);
    if known.len() >= SERIES_KEPT {
        let oldest = known.iter().min_by_key(|(_, s)| s.last).map(|(k, _)| k.clone());
        oldest.map(|k| known.remove(&k));
    }
    match known.get_mut(key) {
        Some(s) => {
            s.count = s.count.saturating_add(1);
            s.last = now;
            Publish::Count { name: s.name.clone(), count: s.count }
        }
        None => Publish::Create,
    }
}

impl Events {
    pub fn new(client: Client, controller: &str, instance: &str) -> Self {
        Self {
            client,
            controller: controller.to_string(),
            instance: instance.to_string(),
            series: Mutex::default(),
        }
    }

    /// Publishes what one reconcile step says about `regarding`, one event per type, reason and batch;
    /// best effort (a failure is logged, the rollout does not wait on it).
    pub async fn publish_step(&self, events: Vec<StepEvent>, regarding: &ObjectReference) {
        for e in merged(events) {
            let event = Event {
                warning: e.type_ == EventType::Warning,
                reason: e.reason.to_string(),
                note: e.message,
                action: e.batch.map_or_else(|| "Rollout".to_string(), |b| format!("Batch{}", b + 1)),
            };
            if let Err(err) = self.publish(event, regarding).await {
                warn!(error = %err, "could not publish an event");
            }
        }
    }

    /// Publishes `e` about `regarding`: a new event, or a repeat counted in its series.
    pub async fn publish(&self, e: Event, regarding: &ObjectReference) -> kube::Result<()> {
        let key = Key {
            regarding: (regarding.namespace.clone(), regarding.name.clone(), regarding.uid.clone()),
            warning: e.warning,
            reason: e.reason.clone(),
            action: e.action.clone(),
            note: e.note.clone(),
        };
        let now = Timestamp::now();
        let decided = decide(&mut self.lock(), &key, now);
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        let api: Api<KubeEvent> = Api::namespaced(self.client.clone(), &namespace);
        if let Publish::Count { name, count } = decided {
            let series = EventSeries { count, last_observed_time: MicroTime(now) };
            let patch = serde_json::json!({"series": series});
            match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => return Ok(()),
                // Gone (expired, deleted): published anew below.
                Err(err) if is_not_found(&err) => {}
                Err(err) => return Err(err),
            }
        }
        let name =
            format!("{}.{:x}", regarding.name.as_deref().unwrap_or(&self.controller), now.as_nanosecond());
        let event = KubeEvent {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(if e.warning { "Warning" } else { "Normal" }.into()),
            reason: Some(e.reason),
            action: Some(e.action),
            note: Some(e.note),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        api.create(&PostParams::default(), &event).await?;
        self.lock().insert(key, Series { name, count: 1, last: now });
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Series>> {
        // One insert or removal at a time: the map stays whole whatever panicked while holding it.
        self.series.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The most an Event's note may hold: events.k8s.io/v1 refuses a longer one (and the event with it).
const NOTE_MAX_BYTES: usize = 1024;

/// One event per type, reason and batch, their messages joined in order, each cut to what the API takes:
/// what one step says of one thing reads as one event (a plan's notes on clusters left out, say).
fn merged(events: Vec<StepEvent>) -> Vec<StepEvent> {
    let mut out: Vec<StepEvent> = Vec::new();
    for e in events {
        let same = |o: &&mut StepEvent| o.type_ == e.type_ && o.reason == e.reason && o.batch == e.batch;
        match out.iter_mut().find(same) {
            Some(first) => {
                first.message.push_str("; ");
                first.message.push_str(&e.message);
            }
            None => out.push(e),
        }
    }
    for e in &mut out {
        e.message = crate::core::text::cut(&e.message, NOTE_MAX_BYTES);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(note: &str) -> Key {
        Key {
            regarding: (Some("fleet".into()), Some("web".into()), Some("uid-1".into())),
            warning: false,
            reason: "AnalysisMeasured".into(),
            action: "Batch2".into(),
            note: note.into(),
        }
    }

    fn seen(name: &str, last: Timestamp) -> Series {
        Series { name: name.into(), count: 1, last }
    }

    #[test]
    fn only_the_same_note_within_the_ttl_is_counted_in_a_series() {
        let t0: Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        let later = |secs: i64| t0.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(secs)).unwrap();
        let mut known = HashMap::from([(key("error-rate 0.01 (1/3)"), seen("web.1", t0))]);
        assert_eq!(decide(&mut known, &key("error-rate 0.02 (2/3)"), later(10)), Publish::Create);
        assert_eq!(
            decide(&mut known, &key("error-rate 0.01 (1/3)"), later(20)),
            Publish::Count { name: "web.1".into(), count: 2 }
        );
        assert_eq!(
            decide(&mut known, &key("error-rate 0.01 (1/3)"), later(20 + 359)),
            Publish::Count { name: "web.1".into(), count: 3 },
            "the series was seen again 359 s ago: still within the TTL"
        );
        assert_eq!(decide(&mut known, &key("error-rate 0.01 (1/3)"), later(20 + 359 + 360)), Publish::Create);
        assert!(known.is_empty(), "series past the TTL are forgotten");
    }

    #[test]
    fn the_series_remembered_are_capped_oldest_first() {
        let t0: Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        let at = |ms: i64| t0.checked_add(k8s_openapi::jiff::SignedDuration::from_millis(ms)).unwrap();
        let mut known: HashMap<Key, Series> =
            (0..SERIES_KEPT as i64).map(|i| (key(&format!("n{i}")), seen(&format!("e{i}"), at(i)))).collect();
        assert_eq!(decide(&mut known, &key("new"), at(SERIES_KEPT as i64)), Publish::Create);
        assert_eq!(known.len(), SERIES_KEPT - 1);
        assert!(!known.contains_key(&key("n0")) && known.contains_key(&key("n1")));
    }

    #[test]
    fn the_events_of_one_kind_a_step_sends_read_as_one_and_every_note_fits_the_api() {
        let events = vec![
            StepEvent::warning("ClusterRefused", None, "member cluster a has no target".into()),
            StepEvent::normal("Planned", None, "waves: canary".into()),
            StepEvent::warning("ClusterRefused", None, "wave canary reaches no member cluster".into()),
            StepEvent::warning("ClusterRefused", Some(1), "in a batch: a series of its own".into()),
            StepEvent::warning("TargetFailed", Some(1), "é".repeat(2000)),
        ];
        let merged = merged(events);
        let shown: Vec<(&str, Option<u32>, &str)> =
            merged.iter().map(|e| (e.reason, e.batch, e.message.as_str())).collect();
        assert_eq!(
            shown[..3],
            [
                (
                    "ClusterRefused",
                    None,
                    "member cluster a has no target; wave canary reaches no member cluster"
                ),
                ("Planned", None, "waves: canary"),
                ("ClusterRefused", Some(1), "in a batch: a series of its own"),
            ]
        );
        let long = &merged[3].message;
        assert!(long.len() <= NOTE_MAX_BYTES && long.ends_with("é…"), "{}", long.len());
    }
}
