//! Analysis queries to a Prometheus-compatible backend (Prometheus, Thanos, Mimir, VictoriaMetrics): one
//! measurement's instant queries sent as `POST <address>/api/v1/query`, concurrently and within a time
//! budget, each answer read into samples ([`parse_answer`]) for the core to judge. Where queries may go is
//! judged like health checks ([`crate::core::http_check`], under `--analysis-allow`): literal addresses
//! and every address a name resolves to, no ExternalName Service, no proxy, no redirect.

mod answer;
mod credentials;

use std::{sync::Arc, time::Duration};

use futures::{StreamExt, stream};
use kube::Client;
use reqwest::header::{ACCEPT, CONTENT_TYPE};

use self::credentials::Auth;
pub use self::{
    answer::parse_answer,
    credentials::{Credentials, read_credentials},
};
use crate::{
    core::{
        analysis::{Answer, Query, provider::Backend},
        http_check::{Policy, Purpose},
    },
    edge::egress::{GuardedResolver, chain, guarded, refusal},
};

/// How many queries of one measurement are in flight at once.
const CONCURRENCY: usize = 8;
/// The longest one measurement takes, all its queries together (a reconcile has 60 s in all).
const BUDGET: Duration = Duration::from_secs(40);
/// The largest answer read; a bigger one is not judged.
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// The most JSON values one answer may hold before it is decoded (10,000 samples of a dozen labels fit):
/// what a 4 MiB answer costs decoded is bounded by its values, not only its bytes.
pub const MAX_ANSWER_VALUES: usize = 256 * 1024;

/// Sends analysis queries within the operator's rules for where they may go.
#[derive(Clone)]
pub struct Querier {
    policy: Arc<Policy>,
    resolver: Arc<GuardedResolver>,
    /// [`BUDGET`]; shorter in tests.
    budget: Duration,
}

impl Querier {
    /// A querier under `policy` (built from `--analysis-allow`); `services` reads Services, to refuse
    /// ExternalName ones. Err: no client can be built (tried once here with the public roots, so that the
    /// operator fails at start rather than at every measurement).
    pub fn new(policy: Policy, services: Option<Client>) -> Result<Self, String> {
        let policy = Arc::new(policy);
        let resolver = Arc::new(GuardedResolver::new(policy.clone(), services, Purpose::ANALYSIS));
        let querier = Self { policy, resolver, budget: BUDGET };
        querier.client("https://prometheus.invalid/api/v1/query", None)?;
        Ok(querier)
    }

    /// Sends each query to `backend` and reads its answer; the result is in the order of `queries`. A
    /// query not answered within the measurement's budget is an error, as is every query when the backend
    /// may not be reached or no client can be built for it.
    /// Sends `queries` to `backend`, and makes each answer what the caller keeps of it (`judge`: the core's
    /// verdict, [`crate::core::analysis::judge`]) as soon as it arrives, so that at most [`CONCURRENCY`]
    /// answers are held at once however many queries a measurement has; one not sent or not answered within
    /// the budget is judged as the error it is.
    pub async fn measure<T: Send>(
        &self,
        backend: &Backend,
        credentials: Option<&Credentials>,
        queries: Vec<Query>,
        judge: &(dyn Fn(&Query, Answer) -> T + Sync),
    ) -> Vec<(Query, T)> {
        let url = format!("{}/api/v1/query", backend.address.trim_end_matches('/'));
        let prepared = match refusal(&self.policy, Purpose::ANALYSIS, &url) {
            Some(why) => Err(format!("POST {url} refused: {why}")),
            None => self.client(&url, credentials),
        };
        let http = match prepared {
            Ok(http) => http,
            Err(why) => {
                return queries
                    .into_iter()
                    .map(|q| (judge(&q, Err(why.clone())), q))
                    .map(|(t, q)| (q, t))
                    .collect();
            }
        };
        let ask = Ask {
            http,
            url,
            auth: credentials.and_then(|c| c.auth.clone()),
            timeout: backend.timeout,
            namespace_header: backend.namespace_header.clone(),
        };
        // However slow the backend, a measurement ends within the budget: what is not answered by then
        // is an error, which the core counts like any other.
        let budget = tokio::time::sleep(self.budget);
        let ask = &ask;
        // Owned items: over borrowed ones, the compiler cannot prove the future Send (the controller spawns it).
        let promql: Vec<(usize, String)> = queries.iter().map(|q| q.promql.clone()).enumerate().collect();
        let queries = &queries;
        let answered: Vec<(usize, T)> = stream::iter(promql)
            .map(|(i, promql)| async move { (i, judge(&queries[i], ask.send(&promql).await)) })
            .buffer_unordered(CONCURRENCY)
            .take_until(budget)
            .collect()
            .await;
        let mut kept: Vec<Option<T>> = std::iter::repeat_with(|| None).take(queries.len()).collect();
        for (i, t) in answered {
            kept[i] = Some(t);
        }
        queries
            .iter()
            .zip(kept)
            .map(|(q, t)| (q.clone(), t.unwrap_or_else(|| judge(q, Err("not answered in time".into())))))
            .collect()
    }

    /// One client per measurement, for its backend's credentials: the CAs of `ca.crt`, else the public
    /// roots (the image carries no CA bundle); the client certificate; no proxy (it would resolve names
    /// past the guard) and no redirects (they could lead anywhere).
    fn client(&self, url: &str, credentials: Option<&Credentials>) -> Result<reqwest::Client, String> {
        let failed = |e: reqwest::Error| format!("cannot build a client for {url}: {}", chain(&e));
        let mut builder = guarded(self.resolver.clone());
        match credentials.and_then(|c| c.ca_pem.as_deref()) {
            Some(pem) => {
                for cert in reqwest::Certificate::from_pem_bundle(pem).map_err(failed)? {
                    builder = builder.add_root_certificate(cert);
                }
            }
            None if url.starts_with("https:") => {
                for der in webpki_root_certs::TLS_SERVER_ROOT_CERTS {
                    builder =
                        builder.add_root_certificate(reqwest::Certificate::from_der(der).map_err(failed)?);
                }
            }
            None => {}
        }
        if let Some(pem) = credentials.and_then(|c| c.identity_pem.as_deref()) {
            builder = builder.identity(reqwest::Identity::from_pem(pem).map_err(failed)?);
        }
        builder.build().map_err(failed)
    }
}

/// What every query of one measurement is sent with.
struct Ask {
    http: reqwest::Client,
    url: String,
    auth: Option<Auth>,
    timeout: Duration,
    /// The header naming the rollout's namespace, for a backend that scopes queries by it.
    namespace_header: Option<(String, String)>,
}

impl Ask {
    /// Sends one instant query (at the backend's now) and reads its answer. Errors never carry the
    /// credentials: they travel in a header, and the URL carries no user information.
    async fn send(&self, promql: &str) -> Answer {
        let url = &self.url;
        let form = url::form_urlencoded::Serializer::new(String::new()).append_pair("query", promql).finish();
        let mut request = self
            .http
            .post(url)
            .timeout(self.timeout)
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(ACCEPT, "application/json")
            .body(form);
        request = match &self.auth {
            Some(Auth::Bearer(token)) => request.bearer_auth(token),
            Some(Auth::Basic { username, password }) => request.basic_auth(username, Some(password)),
            None => request,
        };
        if let Some((name, namespace)) = &self.namespace_header {
            request = request.header(name.as_str(), namespace.as_str());
        }
        let failed = |e: reqwest::Error| match e.is_timeout() {
            true => format!("POST {url}: no answer within {:?} (provider.prometheus.timeout)", self.timeout),
            false => format!("POST {url} failed: {}", chain(&e)),
        };
        let response = request.send().await.map_err(failed)?;
        let status = response.status().as_u16();
        let body = read_capped(response, failed).await?;
        if !crate::edge::answers::Bound::document(MAX_ANSWER_BYTES, MAX_ANSWER_VALUES).holds(&body) {
            return Err(format!("answer of more than {MAX_ANSWER_VALUES} JSON values"));
        }
        parse_answer(status, &body)
    }
}

/// The body, up to [`MAX_ANSWER_BYTES`]: a backend (or whatever answers in its place) cannot make the
/// operator hold more.
async fn read_capped(
    mut response: reqwest::Response,
    failed: impl Fn(reqwest::Error) -> String,
) -> Result<Vec<u8>, String> {
    let too_large = || format!("answer larger than {} MiB", MAX_ANSWER_BYTES / (1024 * 1024));
    if response.content_length().is_some_and(|n| n > MAX_ANSWER_BYTES as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(&failed)? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests;
