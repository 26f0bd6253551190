//! Health checks over HTTP, like a kubelet probe, within the operator's rules for where checks may go
//! ([`crate::core::http_check`]): every address a name resolves to is checked, literal addresses too, an
//! ExternalName Service is never followed, and redirects are not followed.

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::{StreamExt, stream};
use kube::Client;

use crate::{
    core::http_check::{Policy, Purpose},
    edge::egress::{GuardedResolver, chain, guarded, refusal},
};

const HTTP_CONCURRENCY: usize = 16;
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest one step's probes take together (a reconcile has 60 s in all).
const PROBE_BUDGET: Duration = Duration::from_secs(15);

/// Runs the HTTP check against each target, like a kubelet probe (TLS certificates are not verified: the
/// host is the target's own), within the operator's rules for where checks may go (see
/// [`crate::core::http_check`]): every address a name resolves to is checked, literal addresses too, and
/// redirects are not followed.
#[derive(Clone)]
pub struct Prober {
    http: reqwest::Client,
    policy: Arc<Policy>,
}

impl Prober {
    /// A prober under `policy`; `services` reads the targets' Services (to refuse ExternalName ones). Err:
    /// the HTTP client cannot be built, and no check may run without these rules.
    pub fn new(policy: Policy, services: Option<Client>) -> Result<Self, String> {
        let policy = Arc::new(policy);
        let resolver = GuardedResolver::new(policy.clone(), services, Purpose::HEALTH_CHECKS);
        let http = guarded(Arc::new(resolver))
            .timeout(HTTP_TIMEOUT)
            .danger_accept_invalid_certs(true)
            .build()
            .map_err(|e| format!("cannot build the health-check client: {e}"))?;
        Ok(Self { http, policy })
    }

    /// The rules it probes by.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// GETs each target's URL; the answer is keyed like the input. Only the status code is read: a
    /// failure never echoes what the endpoint answered.
    pub async fn check_all(
        &self,
        expect: u16,
        checks: Vec<((String, String), String)>,
    ) -> HashMap<(String, String), Result<(), String>> {
        // However slow the endpoints (a tarpit), one step's probes end within this time: targets not
        // answered by then count as not probed yet, and fail at the health timeout.
        let budget = tokio::time::sleep(PROBE_BUDGET);
        stream::iter(checks)
            .map(|(key, url)| async move {
                let result = match refusal(&self.policy, Purpose::HEALTH_CHECKS, &url) {
                    Some(why) => Err(format!("GET {url} refused: {why}")),
                    None => match self.http.get(&url).send().await {
                        Ok(r) if r.status().as_u16() == expect => Ok(()),
                        Ok(r) => {
                            Err(format!("GET {url} returned {}, expected {expect}", r.status().as_u16()))
                        }
                        Err(e) => Err(format!("GET {url} failed: {}", chain(&e))),
                    },
                };
                (key, result)
            })
            .buffer_unordered(HTTP_CONCURRENCY)
            .take_until(budget)
            .collect()
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn literal_addresses_and_user_information_are_refused_before_any_request() {
        let prober = Prober::new(Policy::default(), None).unwrap();
        let key = ("ns".to_string(), "web".to_string());
        for url in ["http://127.0.0.1:1/x", "http://[::ffff:169.254.169.254]/", "http://user:pw@10.1.2.3/"] {
            let result = prober.check_all(200, vec![(key.clone(), url.to_string())]).await;
            let message = result[&key].clone().unwrap_err();
            assert!(message.contains("refused"), "{url}: {message}");
        }
    }
}
