//! A bounded cache whose answers go stale: for TokenReview and SubjectAccessReview answers.

use std::{
    hash::Hash,
    num::NonZeroUsize,
    sync::Mutex,
    time::{Duration, Instant},
};

use lru::LruCache;

/// A value as a cache holds it: fresh, or known but due for another look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Cached<V> {
    Fresh(V),
    Stale(V),
}

/// A least-recently-used map of bounded size whose entries go stale after a TTL. Stale entries are kept
/// (until evicted) so that a caller can tell "seen before, look again" from "never seen".
pub(crate) struct TtlLru<K: Hash + Eq, V> {
    ttl: Duration,
    entries: Mutex<LruCache<K, (V, Instant)>>,
}

impl<K: Hash + Eq, V: Clone> TtlLru<K, V> {
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        Self { ttl, entries: Mutex::new(LruCache::new(capacity)) }
    }

    pub fn get(&self, key: &K) -> Option<Cached<V>> {
        self.get_at(key, Instant::now())
    }

    fn get_at(&self, key: &K, now: Instant) -> Option<Cached<V>> {
        let mut entries = self.entries.lock().ok()?;
        let (value, at) = entries.get(key)?;
        let fresh = now.saturating_duration_since(*at) < self.ttl;
        Some(if fresh { Cached::Fresh(value.clone()) } else { Cached::Stale(value.clone()) })
    }

    pub fn insert(&self, key: K, value: V) {
        self.insert_at(key, value, Instant::now());
    }

    fn insert_at(&self, key: K, value: V, now: Instant) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.put(key, (value, now));
        }
    }

    pub fn remove(&self, key: &K) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.pop(key);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().map_or(0, |e| e.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_holds_a_bounded_number_of_entries_and_evicts_the_least_recently_used() {
        let cache = TtlLru::new(2, Duration::from_secs(30));
        cache.insert("a", 1);
        cache.insert("b", 2);
        assert_eq!(cache.get(&"a"), Some(Cached::Fresh(1)), "a is now the most recently used");
        cache.insert("c", 3);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(&"b"), None, "b was the least recently used");
        assert_eq!(cache.get(&"a"), Some(Cached::Fresh(1)));
        assert_eq!(cache.get(&"c"), Some(Cached::Fresh(3)));
        cache.remove(&"a");
        assert_eq!(cache.get(&"a"), None);
    }

    #[test]
    fn entries_go_stale_after_the_ttl_but_are_still_known() {
        let cache = TtlLru::new(8, Duration::from_secs(30));
        let t0 = Instant::now();
        cache.insert_at("k", 7, t0);
        assert_eq!(cache.get_at(&"k", t0 + Duration::from_secs(29)), Some(Cached::Fresh(7)));
        assert_eq!(cache.get_at(&"k", t0 + Duration::from_secs(30)), Some(Cached::Stale(7)));
        cache.insert_at("k", 8, t0 + Duration::from_secs(31));
        assert_eq!(cache.get_at(&"k", t0 + Duration::from_secs(32)), Some(Cached::Fresh(8)));
    }
}
