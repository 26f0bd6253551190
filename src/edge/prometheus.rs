//! TEMPORARY stub until the real client lands (helper branch prom-client).
use crate::core::{
    analysis::{Answer, Query, provider::Backend},
    http_check::Policy,
};

pub struct Credentials;

pub async fn read_credentials(
    _client: &kube::Client,
    _namespace: &str,
    _name: &str,
) -> Result<Credentials, String> {
    Err("stub".into())
}

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
