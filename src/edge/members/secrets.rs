//! Which Secrets describe member clusters, and what they say: pure functions over Secrets already read.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;

use super::{Member, MemberConfig, Refused, Source, argo, kubeconfig};

/// The label that makes a Secret an Argo CD cluster Secret (with the value [`ARGO_CLUSTER`]).
pub const ARGO_SECRET_TYPE_LABEL: &str = "argocd.argoproj.io/secret-type";
/// [`ARGO_SECRET_TYPE_LABEL`]'s value for clusters.
pub const ARGO_CLUSTER: &str = "cluster";
/// Argo CD's own labels, which are not the cluster's.
const ARGO_LABEL_PREFIX: &str = "argocd.argoproj.io/";
/// The type of the Secrets Cluster API writes (kubeconfigs, CAs, keys).
pub const CAPI_SECRET_TYPE: &str = "cluster.x-k8s.io/secret";
/// The label naming the cluster a Cluster API Secret belongs to.
pub const CAPI_CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// The largest `config` (Argo CD) or `value` (Cluster API kubeconfig) accepted.
pub const MAX_CONFIG_BYTES: usize = 64 * 1024;
/// The largest `name` or `server` value read (the name must then be at most [`MAX_NAME_BYTES`]).
const MAX_SHORT_BYTES: usize = 2048;

/// Which convention a Secret follows, if any.
enum Kind<'a> {
    ArgoCd,
    /// A Cluster API kubeconfig Secret of this cluster.
    ClusterApi(&'a str),
}

fn kind(secret: &Secret) -> Option<Kind<'_>> {
    let labels = secret.metadata.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
    if label(ARGO_SECRET_TYPE_LABEL) == Some(ARGO_CLUSTER) {
        return Some(Kind::ArgoCd);
    }
    if secret.type_.as_deref() != Some(CAPI_SECRET_TYPE) {
        return None;
    }
    let name = secret.metadata.name.as_deref().unwrap_or_default();
    match label(CAPI_CLUSTER_NAME_LABEL) {
        // Cluster API keeps a cluster's CA, keys and other kubeconfigs in Secrets of the same type and
        // label: only `<cluster>-kubeconfig` is the one to use.
        Some(cluster) => {
            (name.strip_suffix("-kubeconfig") == Some(cluster)).then_some(Kind::ClusterApi(cluster))
        }
        None => name.ends_with("-kubeconfig").then_some(Kind::ClusterApi("")),
    }
}

/// The cluster a Cluster API kubeconfig Secret belongs to (whose `Cluster` object holds its labels).
pub fn capi_cluster(secret: &Secret) -> Option<&str> {
    match kind(secret) {
        Some(Kind::ClusterApi(cluster)) if !cluster.is_empty() => Some(cluster),
        _ => None,
    }
}

/// Reads one Secret: `Ok(None)` when it describes no member cluster (neither an Argo CD cluster Secret
/// nor a Cluster API `<cluster>-kubeconfig` Secret), `Err` when it does but cannot be used (the reason
/// names fields, never values). `cluster_labels` are the labels of the Cluster API `Cluster` object,
/// when there is one; an Argo CD cluster's labels are its Secret's, Argo CD's own left out.
pub fn parse(
    secret: &Secret,
    cluster_labels: Option<&BTreeMap<String, String>>,
) -> Result<Option<(Member, MemberConfig)>, Refused> {
    let Some(kind) = kind(secret) else { return Ok(None) };
    let secret_name = secret.metadata.name.clone().unwrap_or_default();
    let keys = Keys { data: secret.data.as_ref() };
    let (cluster, found) = match kind {
        Kind::ArgoCd => {
            let cluster = keys.text("name").ok().flatten().filter(|n| n.len() <= 253).map(str::to_string);
            (cluster, argo_member(&keys))
        }
        Kind::ClusterApi(cluster) => {
            let found = match cluster {
                "" => {
                    Err(format!("is of type {CAPI_SECRET_TYPE} but has no label {CAPI_CLUSTER_NAME_LABEL}"))
                }
                _ => capi_member(&keys),
            };
            (Some(cluster.to_string()).filter(|c| !c.is_empty()), found)
        }
    };
    let refused = |reason: String| Refused { secret: secret_name.clone(), cluster: cluster.clone(), reason };
    let (config, server, insecure) = found.map_err(refused)?;
    let name = cluster.clone().unwrap_or_default();
    check_name(&name).map_err(refused)?;
    let (source, labels) = match kind {
        Kind::ArgoCd => {
            let own = secret.metadata.labels.iter().flatten();
            (Source::ArgoCd, own.filter(|(k, _)| !k.starts_with(ARGO_LABEL_PREFIX)).map(clone_pair).collect())
        }
        Kind::ClusterApi(_) => (Source::ClusterApi, cluster_labels.cloned().unwrap_or_default()),
    };
    let tls_server_name = config.config().tls_server_name.clone();
    let windows =
        secret.metadata.annotations.as_ref().and_then(|a| a.get(crate::api::WINDOWS_ANNOTATION)).map(|w| {
            match w.len() {
                n if n <= crate::core::window::ANNOTATION_MAX => w.clone(),
                _ => crate::core::window::ANNOTATION_TOO_LONG.to_string(),
            }
        });
    let member =
        Member { name, labels, source, secret: secret_name, server, tls_server_name, insecure, windows };
    Ok(Some((member, config)))
}

fn clone_pair((k, v): (&String, &String)) -> (String, String) {
    (k.clone(), v.clone())
}

/// What a member Secret gives: its configuration, its server, whether TLS goes unverified.
type Found = Result<(MemberConfig, String, bool), String>;

fn argo_member(keys: &Keys) -> Found {
    keys.text("name")?.ok_or("has no key name")?;
    let server = keys.text("server")?.ok_or("has no key server")?;
    kubeconfig::check_server("server", server)?;
    let config = keys.bytes("config", MAX_CONFIG_BYTES)?.unwrap_or(b"{}");
    let (config, server) = kubeconfig::to_config(argo::kubeconfig("argocd", server, config)?)
        .map_err(|e| format!("config {e}"))?;
    let insecure = config.config().accept_invalid_certs;
    Ok((config, server, insecure))
}

fn capi_member(keys: &Keys) -> Found {
    let value = keys.bytes("value", MAX_CONFIG_BYTES)?.ok_or("has no key value (the kubeconfig)")?;
    let text = std::str::from_utf8(value).map_err(|_| "value is not UTF-8 text".to_string())?;
    let parsed = kubeconfig::from_yaml(text).map_err(|e| format!("value {e}"))?;
    let (config, server) =
        kubeconfig::to_config(parsed).map_err(|e| format!("the kubeconfig in value {e}"))?;
    let insecure = config.config().accept_invalid_certs;
    Ok((config, server, insecure))
}

/// The longest cluster name accepted (a DNS subdomain's bound: an EKS ARN or a GKE context name fits).
const MAX_NAME_BYTES: usize = 253;

/// A member's name goes into target keys (`cluster/namespace/name`), messages, status and terminals:
/// printable ASCII without spaces, at most [`MAX_NAME_BYTES`]. Argo CD's own names are taken as they are
/// (`argocd cluster add` names a cluster after its kubeconfig context: an EKS ARN, `gke_project_zone_name`).
fn check_name(name: &str) -> Result<(), String> {
    match !name.is_empty() && name.len() <= MAX_NAME_BYTES && name.bytes().all(|b| b.is_ascii_graphic()) {
        true => Ok(()),
        false => Err(format!(
            "gives the cluster name {}, which is not printable ASCII without spaces of at most {MAX_NAME_BYTES} \
             characters",
            kubeconfig::shown(name)
        )),
    }
}

/// A Secret's data, read key by key within bounds.
struct Keys<'a> {
    data: Option<&'a BTreeMap<String, k8s_openapi::ByteString>>,
}

impl<'a> Keys<'a> {
    fn bytes(&self, key: &str, max: usize) -> Result<Option<&'a [u8]>, String> {
        let Some(value) = self.data.and_then(|d| d.get(key)) else { return Ok(None) };
        if value.0.len() > max {
            return Err(format!("{key} is larger than {} KiB", max.div_ceil(1024)));
        }
        Ok(Some(&value.0))
    }

    /// A short text value, surrounding whitespace dropped (Secrets are often made from files).
    fn text(&self, key: &str) -> Result<Option<&'a str>, String> {
        let Some(bytes) = self.bytes(key, MAX_SHORT_BYTES)? else { return Ok(None) };
        let text = std::str::from_utf8(bytes).map_err(|_| format!("{key} is not UTF-8 text"))?.trim();
        if text.chars().any(char::is_control) {
            return Err(format!("{key} holds control characters or line breaks"));
        }
        Ok(Some(text).filter(|t| !t.is_empty()))
    }
}

/// Members by name, from what each Secret gave, and every refusal, sorted by Secret. A name given by
/// more than one Secret (a member or a refused Secret) is refused for all of them: which one is meant
/// cannot be known, and a rollout must never reach a cluster by the wrong credentials.
pub fn group<T>(parsed: Vec<Result<Option<(Member, T)>, Refused>>) -> (Vec<(Member, T)>, Vec<Refused>) {
    let mut refused = Vec::new();
    let mut claims: BTreeMap<String, Vec<(Member, T)>> = BTreeMap::new();
    for item in parsed {
        match item {
            Ok(Some(found)) => claims.entry(found.0.name.clone()).or_default().push(found),
            Ok(None) => {}
            Err(r) => refused.push(r),
        }
    }
    let mut members = Vec::new();
    for (name, found) in claims {
        let mut secrets: Vec<&str> = found.iter().map(|(m, _)| m.secret.as_str()).collect();
        let others = refused.iter().filter(|r| r.cluster.as_deref() == Some(name.as_str()));
        secrets.extend(others.map(|r| r.secret.as_str()));
        if secrets.len() == 1 {
            members.extend(found);
            continue;
        }
        secrets.sort_unstable();
        let all = secrets.join(", ");
        let duplicate: Vec<Refused> = found
            .iter()
            .map(|(m, _)| Refused {
                secret: m.secret.clone(),
                cluster: Some(name.clone()),
                reason: format!(
                    "gives the cluster name {name}, as do other Secrets (all of them: {all}): {name} is refused \
                     until only one Secret gives it"
                ),
            })
            .collect();
        refused.extend(duplicate);
    }
    refused.sort_by(|a, b| a.secret.cmp(&b.secret));
    (members, refused)
}
