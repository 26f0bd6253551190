//! What a change of someone else's object may make the operator do. A workload that names a rollout (our
//! annotation, which anyone who may write the workload can set) wakes that rollout only when the rollout
//! exists and could target the workload ([`scope::Rules::may_wake`]); and no rollout is woken more than
//! [`BURST`] times at once and [`PER_SECOND`] times a second after that, however often its workloads
//! change. A wake past its share is delayed, never dropped: the last change is always looked at.

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::{Stream, StreamExt, channel::mpsc};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};
use tokio::time::Instant;

use crate::{api::FleetRollout, core::scope};

/// Wakes of one rollout taken back to back before the rate applies: a batch's targets settle together, and
/// a rollout of small batches changes a target and sees it settle two or three times per batch.
pub(super) const BURST: f64 = 200.0;
/// Wakes of one rollout a second, sustained. Only changes a decision reads wake at all, and a rollout's
/// reconciles never overlap, so this bounds what cheap reconciles can cost; it is well above what a
/// rollout of one-target batches needs (about 150 a second: fewer would slow its batches down).
pub(super) const PER_SECOND: f64 = 100.0;
/// Rollouts whose shares are remembered before full ones are forgotten.
const SHARES_KEPT: usize = 4096;

/// Decides which rollout a changed workload wakes.
#[derive(Clone)]
pub(super) struct Wakes {
    pub rollouts: Store<FleetRollout>,
    pub namespaces: Store<Namespace>,
    pub rules: Arc<scope::Rules>,
}

impl Wakes {
    /// The rollout `(namespace, name)` that a workload of `workload_namespace` names wakes, if it exists and
    /// could target the workload; None otherwise (another tenant's rollout, or none at all).
    pub fn of(&self, workload_namespace: &str, (ns, name): (&str, &str)) -> Option<ObjectRef<FleetRollout>> {
        let key = ObjectRef::new(name).within(ns);
        let fr = self.rollouts.get(&key)?;
        let revision = fr.status.as_ref().and_then(|s| s.revision.as_ref());
        let cross_namespace = fr.spec.targets.namespace_selector.is_some()
            || revision.is_some_and(|r| r.inputs.namespace_selector.is_some());
        let namespace = fr.namespace().unwrap_or_default();
        let rollout = scope::Rollout { namespace: &namespace, kind: fr.spec.targets.kind, cross_namespace };
        let labels = self.namespaces.get(&ObjectRef::new(workload_namespace));
        self.rules.may_wake(rollout, workload_namespace, labels.as_ref().map(|n| n.labels())).then_some(key)
    }
}

/// A rollout's share of wakes: a token bucket.
#[derive(Clone, Copy, Debug)]
pub(super) struct Share {
    tokens: f64,
    at: Instant,
}

impl Share {
    pub fn full(now: Instant) -> Self {
        Self { tokens: BURST, at: now }
    }

    /// Takes a wake now, or says when the next one is due.
    pub fn take(&mut self, now: Instant) -> Result<(), Instant> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * PER_SECOND).min(BURST);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(now + Duration::from_secs_f64((1.0 - self.tokens) / PER_SECOND))
        }
    }

    fn is_full(&self, now: Instant) -> bool {
        self.tokens + now.saturating_duration_since(self.at).as_secs_f64() * PER_SECOND >= BURST
    }
}

/// `wakes`, each rollout held to its share: a wake past it is delayed until the share allows it, and wakes of
/// a rollout already delayed are one.
pub(super) fn shared<S>(wakes: S) -> impl Stream<Item = ObjectRef<FleetRollout>> + Send + 'static
where
    S: Stream<Item = ObjectRef<FleetRollout>> + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded();
    tokio::spawn(async move {
        let mut wakes = std::pin::pin!(wakes);
        let mut shares: HashMap<ObjectRef<FleetRollout>, Share> = HashMap::new();
        let mut delayed: HashMap<ObjectRef<FleetRollout>, Instant> = HashMap::new();
        loop {
            let next = delayed.values().min().copied();
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                wake = wakes.next() => {
                    let Some(key) = wake else { return };
                    if delayed.contains_key(&key) {
                        continue;
                    }
                    let now = Instant::now();
                    if shares.len() >= SHARES_KEPT {
                        shares.retain(|k, s| delayed.contains_key(k) || !s.is_full(now));
                    }
                    match shares.entry(key.clone()).or_insert_with(|| Share::full(now)).take(now) {
                        Ok(()) => {
                            if tx.unbounded_send(key).is_err() {
                                return;
                            }
                        }
                        Err(at) => {
                            delayed.insert(key, at);
                        }
                    }
                }
                () = sleep => {
                    let now = Instant::now();
                    let due: Vec<_> = delayed.iter().filter(|(_, at)| **at <= now).map(|(k, _)| k.clone()).collect();
                    for key in due {
                        delayed.remove(&key);
                        if let Some(share) = shares.get_mut(&key) {
                            let _ = share.take(now);
                        }
                        if tx.unbounded_send(key).is_err() {
                            return;
                        }
                    }
                }
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_allows_a_burst_then_the_rate() {
        let start = Instant::now();
        let mut share = Share::full(start);
        for _ in 0..BURST as usize {
            assert_eq!(share.take(start), Ok(()));
        }
        let due = share.take(start).unwrap_err();
        assert_eq!(due - start, Duration::from_secs_f64(1.0 / PER_SECOND));
        assert_eq!(share.take(due), Ok(()), "one more once it is due");
        // Over a minute of constant wakes, at most the burst and the rate.
        let mut taken = 0;
        let mut now = due;
        for _ in 0..60_000 {
            now += Duration::from_millis(1);
            taken += usize::from(share.take(now).is_ok());
        }
        assert!(taken <= (60.0 * PER_SECOND) as usize + 1, "{taken}");
        assert!(share.is_full(now + Duration::from_secs(3)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_wakes_reaches_a_rollout_at_its_share_and_the_last_is_never_lost() {
        let (tx, rx) = mpsc::unbounded();
        let out = shared(rx);
        let key = ObjectRef::<FleetRollout>::new("r").within("t1");
        let other = ObjectRef::<FleetRollout>::new("quiet").within("t2");
        for _ in 0..1000 {
            tx.unbounded_send(key.clone()).unwrap();
        }
        tx.unbounded_send(other.clone()).unwrap();
        let mut out = std::pin::pin!(out);
        let mut seen = Vec::new();
        // A burst, the other rollout unaffected, then the flood's one delayed wake.
        for _ in 0..(BURST as usize + 2) {
            seen.push(out.next().await.unwrap());
        }
        assert_eq!(seen.iter().filter(|k| **k == key).count(), BURST as usize + 1);
        assert_eq!(seen.iter().filter(|k| **k == other).count(), 1);
        drop(tx);
        assert_eq!(out.next().await, None, "1,000 wakes cost {} reconciles", BURST as usize + 1);
    }
}
