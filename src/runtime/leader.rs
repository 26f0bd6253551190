//! Leader election through a coordination.k8s.io Lease, as client-go does it: one holder at a time,
//! renewed every `duration / 3`; another replica takes over once `duration` passes without a renewal. Every
//! write carries the Lease's resourceVersion, so two candidates can never both win.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::{SignedDuration, Timestamp},
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use tokio::sync::watch;
use tracing::{info, warn};

/// What a candidate should do about the lease, given what it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds it (or the holder let it expire): take it.
    Acquire,
    /// We hold it: renew it.
    Renew,
    /// Someone else holds it: check again in this long.
    Wait(Duration),
}

/// Pure decision over the lease as read.
pub fn decide(lease: Option<&LeaseSpec>, me: &str, now: Timestamp) -> Decision {
    let Some(spec) = lease else {
        return Decision::Acquire;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    if holder == me {
        return Decision::Renew;
    }
    if holder.is_empty() {
        return Decision::Acquire;
    }
    let duration =
        Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(15)).unwrap_or(15));
    let renewed = spec.renew_time.as_ref().map(|t| t.0).or(spec.acquire_time.as_ref().map(|t| t.0));
    match renewed {
        Some(at) => {
            let expires = at + SignedDuration::try_from(duration).unwrap_or(SignedDuration::MAX);
            if now >= expires {
                Decision::Acquire
            } else {
                Decision::Wait(Duration::try_from(expires.duration_since(now)).unwrap_or(Duration::ZERO))
            }
        }
        None => Decision::Acquire,
    }
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

    /// Campaigns until we hold the lease, then keeps renewing it. Returns only when leadership is lost
    /// (a renewal could not be made for longer than the lease lasts), which the caller treats as fatal.
    pub async fn run(&self) {
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            let leading = *self.leading.borrow();
            match self.try_once().await {
                Ok(true) => {
                    if !leading {
                        info!(identity = %self.config.identity, lease = %self.config.name, "became the leader");
                        self.leading.send_replace(true);
                    }
                    last_renewal = tokio::time::Instant::now();
                    tokio::time::sleep(self.config.duration / 3).await;
                }
                Ok(false) => {
                    if leading {
                        warn!("another replica holds the lease: stepping down");
                        self.leading.send_replace(false);
                        return;
                    }
                    tokio::time::sleep(self.retry()).await;
                }
                Err(e) => {
                    warn!(error = %e, "lease request failed");
                    if leading && last_renewal.elapsed() >= self.config.duration * 2 / 3 {
                        warn!("could not renew the lease in time: stepping down");
                        self.leading.send_replace(false);
                        return;
                    }
                    tokio::time::sleep(self.retry()).await;
                }
            }
        }
    }

    /// One read-decide-write round. Ok(true) when we hold the lease afterwards.
    async fn try_once(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let current = self.api.get_opt(&self.config.name).await?;
        let decision = decide(current.as_ref().and_then(|l| l.spec.as_ref()), &self.config.identity, now);
        let seconds = i32::try_from(self.config.duration.as_secs().max(1)).unwrap_or(15);
        match (decision, current) {
            (Decision::Wait(_), _) => Ok(false),
            (_, None) => {
                let lease = Lease {
                    metadata: ObjectMeta { name: Some(self.config.name.clone()), ..Default::default() },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.config.identity.clone()),
                        lease_duration_seconds: Some(seconds),
                        acquire_time: Some(MicroTime(now)),
                        renew_time: Some(MicroTime(now)),
                        lease_transitions: Some(0),
                        ..Default::default()
                    }),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(e) if crate::error::is_conflict(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            }
            (decision, Some(mut lease)) => {
                let spec = lease.spec.get_or_insert_with(Default::default);
                if decision == Decision::Acquire {
                    spec.acquire_time = Some(MicroTime(now));
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.holder_identity = Some(self.config.identity.clone());
                spec.lease_duration_seconds = Some(seconds);
                spec.renew_time = Some(MicroTime(now));
                // The resourceVersion we read makes this a compare-and-swap.
                match self.api.replace(&self.config.name, &PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(e) if crate::error::is_conflict(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            }
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

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn held_by(who: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(who.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(at(renewed))),
            ..Default::default()
        }
    }

    #[test]
    fn a_missing_or_released_lease_is_taken() {
        assert_eq!(decide(None, "a", at(100)), Decision::Acquire);
        let mut released = held_by("b", 100);
        released.holder_identity = None;
        assert_eq!(decide(Some(&released), "a", at(100)), Decision::Acquire);
    }

    #[test]
    fn the_holder_renews() {
        assert_eq!(decide(Some(&held_by("a", 100)), "a", at(200)), Decision::Renew);
    }

    #[test]
    fn a_live_lease_of_another_is_respected_until_it_expires() {
        let lease = held_by("b", 100);
        assert_eq!(decide(Some(&lease), "a", at(105)), Decision::Wait(Duration::from_secs(10)));
        assert_eq!(decide(Some(&lease), "a", at(115)), Decision::Acquire);
    }
}
