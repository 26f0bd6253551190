//! The member clusters of the local test environment (tests/testenv/members.sh, `make cluster MEMBERS=2`):
//! each a whole control plane on its own loopback address 127.0.0.(1+N), with its own CA and ServiceAccount
//! signing key, so no hub credential works on it. Helpers to reach a member as its admin, to mint and revoke
//! ServiceAccount tokens on it, to write the hub's Secrets for it in the Argo CD and the Cluster API
//! conventions, and to freeze its apiserver.

use std::{collections::BTreeMap, path::PathBuf, process::Command, time::Duration};

use k8s_openapi::{
    ByteString,
    api::{
        authentication::v1::{TokenRequest, TokenRequestSpec},
        core::v1::{Namespace, Secret, ServiceAccount},
        rbac::v1::{ClusterRole, ClusterRoleBinding},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, Config,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams,
        PostParams,
    },
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{conditions, wait::await_condition},
};
use serde_json::json;

use super::testenv_dir;

/// The hub namespace `cluster.sh up` writes the members' Secrets into.
pub const MEMBERS_NAMESPACE: &str = "fleetroll-members";
/// The ClusterRole on each member with what fleetroll needs there (tests/testenv/member-rbac.yaml).
pub const MEMBER_CLUSTER_ROLE: &str = "fleetroll-member";
/// The label that makes a Secret an Argo CD cluster.
pub const ARGO_SECRET_TYPE: (&str, &str) = ("argocd.argoproj.io/secret-type", "cluster");
/// The label naming the cluster of a Cluster API Secret.
pub const CAPI_CLUSTER_NAME: &str = "cluster.x-k8s.io/cluster-name";
const MANAGER: &str = "fleetroll-tests";
const DEADLINE: Duration = Duration::from_secs(60);

/// One member cluster that is up.
#[derive(Clone, Debug)]
pub struct Member {
    /// `member-N`.
    pub name: String,
    /// Its state directory, `<testenv>/members/member-N` (kubeconfig, pki/, pids/, logs/, ports/).
    pub dir: PathBuf,
    /// Its apiserver's URL, `https://127.0.0.(1+N):PORT`.
    pub server: String,
}

/// The members that are up (their apiserver process runs), in order: member-1, member-2, ...
pub fn members() -> Vec<Member> {
    let Ok(entries) = std::fs::read_dir(testenv_dir().join("members")) else { return Vec::new() };
    let mut found: Vec<(u32, Member)> = entries
        .filter_map(|entry| {
            let dir = entry.ok()?.path();
            let name = dir.file_name()?.to_str()?.to_string();
            let n = name.strip_prefix("member-")?.parse().ok()?;
            Some((n, Member::at(name, dir)?))
        })
        .collect();
    found.sort_by_key(|(n, _)| *n);
    found.into_iter().map(|(_, m)| m).collect()
}

/// Member `name` (`member-1`, ...); panics, saying how to start it, when it is not up.
pub fn member(name: &str) -> Member {
    members().into_iter().find(|m| m.name == name).unwrap_or_else(|| {
        panic!(
            "{name} is not up in {}: run `make cluster MEMBERS=2` (`make test` starts them)",
            testenv_dir().display()
        )
    })
}

impl Member {
    fn at(name: String, dir: PathBuf) -> Option<Member> {
        let pid = std::fs::read_to_string(dir.join("pids/kube-apiserver.pid")).ok()?;
        if !PathBuf::from(format!("/proc/{}", pid.trim())).exists() {
            return None;
        }
        let kubeconfig = Kubeconfig::read_from(dir.join("kubeconfig")).ok()?;
        let server = kubeconfig.clusters.first()?.cluster.as_ref()?.server.clone()?;
        Some(Member { name, dir, server })
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// The PEM of the member's own CA.
    pub fn ca_pem(&self) -> Vec<u8> {
        let path = self.dir.join("pki/ca.crt");
        std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
    }

    /// The member's CA PEM in base64, as kubeconfigs' certificate-authority-data and Argo CD's caData hold it.
    pub fn ca_data(&self) -> String {
        base64(&self.ca_pem())
    }

    /// A client with the member's admin certificate (system:masters of the member only).
    pub async fn admin_client(&self) -> Client {
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig()).expect("a member's admin kubeconfig");
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("a config from a member's admin kubeconfig");
        Client::try_from(config).expect("a client for a member")
    }

    pub fn apiserver_pid(&self) -> u32 {
        let path = self.dir.join("pids/kube-apiserver.pid");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        text.trim().parse().expect("a pid in the pid file")
    }

    /// Freezes the member's apiserver (SIGSTOP): connections hang as they would to an unreachable cluster.
    /// The returned guard thaws it (SIGCONT) when dropped, the test's panic included.
    pub fn freeze(&self) -> Frozen {
        let pid = self.apiserver_pid();
        signal(pid, "-STOP").unwrap_or_else(|e| panic!("freeze {}: {e}", self.name));
        Frozen { pid, name: self.name.clone() }
    }
}

/// A frozen member apiserver, thawed on drop.
pub struct Frozen {
    pid: u32,
    name: String,
}

impl Frozen {
    /// Thaws the apiserver now (dropping the guard does the same).
    pub fn thaw(self) {}
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Err(e) = signal(self.pid, "-CONT") {
            eprintln!("warning: could not thaw {}: {e}", self.name);
        }
    }
}

fn signal(pid: u32, sig: &str) -> Result<(), String> {
    let status = Command::new("kill").args([sig, &pid.to_string()]).status().map_err(|e| e.to_string())?;
    if status.success() { Ok(()) } else { Err(format!("kill {sig} {pid}: {status}")) }
}

/// Base64, as the API encodes bytes (k8s-openapi's `ByteString` serializes so).
pub fn base64(bytes: &[u8]) -> String {
    match serde_json::to_value(ByteString(bytes.to_vec())) {
        Ok(serde_json::Value::String(s)) => s,
        other => panic!("ByteString serialized as {other:?}"),
    }
}

/// On a member (given its admin client): ServiceAccount `namespace/name` (namespace included) bound to
/// [`MEMBER_CLUSTER_ROLE`], created if missing; returns a new token of it, valid for an hour. Call again
/// for a second token (rotation); [`revoke_tokens`] invalidates all tokens issued so far.
pub async fn service_account_token(member_admin: &Client, namespace: &str, name: &str) -> String {
    let roles: Api<ClusterRole> = Api::all(member_admin.clone());
    assert!(
        roles.get_opt(MEMBER_CLUSTER_ROLE).await.expect("get the member ClusterRole").is_some(),
        "ClusterRole {MEMBER_CLUSTER_ROLE} is missing on the member: `cluster.sh up` applies member-rbac.yaml"
    );
    let apply = PatchParams::apply(MANAGER).force();
    let namespaces: Api<Namespace> = Api::all(member_admin.clone());
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}});
    namespaces.patch(namespace, &apply, &Patch::Apply(&ns)).await.expect("apply the namespace");
    let accounts: Api<ServiceAccount> = Api::namespaced(member_admin.clone(), namespace);
    let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}});
    accounts.patch(name, &apply, &Patch::Apply(&sa)).await.expect("apply the ServiceAccount");
    let bindings: Api<ClusterRoleBinding> = Api::all(member_admin.clone());
    let binding_name = format!("{MEMBER_CLUSTER_ROLE}-{namespace}-{name}");
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": binding_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": MEMBER_CLUSTER_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
    });
    bindings.patch(&binding_name, &apply, &Patch::Apply(&binding)).await.expect("apply the binding");
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }),
        ..Default::default()
    };
    let issued =
        accounts.create_token_request(name, &PostParams::default(), &request).await.expect("a TokenRequest");
    issued.status.and_then(|s| s.token).expect("a token in the TokenRequest's status")
}

/// Revokes every token [`service_account_token`] issued for `namespace/name` on a member: deletes the
/// ServiceAccount (bound tokens die with its UID) and creates it anew, so new tokens can be issued.
pub async fn revoke_tokens(member_admin: &Client, namespace: &str, name: &str) {
    let accounts: Api<ServiceAccount> = Api::namespaced(member_admin.clone(), namespace);
    let old = accounts.get(name).await.expect("the ServiceAccount to revoke").metadata.uid;
    // A ServiceAccount has no finalizers: it is gone when the delete returns.
    accounts.delete(name, &DeleteParams::default()).await.expect("delete the ServiceAccount");
    let sa = ServiceAccount {
        metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
        ..Default::default()
    };
    let new = accounts.create(&PostParams::default(), &sa).await.expect("recreate the ServiceAccount");
    assert_ne!(new.metadata.uid, old, "the ServiceAccount was not replaced");
}

fn label_map(labels: &[(&str, &str)]) -> BTreeMap<String, String> {
    labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn data(entries: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
    entries.iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect()
}

async fn apply_secret(hub: &Client, namespace: &str, secret: &Secret) -> Secret {
    let name = secret.metadata.name.as_deref().expect("a named Secret");
    Api::<Secret>::namespaced(hub.clone(), namespace)
        .patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(secret))
        .await
        .unwrap_or_else(|e| panic!("apply Secret {namespace}/{name}: {e}"))
}

/// Writes the Argo CD cluster Secret `cluster-<member>` into `namespace` of the hub: labelled
/// [`ARGO_SECRET_TYPE`] and `labels`, with `name`, `server` and `config` (`bearerToken` = `token`,
/// `tlsClientConfig.caData` = the member's CA). Returns the Secret as written.
pub async fn write_argo_secret(
    hub: &Client,
    namespace: &str,
    member: &Member,
    token: &str,
    labels: &[(&str, &str)],
) -> Secret {
    let config = json!({"bearerToken": token, "tlsClientConfig": {"caData": member.ca_data()}});
    write_argo_config(hub, namespace, member, &member.name, config, labels).await
}

/// Writes an Argo CD cluster Secret for `member` under the cluster name `name`, with `config` (its
/// `tlsClientConfig.caData` set to the member's CA), labelled as [`write_argo_secret`] labels it.
pub async fn write_argo_config(
    hub: &Client,
    namespace: &str,
    member: &Member,
    name: &str,
    mut config: serde_json::Value,
    labels: &[(&str, &str)],
) -> Secret {
    config["tlsClientConfig"] = json!({"caData": member.ca_data()});
    let config = config.to_string();
    let mut all = label_map(labels);
    all.insert(ARGO_SECRET_TYPE.0.to_string(), ARGO_SECRET_TYPE.1.to_string());
    // The cluster's name may be no object name (an EKS ARN): the Secret's is made of it.
    let object_name: String = format!("cluster-{name}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .take(63)
        .collect();
    let object_name = object_name.trim_end_matches('-').to_string();
    let secret = Secret {
        metadata: ObjectMeta { name: Some(object_name), labels: Some(all), ..Default::default() },
        type_: Some("Opaque".to_string()),
        data: Some(data(&[("name", name), ("server", &member.server), ("config", &config)])),
        ..Default::default()
    };
    apply_secret(hub, namespace, &secret).await
}

/// A kubeconfig for `member` that authenticates with `token` only, as Cluster API's `value` key holds it.
pub fn token_kubeconfig(member: &Member, token: &str) -> String {
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": member.name, "cluster": {"server": member.server, "certificate-authority-data": member.ca_data()}}],
        "users": [{"name": "fleetroll", "user": {"token": token}}],
        "contexts": [{"name": format!("fleetroll@{}", member.name), "context": {"cluster": member.name, "user": "fleetroll"}}],
        "current-context": format!("fleetroll@{}", member.name),
    });
    serde_saphyr::to_string(&kubeconfig).expect("a kubeconfig as YAML")
}

/// Writes the Cluster API Secret `<member>-kubeconfig` into `namespace` of the hub (type
/// `cluster.x-k8s.io/secret`, label [`CAPI_CLUSTER_NAME`], `value` = [`token_kubeconfig`]) and the `Cluster`
/// `<member>` beside it labelled `labels` (Cluster API keeps a cluster's labels there), installing the
/// Cluster CRD (tests/testenv/capi-cluster-crd.yaml) if it is missing. Returns the Secret as written.
pub async fn write_capi_secret(
    hub: &Client,
    namespace: &str,
    member: &Member,
    token: &str,
    labels: &[(&str, &str)],
) -> Secret {
    ensure_cluster_crd(hub).await;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(format!("{}-kubeconfig", member.name)),
            labels: Some(label_map(&[(CAPI_CLUSTER_NAME, &member.name)])),
            ..Default::default()
        },
        type_: Some("cluster.x-k8s.io/secret".to_string()),
        data: Some(data(&[("value", &token_kubeconfig(member, token))])),
        ..Default::default()
    };
    let written = apply_secret(hub, namespace, &secret).await;
    let url = url::Url::parse(&member.server).expect("a member's server URL");
    let cluster = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "Cluster",
        "metadata": {"name": member.name, "labels": label_map(labels)},
        "spec": {"controlPlaneEndpoint": {"host": url.host_str(), "port": url.port()}}
    });
    clusters(hub, namespace)
        .patch(&member.name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&cluster))
        .await
        .unwrap_or_else(|e| panic!("apply Cluster {namespace}/{}: {e}", member.name));
    written
}

/// Cluster API's `Cluster` objects in `namespace` of the hub.
pub fn clusters(hub: &Client, namespace: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta1", "Cluster");
    Api::namespaced_with(hub.clone(), namespace, &ApiResource::from_gvk_with_plural(&gvk, "clusters"))
}

/// Applies tests/testenv/capi-cluster-crd.yaml to the hub and waits until it is established.
pub async fn ensure_cluster_crd(hub: &Client) {
    let path = crate::repo_root().join("tests/testenv/capi-cluster-crd.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&text).expect("the Cluster CRD");
    let crds: Api<CustomResourceDefinition> = Api::all(hub.clone());
    let name = "clusters.cluster.x-k8s.io";
    crds.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&crd)).await.expect("apply the CRD");
    tokio::time::timeout(DEADLINE, await_condition(crds, name, conditions::is_crd_established()))
        .await
        .expect("the Cluster CRD was not established in time")
        .expect("watch the Cluster CRD");
}
