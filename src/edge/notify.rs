//! Sending one notification to one sink: where (the labelled Secret a subscription names, read live), what
//! (the request each kind of sink takes) and how (through the egress guard, allowed what `--notify-allow`
//! binds to the Secret's namespace). Whether it is due, and what its delivery means for the outbox, is for
//! the delivery loop and `core::notify`.

use std::{sync::Arc, time::Duration};

use hmac::{Hmac, Mac};
use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::egress::{GuardedResolver, chain, guarded, refusal};
use crate::{
    api::{NOTIFY_SECRET_LABEL, Notification, NotificationKind, SinkKind},
    core::http_check::{Allowed, BoundPolicy, Policy, Purpose},
};

/// How long one delivery may take, connecting included: a receiver that hangs costs its own lane this long
/// and never a rollout anything.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest value a sink Secret's key may hold.
const MAX_VALUE_BYTES: usize = 8 * 1024;
/// How long an alert stays firing in Alertmanager after it is sent: a notification tells of a moment.
const ALERT_LIFETIME: Duration = Duration::from_secs(600);

/// Where a sink is and what it is sent with: from its Secret. Debug shows neither key nor token.
#[derive(Clone)]
pub struct Sink {
    pub url: String,
    /// The Secret's namespace: what it may reach is what `--notify-allow` binds to that namespace.
    namespace: String,
    hmac_key: Option<Vec<u8>>,
    token: Option<String>,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("url", &self.url)
            .field("namespace", &self.namespace)
            .field("signed", &self.hmac_key.is_some())
            .field("token", &self.token.is_some())
            .finish()
    }
}

/// The rollout a notification is about.
#[derive(Clone, Debug)]
pub struct About {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// How many distinct sets of allowances have a client of their own at once (one per set of
/// `--notify-allow` entries some namespace matches; few, as the entries are the operator's).
const CLIENTS_KEPT: std::num::NonZeroUsize = match std::num::NonZeroUsize::new(64) {
    Some(n) => n,
    None => std::num::NonZeroUsize::MIN,
};

pub struct Sender {
    egress: BoundPolicy,
    /// A client for each set of allowances: a sink's connections are judged by what its Secret's namespace
    /// is allowed, never by what another namespace is.
    clients: std::sync::Mutex<lru::LruCache<Vec<Allowed>, Guarded>>,
    kube: Client,
}

/// A client whose every connection is judged by `policy`.
#[derive(Clone)]
struct Guarded {
    http: reqwest::Client,
    policy: Arc<Policy>,
}

impl Guarded {
    fn new(policy: Policy, kube: &Client) -> Result<Self, String> {
        let policy = Arc::new(policy);
        let resolver =
            Arc::new(GuardedResolver::new(policy.clone(), Some(kube.clone()), Purpose::NOTIFICATIONS));
        let mut builder = guarded(resolver).timeout(SEND_TIMEOUT).connect_timeout(SEND_TIMEOUT);
        for der in webpki_root_certs::TLS_SERVER_ROOT_CERTS {
            let cert = reqwest::Certificate::from_der(der).map_err(|e| chain(&e))?;
            builder = builder.add_root_certificate(cert);
        }
        let http =
            builder.build().map_err(|e| format!("cannot build the notification client: {}", chain(&e)))?;
        Ok(Self { http, policy })
    }
}

impl Sender {
    /// A sender under `egress` (built from `--notify-allow`).
    pub fn new(egress: BoundPolicy, kube: Client) -> Result<Self, String> {
        // Built once here so that a client that cannot be built is a start-up error.
        Guarded::new(egress.base.clone(), &kube)?;
        Ok(Self { egress, clients: std::sync::Mutex::new(lru::LruCache::new(CLIENTS_KEPT)), kube })
    }

    /// The client for sinks whose Secret is in `namespace`.
    fn client(&self, namespace: &str) -> Result<Guarded, String> {
        let policy = self.egress.for_namespace(namespace);
        let key = policy.allowed.clone();
        let kept = self.clients.lock().ok().and_then(|mut c| c.get(&key).cloned());
        if let Some(client) = kept {
            return Ok(client);
        }
        let client = Guarded::new(policy, &self.kube)?;
        if let Ok(mut clients) = self.clients.lock() {
            clients.put(key, client.clone());
        }
        Ok(client)
    }

    /// The sink a subscription's Secret describes; it must be labelled for notifications.
    pub async fn sink(&self, namespace: &str, name: &str) -> Result<Sink, String> {
        let api: Api<Secret> = Api::namespaced(self.kube.clone(), namespace);
        match api.get_opt(name).await {
            Ok(Some(secret)) => sink(&secret),
            Ok(None) => Err(format!("Secret {namespace}/{name} not found")),
            Err(e) => Err(format!("cannot read Secret {namespace}/{name}: {}", chain(&e))),
        }
    }

    /// Sends `n` to `sink`; Ok once the receiver answered 2xx.
    pub async fn send(
        &self,
        kind: SinkKind,
        sink: &Sink,
        n: &Notification,
        about: &About,
    ) -> Result<(), String> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let (url, body, headers) = match kind {
            SinkKind::Webhook => (sink.url.clone(), event(n, about), standard_webhook(n, now)),
            SinkKind::CloudEvents => (sink.url.clone(), event(n, about), cloud_event(n, about, now)),
            SinkKind::Alertmanager => {
                let url = format!("{}/api/v2/alerts", sink.url.trim_end_matches('/'));
                (url, alert(n, about, now), Vec::new())
            }
        };
        let client = self.client(&sink.namespace)?;
        // Errors never name the URL: it is a secret of the Secret (a chat hook's path, a token in a query).
        if let Some(why) = refusal(&client.policy, Purpose::NOTIFICATIONS, &url) {
            return Err(format!("the Secret's url is refused: {why}"));
        }
        let body = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
        let headers = signed(sink, headers, &body);
        let mut request = client.http.post(&url).header("content-type", "application/json").body(body);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        if let Some(token) = &sink.token {
            request = request.bearer_auth(token);
        }
        match request.send().await {
            Ok(answer) if answer.status().is_success() => Ok(()),
            Ok(answer) => Err(format!("the sink answered {}", answer.status())),
            Err(e) => Err(format!("the sink was not reached: {}", failure(&e))),
        }
    }
}

/// Why a request failed, by class: what a tenant may read in an Event of the rollout (never the URL, nor
/// what an address inside the cluster answered beyond that).
fn failure(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "no connection (refused, unresolved or not allowed)"
    } else if e.is_redirect() {
        "redirected (not followed)"
    } else {
        "the request failed"
    }
}

/// A Secret read as a sink: `url`, and optionally `hmacKey` and `token`. Errors name keys, never values.
pub fn sink(secret: &Secret) -> Result<Sink, String> {
    let meta = &secret.metadata;
    let (namespace, name) =
        (meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default());
    let labelled = meta.labels.as_ref().and_then(|l| l.get(NOTIFY_SECRET_LABEL)).is_some_and(|v| v == "true");
    if !labelled {
        return Err(format!(
            "Secret {namespace}/{name} is not labelled {NOTIFY_SECRET_LABEL}=true: add the label (kubectl label \
             secret -n {namespace} {name} {NOTIFY_SECRET_LABEL}=true) to let notifications use it. Only labelled \
             Secrets are sent anywhere, so that a rollout cannot send the other Secrets of its namespace"
        ));
    }
    let value = |key: &str| -> Result<Option<&ByteString>, String> {
        match secret.data.as_ref().and_then(|d| d.get(key)) {
            Some(v) if v.0.len() > MAX_VALUE_BYTES => {
                Err(format!("Secret {namespace}/{name}: {key} is larger than {} KiB", MAX_VALUE_BYTES / 1024))
            }
            other => Ok(other),
        }
    };
    let text = |key: &str| -> Result<Option<String>, String> {
        let Some(v) = value(key)? else { return Ok(None) };
        let text = std::str::from_utf8(&v.0)
            .map_err(|_| format!("Secret {namespace}/{name}: {key} is not UTF-8"))?;
        let text = text.trim_end_matches(['\n', '\r']);
        match text.chars().any(char::is_control) || text.is_empty() {
            true => Err(format!("Secret {namespace}/{name}: {key} is empty or holds control characters")),
            false => Ok(Some(text.to_string())),
        }
    };
    let url = text("url")?.ok_or_else(|| format!("Secret {namespace}/{name} has no url"))?;
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!("Secret {namespace}/{name}: url must be an http:// or https:// URL"));
    }
    let hmac_key = value("hmacKey")?.map(|v| v.0.clone()).filter(|k| !k.is_empty());
    Ok(Sink { url, namespace: namespace.to_string(), hmac_key, token: text("token")? })
}

/// The JSON every webhook and CloudEvent carries: the notification and the rollout it is about.
pub fn event(n: &Notification, about: &About) -> Value {
    json!({
        "id": n.id,
        "kind": n.kind,
        "at": n.at.0.to_string(),
        "rollout": {"namespace": about.namespace, "name": about.name, "uid": about.uid},
        "revision": n.revision,
        "batch": n.batch,
        "reason": n.reason,
        "message": n.message,
    })
}

/// The Standard Webhooks headers (standardwebhooks.com): the id a receiver deduplicates by, and when sent.
fn standard_webhook(n: &Notification, now: k8s_openapi::jiff::Timestamp) -> Vec<(&'static str, String)> {
    vec![("webhook-id", n.id.clone()), ("webhook-timestamp", now.as_second().to_string())]
}

/// CloudEvents 1.0 over HTTP in binary mode: the attributes as ce- headers, the event as the body.
fn cloud_event(
    n: &Notification,
    about: &About,
    now: k8s_openapi::jiff::Timestamp,
) -> Vec<(&'static str, String)> {
    let mut headers = vec![
        ("ce-specversion", "1.0".to_string()),
        ("ce-id", n.id.clone()),
        (
            "ce-source",
            format!(
                "/apis/fleetroll.dev/v1alpha1/namespaces/{}/fleetrollouts/{}",
                about.namespace, about.name
            ),
        ),
        ("ce-type", format!("dev.fleetroll.rollout.{}", n.kind.as_str().to_ascii_lowercase())),
        ("ce-subject", format!("{}/{}", about.namespace, about.name)),
        ("ce-time", n.at.0.to_string()),
    ];
    // A CloudEvents receiver that checks signatures checks them as a webhook's.
    headers.extend(standard_webhook(n, now));
    headers
}

/// Adds `webhook-signature` when the sink has a key: `v1,` and the base64 HMAC-SHA256 of
/// `<webhook-id>.<webhook-timestamp>.<body>`.
fn signed(sink: &Sink, mut headers: Vec<(&'static str, String)>, body: &[u8]) -> Vec<(&'static str, String)> {
    let Some(key) = &sink.hmac_key else { return headers };
    let header = |name| headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone());
    let (Some(id), Some(timestamp)) = (header("webhook-id"), header("webhook-timestamp")) else {
        return headers;
    };
    headers.push(("webhook-signature", format!("v1,{}", signature(key, &id, &timestamp, body))));
    headers
}

/// The Standard Webhooks signature, base64.
pub fn signature(key: &[u8], id: &str, timestamp: &str, body: &[u8]) -> String {
    use base64::Engine;
    // HMAC takes a key of any length.
    let Ok(mut mac) = Hmac::<sha2::Sha256>::new_from_slice(key) else { return String::new() };
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// One alert for Alertmanager's `POST /api/v2/alerts`. Alertmanager tells alerts apart by their labels, so
/// the notification's id is one: sent twice, it is one alert. It fires from when it happened for a while.
pub fn alert(n: &Notification, about: &About, now: k8s_openapi::jiff::Timestamp) -> Value {
    let severity = match n.kind {
        NotificationKind::BatchFailed
        | NotificationKind::Failed
        | NotificationKind::RolledBack
        | NotificationKind::ChangedByOthers
        | NotificationKind::Deleted
        | NotificationKind::Held => "warning",
        _ => "info",
    };
    let ends = now.checked_add(ALERT_LIFETIME).unwrap_or(now);
    json!([{
        "labels": {
            "alertname": format!("FleetRollout{}", n.kind),
            "fleetroll_event_id": n.id,
            "fleetroll_event": n.kind,
            "namespace": about.namespace,
            "fleetrollout": about.name,
            "severity": severity,
        },
        "annotations": {
            "summary": format!("{}/{}: {}", about.namespace, about.name, n.kind),
            "description": n.message,
            "reason": n.reason,
        },
        "startsAt": n.at.0.to_string(),
        "endsAt": ends.to_string(),
    }])
}

#[cfg(test)]
mod tests;
