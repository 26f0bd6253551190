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
    collections::{BTreeSet, HashMap},
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
/// The most lanes sending at once to the tenants' own subscriptions, and of one namespace's rollouts: a
/// tenant whose receivers hang holds only its own share.
const LANES_MAX: usize = 64;
const NAMESPACE_LANES_MAX: usize = 8;
/// The platform's subscriptions (a FleetRolloutPolicy's) send in a pool of their own, which no tenant's
/// subscriptions count against; one namespace's rollouts take at most a quarter of it.
const PLATFORM_LANES_MAX: usize = 16;
const PLATFORM_NAMESPACE_LANES_MAX: usize = 4;

type Pairs = BTreeSet<(String, String)>;

/// A lane owed notifications, with its rollout (what it owes is read from it once the lane is taken).
type Owed = (LaneKey, Arc<FleetRollout>);

/// A lane: one rollout's notifications to one subscription, keyed (namespace, uid, subscriber key).
#[derive(Default)]
struct Lane {
    busy: bool,
    failures: u32,
    next: Option<Instant>,
    /// When it was last taken, in claims: lanes waiting longest go first.
    served: u64,
}

type LaneKey = (String, String, String);

/// Every lane, and the claims made so far. Pure: the delivery loop holds it behind a lock.
#[derive(Default)]
struct Lanes {
    lanes: HashMap<LaneKey, Lane>,
    /// Lanes sending now, in each pool ([tenants', platform's]) and of each namespace in each: counted as
    /// they are taken and freed, so that a claim costs the same however many lanes there are.
    busy: [usize; 2],
    busy_by_namespace: HashMap<String, [usize; 2]>,
    claims: u64,
}

impl Lanes {
    /// Takes the lane, unless it is sending or waiting after a failure, or its pool (or its namespace's
    /// share of it) is full.
    fn claim(&mut self, lane: &LaneKey, now: Instant) -> bool {
        let platform = notify::is_platform(&lane.2);
        let p = usize::from(platform);
        let all = self.busy[p];
        let namespace = self.busy_by_namespace.get(lane.0.as_str()).map_or(0, |b| b[p]);
        let (pool, share) = match platform {
            true => (PLATFORM_LANES_MAX, PLATFORM_NAMESPACE_LANES_MAX),
            false => (LANES_MAX, NAMESPACE_LANES_MAX),
        };
        if all >= pool || namespace >= share {
            return false;
        }
        let l = self.lanes.entry(lane.clone()).or_default();
        if l.busy || l.next.is_some_and(|next| next > now) {
            return false;
        }
        self.claims += 1;
        (l.busy, l.served) = (true, self.claims);
        self.busy[p] += 1;
        self.busy_by_namespace.entry(lane.0.clone()).or_default()[p] += 1;
        true
    }

    /// Frees the lane; returns how many times in a row it has failed.
    fn release(&mut self, lane: &LaneKey, failed: bool, now: Instant) -> u32 {
        let l = self.lanes.entry(lane.clone()).or_default();
        if std::mem::take(&mut l.busy) {
            let p = usize::from(notify::is_platform(&lane.2));
            self.busy[p] = self.busy[p].saturating_sub(1);
            if let Some(b) = self.busy_by_namespace.get_mut(lane.0.as_str()) {
                b[p] = b[p].saturating_sub(1);
                if *b == [0, 0] {
                    self.busy_by_namespace.remove(lane.0.as_str());
                }
            }
        }
        l.failures = if failed { l.failures.saturating_add(1) } else { 0 };
        l.next = failed.then(|| now + backoff(l.failures));
        l.failures
    }

    /// Round robin: the lanes that have waited longest since they were last taken first (never taken
    /// before all), so that no rollout's or subscription's lanes keep a pool to themselves.
    fn by_turn<T>(&self, owed: &mut [(LaneKey, T)]) {
        owed.sort_by_key(|(key, _)| self.lanes.get(key).map_or(0, |l| l.served));
    }
}

pub struct Deliveries {
    sender: Sender,
    /// Delivered (id, subscriber) pairs by rollout uid, until a status write takes them out.
    delivered: Mutex<HashMap<String, Pairs>>,
    lanes: Mutex<Lanes>,
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

    fn claim(&self, lane: &LaneKey, now: Instant) -> bool {
        self.lanes.lock().is_ok_and(|mut lanes| lanes.claim(lane, now))
    }

    fn release(&self, lane: &LaneKey, failed: bool) -> u32 {
        let failures = self.lanes.lock().map_or(0, |mut lanes| lanes.release(lane, failed, Instant::now()));
        self.poke.notify_one();
        failures
    }

    /// Forgets rollouts that are gone.
    fn keep_only(&self, uids: &BTreeSet<String>) {
        if let Ok(mut d) = self.delivered.lock() {
            d.retain(|uid, _| uids.contains(uid));
        }
        if let Ok(mut lanes) = self.lanes.lock() {
            lanes.lanes.retain(|(_, uid, _), l| l.busy || uids.contains(uid));
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
        let mut owed: Vec<Owed> = Vec::new();
        for fr in rollouts {
            owed.extend(owed_lanes(&ctx, ctx.rollouts_io.newest(fr)));
        }
        if let Ok(lanes) = ctx.deliveries.lanes.lock() {
            lanes.by_turn(&mut owed);
        }
        let now = Instant::now();
        for (lane, fr) in owed {
            if ctx.deliveries.claim(&lane, now) {
                let notifications = owed_to(&ctx, &fr, &lane.2);
                start_lane(&ctx, lane, fr, notifications);
            }
        }
    }
}

/// The lanes the rollout's outbox owes something not delivered yet.
fn owed_lanes(ctx: &Context, fr: Arc<FleetRollout>) -> Vec<Owed> {
    let Some(outbox) = fr.status.as_ref().and_then(|s| s.notifications.as_ref()) else { return Vec::new() };
    let uid = fr.uid().unwrap_or_default();
    let delivered = ctx.deliveries.delivered(&uid);
    let undelivered =
        |(n, key): &(&Notification, &str)| !delivered.contains(&(n.id.clone(), key.to_string()));
    let keys: BTreeSet<&str> = notify::owed(outbox).filter(undelivered).map(|(_, key)| key).collect();
    let namespace = fr.namespace().unwrap_or_default();
    keys.into_iter().map(|key| ((namespace.clone(), uid.clone(), key.to_string()), fr.clone())).collect()
}

/// What the rollout's outbox owes the subscription `key` and was not delivered yet, in order.
fn owed_to(ctx: &Context, fr: &FleetRollout, key: &str) -> Vec<Notification> {
    let Some(outbox) = fr.status.as_ref().and_then(|s| s.notifications.as_ref()) else { return Vec::new() };
    let delivered = ctx.deliveries.delivered(&fr.uid().unwrap_or_default());
    notify::owed(outbox)
        .filter(|(n, k)| *k == key && !delivered.contains(&(n.id.clone(), key.to_string())))
        .map(|(n, _)| n.clone())
        .collect()
}

/// Sends a claimed lane's notifications, and frees the lane when done.
fn start_lane(ctx: &Arc<Context>, lane: LaneKey, fr: Arc<FleetRollout>, notifications: Vec<Notification>) {
    let ctx = ctx.clone();
    tokio::spawn(async move {
        // A panic in a delivery frees its lane all the same.
        let sent = std::panic::AssertUnwindSafe(deliver(&ctx, &fr, &lane.2, notifications));
        let result = futures::FutureExt::catch_unwind(sent).await.unwrap_or_else(|_| Err("a panic".into()));
        let failures = ctx.deliveries.release(&lane, result.is_err());
        if let Err(why) = result {
            ctx.metrics.notification_failures.inc();
            warn!(rollout = %fr.name_any(), subscription = %lane.2, error = %why, failures, "a notification was not delivered; it will be sent again");
            // Once per streak of failures: a receiver down for hours is one Warning, not one a minute.
            if failures == 1 {
                let message = failure_event(&lane.2, &why);
                ctx.rollouts_io.warn(
                    &fr,
                    crate::core::reason::NOTIFICATION_FAILED,
                    crate::core::text::cut(&message, 1024),
                );
            }
        }
    });
}

/// The Event a subscription's failed delivery records on the rollout, which its tenant reads: of the
/// platform's subscriptions, only that one failed (the policy, its Secret and the sink's answer are the
/// platform's, in the operator's log).
fn failure_event(key: &str, why: &str) -> String {
    match notify::is_platform(key) {
        true => "a notification a FleetRolloutPolicy subscribes to was not delivered; it is sent again with \
                 backoff (the operator's log says why)"
            .into(),
        false => format!("to {key}: not delivered, sent again with backoff: {why}"),
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

mod deletion;
pub(super) use deletion::{farewell, held};

#[cfg(test)]
mod tests;
