//! The three workload kinds seen through one lens: their containers, our annotations, and whether their own
//! rollout is complete. Also the server-side-apply body that changes a target's image.
//!
//! Pure functions over the API objects; no client here.

use std::collections::BTreeMap;

use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment, StatefulSet},
    core::v1::PodTemplateSpec,
};
use kube_core::ResourceExt;
use serde_json::{Value, json};

use crate::api::{APPLIED_ANNOTATION, ROLLOUT_ANNOTATION, TargetKind};

/// What the labels the facts of one workload keep may weigh ([`WorkloadFacts::weight`]: about twenty
/// labels of the usual kind): past that, none are kept (and the workload is never reported as an
/// unplanned match). Plans select workloads by label with the API server, so only reports read them here.
pub const LABELS_KEPT: usize = 4096;
/// The longest image reference kept. Docker's reference grammar allows a 255-byte name, a 128-byte tag
/// and a digest, about 460 bytes in all; anything longer cannot be pulled, and the API server would keep
/// megabytes of it.
pub const IMAGE_KEPT: usize = 512;
/// The most containers of one pod template kept (more is no workload anyone runs).
pub const CONTAINERS_KEPT: usize = 16;
/// The longest annotation value fleetroll reads back (its own keys and `namespace/name`s are far shorter).
pub const ANNOTATION_KEPT: usize = 512;

/// What fleetroll needs to know about one workload, each part bounded: whatever a tenant writes into its
/// workloads (images, labels, annotations, containers), the facts of one weigh at most about 15 KiB (a few
/// hundred bytes as workloads usually are), so the caches grow with the number of workloads, never their
/// size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadFacts {
    pub namespace: String,
    pub name: String,
    /// None when they weigh more than [`LABELS_KEPT`].
    pub labels: Option<BTreeMap<String, String>>,
    /// The `fleetroll.dev/applied` annotation, if any (and no longer than [`ANNOTATION_KEPT`]).
    pub applied: Option<String>,
    /// Each container, in order: its name and its image, or the length of an image longer than
    /// [`IMAGE_KEPT`]. At most [`CONTAINERS_KEPT`].
    pub containers: Vec<Container>,
    /// How many containers the template has beyond those kept.
    pub containers_cut: usize,
    pub generation: i64,
    pub status: RolloutStatus,
    /// The object's resourceVersion when these facts were taken: a change is made only against it.
    pub resource_version: Option<String>,
}

/// A container: its name, and its image or the length of an image longer than [`IMAGE_KEPT`].
pub type Container = (String, Result<String, usize>);

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
    /// Whether every decision reads `other` as it reads these: the same facts but for the resourceVersion.
    pub fn decides_as(&self, other: &Self) -> bool {
        // Named field by field, so that a fact added later is compared too (or left out on purpose).
        let WorkloadFacts {
            namespace,
            name,
            labels,
            applied,
            containers,
            containers_cut,
            generation,
            status,
            resource_version: _,
        } = self;
        let o = other;
        (namespace, name, labels, applied) == (&o.namespace, &o.name, &o.labels, &o.applied)
            && (containers, containers_cut, generation, status)
                == (&o.containers, &o.containers_cut, &o.generation, &o.status)
    }

    /// The image of the container a rollout changes: the named one, or the only one.
    pub fn container_image(&self, container: Option<&str>) -> Result<(&str, &str), ContainerError> {
        let only = self.containers_cut == 0;
        let index = match container {
            Some(_) => rolled_container(&self.containers, |(name, _)| name, container),
            None => rolled_container(&self.containers, |(name, _)| name, None).filter(|_| only),
        };
        match index.and_then(|i| self.containers.get(i)) {
            Some((name, Ok(image))) => Ok((name.as_str(), image.as_str())),
            Some((name, Err(bytes))) => Err(ContainerError::ImageTooLong {
                target: self.key(),
                container: name.clone(),
                bytes: *bytes,
            }),
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
            + self.resource_version.as_ref().map_or(0, text)
            + self.labels.as_ref().map_or(0, labels_weight)
            + self.containers.iter().map(|(n, i)| text(n) + i.as_ref().map_or(0, text)).sum::<usize>()
    }

    fn container_names(&self) -> String {
        let mut names = self.containers.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ");
        if self.containers_cut > 0 {
            names.push_str(&format!(" and {} more", self.containers_cut));
        }
        names
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
    #[error(
        "{target}: the image of container {container:?} is {bytes} bytes long, longer than any image \
         reference can be ({IMAGE_KEPT})"
    )]
    ImageTooLong { target: String, container: String, bytes: usize },
}

impl ContainerError {
    /// The reason a plan that meets this error is refused with.
    pub fn reason(&self) -> &'static str {
        match self {
            ContainerError::NotFound { .. } => crate::core::reason::CONTAINER_NOT_FOUND,
            ContainerError::Ambiguous { .. } => crate::core::reason::CONTAINER_AMBIGUOUS,
            ContainerError::ImageTooLong { .. } => crate::core::reason::IMAGE_TOO_LONG,
        }
    }
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

/// The containers kept of a pod template (at most [`CONTAINERS_KEPT`], each image at most [`IMAGE_KEPT`]
/// bytes), and how many more it has.
fn containers(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> (Vec<Container>, usize) {
    let all = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
    let kept = all
        .iter()
        .take(CONTAINERS_KEPT)
        .map(|c| {
            let image = c.image.as_deref().unwrap_or_default();
            let image = if image.len() <= IMAGE_KEPT { Ok(image.to_string()) } else { Err(image.len()) };
            (c.name.clone(), image)
        })
        .collect();
    (kept, all.len().saturating_sub(CONTAINERS_KEPT))
}

/// A workload's labels, unless they weigh more than [`LABELS_KEPT`].
pub fn kept_labels(labels: &BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    (labels_weight(labels) <= LABELS_KEPT).then(|| labels.clone())
}

/// What labels weigh held in a map: two Strings of 24 bytes and their text, and about as much again for the
/// tree's node.
fn labels_weight(labels: &BTreeMap<String, String>) -> usize {
    labels.iter().map(|(k, v)| 96 + k.len() + v.len()).sum()
}

/// An annotation's value, unless it is longer than any value fleetroll writes.
pub fn kept_annotation(obj: &impl ResourceExt, key: &str) -> Option<String> {
    obj.annotations().get(key).filter(|v| v.len() <= ANNOTATION_KEPT).cloned()
}

/// The facts every kind shares (name, labels, our annotation, containers), with the kind's own `status`.
fn facts(obj: &impl ResourceExt, template: &PodTemplateSpec, status: RolloutStatus) -> WorkloadFacts {
    let (containers, containers_cut) = containers(template.spec.as_ref());
    WorkloadFacts {
        namespace: obj.namespace().unwrap_or_default(),
        name: obj.name_any(),
        labels: kept_labels(obj.labels()),
        applied: kept_annotation(obj, APPLIED_ANNOTATION),
        containers,
        containers_cut,
        generation: obj.meta().generation.unwrap_or(0),
        status,
        resource_version: obj.meta().resource_version.clone().filter(|v| v.len() <= 64),
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

/// The server-side-apply body that sets one container's image and stamps our annotations. Applied with
/// field manager `fleetroll`, it owns exactly these fields and nothing else of the workload. It carries the
/// resourceVersion the facts were taken at, so it applies only to the workload as it was judged: two
/// rollouts that judged one workload free at once cannot both change it (the second gets a conflict and
/// judges it again).
pub fn image_patch(
    kind: TargetKind,
    target: &WorkloadFacts,
    container: &str,
    image: &str,
    applied_key: &str,
    rollout: &str,
) -> Value {
    let mut metadata = json!({
        "name": target.name,
        "namespace": target.namespace,
        "annotations": { APPLIED_ANNOTATION: applied_key, ROLLOUT_ANNOTATION: rollout },
    });
    if let Some(version) = &target.resource_version {
        metadata["resourceVersion"] = json!(version);
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": kind_name(kind),
        "metadata": metadata,
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
mod tests;
