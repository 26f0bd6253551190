//! The newest version of each object this process wrote. A watch cache lags behind our own writes by a
//! few milliseconds; reading through this never shows a caller something older than what we just wrote.
//! A write is kept until the cache has caught up with it, or for [`KEPT_FOR`] at most: one whose object was
//! deleted before the cache showed it would otherwise be kept for ever.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use kube::{Resource, ResourceExt, runtime::reflector::ObjectRef};

/// How long a write is served ahead of the cache: far longer than a watch lags.
const KEPT_FOR: Duration = Duration::from_secs(60);

pub struct OwnWrites<K: Resource<DynamicType = ()>> {
    newest: Mutex<HashMap<ObjectRef<K>, Written<K>>>,
}

/// A write, and when it was made.
type Written<K> = (Arc<K>, Instant);

impl<K: Resource<DynamicType = ()>> Default for OwnWrites<K> {
    fn default() -> Self {
        Self { newest: Mutex::new(HashMap::new()) }
    }
}

/// resourceVersions are opaque, but etcd's are one global counter: the larger is the newer, even across a
/// delete and re-create. An unparsable one never wins.
fn resource_version<K: Resource>(obj: &K) -> u64 {
    obj.resource_version().and_then(|v| v.parse().ok()).unwrap_or(0)
}

impl<K: Resource<DynamicType = ()>> OwnWrites<K> {
    pub fn remember(&self, written: &Arc<K>) {
        self.remember_at(written, Instant::now());
    }

    fn remember_at(&self, written: &Arc<K>, now: Instant) {
        if let Ok(mut newest) = self.newest.lock() {
            newest.retain(|_, (_, at)| now.saturating_duration_since(*at) < KEPT_FOR);
            newest.insert(ObjectRef::from_obj(written.as_ref()), (written.clone(), now));
        }
    }

    /// How many writes are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.newest.lock().map_or(0, |n| n.len())
    }

    /// The cached object, or our own write of it when that is newer. Once the cache has caught up, our
    /// copy is dropped, so this holds only writes the watch has not delivered yet.
    pub fn newest(&self, cached: Arc<K>) -> Arc<K> {
        let Ok(mut newest) = self.newest.lock() else {
            return cached;
        };
        let key = ObjectRef::from_obj(cached.as_ref());
        match newest.get(&key) {
            Some((ours, at))
                if resource_version(ours.as_ref()) > resource_version(cached.as_ref())
                    && at.elapsed() < KEPT_FOR =>
            {
                ours.clone()
            }
            Some(_) => {
                newest.remove(&key);
                cached
            }
            None => cached,
        }
    }

    /// Drops our copy (the object is gone, or was read afresh from the API server).
    pub fn forget(&self, key: &ObjectRef<K>) {
        if let Ok(mut newest) = self.newest.lock() {
            newest.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn cm(rv: &str, data: &str) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                name: Some("c".into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            data: Some([("k".to_string(), data.to_string())].into()),
            ..Default::default()
        })
    }

    #[test]
    fn a_lagging_cache_never_hides_our_newer_write() {
        let own = OwnWrites::default();
        own.remember(&cm("20", "ours"));
        assert_eq!(own.newest(cm("10", "stale")).data, cm("20", "ours").data);
        // The cache caught up (or went past): it wins, and our copy is dropped.
        assert_eq!(own.newest(cm("30", "later")).data, cm("30", "later").data);
        assert_eq!(own.newest(cm("10", "stale")).data, cm("10", "stale").data);
    }

    #[test]
    fn writes_of_objects_deleted_before_the_cache_showed_them_are_not_kept_for_ever() {
        let own = OwnWrites::default();
        let start = Instant::now();
        for i in 0..1000 {
            let mut obj = (*cm("5", "gone")).clone();
            obj.metadata.name = Some(format!("c{i}"));
            own.remember_at(&Arc::new(obj), start);
        }
        assert_eq!(own.len(), 1000);
        own.remember_at(&cm("7", "later"), start + KEPT_FOR);
        assert_eq!(own.len(), 1, "only the newest write is left");
    }

    #[test]
    fn forgotten_writes_are_not_served() {
        let own = OwnWrites::default();
        own.remember(&cm("20", "ours"));
        own.forget(&ObjectRef::from_obj(cm("20", "ours").as_ref()));
        assert_eq!(own.newest(cm("10", "stale")).data, cm("10", "stale").data);
    }
}
