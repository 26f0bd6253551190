//! Credentials for an analysis backend, from the Secret a rollout names. A rollout's creator chooses both
//! the Secret and (within the operator's rules) where queries go, so only Secrets labelled for analysis
//! are read: otherwise a rollout could send any Secret of its namespace to a backend of its choosing.
//! Secrets are read live, once per measurement, never watched: the operator holds no Secret in memory.

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{Api, Client};

use crate::{api::ANALYSIS_SECRET_LABEL, edge::egress::chain};

/// The largest value a credentials key may hold (a token, a certificate chain).
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

/// Where a rollout names the Secret, for messages.
const SECRET_FIELD: &str = "spec.analysis.provider.prometheus.secretRef";

/// What a request to the backend carries: an Authorization header, a CA to trust, a client certificate.
/// Its Debug output says which are present, never what they are.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    pub(super) auth: Option<Auth>,
    /// PEM certificates trusted instead of the public roots.
    pub(super) ca_pem: Option<Vec<u8>>,
    /// `tls.crt` and `tls.key`, one PEM after the other.
    pub(super) identity_pem: Option<Vec<u8>>,
}

/// The Authorization header.
#[derive(Clone, PartialEq, Eq)]
pub(super) enum Auth {
    Bearer(String),
    Basic { username: String, password: String },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let auth = match self.auth {
            Some(Auth::Bearer(_)) => "bearer token",
            Some(Auth::Basic { .. }) => "basic",
            None => "none",
        };
        f.debug_struct("Credentials")
            .field("auth", &auth)
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.identity_pem.is_some())
            .finish()
    }
}

impl Credentials {
    /// Reads credentials from a Secret labelled for analysis: `token` (bearer) or `username` and
    /// `password` (basic), optionally `ca.crt`, and `tls.crt` with `tls.key`. Errors name keys, never
    /// values.
    pub fn from_secret(secret: &Secret) -> Result<Credentials, String> {
        let meta = &secret.metadata;
        let (namespace, name) =
            (meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default());
        let what = format!("Secret {namespace}/{name} ({SECRET_FIELD})");
        let labelled =
            meta.labels.as_ref().and_then(|l| l.get(ANALYSIS_SECRET_LABEL)).is_some_and(|v| v == "true");
        if !labelled {
            return Err(format!(
                "{what} is not labelled {ANALYSIS_SECRET_LABEL}=true: add the label (kubectl label secret -n \
                 {namespace} {name} {ANALYSIS_SECRET_LABEL}=true) to let analyses use it. Only labelled Secrets \
                 are sent to a metrics backend, so that a rollout cannot send the other Secrets of its namespace \
                 anywhere"
            ));
        }
        let keys = Keys { data: secret.data.as_ref() };
        let parsed = parse(&keys).map_err(|e| format!("{what}: {e}"))?;
        if parsed == Credentials::default() {
            return Err(format!(
                "{what} holds none of the keys token, username and password, ca.crt, tls.crt and tls.key"
            ));
        }
        Ok(parsed)
    }
}

fn parse(keys: &Keys) -> Result<Credentials, String> {
    let auth = match (keys.text("token")?, keys.text("username")?, keys.text("password")?) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            return Err("holds both token and username/password: keep one".into());
        }
        (Some(token), None, None) if token.is_empty() => return Err("token is empty".into()),
        (Some(token), None, None) => Some(Auth::Bearer(token)),
        (None, Some(username), _) if username.is_empty() => return Err("username is empty".into()),
        (None, Some(username), Some(password)) => Some(Auth::Basic { username, password }),
        (None, Some(_), None) => return Err("holds username but no password".into()),
        (None, None, Some(_)) => return Err("holds password but no username".into()),
        (None, None, None) => None,
    };
    let ca_pem = match keys.bytes("ca.crt")? {
        Some(pem) => match reqwest::Certificate::from_pem_bundle(pem) {
            Ok(certs) if !certs.is_empty() => Some(pem.to_vec()),
            _ => return Err("ca.crt holds no PEM certificate".into()),
        },
        None => None,
    };
    let identity_pem = match (keys.bytes("tls.crt")?, keys.bytes("tls.key")?) {
        (Some(cert), Some(key)) => {
            let pem = [cert, b"\n", key].concat();
            reqwest::Identity::from_pem(&pem).map_err(|e| {
                format!("tls.crt and tls.key are not a PEM certificate and key: {}", chain(&e))
            })?;
            Some(pem)
        }
        (None, None) => None,
        _ => return Err("holds only one of tls.crt and tls.key: a client certificate needs both".into()),
    };
    Ok(Credentials { auth, ca_pem, identity_pem })
}

/// A Secret's data, read key by key within bounds.
struct Keys<'a> {
    data: Option<&'a std::collections::BTreeMap<String, ByteString>>,
}

impl Keys<'_> {
    fn bytes(&self, key: &str) -> Result<Option<&[u8]>, String> {
        let Some(value) = self.data.and_then(|d| d.get(key)) else { return Ok(None) };
        if value.0.len() > MAX_VALUE_BYTES {
            return Err(format!("{key} is larger than {} KiB", MAX_VALUE_BYTES / 1024));
        }
        Ok(Some(&value.0))
    }

    /// A value that goes into a header: UTF-8 without control characters, a trailing newline dropped
    /// (Secrets are often made from files).
    fn text(&self, key: &str) -> Result<Option<String>, String> {
        let Some(bytes) = self.bytes(key)? else { return Ok(None) };
        let text = std::str::from_utf8(bytes).map_err(|_| format!("{key} is not UTF-8 text"))?;
        let text = text.trim_end_matches(['\n', '\r']);
        if text.chars().any(char::is_control) {
            return Err(format!("{key} holds control characters or line breaks"));
        }
        Ok(Some(text.to_string()))
    }
}

/// The credentials in Secret `namespace/name`, read live (never cached: the operator keeps no Secret in
/// memory, and a rotated token is used at the next measurement).
pub async fn read_credentials(client: &Client, namespace: &str, name: &str) -> Result<Credentials, String> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    match api.get(name).await {
        Ok(secret) => Credentials::from_secret(&secret),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            Err(format!("Secret {namespace}/{name} ({SECRET_FIELD}) not found"))
        }
        Err(kube::Error::Api(s)) if s.code == 403 => Err(format!(
            "the operator is not allowed to read Secret {namespace}/{name} ({SECRET_FIELD}): analysis \
             credentials need it to read Secrets (Helm value analysis.readSecrets)"
        )),
        Err(e) => Err(format!("cannot read Secret {namespace}/{name} ({SECRET_FIELD}): {}", chain(&e))),
    }
}
