//! Analysis queries to a Prometheus-compatible backend (Prometheus, Thanos, Mimir, VictoriaMetrics): one
//! measurement's instant queries sent as `POST <address>/api/v1/query`, concurrently and within a time
//! budget, each answer read into samples ([`parse_answer`]) for the core to judge. Where queries may go is
//! judged like health checks ([`crate::core::http_check`], under `--analysis-allow`): literal addresses
//! and every address a name resolves to, no ExternalName Service, no proxy, no redirect.

mod answer;
mod credentials;

pub use self::{
    answer::{MAX_SAMPLES, parse_answer},
    credentials::{Credentials, MAX_VALUE_BYTES, read_credentials},
};
// TEMPORARY stub until the querier below lands.
use crate::core::{
    analysis::{Answer, Query, provider::Backend},
    http_check::Policy,
};

#[derive(Clone)]
pub struct Querier;

impl Querier {
    pub fn new(_policy: Policy, _services: Option<kube::Client>) -> Result<Self, String> {
        Ok(Self)
    }
    pub async fn measure(
        &self,
        _b: &Backend,
        _c: Option<&Credentials>,
        queries: Vec<Query>,
    ) -> Vec<(Query, Answer)> {
        queries.into_iter().map(|q| (q, Err("stub".to_string()))).collect()
    }
}

#[cfg(test)]
mod tests;
