//! The newest version of each object this process wrote. A watch cache lags behind our own writes by a
//! few milliseconds; reading through this never shows a caller something older than what we just wrote.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use kube::{Resource, ResourceExt, runtime::reflector::ObjectRef};

pub struct OwnWrites<K: Resource<DynamicType = ()>> {
    newest: Mutex<HashMap<ObjectRef<K>, Arc<K>>>,
}

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
        if let Ok(mut newest) = self.newest.lock() {
            newest.insert(ObjectRef::from_obj(written.as_ref()), written.clone());
        }
    }

    /// The cached object, or our own write of it when that is newer. Once the cache has caught up, our
    /// copy is dropped, so this holds only writes the watch has not delivered yet.
    pub fn newest(&self, cached: Arc<K>) -> Arc<K> {
        let Ok(mut newest) = self.newest.lock() else {
            return cached;
        };
        let key = ObjectRef::from_obj(cached.as_ref());
        match newest.get(&key) {
            Some(ours) if resource_version(ours.as_ref()) > resource_version(cached.as_ref()) => ours.clone(),
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
    fn forgotten_writes_are_not_served() {
        let own = OwnWrites::default();
        own.remember(&cm("20", "ours"));
        own.forget(&ObjectRef::from_obj(cm("20", "ours").as_ref()));
        assert_eq!(own.newest(cm("10", "stale")).data, cm("10", "stale").data);
    }
}
