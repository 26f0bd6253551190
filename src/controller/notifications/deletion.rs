//! The platform's finalizer on the rollouts a FleetRolloutPolicy subscribes notifications of: carried
//! while a policy's subscription hears of the rollout, and, once the rollout is deleted, removed after the
//! farewell the core decides (`core::notify::deletion`).

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt, runtime::controller::Action};
use tracing::warn;

use super::super::Context;
use crate::{
    api::{FleetRollout, PLATFORM_NOTIFICATIONS_FINALIZER as FINALIZER},
    core::{
        notify::{
            self,
            deletion::{Deleted, Farewell},
        },
        rollout::Transition,
    },
    edge::rollouts::holds,
    error::Result,
};

/// Before any step of a rollout not being deleted: the finalizer on while a policy's subscription hears of
/// it, off once none does. Returns the rollout as it is now.
pub(in crate::controller) async fn held(ctx: &Context, fr: Arc<FleetRollout>) -> Result<Arc<FleetRollout>> {
    let guardrails = crate::core::policy::guardrails(&ctx.policies.state(), fr.spec.creator.as_ref());
    let subscribers = notify::subscribers(&fr.spec, &guardrails);
    match notify::deletion::finalizer_change(&subscribers, holds(&fr, FINALIZER)) {
        Some(on) => Ok(ctx.rollouts_io.set_finalizer(&fr, FINALIZER, on).await?.unwrap_or(fr)),
        None => Ok(fr),
    }
}

/// A deleted rollout holding the finalizer: tells the platform it went, waits for what the platform is
/// owed to be delivered (a delivery wakes it), then lets it go.
pub(in crate::controller) async fn farewell(ctx: &Context, fr: &FleetRollout) -> Result<Action> {
    if !holds(fr, FINALIZER) {
        return Ok(Action::await_change());
    }
    let guardrails = crate::core::policy::guardrails(&ctx.policies.state(), fr.spec.creator.as_ref());
    let subscribers = notify::subscribers(&fr.spec, &guardrails);
    let uid = fr.uid().unwrap_or_default();
    let delivered = ctx.deliveries.delivered(&uid);
    let status = fr.status.clone().unwrap_or_default();
    let rollout = format!("{}/{}", fr.namespace().unwrap_or_default(), fr.name_any());
    let now = Timestamp::now();
    let deleted_at = fr.meta().deletion_timestamp.as_ref().map_or(now, |t| t.0);
    let deleted = Deleted {
        uid: &uid,
        rollout: &rollout,
        status: &status,
        deleted_at,
        subscribers: &subscribers,
        delivered: &delivered,
    };
    match notify::deletion::farewell(&deleted, now) {
        Farewell::Write(status) => {
            let t = Transition { status: *status, events: Vec::new() };
            let written = ctx.rollouts_io.write_status(fr, t).await?;
            ctx.deliveries.written(&uid, written.status.as_ref().and_then(|s| s.notifications.as_ref()));
            // Its own write wakes it again.
            Ok(Action::await_change())
        }
        Farewell::Wait(after) => Ok(Action::requeue(after)),
        Farewell::Release { undelivered } => {
            if undelivered > 0 {
                warn!(
                    undelivered,
                    "the rollout goes with notifications a FleetRolloutPolicy's subscription was owed undelivered: its sink did not take them within the grace"
                );
            }
            ctx.rollouts_io.set_finalizer(fr, FINALIZER, false).await?;
            Ok(Action::await_change())
        }
    }
}
