//! The three workload kinds seen through one lens: their containers, our annotations, and whether their own
//! rollout is complete. Also the server-side-apply body that changes a target's image.
//!
//! Pure functions over the API objects; no client here.

use std::{borrow::Cow, collections::BTreeMap, marker::PhantomData};

use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment, StatefulSet},
    core::v1::PodTemplateSpec,
};
use kube::{Resource, ResourceExt, runtime::reflector::Lookup};
use serde_json::{Value, json};

use crate::api::{APPLIED_ANNOTATION, ROLLOUT_ANNOTATION, TargetKind};

/// What fleetroll needs to know about one workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadFacts {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// The `fleetroll.dev/applied` annotation, if any.
    pub applied: Option<String>,
    /// (name, image) of each container, in order.
    pub containers: Vec<(String, String)>,
    pub generation: i64,
    pub status: RolloutStatus,
}

/// The workload's own rollout, from its status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RolloutStatus {
    pub observed_generation: i64,
    pub desired: i32,
    /// Pods of any revision (more than desired while old ones are still around).
    pub current: i32,
    pub updated: i32,
    pub ready: i32,
    pub available: i32,
    /// Deployment: Progressing=False with reason ProgressDeadlineExceeded.
    pub deadline_exceeded: bool,
    /// StatefulSet/DaemonSet with the OnDelete update strategy: pods never update by themselves.
    pub on_delete: bool,
    /// StatefulSet: currentRevision == updateRevision. Always true for the other kinds.
    pub revision_settled: bool,
}

/// Whether a workload's own rollout of its current template is complete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// Still rolling; the string says what it is waiting for.
    NotReady(String),
    /// It will not get there by itself.
    Failed {
        reason: &'static str,
        message: String,
    },
}

impl WorkloadFacts {
    /// The image of the container a rollout changes: the named one, or the only one.
    pub fn container_image(&self, container: Option<&str>) -> Result<(&str, &str), ContainerError> {
        match rolled_container(&self.containers, |(name, _)| name, container)
            .and_then(|i| self.containers.get(i))
        {
            Some((name, image)) => Ok((name.as_str(), image.as_str())),
            None => Err(match container {
                Some(wanted) => ContainerError::NotFound {
                    target: self.key(),
                    container: wanted.to_string(),
                    available: self.container_names(),
                },
                None => ContainerError::Ambiguous { target: self.key(), available: self.container_names() },
            }),
        }
    }

    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// About how many bytes of memory these facts hold: what bounds a cache or a list of them.
    pub fn weight(&self) -> usize {
        // A String's own 24 bytes, and about as much again per map entry for the tree it is kept in.
        let text = |s: &String| 24 + s.len();
        std::mem::size_of::<Self>()
            + self.namespace.len()
            + self.name.len()
            + self.applied.as_ref().map_or(0, text)
            + self.labels.iter().map(|(k, v)| 48 + text(k) + text(v)).sum::<usize>()
            + self.containers.iter().map(|(n, i)| text(n) + text(i)).sum::<usize>()
    }

    fn container_names(&self) -> String {
        self.containers.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
    }

    pub fn readiness(&self) -> Readiness {
        let s = &self.status;
        if s.observed_generation < self.generation {
            return Readiness::NotReady("its controller has not observed the change yet".into());
        }
        if s.deadline_exceeded {
            return Readiness::Failed {
                reason: "ProgressDeadlineExceeded",
                message: format!("{} exceeded its progress deadline", self.key()),
            };
        }
        if s.on_delete && s.updated < s.desired {
            return Readiness::NotReady(format!(
                "updateStrategy is OnDelete: {}/{} pods updated (pods must be deleted to update)",
                s.updated, s.desired
            ));
        }
        if s.updated < s.desired {
            return Readiness::NotReady(format!("{}/{} replicas updated", s.updated, s.desired));
        }
        if s.current > s.desired {
            return Readiness::NotReady(format!(
                "{} old replicas pending termination",
                s.current - s.desired
            ));
        }
        if s.ready < s.desired || s.available < s.desired {
            return Readiness::NotReady(format!(
                "{}/{} replicas ready, {} available",
                s.ready, s.desired, s.available
            ));
        }
        if !s.revision_settled {
            return Readiness::NotReady("the update revision is not current yet".into());
        }
        Readiness::Ready
    }
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ContainerError {
    #[error("{target} has no container named {container:?} (it has: {available})")]
    NotFound { target: String, container: String, available: String },
    #[error("{target} has several containers ({available}): set spec.container to choose one")]
    Ambiguous { target: String, available: String },
}

/// Which of a pod template's containers a rollout changes: the one named, or else the only one.
pub fn rolled_container<T>(
    containers: &[T],
    name_of: impl Fn(&T) -> &str,
    wanted: Option<&str>,
) -> Option<usize> {
    match wanted {
        Some(wanted) => containers.iter().position(|c| name_of(c) == wanted),
        None => (containers.len() == 1).then_some(0),
    }
}

fn containers(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> Vec<(String, String)> {
    spec.map(|s| s.containers.iter().map(|c| (c.name.clone(), c.image.clone().unwrap_or_default())).collect())
        .unwrap_or_default()
}

/// The facts every kind shares (name, labels, our annotation, containers), with the kind's own `status`.
fn facts(obj: &impl ResourceExt, template: &PodTemplateSpec, status: RolloutStatus) -> WorkloadFacts {
    WorkloadFacts {
        namespace: obj.namespace().unwrap_or_default(),
        name: obj.name_any(),
        labels: obj.labels().clone(),
        applied: obj.annotations().get(APPLIED_ANNOTATION).cloned(),
        containers: containers(template.spec.as_ref()),
        generation: obj.meta().generation.unwrap_or(0),
        status,
    }
}

fn on_delete(strategy_type: Option<&str>) -> bool {
    strategy_type == Some("OnDelete")
}

pub fn deployment_facts(d: &Deployment) -> WorkloadFacts {
    let st = d.status.clone().unwrap_or_default();
    let deadline_exceeded = st.conditions.iter().flatten().any(|c| {
        c.type_.as_deref() == Some("Progressing")
            && c.status.as_deref() == Some("False")
            && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    });
    let status = RolloutStatus {
        observed_generation: st.observed_generation.unwrap_or(0),
        desired: d.spec.replicas.unwrap_or(1),
        current: st.replicas.unwrap_or(0),
        updated: st.updated_replicas.unwrap_or(0),
        ready: st.ready_replicas.unwrap_or(0),
        available: st.available_replicas.unwrap_or(0),
        deadline_exceeded,
        on_delete: false,
        revision_settled: true,
    };
    facts(d, &d.spec.template, status)
}

pub fn statefulset_facts(s: &StatefulSet) -> WorkloadFacts {
    let st = s.status.clone().unwrap_or_default();
    let status = RolloutStatus {
        observed_generation: st.observed_generation.unwrap_or(0),
        desired: s.spec.replicas.unwrap_or(1),
        current: st.replicas,
        updated: st.updated_replicas.unwrap_or(0),
        ready: st.ready_replicas.unwrap_or(0),
        available: st.available_replicas.unwrap_or(0),
        deadline_exceeded: false,
        on_delete: on_delete(s.spec.update_strategy.as_ref().and_then(|u| u.type_.as_deref())),
        revision_settled: st.update_revision.is_none() || st.current_revision == st.update_revision,
    };
    facts(s, &s.spec.template, status)
}

pub fn daemonset_facts(d: &DaemonSet) -> WorkloadFacts {
    let st = d.status.clone().unwrap_or_default();
    let status = RolloutStatus {
        observed_generation: st.observed_generation.unwrap_or(0),
        desired: st.desired_number_scheduled,
        current: st.current_number_scheduled,
        updated: st.updated_number_scheduled.unwrap_or(0),
        ready: st.number_ready,
        available: st.number_available.unwrap_or(0),
        deadline_exceeded: false,
        on_delete: on_delete(d.spec.update_strategy.as_ref().and_then(|u| u.type_.as_deref())),
        revision_settled: true,
    };
    facts(d, &d.spec.template, status)
}

/// A workload as the controller's cache keeps it: its facts and our annotations, nothing else. A full
/// object costs about 6 KB of memory even when its fields are empty (the API structs are wide); this costs
/// a few hundred bytes, so a fleet of 10,000 is cached in a few MB.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cached<K> {
    pub facts: WorkloadFacts,
    /// The `fleetroll.dev/*` annotations.
    pub annotations: BTreeMap<String, String>,
    resource_version: Option<String>,
    kind: PhantomData<fn() -> K>,
}

impl<K: Resource> Cached<K> {
    pub fn new(obj: &K, facts: fn(&K) -> WorkloadFacts) -> Self {
        let annotations = obj
            .annotations()
            .iter()
            .filter(|(k, _)| k.starts_with("fleetroll.dev/"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Self {
            facts: facts(obj),
            annotations,
            resource_version: obj.meta().resource_version.clone(),
            kind: PhantomData,
        }
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
        self.resource_version.as_deref().map(Cow::Borrowed)
    }

    fn uid(&self) -> Option<Cow<'_, str>> {
        None
    }
}

/// The server-side-apply body that sets one container's image and stamps our annotations. Applied with
/// field manager `fleetroll`, it owns exactly these fields and nothing else of the workload.
pub fn image_patch(
    kind: TargetKind,
    namespace: &str,
    name: &str,
    container: &str,
    image: &str,
    applied_key: &str,
    rollout: &str,
) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": kind_name(kind),
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": { APPLIED_ANNOTATION: applied_key, ROLLOUT_ANNOTATION: rollout },
        },
        "spec": { "template": { "spec": { "containers": [ { "name": container, "image": image } ] } } },
    })
}

pub fn kind_name(kind: TargetKind) -> &'static str {
    match kind {
        TargetKind::Deployment => "Deployment",
        TargetKind::StatefulSet => "StatefulSet",
        TargetKind::DaemonSet => "DaemonSet",
        TargetKind::Node => "Node",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(status: RolloutStatus, generation: i64) -> WorkloadFacts {
        WorkloadFacts {
            namespace: "ns".into(),
            name: "web".into(),
            labels: BTreeMap::new(),
            applied: None,
            containers: vec![("web".into(), "web:v1".into()), ("sidecar".into(), "proxy:v1".into())],
            generation,
            status,
        }
    }

    fn settled(n: i32) -> RolloutStatus {
        RolloutStatus {
            observed_generation: 2,
            desired: n,
            current: n,
            updated: n,
            ready: n,
            available: n,
            revision_settled: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_fully_rolled_out_workload_is_ready() {
        assert_eq!(facts(settled(3), 2).readiness(), Readiness::Ready);
    }

    #[test]
    fn an_unobserved_generation_is_not_ready_whatever_the_counts() {
        assert!(matches!(facts(settled(3), 3).readiness(), Readiness::NotReady(_)));
    }

    #[test]
    fn old_replicas_or_unready_ones_keep_it_not_ready() {
        let mut s = settled(3);
        s.current = 4;
        assert!(matches!(facts(s, 2).readiness(), Readiness::NotReady(m) if m.contains("old replicas")));
        let mut s = settled(3);
        s.ready = 2;
        assert!(matches!(facts(s, 2).readiness(), Readiness::NotReady(_)));
        let mut s = settled(3);
        s.revision_settled = false;
        assert!(matches!(facts(s, 2).readiness(), Readiness::NotReady(_)));
    }

    #[test]
    fn a_deployment_past_its_progress_deadline_has_failed() {
        let mut s = settled(3);
        s.ready = 0;
        s.deadline_exceeded = true;
        assert!(matches!(
            facts(s, 2).readiness(),
            Readiness::Failed { reason: "ProgressDeadlineExceeded", .. }
        ));
    }

    #[test]
    fn zero_replicas_is_trivially_ready() {
        assert_eq!(facts(settled(0), 2).readiness(), Readiness::Ready);
    }

    #[test]
    fn the_container_is_named_or_the_only_one() {
        let f = facts(settled(1), 2);
        assert_eq!(f.container_image(Some("sidecar")), Ok(("sidecar", "proxy:v1")));
        assert!(matches!(f.container_image(None), Err(ContainerError::Ambiguous { .. })));
        let err = f.container_image(Some("nope")).unwrap_err();
        assert_eq!(err.to_string(), "ns/web has no container named \"nope\" (it has: web, sidecar)");
        let mut single = facts(settled(1), 2);
        single.containers.truncate(1);
        assert_eq!(single.container_image(None), Ok(("web", "web:v1")));
    }

    #[test]
    fn the_patch_touches_only_the_image_and_our_annotations() {
        let p = image_patch(TargetKind::StatefulSet, "ns", "db", "db", "db:v2", "uid/1/0", "fleet/r");
        assert_eq!(p["kind"], "StatefulSet");
        assert_eq!(p["metadata"]["annotations"][APPLIED_ANNOTATION], "uid/1/0");
        assert_eq!(p["spec"]["template"]["spec"]["containers"], json!([{"name": "db", "image": "db:v2"}]));
        assert_eq!(p["spec"].as_object().map(|o| o.len()), Some(1));
    }

    #[test]
    fn the_cache_keeps_the_facts_and_our_annotations_only() {
        let d: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "resourceVersion": "7", "generation": 2,
                "labels": {"app": "web"},
                "annotations": {ROLLOUT_ANNOTATION: "fleet/r1", "kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "web", "image": "web:v1"}]}}},
        }))
        .unwrap();
        let cached = Cached::new(&d, deployment_facts);
        assert_eq!(cached.facts, deployment_facts(&d));
        assert_eq!(cached.annotations.keys().collect::<Vec<_>>(), [ROLLOUT_ANNOTATION]);
        assert_eq!(cached.rollout(), Some(("fleet", "r1")));
        let key = cached.to_object_ref(());
        assert_eq!((key.name.as_str(), key.namespace.as_deref()), ("web", Some("ns")));
        assert_eq!(key.extra.resource_version.as_deref(), Some("7"));
        assert_eq!(<Cached<Deployment> as Lookup>::plural(&()), "deployments");
    }
}
