//! The namespaces as the controller's cache keeps them: the opt-in label (and the labels rules select
//! on), and the change windows a namespace's owner declares; nothing else of them.

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};

use super::Context;
use crate::{
    api::{FleetRollout, WINDOWS_ANNOTATION},
    core::{
        window::{self, Owner},
        workload,
    },
};

/// The change windows a namespace's owner declares (its `fleetroll.dev/windows` annotation), as the cache
/// keeps it, or a member cluster's (its Secret's, from `members`, [`member_windows`]); None for other
/// owners and places without.
pub(super) fn declared_windows(ctx: &Context, members: &MemberWindows, owner: &Owner) -> Option<String> {
    match owner {
        Owner::Namespace(ns) => {
            let namespace = ctx.stores.namespaces.get(&ObjectRef::new(ns))?;
            namespace.annotations().get(WINDOWS_ANNOTATION).cloned()
        }
        Owner::Cluster(cluster) => members.get(cluster).cloned().flatten(),
        Owner::Policy(_) | Owner::Rollout => None,
    }
}

/// The member clusters' declared windows, by name.
pub(super) type MemberWindows = crate::edge::members::DeclaredWindows;

/// The windows of the member clusters, for a rollout across them whose next batch may start (read from
/// their Secrets, at most 5 s ago); none for any other. An error when they cannot be read: the step is
/// tried again rather than judged as if no member declared any.
pub(super) async fn member_windows(ctx: &Context, fr: &FleetRollout) -> crate::error::Result<MemberWindows> {
    let phase = fr.status.as_ref().map(|s| s.phase).unwrap_or_default();
    let may_start = !phase.is_terminal() && phase != crate::api::Phase::RollingBack;
    match fr.spec.targets.clusters.is_some() && may_start {
        true => ctx.members.members().windows().await,
        false => Ok(MemberWindows::default()),
    }
}

/// The rollouts whose next batch `namespace`'s windows hold now: a change of the namespace (its windows
/// annotation, say) wakes them at once, rather than at their next look.
pub(super) fn held_by(rollouts: &Store<FleetRollout>, namespace: &Namespace) -> Vec<ObjectRef<FleetRollout>> {
    let owner = Owner::Namespace(namespace.name_any()).to_string();
    let holds = |fr: &FleetRollout| {
        fr.status.as_ref().and_then(|s| s.window_hold.as_ref()).is_some_and(|h| h.owner == owner)
    };
    rollouts.state().iter().filter(|fr| holds(fr)).map(|fr| ObjectRef::from_obj(fr.as_ref())).collect()
}

/// A namespace as the cache keeps it: name and labels (the opt-in label at least, all of them unless
/// they weigh more than a workload's may), and its windows annotation.
pub(super) fn kept(n: &mut Namespace) {
    let labels = n.metadata.labels.take().unwrap_or_default();
    // The windows annotation, bounded: one too long to be read is kept as a marker that fails to parse,
    // so its targets are held with why rather than changed outside windows their owner declared.
    let annotations = n.metadata.annotations.take();
    let windows = annotations.and_then(|mut a| a.remove(WINDOWS_ANNOTATION)).map(|v| match v.len() {
        n if n <= window::ANNOTATION_MAX => v,
        _ => window::ANNOTATION_TOO_LONG.to_string(),
    });
    let kept = workload::kept_labels(&labels).unwrap_or_else(|| {
        labels.into_iter().filter(|(k, v)| k == crate::api::OPT_IN_LABEL && v.len() <= 64).collect()
    });
    n.metadata = kube::api::ObjectMeta {
        name: n.metadata.name.take(),
        resource_version: n.metadata.resource_version.take(),
        uid: n.metadata.uid.take(),
        labels: Some(kept),
        annotations: windows.map(|w| [(crate::api::WINDOWS_ANNOTATION.to_string(), w)].into()),
        ..Default::default()
    };
    n.spec = None;
    n.status = None;
}
