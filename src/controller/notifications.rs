//! Delivering the outboxes, beside the reconciles and never in their way. Every status write records what
//! its transition tells (`core::notify::record`), in that same write; a loop here reads the outboxes from
//! the cache and sends each notification to each subscription still owed it, one lane per rollout and
//! subscription (in order, one request at a time, with backoff after a failure), and remembers what was
//! delivered. The next status write of the rollout takes that out of its outbox; when none is coming, the
//! rollout is woken for a write of its own. The reconcile stays the only writer of status, so delivery
//! never costs a transition a conflict.
//!
//! What was delivered lives in memory until written: a crash in between sends it again, with the same id.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::jiff::Timestamp;
use kube::{ResourceExt, runtime::reflector::ObjectRef};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::Context;
use crate::{
    api::{FleetRollout, FleetRolloutStatus, Notification, Outbox},
    core::{
        notify,
        rollout::{Step, Transition},
    },
    edge::notify::{About, Sender},
    error::Result,
};

/// How often the outboxes are looked at when no write pokes the loop.
const SCAN: Duration = Duration::from_secs(2);
/// The first wait after a failed delivery; each further failure doubles it, up to [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// The most lanes sending at once, and of one namespace's rollouts: a tenant whose receivers hang holds
/// only its own share.
const LANES_MAX: usize = 64;
const NAMESPACE_LANES_MAX: usize = 8;

type Pairs = BTreeSet<(String, String)>;

/// A lane: one rollout's notifications to one subscription, keyed (namespace, uid, subscriber key).
#[derive(Default)]
struct Lane {
    busy: bool,
    failures: u32,
    next: Option<Instant>,
}

type LaneKey = (String, String, String);

pub struct Deliveries {
    sender: Sender,
    /// Delivered (id, subscriber) pairs by rollout uid, until a status write takes them out.
    delivered: Mutex<HashMap<String, Pairs>>,
    lanes: Mutex<HashMap<LaneKey, Lane>>,
    poke: tokio::sync::Notify,
    wake: UnboundedSender<ObjectRef<FleetRollout>>,
}

impl Deliveries {
    pub fn new(sender: Sender, wake: UnboundedSender<ObjectRef<FleetRollout>>) -> Self {
        Self { sender, delivered: Mutex::default(), lanes: Mutex::default(), poke: Default::default(), wake }
    }

    fn delivered(&self, uid: &str) -> Pairs {
        self.delivered.lock().map(|d| d.get(uid).cloned().unwrap_or_default()).unwrap_or_default()
    }

    /// After a status write: what it took out of the outbox need not be remembered.
    fn written(&self, uid: &str, outbox: Option<&Outbox>) {
        let pending: BTreeSet<&str> = outbox.iter().flat_map(|o| &o.pending).map(|n| n.id.as_str()).collect();
        if let Ok(mut d) = self.delivered.lock()
            && let Some(pairs) = d.get_mut(uid)
        {
            pairs.retain(|(id, _)| pending.contains(id.as_str()));
        }
        self.poke.notify_one();
    }

    /// Takes the lane, unless it is sending or waiting after a failure, or its namespace's share (or the
    /// whole pool) is sending.
    fn claim(&self, lane: &LaneKey, now: Instant) -> bool {
        let Ok(mut lanes) = self.lanes.lock() else { return false };
        let busy = lanes.iter().filter(|(_, l)| l.busy);
        let (all, namespace) =
            busy.fold((0, 0), |(a, n), ((ns, _, _), _)| (a + 1, n + usize::from(*ns == lane.0)));
        if all >= LANES_MAX || namespace >= NAMESPACE_LANES_MAX {
            return false;
        }
        let l = lanes.entry(lane.clone()).or_default();
        if l.busy || l.next.is_some_and(|next| next > now) {
            return false;
        }
        l.busy = true;
        true
    }

    /// Frees the lane; returns how many times in a row it has failed.
    fn release(&self, lane: &LaneKey, failed: bool) -> u32 {
        let failures = match self.lanes.lock() {
            Ok(mut lanes) => {
                let l = lanes.entry(lane.clone()).or_default();
                l.busy = false;
                l.failures = if failed { l.failures.saturating_add(1) } else { 0 };
                l.next = failed.then(|| Instant::now() + backoff(l.failures));
                l.failures
            }
            Err(_) => 0,
        };
        self.poke.notify_one();
        failures
    }

    /// Forgets rollouts that are gone.
    fn keep_only(&self, uids: &BTreeSet<String>) {
        if let Ok(mut d) = self.delivered.lock() {
            d.retain(|uid, _| uids.contains(uid));
        }
        if let Ok(mut lanes) = self.lanes.lock() {
            lanes.retain(|(_, uid, _), l| l.busy || uids.contains(uid));
        }
    }
}

fn backoff(failures: u32) -> Duration {
    BACKOFF_FIRST.saturating_mul(2u32.saturating_pow(failures.saturating_sub(1))).min(BACKOFF_MAX)
}

/// Persists a status the core decided, with what its transition tells written to the outbox and what was
/// delivered taken out.
pub(super) async fn persist(
    ctx: &Context,
    fr: &FleetRollout,
    mut t: Transition,
) -> Result<Arc<FleetRollout>> {
    let before = fr.status.clone().unwrap_or_default();
    let uid = fr.uid().unwrap_or_default();
    let guardrails = crate::core::policy::guardrails(&ctx.policies.state(), fr.spec.creator.as_ref());
    let subscribers = notify::subscribers(&fr.spec, &guardrails);
    let rollout = format!("{}/{}", fr.namespace().unwrap_or_default(), fr.name_any());
    let origin = notify::Origin {
        rollout: &rollout,
        over_mcp: fr.annotations().contains_key(crate::api::TASK_TOKEN_HASH_ANNOTATION),
    };
    let told = notify::happened(&fr.spec, origin, &before, &t.status);
    let delivered = ctx.deliveries.delivered(&uid);
    notify::record(&uid, told, &before, &mut t.status, &subscribers, &delivered, Timestamp::now());
    let written = ctx.rollouts_io.write_status(fr, t).await?;
    ctx.deliveries.written(&uid, written.status.as_ref().and_then(|s| s.notifications.as_ref()));
    Ok(written)
}

/// `step`, or, when it writes nothing and the outbox holds what was delivered (or what no one subscribes
/// to any more), a write of the status as it is, which takes that out.
pub(super) fn acknowledging(
    ctx: &Context,
    fr: &FleetRollout,
    status: &FleetRolloutStatus,
    step: Step,
) -> Step {
    if !matches!(step, Step::Wait { .. } | Step::Retry { write: None, .. }) || status.notifications.is_none()
    {
        return step;
    }
    let guardrails = crate::core::policy::guardrails(&ctx.policies.state(), fr.spec.creator.as_ref());
    let subscribers = notify::subscribers(&fr.spec, &guardrails);
    let delivered = ctx.deliveries.delivered(&fr.uid().unwrap_or_default());
    if !notify::owes_write(status, &delivered, &subscribers) {
        return step;
    }
    ctx.metrics.notification_ack_writes.inc();
    Step::Write(Transition { status: status.clone(), events: Vec::new() })
}

/// Sends what the outboxes owe until `shutdown`. Runs only beside the controller, on the leader.
pub(super) async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ctx.deliveries.poke.notified() => {}
            _ = tokio::time::sleep(SCAN) => {}
        }
        let rollouts = ctx.rollouts.state();
        let uids: BTreeSet<String> = rollouts.iter().filter_map(|fr| fr.uid()).collect();
        ctx.deliveries.keep_only(&uids);
        // Our own writes may be ahead of the cache: what they took out is not sent again.
        for fr in rollouts {
            start_lanes(&ctx, ctx.rollouts_io.newest(fr));
        }
    }
}

/// Starts a lane for each subscription the rollout's outbox owes something, unless it is busy or waiting.
fn start_lanes(ctx: &Arc<Context>, fr: Arc<FleetRollout>) {
    let Some(outbox) = fr.status.as_ref().and_then(|s| s.notifications.as_ref()) else { return };
    let uid = fr.uid().unwrap_or_default();
    let delivered = ctx.deliveries.delivered(&uid);
    let mut owed: BTreeMap<String, Vec<Notification>> = BTreeMap::new();
    for (n, key) in notify::owed(outbox) {
        if !delivered.contains(&(n.id.clone(), key.to_string())) {
            owed.entry(key.to_string()).or_default().push(n.clone());
        }
    }
    let now = Instant::now();
    let namespace = fr.namespace().unwrap_or_default();
    for (key, notifications) in owed {
        let lane = (namespace.clone(), uid.clone(), key);
        if !ctx.deliveries.claim(&lane, now) {
            continue;
        }
        let (ctx, fr) = (ctx.clone(), fr.clone());
        tokio::spawn(async move {
            // A panic in a delivery frees its lane all the same.
            let sent = std::panic::AssertUnwindSafe(deliver(&ctx, &fr, &lane.2, notifications));
            let result =
                futures::FutureExt::catch_unwind(sent).await.unwrap_or_else(|_| Err("a panic".into()));
            let failures = ctx.deliveries.release(&lane, result.is_err());
            if let Err(why) = result {
                ctx.metrics.notification_failures.inc();
                warn!(rollout = %fr.name_any(), subscription = %lane.2, error = %why, failures, "a notification was not delivered; it will be sent again");
                // Once per streak of failures: a receiver down for hours is one Warning, not one a minute.
                if failures == 1 {
                    let message = format!("to {}: not delivered, sent again with backoff: {why}", lane.2);
                    ctx.rollouts_io.warn(
                        &fr,
                        crate::core::reason::NOTIFICATION_FAILED,
                        crate::core::text::cut(&message, 1024),
                    );
                }
            }
        });
    }
}

/// Sends a lane's notifications in order; stops at the first that fails. Wakes the rollout once something
/// was delivered, for the write that takes it out of the outbox.
async fn deliver(
    ctx: &Context,
    fr: &FleetRollout,
    key: &str,
    notifications: Vec<Notification>,
) -> std::result::Result<(), String> {
    let guardrails = crate::core::policy::guardrails(&ctx.policies.state(), fr.spec.creator.as_ref());
    let subscribers = notify::subscribers(&fr.spec, &guardrails);
    let wake = || {
        let _ = ctx.deliveries.wake.unbounded_send(ObjectRef::from_obj(fr));
    };
    // No longer subscribed: the next write takes it out of the outbox.
    let Some(subscriber) = notify::subscriber(&subscribers, key) else {
        wake();
        return Ok(());
    };
    let namespace = fr.namespace().unwrap_or_default();
    let secret_namespace = match subscriber.policy {
        Some(_) if ctx.settings.fleet_namespace.is_empty() => {
            return Err(
                "a FleetRolloutPolicy's sink Secret is read from the fleet namespace, and the operator \
                        has none (--fleet-namespace, chart fleetNamespace)"
                    .into(),
            );
        }
        Some(_) => ctx.settings.fleet_namespace.as_str(),
        None => namespace.as_str(),
    };
    let sub = subscriber.subscription;
    let sink = ctx.deliveries.sender.sink(secret_namespace, &sub.secret_ref.name).await?;
    let about = About { namespace, name: fr.name_any(), uid: fr.uid().unwrap_or_default() };
    let mut result = Ok(());
    let mut sent = false;
    for n in notifications {
        if let Err(why) = ctx.deliveries.sender.send(sub.sink, &sink, &n, &about).await {
            result = Err(format!("{} to {key}: {why}", n.id));
            break;
        }
        debug!(id = %n.id, subscription = key, "notification delivered");
        ctx.metrics.notifications_delivered.inc();
        if let Ok(mut d) = ctx.deliveries.delivered.lock() {
            d.entry(about.uid.clone()).or_default().insert((n.id.clone(), key.to_string()));
        }
        sent = true;
    }
    if sent {
        wake();
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_lane_backs_off_exponentially_up_to_a_cap() {
        let waits: Vec<Duration> = (1..=8).map(backoff).collect();
        assert_eq!(&waits[..3], &[Duration::from_secs(1), Duration::from_secs(2), Duration::from_secs(4)]);
        assert_eq!(waits[7], BACKOFF_MAX);
        assert_eq!(backoff(u32::MAX), BACKOFF_MAX, "no overflow, however long it fails");
    }
}
