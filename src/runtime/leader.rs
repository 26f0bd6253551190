//! Leader election through a coordination.k8s.io Lease, as client-go does it: one holder at a time,
//! renewed every `duration / 5` (at most 2 s, client-go's retry period); another replica takes over once it has seen the lease record stay the same
//! for the lease's duration, timed on its own monotonic clock from when it saw the record change. The times
//! in the record (renewTime, acquireTime) are written for people and other tools but never read for a
//! decision: they come from another replica's wall clock, which may be minutes off ours. Every write
//! carries the Lease's resourceVersion, so two candidates can never both win.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use tokio::{sync::watch, time::Instant};
use tracing::{debug, info, warn};

use crate::core::text::cut;

/// A lease's duration when its record gives none (client-go's default).
const DEFAULT_DURATION: Duration = Duration::from_secs(15);

/// What a candidate should do about the lease, given what it has seen of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// There is no lease, nobody holds it, or its record has not changed for its duration: take it.
    Acquire,
    /// We hold it: renew it.
    Renew,
    /// Someone else holds it: it is theirs for this long yet, unless they renew it again.
    Wait(Duration),
}

/// The lease record as this replica last read it, and when it saw that record change (on this replica's
/// monotonic clock): the only time the decision trusts.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    pub spec: LeaseSpec,
    pub resource_version: Option<String>,
    pub changed_at: Instant,
}

impl Seen {
    fn holder(&self) -> &str {
        self.spec.holder_identity.as_deref().unwrap_or("")
    }

    /// How long the holder said its lease lasts.
    fn duration(&self) -> Duration {
        match self.spec.lease_duration_seconds.and_then(|s| u64::try_from(s).ok()) {
            Some(s) if s > 0 => Duration::from_secs(s),
            _ => DEFAULT_DURATION,
        }
    }
}

/// What this replica knows of the lease after reading `read` at `now`. The clock starts again only when the
/// record differs from the one seen before: any field of its spec (holder, renewTime, acquireTime,
/// transitions, duration), or its resourceVersion (any write at all). A first sight starts it too.
pub fn observe(before: Option<Seen>, read: Option<&Lease>, now: Instant) -> Option<Seen> {
    let lease = read?;
    let spec = lease.spec.clone().unwrap_or_default();
    let resource_version = lease.metadata.resource_version.clone();
    match before {
        Some(seen) if seen.spec == spec && seen.resource_version == resource_version => Some(seen),
        _ => Some(Seen { spec, resource_version, changed_at: now }),
    }
}

/// Pure decision over the lease as seen (`None`: there is no Lease object) by replica `me` at `now`.
pub fn decide(seen: Option<&Seen>, me: &str, now: Instant) -> Decision {
    let Some(seen) = seen else {
        return Decision::Acquire;
    };
    match seen.holder() {
        holder if holder == me => Decision::Renew,
        "" => Decision::Acquire,
        _ => match seen.changed_at.checked_add(seen.duration()) {
            Some(expires) if now >= expires => Decision::Acquire,
            Some(expires) => Decision::Wait(expires - now),
            // A duration past the end of the clock: the holder's for as long as we can count.
            None => Decision::Wait(Duration::MAX),
        },
    }
}

/// How one round of [`Elector::try_once`] went.
#[derive(Debug)]
enum Round {
    /// We hold the lease, freshly written.
    Holding,
    /// Another replica holds it, for this long yet unless it renews.
    Held { by: String, wait: Duration },
    /// Someone wrote the lease between our read and our write: read it again.
    Conflict,
}

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    pub duration: Duration,
}

/// A held (or sought) lease. `leading()` tells whether we hold it right now.
#[derive(Debug)]
pub struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    leading: watch::Sender<bool>,
}

impl Elector {
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        let api = Api::namespaced(client, &config.namespace);
        Self { api, config, leading: watch::channel(false).0 }
    }

    pub fn leading(&self) -> watch::Receiver<bool> {
        self.leading.subscribe()
    }

    fn retry(&self) -> Duration {
        (self.config.duration / 5).clamp(Duration::from_millis(200), Duration::from_secs(2))
    }

    /// How long a leader goes on without a renewal before it steps down: the others wait a whole
    /// `duration` from when they read its last one, so a third of it is left for stopping.
    fn renew_deadline(&self) -> Duration {
        self.config.duration * 2 / 3
    }

    /// Campaigns until we hold the lease, then keeps renewing it. Returns only when leadership is lost
    /// (another replica holds the lease, or no renewal went through within the renewal deadline), which the
    /// caller treats as fatal. All its timing is on the monotonic clock.
    pub async fn run(&self) {
        let mut seen = None;
        // When the last renewal that went through was *sent*: the write landed after that, and every other
        // replica times the lease from when it reads the write, later still.
        let mut renewed_at = Instant::now();
        loop {
            let leading = *self.leading.borrow();
            let started = Instant::now();
            // A request that hangs must not keep a leader acting past its deadline.
            let deadline =
                if leading { renewed_at + self.renew_deadline() } else { started + self.config.duration };
            let round = tokio::time::timeout_at(deadline, self.try_once(&mut seen)).await;
            match round {
                Ok(Ok(Round::Holding)) => {
                    if !leading {
                        info!(identity = %self.config.identity, lease = %self.config.name, "became the leader");
                        self.leading.send_replace(true);
                    }
                    renewed_at = started;
                    // As client-go's retry period: several tries fit before the deadline, so one slow
                    // request on a loaded API server does not make the leader step down.
                    tokio::time::sleep(self.retry()).await;
                    continue;
                }
                Ok(Ok(Round::Held { by, wait })) => {
                    if leading {
                        warn!(holder = %cut(&by, 253), "another replica holds the lease: stepping down");
                        self.leading.send_replace(false);
                        return;
                    }
                    tokio::time::sleep(wait.min(self.retry())).await;
                    continue;
                }
                Ok(Ok(Round::Conflict)) => debug!("the lease changed while we wrote it"),
                Ok(Err(e)) => warn!(error = %e, "lease request failed"),
                Err(_) => warn!("lease request timed out"),
            }
            if leading && renewed_at.elapsed() >= self.renew_deadline() {
                warn!("could not renew the lease in time: stepping down");
                self.leading.send_replace(false);
                return;
            }
            tokio::time::sleep(self.retry()).await;
        }
    }

    /// One read-decide-write round.
    async fn try_once(&self, seen: &mut Option<Seen>) -> Result<Round, kube::Error> {
        let current = self.api.get_opt(&self.config.name).await?;
        let now = Instant::now();
        *seen = observe(seen.take(), current.as_ref(), now);
        let decision = decide(seen.as_ref(), &self.config.identity, now);
        if let (Decision::Wait(wait), Some(seen)) = (decision, seen.as_ref()) {
            if seen.changed_at == now {
                debug!(
                    holder = %cut(seen.holder(), 253),
                    "saw the lease of another replica change; taking it over if it stays unchanged for {:?}",
                    seen.duration()
                );
            }
            return Ok(Round::Held { by: seen.holder().to_string(), wait });
        }
        // Wall-clock times, written for people and other tools only.
        let wall = MicroTime(Timestamp::now());
        let seconds = i32::try_from(self.config.duration.as_secs().max(1)).unwrap_or(15);
        let written = match current {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta { name: Some(self.config.name.clone()), ..Default::default() },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.config.identity.clone()),
                        lease_duration_seconds: Some(seconds),
                        acquire_time: Some(wall.clone()),
                        renew_time: Some(wall),
                        lease_transitions: Some(0),
                        ..Default::default()
                    }),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            Some(mut lease) => {
                let spec = lease.spec.get_or_insert_with(Default::default);
                if decision == Decision::Acquire {
                    spec.acquire_time = Some(wall.clone());
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
                }
                spec.holder_identity = Some(self.config.identity.clone());
                spec.lease_duration_seconds = Some(seconds);
                spec.renew_time = Some(wall);
                // The resourceVersion we read makes this a compare-and-swap.
                self.api.replace(&self.config.name, &PostParams::default(), &lease).await
            }
        };
        match written {
            Ok(_) => Ok(Round::Holding),
            Err(e) if crate::error::is_conflict(&e) => Ok(Round::Conflict),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up on a clean shutdown, so another replica takes over at once.
    pub async fn release(&self) {
        if !*self.leading.borrow() {
            return;
        }
        self.leading.send_replace(false);
        if let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await
            && let Some(spec) = lease.spec.as_mut()
            && spec.holder_identity.as_deref() == Some(self.config.identity.as_str())
        {
            spec.holder_identity = None;
            if let Err(e) = self.api.replace(&self.config.name, &PostParams::default(), &lease).await {
                warn!(error = %e, "could not release the lease");
            } else {
                info!("released the lease");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    /// A Lease as the API server returns it; `renewed` is whatever the holder's wall clock said.
    fn lease(holder: &str, renewed: Timestamp, version: u64) -> Lease {
        Lease {
            metadata: ObjectMeta { resource_version: Some(version.to_string()), ..Default::default() },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(renewed)),
                acquire_time: Some(MicroTime(renewed)),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        }
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    /// `read` seen at `now` after `before`, and the decision of replica "a" then.
    fn step(before: Option<Seen>, read: &Lease, now: Instant) -> (Option<Seen>, Decision) {
        let seen = observe(before, Some(read), now);
        let decision = decide(seen.as_ref(), "a", now);
        (seen, decision)
    }

    #[test]
    fn a_missing_or_released_lease_is_taken_at_once() {
        let now = Instant::now();
        assert_eq!(observe(None, None, now), None);
        assert_eq!(decide(None, "a", now), Decision::Acquire);
        // Released by its holder: taken on first sight, without waiting out the duration.
        let mut released = lease("b", at(100), 7);
        released.spec.as_mut().unwrap().holder_identity = None;
        assert_eq!(step(None, &released, now).1, Decision::Acquire);
        released.spec.as_mut().unwrap().holder_identity = Some(String::new());
        assert_eq!(step(None, &released, now).1, Decision::Acquire);
    }

    #[test]
    fn the_holder_renews() {
        assert_eq!(step(None, &lease("a", at(100), 1), Instant::now()).1, Decision::Renew);
    }

    #[test]
    fn a_live_leader_renewing_is_never_displaced_however_far_the_clocks_are_apart() {
        // The holder's wall clock is a day, a minute or nothing off ours, either way: it renews every 5s of
        // real time, and we read the lease every 2s.
        for skew in [-86_400, -60, 0, 60, 86_400] {
            let start = Instant::now();
            let mut seen = None;
            for tick in 0..200u64 {
                let elapsed = 2 * tick;
                let renewals = elapsed / 5;
                let renewed = at(1_000_000 + skew + 5 * i64::try_from(renewals).unwrap());
                let read = lease("b", renewed, 1 + renewals);
                let (next, decision) = step(seen, &read, start + Duration::from_secs(elapsed));
                assert!(matches!(decision, Decision::Wait(_)), "skew {skew}s, {elapsed}s in: {decision:?}");
                seen = next;
            }
        }
    }

    #[test]
    fn a_lease_that_stops_changing_is_taken_after_its_duration_on_our_clock() {
        let t0 = Instant::now();
        // Renewed, by the holder's clock, a day in the future: it does not matter.
        let stale = lease("b", Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_hours(24), 9);
        let (seen, decision) = step(None, &stale, t0);
        assert_eq!(decision, Decision::Wait(15 * SECOND));
        let (seen, decision) = step(seen, &stale, t0 + 10 * SECOND);
        assert_eq!(decision, Decision::Wait(5 * SECOND));
        let (seen, decision) = step(seen, &stale, t0 + 15 * SECOND - Duration::from_millis(1));
        assert_eq!(decision, Decision::Wait(Duration::from_millis(1)));
        assert_eq!(step(seen, &stale, t0 + 15 * SECOND).1, Decision::Acquire);
    }

    #[test]
    fn a_first_sight_starts_the_clock_however_old_the_renewal_looks() {
        // A fresh replica has never seen this lease change: renewed in 1970 by the record, it still waits
        // the whole duration, as the holder may have renewed it just now by a clock far behind ours.
        let t0 = Instant::now();
        let (seen, decision) = step(None, &lease("b", at(0), 3), t0);
        assert_eq!(decision, Decision::Wait(15 * SECOND));
        assert_eq!(step(seen, &lease("b", at(0), 3), t0 + 15 * SECOND).1, Decision::Acquire);
    }

    #[test]
    fn any_write_to_the_record_starts_the_clock_again() {
        let t0 = Instant::now();
        let base = lease("b", at(100), 1);
        let changes: [fn(&mut Lease); 6] = [
            |l| l.metadata.resource_version = Some("2".into()),
            |l| l.spec.as_mut().unwrap().holder_identity = Some("c".into()),
            |l| l.spec.as_mut().unwrap().renew_time = Some(MicroTime(at(101))),
            |l| l.spec.as_mut().unwrap().acquire_time = Some(MicroTime(at(99))),
            |l| l.spec.as_mut().unwrap().lease_transitions = Some(1),
            |l| l.spec.as_mut().unwrap().lease_duration_seconds = Some(16),
        ];
        for (i, change) in changes.iter().enumerate() {
            let (seen, _) = step(None, &base, t0);
            let mut changed = base.clone();
            change(&mut changed);
            let later = t0 + 14 * SECOND;
            let (seen, decision) = step(seen, &changed, later);
            assert_eq!(seen.unwrap().changed_at, later, "change {i}");
            assert!(matches!(decision, Decision::Wait(w) if w >= 15 * SECOND), "change {i}: {decision:?}");
        }
    }

    #[test]
    fn the_duration_is_the_records_and_none_overflows() {
        let t0 = Instant::now();
        let with = |seconds: Option<i32>| {
            let mut l = lease("b", at(100), 1);
            l.spec.as_mut().unwrap().lease_duration_seconds = seconds;
            step(None, &l, t0).1
        };
        assert_eq!(with(Some(4)), Decision::Wait(4 * SECOND));
        for odd in [None, Some(0), Some(-5)] {
            assert_eq!(with(odd), Decision::Wait(DEFAULT_DURATION));
        }
        assert!(matches!(with(Some(i32::MAX)), Decision::Wait(w) if w >= 60 * 60 * 24 * 365 * SECOND));
    }
}
