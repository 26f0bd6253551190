//! Rates: token buckets for the reviews a caller makes the API server do. TokenReviews of unknown tokens
//! share one budget (nobody is known yet to charge them to); SubjectAccessReviews are charged to the
//! caller and its tenant, so one caller's flood of distinct questions spends only its own budget.

use std::{
    num::NonZeroUsize,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use lru::LruCache;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{
    REVIEW_BURST, REVIEW_QUEUE_WAIT, REVIEWS_IN_FLIGHT, REVIEWS_PER_SECOND,
    shares::{Caller, Key},
};

/// A rate: `per_second` tokens a second, at most `burst` saved up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    pub per_second: f64,
    pub burst: f64,
}

/// The tokens a bucket holds at `now`, having held `tokens` at `last`.
fn refilled(rate: Rate, (tokens, last): (f64, Instant), now: Instant) -> f64 {
    (tokens + now.saturating_duration_since(last).as_secs_f64() * rate.per_second).min(rate.burst)
}

/// How long until a bucket holding `tokens` (fewer than one) holds one.
fn until_one(rate: Rate, tokens: f64) -> Duration {
    Duration::try_from_secs_f64((1.0 - tokens) / rate.per_second).unwrap_or(Duration::MAX)
}

/// A token bucket.
pub(crate) struct TokenBucket {
    rate: Rate,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    pub fn new(rate: f64, burst: f64) -> Self {
        Self::new_at(rate, burst, Instant::now())
    }

    fn new_at(per_second: f64, burst: f64, now: Instant) -> Self {
        Self { rate: Rate { per_second, burst }, state: Mutex::new((burst, now)) }
    }

    /// Takes a token, or says how long until one is there.
    pub fn take(&self) -> Result<(), Duration> {
        self.take_at(Instant::now())
    }

    fn take_at(&self, now: Instant) -> Result<(), Duration> {
        let Ok(mut state) = self.state.lock() else { return Err(Duration::from_secs(1)) };
        let tokens = refilled(self.rate, *state, now);
        if tokens >= 1.0 {
            *state = (tokens - 1.0, now);
            Ok(())
        } else {
            *state = (tokens, now);
            Err(until_one(self.rate, tokens))
        }
    }
}

/// The budget for TokenReviews of tokens not in the cache.
pub(crate) struct ReviewBudget {
    rate: TokenBucket,
    slots: Arc<Semaphore>,
}

impl Default for ReviewBudget {
    fn default() -> Self {
        Self::new(REVIEWS_PER_SECOND, REVIEW_BURST, REVIEWS_IN_FLIGHT)
    }
}

impl ReviewBudget {
    pub fn new(rate: f64, burst: f64, in_flight: usize) -> Self {
        Self { rate: TokenBucket::new(rate, burst), slots: Arc::new(Semaphore::new(in_flight)) }
    }

    /// A permit for one TokenReview (held while it runs), or how long to wait before trying again. The
    /// rate is taken before the wait for a slot, so at most burst + rate × [`REVIEW_QUEUE_WAIT`] requests
    /// wait at once: what an unauthenticated flood can hold in this server is bounded by the budget too.
    pub async fn admit(&self) -> Result<OwnedSemaphorePermit, Duration> {
        self.rate.take()?;
        match tokio::time::timeout(REVIEW_QUEUE_WAIT, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(Duration::from_secs(1)),
        }
    }
}

/// Token buckets per caller and per tenant, for SubjectAccessReviews. At most `capacity` buckets are
/// remembered; a forgotten one starts again full, and forgetting a caller's bucket takes `capacity` other
/// callers reviewed since, far more than the TokenReview budget lets in within a bucket's refill time.
pub(crate) struct CallerBudgets {
    caller: Rate,
    tenant: Rate,
    buckets: Mutex<LruCache<Key, (f64, Instant)>>,
}

impl CallerBudgets {
    pub fn new(caller: Rate, tenant: Rate, capacity: usize) -> Self {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        Self { caller, tenant, buckets: Mutex::new(LruCache::new(capacity)) }
    }

    /// Takes a token from both the caller's bucket and its tenant's, or from neither and says how long
    /// until both have one.
    pub fn take(&self, caller: &Caller) -> Result<(), Duration> {
        self.take_at(caller, Instant::now())
    }

    fn take_at(&self, caller: &Caller, now: Instant) -> Result<(), Duration> {
        let Ok(mut buckets) = self.buckets.lock() else { return Err(Duration::from_secs(1)) };
        let wants = [(caller.key(), self.caller), (caller.tenant_key(), self.tenant)];
        let levels = wants
            .clone()
            .map(|(key, rate)| buckets.get(&key).map_or(rate.burst, |s| refilled(rate, *s, now)));
        let wait = wants
            .iter()
            .zip(levels)
            .filter(|(_, l)| *l < 1.0)
            .map(|((_, rate), l)| until_one(*rate, l))
            .max();
        let spent = if wait.is_none() { 1.0 } else { 0.0 };
        for ((key, _), level) in wants.into_iter().zip(levels) {
            buckets.put(key, (level - spent, now));
        }
        wait.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_allows_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let bucket = TokenBucket::new_at(20.0, 40.0, t0);
        for i in 0..40 {
            assert_eq!(bucket.take_at(t0), Ok(()), "burst token {i}");
        }
        let wait = bucket.take_at(t0).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_millis(50), "{wait:?}");
        // One second later: exactly the rate's worth, not more.
        let t1 = t0 + Duration::from_secs(1);
        let allowed = (0..100).filter(|_| bucket.take_at(t1).is_ok()).count();
        assert_eq!(allowed, 20);
        // A long pause saves up no more than the burst.
        let t2 = t1 + Duration::from_secs(3600);
        let allowed = (0..100).filter(|_| bucket.take_at(t2).is_ok()).count();
        assert_eq!(allowed, 40);
    }

    #[test]
    fn over_a_flood_the_bucket_admits_burst_plus_rate_times_time() {
        let t0 = Instant::now();
        let bucket = TokenBucket::new_at(REVIEWS_PER_SECOND, REVIEW_BURST, t0);
        // 10,000 attempts spread over 5 s.
        let admitted = (0..10_000u64)
            .filter(|i| bucket.take_at(t0 + Duration::from_micros(i * 500)).is_ok())
            .count() as f64;
        let bound = REVIEW_BURST + REVIEWS_PER_SECOND * 5.0;
        assert!(admitted <= bound && admitted >= bound - 1.0, "{admitted} admitted, bound {bound}");
    }

    #[tokio::test]
    async fn the_review_budget_caps_concurrency_and_rate() {
        let budget = ReviewBudget::new(1000.0, 3.0, 2);
        let a = budget.admit().await.unwrap();
        let _b = budget.admit().await.unwrap();
        // Both slots are taken: the third waits REVIEW_QUEUE_WAIT (1 s), then is told to retry.
        assert_eq!(budget.admit().await.unwrap_err(), Duration::from_secs(1));
        drop(a);
        assert!(budget.admit().await.is_ok(), "a freed slot is taken again");
        // The rate: with the bucket empty, a request is refused at once, slots or not.
        let budget = ReviewBudget::new(0.001, 1.0, 8);
        let _ok = budget.admit().await.unwrap();
        let refused = budget.admit().await.unwrap_err();
        assert!(refused > Duration::from_secs(900), "{refused:?}: the wait until the next token");
    }

    fn sa(namespace: &str, name: &str) -> Caller {
        Caller::of(&format!("system:serviceaccount:{namespace}:{name}"))
    }

    #[test]
    fn a_callers_flood_of_reviews_spends_its_own_budget_and_its_tenants_only() {
        let rate = |per_second, burst| Rate { per_second, burst };
        let budgets = CallerBudgets::new(rate(10.0, 20.0), rate(20.0, 30.0), 64);
        let t0 = Instant::now();
        let (attacker, neighbour, other) = (sa("a", "x"), sa("a", "y"), sa("b", "z"));
        let spent = (0..1000).filter(|_| budgets.take_at(&attacker, t0).is_ok()).count();
        assert_eq!(spent, 20, "the caller's burst, and nothing more");
        let wait = budgets.take_at(&attacker, t0).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_millis(100), "{wait:?}");
        // Its tenant has 10 left: a neighbour in the same namespace gets those, not its own 20.
        assert_eq!((0..1000).filter(|_| budgets.take_at(&neighbour, t0).is_ok()).count(), 10);
        // Another tenant's caller is untouched by both.
        assert_eq!((0..1000).filter(|_| budgets.take_at(&other, t0).is_ok()).count(), 20);
        // A refusal spends nothing: a second later the attacker has exactly its rate's worth again, bounded
        // by what the tenant got back (20) too.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!((0..1000).filter(|_| budgets.take_at(&attacker, t1).is_ok()).count(), 10);
    }
}
