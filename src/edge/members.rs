//! Member clusters, from the Secrets users already have: Argo CD cluster Secrets (labelled
//! `argocd.argoproj.io/secret-type: cluster`) and Cluster API kubeconfig Secrets (`<cluster>-kubeconfig`,
//! their labels on the `Cluster` object). Only Secrets of the operator's fleet namespace are read, live;
//! each is hostile input: bounded, https only, no file paths, no proxy, names of printable ASCII, a
//! name given twice refused. A member's client is cached while its Secret is unchanged, and rebuilt
//! after a 401 ([`Members::forget`]), so rotated credentials are used without a restart.
//!
//! Trust: whoever may write Secrets in the fleet namespace chooses which member an exec plugin fetches a
//! token for, inside the operator (as Argo CD does), but only within the installation's policy: the
//! command, its arguments and its variables (`members/exec.rs`, [`crate::core::exec`]); a Secret asking
//! for more is refused and its plugin never runs. `insecure` (Argo CD) and `insecure-skip-tls-verify` are honoured, as
//! Argo CD honours them, and shown on the [`Member`].

mod argo;
mod errors;
mod exec;
mod kubeconfig;
pub(crate) mod nodes;
mod secrets;
pub(crate) mod watch;
pub(crate) mod workloads;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use k8s_openapi::{api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams},
};

pub use self::{
    errors::{describe, is_unauthorized, is_unreachable},
    exec::ExecPolicy,
    kubeconfig::MemberConfig,
    secrets::{ARGO_CLUSTER, ARGO_SECRET_TYPE_LABEL, CAPI_SECRET_TYPE, parse},
};
use crate::error::{Error, Result, is_not_found};

/// How long building a member's client may take: an exec plugin runs then, and one that never returns
/// must not hold a reconcile (its thread is left behind; kube gives no way to stop it).
const BUILD_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a cached client is used without asking whether its Secret changed: a rollout step calls a
/// member several times, and a changed Secret is used within this anyway (at once after a 401).
const SECRET_RECHECK: Duration = Duration::from_secs(5);

/// A member cluster as its Secret describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The cluster's name: Argo CD's `name` key, or Cluster API's cluster name. Printable ASCII without
    /// spaces, at most 253 characters.
    pub name: String,
    /// What rollouts select it by: the Argo CD Secret's labels (Argo CD's own left out), or the
    /// Cluster API `Cluster` object's.
    pub labels: BTreeMap<String, String>,
    /// Which convention its Secret follows.
    pub source: Source,
    /// The name of its Secret, in the fleet namespace.
    pub secret: String,
    /// Its API server's URL, as the Secret gives it (https).
    pub server: String,
    /// The name its server's certificate is checked against, when not the URL's host (an endpoint that
    /// routes by TLS server name).
    pub tls_server_name: Option<String>,
    /// Whether its server's certificate goes unverified (the Secret asks for it).
    pub insecure: bool,
    /// The change windows its Secret declares (its `fleetroll.dev/windows` annotation, as a namespace's):
    /// one too long to read is kept as a marker that fails to parse, so its targets are held with why.
    pub windows: Option<String>,
}

/// The convention a member Secret follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// An Argo CD cluster Secret.
    ArgoCd,
    /// A Cluster API kubeconfig Secret.
    ClusterApi,
}

/// Why a Secret gives no member, for users (status, events): the Secret and the problem, never a
/// credential.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Secret {secret}: {reason}")]
pub struct Refused {
    /// The Secret's name, in the fleet namespace.
    pub secret: String,
    /// The cluster name the Secret gives, when it could be read.
    pub cluster: Option<String>,
    /// What is wrong with it, naming keys and fields, never values.
    pub reason: String,
}

/// Why no client for a member.
#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    /// No Secret of the fleet namespace gives this cluster name.
    #[error(
        "no member cluster {cluster}: no Argo CD cluster Secret or Cluster API kubeconfig Secret in namespace \
         {namespace} gives that name"
    )]
    NotFound { cluster: String, namespace: String },
    /// The member's Secret (or one of the Secrets giving its name) is refused.
    #[error("member cluster {cluster} is refused: {refused}")]
    Refused { cluster: String, refused: Refused },
    /// Its Secret is read, but no client could be built from it (an exec plugin failed, say).
    #[error("cannot build a client for member cluster {cluster} (Secret {secret}): {reason}")]
    Credentials { cluster: String, secret: String, reason: String },
    /// The hub would not list or read the Secrets.
    #[error(transparent)]
    Hub(#[from] Error),
}

/// The identity of one version of a Secret: a cached client is reused while it is unchanged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretVersion {
    uid: String,
    resource_version: String,
}

impl SecretVersion {
    fn of(meta: &ObjectMeta) -> Self {
        Self {
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
        }
    }
}

/// What one Secret gives: a member with its configuration and the Secret's version, nothing, or a
/// refusal.
type Parsed = Result<Option<(Member, (MemberConfig, SecretVersion))>, Refused>;

/// A client and the Secret version it was built from.
#[derive(Clone)]
struct Cached {
    secret: String,
    version: SecretVersion,
    client: Client,
    /// When the Secret was last seen unchanged.
    checked: tokio::time::Instant,
}

/// The member clusters of the fleet namespace, read live, and a client per member, cached while its
/// Secret is unchanged.
///
/// Cost: [`Members::client`] reads the member's Secret's metadata (one GET, no data) before reusing its
/// client, at most every [`SECRET_RECHECK`], so that a changed Secret is used within that; on a miss it
/// lists the member Secrets (two LISTs).
/// A Secret that starts giving an already cached name is noticed by the next [`Members::list`] (which
/// drops clients whose Secret changed or is refused), or when the cached Secret changes.
#[derive(Clone)]
pub struct Members {
    hub: Client,
    namespace: String,
    state: Arc<Mutex<State>>,
    /// [`BUILD_TIMEOUT`]; shorter in tests.
    build_timeout: Duration,
    /// What a member Secret's exec credential plugin may be.
    exec: Arc<ExecPolicy>,
}

/// A client being built on a blocking thread (an exec plugin may be running).
type Building = tokio::task::JoinHandle<kube::Result<Client>>;

/// What [`Members`] remembers; any of it can be dropped without changing an answer.
#[derive(Default)]
struct State {
    /// Clients by member name.
    clients: HashMap<String, Cached>,
    /// Builds that outlived their timeout, by member name: no other starts for that member while one
    /// still runs, so a plugin that never returns holds one thread, not one per reconcile.
    stalled: HashMap<String, Building>,
    /// The members' declared windows by name, and when they were read.
    windows: Option<(tokio::time::Instant, DeclaredWindows)>,
}

/// Each member's declared windows (its Secret's annotation), by name.
pub type DeclaredWindows = Arc<HashMap<String, Option<String>>>;

/// How long the members' windows are taken as read: as long as a client is taken as current.
const WINDOWS_FRESH: Duration = Duration::from_secs(5);

impl Members {
    /// Members described by the Secrets of `fleet_namespace`, read with `hub`.
    pub fn new(hub: Client, fleet_namespace: String) -> Self {
        Self {
            hub,
            namespace: fleet_namespace,
            state: Arc::default(),
            build_timeout: BUILD_TIMEOUT,
            exec: Arc::new(ExecPolicy::never("is not run here: no exec policy was given")),
        }
    }

    /// Runs the exec credential plugins `exec` allows (none otherwise).
    pub fn with_exec(mut self, exec: ExecPolicy) -> Self {
        self.exec = Arc::new(exec);
        self
    }

    /// The namespace of the member Secrets, the only one whose rollouts reach members.
    pub fn fleet_namespace(&self) -> &str {
        &self.namespace
    }

    /// The client of the cluster the member Secrets are in (the rollouts' own).
    pub fn hub(&self) -> &Client {
        &self.hub
    }

    /// Every member Secret of the fleet namespace: the members (sorted by name) and the Secrets refused,
    /// with why (sorted by Secret). Cluster API members take their labels from their `Cluster` object
    /// (none when there is no such object or no Cluster API); a member whose `Cluster` cannot be read
    /// is refused rather than given no labels, as a selector would then silently miss it.
    pub async fn list(&self) -> Result<(Vec<Member>, Vec<Refused>)> {
        let secrets = self.secrets().await?;
        let labels = match secrets.iter().any(|s| secrets::capi_cluster(s).is_some()) {
            true => self.cluster_labels().await,
            false => Ok(HashMap::new()),
        };
        let parsed =
            secrets.iter().map(|s| exec::judged(&self.exec, parse_with_labels(s, &labels))).collect();
        let (members, refused) = secrets::group(parsed);
        self.keep_current(&members);
        Ok((members.into_iter().map(|(m, _)| m).collect(), refused))
    }

    /// The change windows each member declares, by name, read from the Secrets at most [`WINDOWS_FRESH`]
    /// ago. An error when they cannot be read: a member whose windows are unknown is never taken to have
    /// none.
    pub async fn windows(&self) -> Result<DeclaredWindows> {
        let fresh = self.lock().windows.clone().filter(|(at, _)| at.elapsed() < WINDOWS_FRESH);
        if let Some((_, windows)) = fresh {
            return Ok(windows);
        }
        let (members, _) = self.list().await?;
        let windows: DeclaredWindows = Arc::new(members.into_iter().map(|m| (m.name, m.windows)).collect());
        self.lock().windows = Some((tokio::time::Instant::now(), windows.clone()));
        Ok(windows)
    }

    /// A client for member `cluster`, reusing the cached one while its Secret is unchanged. Err when no
    /// Secret gives that name, its Secret is refused, or no client can be built from it.
    pub async fn client(&self, cluster: &str) -> Result<Client, MemberError> {
        self.current(cluster).await.map(|(client, _)| client)
    }

    /// [`Members::client`], with the version of the Secret it was built from: whoever holds a client for
    /// long (a watch) asks again now and then, and starts afresh once the version differs.
    pub async fn current(&self, cluster: &str) -> Result<(Client, SecretVersion), MemberError> {
        if let Some(current) = self.cached(cluster).await? {
            return Ok(current);
        }
        let secrets = self.secrets().await?;
        let parsed = secrets
            .iter()
            .map(|s| parse(s, None).map(|found| found.map(|(m, c)| (m, (c, SecretVersion::of(&s.metadata))))))
            .map(|parsed| exec::judged(&self.exec, parsed))
            .collect();
        let (members, refused) = secrets::group(parsed);
        let Some((member, (config, version))) = members.into_iter().find(|(m, _)| m.name == cluster) else {
            let cluster = cluster.to_string();
            return Err(match refused.into_iter().find(|r| r.cluster.as_ref() == Some(&cluster)) {
                Some(refused) => MemberError::Refused { cluster, refused },
                None => MemberError::NotFound { cluster, namespace: self.namespace.clone() },
            });
        };
        let client = self.build(cluster, config).await.map_err(|reason| MemberError::Credentials {
            cluster: cluster.to_string(),
            secret: member.secret.clone(),
            reason,
        })?;
        let checked = tokio::time::Instant::now();
        let cached =
            Cached { secret: member.secret, version: version.clone(), client: client.clone(), checked };
        self.lock().clients.insert(cluster.to_string(), cached);
        Ok((client, version))
    }

    /// Drops the cached client of `cluster` (after a 401 from it): the next [`Members::client`] builds
    /// one from its Secret, read again.
    pub fn forget(&self, cluster: &str) {
        self.lock().clients.remove(cluster);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The maps stay whole whatever panicked while holding them: every change is one insert or remove.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached client of `cluster`, if its Secret has not changed since it was built.
    async fn cached(&self, cluster: &str) -> Result<Option<(Client, SecretVersion)>, MemberError> {
        let Some(entry) = self.lock().clients.get(cluster).cloned() else { return Ok(None) };
        if entry.checked.elapsed() < SECRET_RECHECK {
            return Ok(Some((entry.client, entry.version)));
        }
        let api: Api<Secret> = Api::namespaced(self.hub.clone(), &self.namespace);
        let now = api.get_metadata_opt(&entry.secret).await.map_err(|e| self.hub_error(e))?;
        if now.is_some_and(|s| SecretVersion::of(&s.metadata) == entry.version) {
            if let Some(c) = self.lock().clients.get_mut(cluster).filter(|c| c.version == entry.version) {
                c.checked = tokio::time::Instant::now();
            }
            return Ok(Some((entry.client, entry.version)));
        }
        let clients = &mut self.lock().clients;
        if clients.get(cluster).is_some_and(|c| c.version == entry.version) {
            clients.remove(cluster);
        }
        Ok(None)
    }

    /// Drops cached clients whose Secret is no longer the one that gives their member.
    fn keep_current<T>(&self, members: &[(Member, (T, SecretVersion))]) {
        let current: HashMap<&str, (&str, &SecretVersion)> =
            members.iter().map(|(m, (_, v))| (m.name.as_str(), (m.secret.as_str(), v))).collect();
        self.lock()
            .clients
            .retain(|name, c| current.get(name.as_str()) == Some(&(c.secret.as_str(), &c.version)));
    }

    /// The Secrets that may describe members: Argo CD's by label, Cluster API's by type.
    async fn secrets(&self) -> Result<Vec<Secret>> {
        let api: Api<Secret> = Api::namespaced(self.hub.clone(), &self.namespace);
        let argo = ListParams::default().labels(&format!("{ARGO_SECRET_TYPE_LABEL}={ARGO_CLUSTER}"));
        let capi = ListParams::default().fields(&format!("type={CAPI_SECRET_TYPE}"));
        let (argo, capi) =
            futures::try_join!(api.list(&argo), api.list(&capi)).map_err(|e| self.hub_error(e))?;
        let mut secrets = argo.items;
        // A Secret both labelled for Argo CD and of Cluster API's type is listed twice: keep it once.
        let seen: Vec<Option<String>> = secrets.iter().map(|s| s.metadata.uid.clone()).collect();
        secrets.extend(capi.items.into_iter().filter(|s| !seen.contains(&s.metadata.uid)));
        Ok(secrets)
    }

    /// The hub's refusal, saying which permission is missing when it is one.
    fn hub_error(&self, e: kube::Error) -> Error {
        match &e {
            kube::Error::Api(s) if s.code == 403 => Error::Config(format!(
                "the operator may not read Secrets in namespace {}: member clusters need get and list on \
                 Secrets there ({})",
                self.namespace, s.message
            )),
            _ => Error::from(e),
        }
    }

    /// A client from `config`, built on a blocking thread: kube runs an exec plugin while building it.
    async fn build(&self, cluster: &str, config: MemberConfig) -> Result<Client, String> {
        let timeout = self.build_timeout;
        // Taken out first: the guard of an if-let condition would live through its body.
        let stalled = self.lock().stalled.remove(cluster);
        if let Some(stalled) = stalled
            && !stalled.is_finished()
        {
            self.lock().stalled.insert(cluster.to_string(), stalled);
            return Err(format!(
                "the exec plugin started for it more than {timeout:?} ago has not returned yet; no other is \
                 started until it does"
            ));
        }
        let hint = config.install_hint().map(str::to_string);
        let mut building =
            tokio::task::spawn_blocking(move || crate::edge::answers::client(config.into_config()));
        let e = match tokio::time::timeout(timeout, &mut building).await {
            Ok(Ok(Ok(client))) => return Ok(client),
            Ok(Ok(Err(e))) => e,
            Ok(Err(join)) => return Err(format!("building the client failed: {join}")),
            Err(_) => {
                self.lock().stalled.insert(cluster.to_string(), building);
                return Err(format!(
                    "building the client took longer than {timeout:?} (an exec plugin that does not return?)"
                ));
            }
        };
        match (matches!(&e, kube::Error::Auth(kube::client::AuthError::AuthExecStart(_))), hint) {
            (true, Some(hint)) => {
                Err(format!("{}; its installHint: {}", describe(&e), kubeconfig::shown(&hint)))
            }
            _ => Err(describe(&e)),
        }
    }

    /// The labels of the Cluster API `Cluster` objects of the fleet namespace, by name (v1beta2, else
    /// v1beta1; none when neither is served). Err: why they cannot be read.
    async fn cluster_labels(&self) -> Result<HashMap<String, BTreeMap<String, String>>, String> {
        for version in ["v1beta2", "v1beta1"] {
            let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", version, "Cluster");
            let resource = ApiResource::from_gvk_with_plural(&gvk, "clusters");
            let api: Api<DynamicObject> = Api::namespaced_with(self.hub.clone(), &self.namespace, &resource);
            match api.list_metadata(&ListParams::default()).await {
                Ok(list) => {
                    let labelled = list.items.into_iter().map(|c| c.metadata);
                    return Ok(labelled
                        .filter_map(|m| Some((m.name?, m.labels.unwrap_or_default())))
                        .collect());
                }
                Err(e) if is_not_found(&e) => continue,
                Err(e) => return Err(describe(&e)),
            }
        }
        Ok(HashMap::new())
    }
}

/// [`parse`], with the labels of the Secret's `Cluster` (for a Cluster API Secret), and the Secret's
/// version.
fn parse_with_labels(
    secret: &Secret,
    labels: &Result<HashMap<String, BTreeMap<String, String>>, String>,
) -> Parsed {
    let cluster = secrets::capi_cluster(secret);
    let found = match (cluster, labels) {
        (Some(cluster), Ok(labels)) => parse(secret, labels.get(cluster)),
        (Some(cluster), Err(why)) => parse(secret, None).and_then(|found| match found {
            None => Ok(None),
            Some(_) => Err(Refused {
                secret: secret.metadata.name.clone().unwrap_or_default(),
                cluster: Some(cluster.to_string()),
                reason: format!("its labels cannot be read from Cluster {cluster} (cluster.x-k8s.io): {why}"),
            }),
        }),
        (None, _) => parse(secret, None),
    }?;
    Ok(found.map(|(m, c)| (m, (c, SecretVersion::of(&secret.metadata)))))
}

#[cfg(test)]
pub(crate) mod registry_tests;
#[cfg(test)]
mod tests;
