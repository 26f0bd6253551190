//! A workload as the controller's reflector caches keep it. The facts and annotations are the core's
//! (`core::workload`); the reflector's `Lookup` is kube-runtime's, which the core crate cannot depend on, so
//! the type lives here in the edge, beside the stores that hold it.

use std::{borrow::Cow, collections::BTreeMap, marker::PhantomData};

use kube::{Resource, ResourceExt, runtime::reflector::Lookup};

use crate::{
    api::ROLLOUT_ANNOTATION,
    core::{
        nodes::SAVED_STRATEGY_ANNOTATION,
        workload::{WorkloadFacts, kept_annotation},
    },
};

/// A workload as the controller's cache keeps it: its facts and our annotations, nothing else. A full
/// object costs about 6 KB of memory even when its fields are empty (the API structs are wide); this costs
/// a few hundred bytes, so a fleet of 10,000 is cached in a few MB.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cached<K> {
    pub facts: WorkloadFacts,
    /// The `fleetroll.dev/*` annotations the controller reads from the cache: the rollout that changed the
    /// workload last, and whether a node rollout holds it (the saved strategy's presence, not its value).
    pub annotations: BTreeMap<String, String>,
    kind: PhantomData<fn() -> K>,
}

impl<K: Resource + ResourceExt> Cached<K> {
    pub fn new(obj: &K, facts: fn(&K) -> WorkloadFacts) -> Self {
        let mut annotations = BTreeMap::new();
        if let Some(rollout) = kept_annotation(obj, ROLLOUT_ANNOTATION) {
            annotations.insert(ROLLOUT_ANNOTATION.to_string(), rollout);
        }
        if obj.annotations().contains_key(SAVED_STRATEGY_ANNOTATION) {
            annotations.insert(SAVED_STRATEGY_ANNOTATION.to_string(), String::new());
        }
        Self { facts: facts(obj), annotations, kind: PhantomData }
    }

    /// Whether every decision reads `other` as it reads this: the same facts but for the resourceVersion,
    /// the same annotations.
    pub fn decides_as(&self, other: &Self) -> bool {
        self.facts.decides_as(&other.facts) && self.annotations == other.annotations
    }

    /// The rollout that last changed this workload (our annotation), whose reconcile its changes wake.
    pub fn rollout(&self) -> Option<(&str, &str)> {
        self.annotations.get(ROLLOUT_ANNOTATION)?.split_once('/')
    }
}

/// What the reflector needs to key the cache: the workload's kind, name and namespace.
impl<K: Resource<DynamicType = ()>> Lookup for Cached<K> {
    type DynamicType = ();

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn name(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.facts.name))
    }

    fn namespace(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.facts.namespace))
    }

    fn resource_version(&self) -> Option<Cow<'_, str>> {
        self.facts.resource_version.as_deref().map(Cow::Borrowed)
    }

    fn uid(&self) -> Option<Cow<'_, str>> {
        None
    }
}

#[cfg(test)]
mod tests;
