//! The controller's writes to FleetRollouts themselves: status (the checkpoint, always with the
//! resourceVersion read), the events that announce it, the operator's finalizers, and deletion when its
//! TTL has passed.

use std::sync::Arc;

use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use tracing::debug;

use super::{events::Events, own_writes::OwnWrites};
use crate::{
    api::{FIELD_MANAGER, FleetRollout, FleetRolloutStatus},
    core::rollout::{self, Event, Transition},
    error::{Error, Result, is_not_found},
    metrics::{Metrics, WriteLabel},
};

/// The finalizer a node rollout carries while it holds its DaemonSet, so that deleting the rollout (by hand,
/// or by `ttlSecondsAfterFinished`) hands the DaemonSet back instead of leaving it on OnDelete for good.
pub use crate::api::RELEASE_DAEMONSET_FINALIZER as FINALIZER;

pub struct Rollouts {
    client: Client,
    events: Arc<Events>,
    metrics: Arc<Metrics>,
    /// The cache may lag behind our own writes, and acting on a stale status would only earn a conflict.
    written: OwnWrites<FleetRollout>,
}

impl Rollouts {
    /// `identity` names this replica in the events it publishes.
    pub fn new(client: Client, identity: &str, metrics: Arc<Metrics>) -> Self {
        Self {
            events: Arc::new(Events::new(client.clone(), "fleetroll", identity)),
            client,
            metrics,
            written: OwnWrites::default(),
        }
    }

    fn api(&self, fr: &FleetRollout) -> Api<FleetRollout> {
        Api::namespaced(self.client.clone(), &fr.namespace().unwrap_or_default())
    }

    /// The cached rollout, or our own write of it when that is newer.
    pub fn newest(&self, cached: Arc<FleetRollout>) -> Arc<FleetRollout> {
        self.written.newest(cached)
    }

    /// Persists a status with the resourceVersion we read: if anything changed since, the API server refuses
    /// (409, [`crate::error::Error::Conflict`]) and the caller re-reads instead of overwriting.
    pub async fn write_status(&self, fr: &FleetRollout, t: Transition) -> Result<Arc<FleetRollout>> {
        let unwritten = FleetRolloutStatus::default();
        let intent = rollout::is_intent(fr.status.as_ref().unwrap_or(&unwritten), &t.status);
        let label = WriteLabel { write: if intent { "intent" } else { "other" }.into() };
        let mut next = fr.clone();
        next.status = Some(t.status);
        next.metadata.managed_fields = None;
        let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        let sent = std::time::Instant::now();
        let mut written = self.api(fr).replace_status(&fr.name_any(), &pp, &next).await?;
        self.metrics.status_write_duration.get_or_create(&label).observe(sent.elapsed().as_secs_f64());
        crate::api::kept_for_cache(&mut written, &[crate::api::TASK_TOKEN_HASH_ANNOTATION]);
        let written = Arc::new(written);
        self.metrics.status_writes.inc();
        self.written.remember(&written);
        if let Some(s) = &written.status {
            debug!(phase = %s.phase, batch = ?s.current_batch, "status written");
        }
        self.publish(&written, t.events);
        Ok(written)
    }

    /// The rollout as the API server has it now.
    pub async fn refetch(&self, fr: &FleetRollout) -> Result<Arc<FleetRollout>> {
        Ok(Arc::new(self.api(fr).get(&fr.name_any()).await?))
    }

    /// Deletes the rollout (its TTL has passed); gone already is fine.
    pub async fn delete(&self, fr: &FleetRollout) -> Result<()> {
        // Only the rollout as judged: one changed since (a rollback asked for, a new image) is read again,
        // not deleted with the request.
        let preconditions =
            kube::api::Preconditions { uid: fr.uid(), resource_version: fr.resource_version() };
        let params = kube::api::DeleteParams { preconditions: Some(preconditions), ..Default::default() };
        match self.api(fr).delete(&fr.name_any(), &params).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) if crate::error::is_conflict(&e) => Err(Error::Conflict),
            Err(e) => Err(Error::Kube(e)),
        }
    }

    /// Adds or removes one of the operator's finalizers, with the resourceVersion read (a concurrent change
    /// gets a conflict, not a lost update). Returns the rollout as written; None when there was nothing to do.
    pub async fn set_finalizer(
        &self,
        fr: &FleetRollout,
        finalizer: &str,
        on: bool,
    ) -> Result<Option<Arc<FleetRollout>>> {
        set_finalizer(&self.client, fr, finalizer, on).await.map(|written| written.map(Arc::new))
    }

    /// Events are best effort and must not slow the rollout down: they are sent in the background.
    /// Publishes a Warning event about `fr` that no status write carries (in the background).
    pub fn warn(&self, fr: &FleetRollout, reason: &'static str, message: String) {
        self.publish(fr, vec![Event::warning(reason, None, message)]);
    }

    fn publish(&self, fr: &FleetRollout, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let publisher = self.events.clone();
        let reference = fr.object_ref(&());
        tokio::spawn(async move { publisher.publish_step(events, &reference).await });
    }
}

/// Whether the rollout carries [`FINALIZER`].
pub fn holds_daemonset(fr: &FleetRollout) -> bool {
    holds(fr, FINALIZER)
}

/// Whether the rollout carries `finalizer`.
pub fn holds(fr: &FleetRollout, finalizer: &str) -> bool {
    fr.finalizers().iter().any(|f| f == finalizer)
}

pub(super) async fn set_finalizer(
    client: &Client,
    fr: &FleetRollout,
    finalizer: &str,
    on: bool,
) -> Result<Option<FleetRollout>> {
    if holds(fr, finalizer) == on {
        return Ok(None);
    }
    let api = Api::<FleetRollout>::namespaced(client.clone(), &fr.namespace().unwrap_or_default());
    // The caches keep only the operator's own finalizers: the others come from the object itself, and the
    // precondition on what was decided from still holds.
    let Some(live) = api.get_metadata_opt(&fr.name_any()).await? else { return Ok(None) };
    let mut finalizers = live.finalizers().to_vec();
    finalizers.retain(|f| f != finalizer);
    if on {
        finalizers.push(finalizer.into());
    }
    let patch =
        serde_json::json!({"metadata": {"resourceVersion": fr.resource_version(), "finalizers": finalizers}});
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    match api.patch(&fr.name_any(), &params, &Patch::Merge(patch)).await {
        Ok(mut written) => {
            crate::api::kept_for_cache(&mut written, &[crate::api::TASK_TOKEN_HASH_ANNOTATION]);
            Ok(Some(written))
        }
        // Deleted and finalized meanwhile: nothing left to hold.
        Err(e) if is_not_found(&e) && !on => Ok(None),
        Err(e) => Err(e.into()),
    }
}
