//! A rollout the platform hears of, deleted by hand. While a FleetRolloutPolicy's subscription governs a
//! rollout, the rollout carries the operator's finalizer ([`PLATFORM_NOTIFICATIONS_FINALIZER`]): deleting
//! it (a right the tenant has, judged as any deletion) tells the platform it went, and it goes once what the
//! platform is owed was delivered, or after [`DELETION_GRACE`]. The admission policy keeps the finalizer out
//! of the tenant's hands; the tenant's own subscriptions are not waited for.
//!
//! [`PLATFORM_NOTIFICATIONS_FINALIZER`]: crate::api::PLATFORM_NOTIFICATIONS_FINALIZER

use std::{collections::BTreeSet, time::Duration};

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::{DELETION_GRACE, Happening, Subscriber, acknowledge, is_platform, owed, record};
use crate::{
    api::{FleetRolloutStatus, NotificationKind},
    core::{reason, text},
};

/// How soon a deleted rollout that waits for its deliveries is looked at again (a delivery wakes it
/// sooner).
const RECHECK: Duration = Duration::from_secs(5);

/// Whether a rollout not being deleted is to gain (`Some(true)`) or lose (`Some(false)`) the finalizer:
/// it carries it while any policy's subscription hears of it.
pub fn finalizer_change(subscribers: &[Subscriber], holds: bool) -> Option<bool> {
    let wanted = subscribers.iter().any(|s| s.policy.is_some());
    (wanted != holds).then_some(wanted)
}

/// A deleted rollout that still carries the finalizer, as the operator sees it.
pub struct Deleted<'a> {
    pub uid: &'a str,
    /// Its `namespace/name`.
    pub rollout: &'a str,
    pub status: &'a FleetRolloutStatus,
    /// Its deletionTimestamp.
    pub deleted_at: Timestamp,
    pub subscribers: &'a [Subscriber<'a>],
    /// What was delivered and is not yet written (id, subscriber key).
    pub delivered: &'a BTreeSet<(String, String)>,
}

/// What a deleted rollout holding the finalizer does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Farewell {
    /// Write this status: the Deleted notification recorded in its outbox.
    Write(Box<FleetRolloutStatus>),
    /// Wait for the platform's deliveries; look again after this long.
    Wait(Duration),
    /// Let it go; `undelivered` notifications the platform was owed are lost (the grace ran out).
    Release { undelivered: usize },
}

/// The next step of a deleted rollout's farewell: a rollout deleted before it finished tells the platform
/// once; then it waits while a platform subscription is owed anything, for at most [`DELETION_GRACE`] from
/// its deletion.
pub fn farewell(d: &Deleted, now: Timestamp) -> Farewell {
    let told = d.status.notifications.as_ref().is_some_and(|o| o.deletion_told);
    let platform_hears =
        d.subscribers.iter().any(|s| s.policy.is_some() && s.hears(NotificationKind::Deleted));
    if !told && platform_hears && !d.status.phase.is_terminal() {
        let mut after = d.status.clone();
        record(d.uid, vec![deleted(d)], d.status, &mut after, d.subscribers, d.delivered, now);
        after.notifications.get_or_insert_default().deletion_told = true;
        return Farewell::Write(Box::new(after));
    }
    let mut outbox = d.status.notifications.clone().unwrap_or_default();
    acknowledge(&mut outbox, d.delivered, d.subscribers);
    let undelivered = owed(&outbox).filter(|(_, key)| is_platform(key)).count();
    let grace = SignedDuration::try_from(DELETION_GRACE).unwrap_or(SignedDuration::ZERO);
    let left =
        d.deleted_at.checked_add(grace).map_or(SignedDuration::ZERO, |until| until.duration_since(now));
    match Duration::try_from(left) {
        Ok(left) if undelivered > 0 && !left.is_zero() => Farewell::Wait(RECHECK.min(left)),
        _ => Farewell::Release { undelivered },
    }
}

fn deleted(d: &Deleted) -> Happening {
    let s = d.status;
    let message = format!(
        "{} was deleted while {} (revision {}, {} of {} targets updated): its targets keep what they have",
        d.rollout,
        s.phase,
        s.revision_number(),
        s.counts.updated,
        s.counts.total,
    );
    Happening {
        kind: NotificationKind::Deleted,
        batch: s.current_batch,
        reason: reason::DELETED.into(),
        message: text::cut(&message, super::MESSAGE_MAX),
    }
}

#[cfg(test)]
mod tests;
