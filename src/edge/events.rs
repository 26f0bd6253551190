//! Events about rollouts, as events.k8s.io/v1 objects. The same event again (type, reason, action and
//! note alike) within [`SERIES_TTL`] becomes a series of the first, as client-go makes it. kube's Recorder
//! also folds an event whose note differs into the first one's series, so a second measurement of a batch
//! or a second cluster's trouble was counted and never read: here that is an event of its own.

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

use crate::error::is_not_found;

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
}
