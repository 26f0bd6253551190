//! A rollout's Kubernetes Events as the page's timeline shows them. Anyone who may create Events in the
//! namespace can write them, so they are bounded here: only the rollout's own (its uid, chosen by the
//! watch), each text cut to [`TEXT_MAX`] bytes, at most [`KEPT`] remembered (the newest), and [`SHOWN`] sent.

use std::collections::HashMap;

use k8s_openapi::{api::core::v1::Event as KubeEvent, jiff::Timestamp};
use kube::ResourceExt;
use serde::Serialize;

use crate::core::text::cut;

/// The most events sent to the page (the newest).
pub const SHOWN: usize = 200;
/// The most events remembered; the oldest go first.
const KEPT: usize = 1000;
/// The most bytes of an event's message (and reason) shown.
const TEXT_MAX: usize = 1024;

#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Entry {
    pub time: Option<Timestamp>,
    #[serde(rename = "type")]
    pub kind: String,
    pub reason: String,
    pub message: String,
    pub count: i32,
}

impl Entry {
    pub fn of(e: &KubeEvent) -> Self {
        let time = e
            .last_timestamp
            .as_ref()
            .map(|t| t.0)
            .or_else(|| e.event_time.as_ref().map(|t| t.0))
            .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0));
        Entry {
            time,
            kind: cut(e.type_.as_deref().unwrap_or_default(), 32),
            reason: cut(e.reason.as_deref().unwrap_or_default(), TEXT_MAX),
            message: cut(e.message.as_deref().unwrap_or_default(), TEXT_MAX),
            count: e.count.unwrap_or(1),
        }
    }
}

/// The events seen, by uid.
#[derive(Default)]
pub struct Timeline {
    events: HashMap<String, Entry>,
}

impl Timeline {
    pub fn apply(&mut self, e: &KubeEvent) {
        self.events.insert(e.uid().unwrap_or_default(), Entry::of(e));
        if self.events.len() > KEPT
            && let Some(oldest) = self.events.iter().min_by_key(|(_, e)| e.time).map(|(k, _)| k.clone())
        {
            self.events.remove(&oldest);
        }
    }

    pub fn remove(&mut self, e: &KubeEvent) {
        self.events.remove(&e.uid().unwrap_or_default());
    }

    pub fn clear(&mut self) {
        self.events.clear();
    }

    /// The newest [`SHOWN`], oldest first.
    pub fn newest(&self) -> Vec<Entry> {
        let mut all: Vec<Entry> = self.events.values().cloned().collect();
        all.sort_by_key(|e| e.time);
        all.split_off(all.len().saturating_sub(SHOWN))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn event(uid: &str, at: &str, message: &str) -> KubeEvent {
        serde_json::from_value(json!({
            "metadata": {"name": uid, "namespace": "shop", "uid": uid},
            "involvedObject": {"kind": "FleetRollout", "name": "web"},
            "type": "Normal", "reason": "BatchStarted", "message": message, "lastTimestamp": at,
        }))
        .expect("an event")
    }

    #[test]
    fn events_are_shown_in_time_order_with_long_messages_cut() {
        let mut t = Timeline::default();
        t.apply(&event("b", "2026-12-05T10:00:44.5Z", "second"));
        t.apply(&event("a", "2026-12-05T10:00:44Z", &"x".repeat(500_000)));
        let shown = t.newest();
        assert_eq!(shown[1].message, "second", "44.5 s comes after 44 s, whatever the text sorts as");
        assert!(shown[0].message.len() <= TEXT_MAX && shown[0].message.ends_with('…'));
    }

    #[test]
    fn a_flood_of_events_is_bounded_and_the_newest_are_shown() {
        let mut t = Timeline::default();
        for i in 0..(KEPT + 500) {
            let at = Timestamp::from_second(1_800_000_000 + i as i64).expect("a time");
            t.apply(&event(&format!("e{i}"), &at.to_string(), "m"));
        }
        assert_eq!(t.events.len(), KEPT);
        let shown = t.newest();
        assert_eq!(shown.len(), SHOWN);
        let last = Timestamp::from_second(1_800_000_000 + (KEPT + 499) as i64).expect("a time");
        assert_eq!(shown.last().and_then(|e| e.time), Some(last));
    }
}
