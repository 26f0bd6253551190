//! The test fixtures of fleetroll's integration tests, benchmark, chaos and security harnesses: a client for
//! the real control plane, a namespace per test, and waits on conditions with deadlines (never fixed sleeps).
//!
//! The cluster is `target/testenv` (started by `make cluster` or `make test`; `FLEETROLL_TESTENV` moves it,
//! as it does for tests/testenv/cluster.sh), or whatever `FLEETROLL_TEST_KUBECONFIG` points at.
#![allow(clippy::unwrap_used)]

use std::{
    fmt::Debug,
    future::Future,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, Config, Resource, ResourceExt,
    api::{DeleteParams, ObjectMeta, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::wait::await_condition,
};
use serde::de::DeserializeOwned;

/// Label put on every namespace a test creates, so leftovers are easy to find.
pub const TEST_LABEL: &str = "fleetroll.dev/test";

/// The repository's root (this crate is `crates/fleetroll-testkit` in it).
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/fleetroll-testkit has a grandparent")
}

/// The files under `dir`, at any depth, whose name ends in `.<extension>`, sorted.
pub fn files_under(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == extension) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The `fleetroll` binary cargo built beside the test binary running now (`target/<profile>/fleetroll`, the
/// test being `target/<profile>/deps/<name>-<hash>`): the one under test, of the same profile and features.
pub fn fleetroll_bin() -> PathBuf {
    let test = std::env::current_exe().expect("the test binary's path");
    let deps = test.parent().expect("the test binary's directory");
    let profile = if deps.ends_with("deps") { deps.parent().expect("target/<profile>") } else { deps };
    let bin = profile.join("fleetroll");
    assert!(bin.exists(), "{} was not built: run the tests through cargo", bin.display());
    bin
}

/// Where the cluster under test is.
pub struct TestCluster {
    pub kubeconfig: PathBuf,
    /// True for the local control plane of `tests/testenv` (kwok nodes), false for a user's own cluster.
    pub local: bool,
}

/// The local test environment's state directory: `$FLEETROLL_TESTENV`, else `target/testenv`.
pub fn testenv_dir() -> PathBuf {
    std::env::var_os("FLEETROLL_TESTENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/testenv"))
}

pub fn cluster() -> TestCluster {
    if let Some(path) = std::env::var_os("FLEETROLL_TEST_KUBECONFIG") {
        return TestCluster { kubeconfig: PathBuf::from(path), local: false };
    }
    let kubeconfig = testenv_dir().join("kubeconfig");
    assert!(
        kubeconfig.exists(),
        "no cluster to test against: run `make cluster` (or `make test`, which starts one), \
         or set FLEETROLL_TEST_KUBECONFIG to a kubeconfig of your own cluster"
    );
    TestCluster { kubeconfig, local: true }
}

pub async fn client() -> Client {
    let path = cluster().kubeconfig;
    let kubeconfig =
        Kubeconfig::read_from(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.unwrap();
    Client::try_from(config).unwrap()
}

/// Creates a namespace `<prefix>-<random>` labelled `labels` and `TEST_LABEL`; returns its name.
pub async fn create_namespace(client: &Client, prefix: &str, labels: &[(&str, &str)]) -> String {
    let mut all: std::collections::BTreeMap<String, String> =
        labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    all.insert(TEST_LABEL.to_string(), "true".to_string());
    let ns = Namespace {
        metadata: ObjectMeta {
            generate_name: Some(format!("{prefix}-")),
            labels: Some(all),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace")
        .name_any()
}

/// Makes a cluster-scoped object belong to namespace `ns`, so that the garbage collector removes it with the
/// namespace even when the test that made it fails half-way.
pub async fn owned_by_namespace<K: Resource<DynamicType = ()>>(client: &Client, ns: &str, obj: &mut K) {
    let namespace = Api::<Namespace>::all(client.clone()).get(ns).await.expect("the owning namespace");
    let owner = namespace.owner_ref(&()).expect("a namespace read back has a uid");
    obj.meta_mut().owner_references = Some(vec![owner]);
}

/// Creates a cluster-scoped object from JSON, owned by namespace `ns` (see [`owned_by_namespace`]).
pub async fn create_owned<K>(client: &Client, ns: &str, value: serde_json::Value) -> K
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + Debug
        + DeserializeOwned
        + serde::Serialize,
{
    let mut obj: K = serde_json::from_value(value).expect("the object's JSON");
    owned_by_namespace(client, ns, &mut obj).await;
    Api::<K>::all(client.clone()).create(&PostParams::default(), &obj).await.expect("create the object")
}

/// Deletes namespace `ns` in the background. FleetRollouts whose operator has stopped keep its finalizers,
/// which nothing else would take off (the namespace would stay Terminating): they are taken off, before the
/// deletion and after it (an operator still running may give a rollout one again until its namespace goes).
pub async fn delete_namespace(client: &Client, ns: &str) -> kube::Result<()> {
    release_rollouts(client, ns).await;
    let deleted = Api::<Namespace>::all(client.clone()).delete(ns, &DeleteParams::background()).await;
    release_rollouts(client, ns).await;
    deleted.map(drop)
}

async fn release_rollouts(client: &Client, ns: &str) {
    let api = Api::<fleetroll::api::FleetRollout>::namespaced(client.clone(), ns);
    let Ok(rollouts) = api.list(&Default::default()).await else { return };
    let strip = kube::api::Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
    for fr in rollouts.items.iter().filter(|fr| !fr.finalizers().is_empty()) {
        let _gone_or_released = api.patch(&fr.name_any(), &Default::default(), &strip).await;
    }
}

/// Runs `body` in a fresh namespace named `<prefix>-<random>`, then deletes the namespace, whether the
/// body passed or panicked (the panic is re-raised afterwards).
pub async fn with_namespace<F, Fut>(prefix: &str, body: F)
where
    F: FnOnce(Client, String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let client = client().await;
    let name = create_namespace(&client, prefix, &[]).await;
    let outcome = tokio::spawn(body(client.clone(), name.clone())).await;
    // Deletion finishes in the background (the namespace controller empties it); tests never reuse names.
    if let Err(e) = delete_namespace(&client, &name).await {
        eprintln!("warning: could not delete test namespace {name}: {e}");
    }
    if let Err(e) = outcome {
        match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => panic!("test body in namespace {name} did not finish: {e}"),
        }
    }
}

/// Waits until the named object satisfies `cond`, or panics after `timeout` showing the object as it last
/// was. Driven by a watch, so it reacts to the change itself rather than polling.
pub async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
    cond: impl Fn(&K) -> bool,
) -> K
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let waited = tokio::time::timeout(
        timeout,
        await_condition(api.clone(), name, move |obj: Option<&K>| obj.is_some_and(&cond)),
    )
    .await;
    match waited {
        Ok(Ok(Some(obj))) => obj,
        Ok(Ok(None)) => panic!("{name} disappeared while waiting for {what}"),
        Ok(Err(e)) => panic!("watch failed while waiting for {what}: {e}"),
        Err(_) => {
            let last = api.get_opt(name).await;
            panic!("timed out after {timeout:?} waiting for {what}; last seen: {last:#?}")
        }
    }
}

/// Polls `check` until it says yes, or panics after `timeout` naming `what`. Only for state that nothing can
/// watch (the API server's authorizer and admission caches); objects are waited on with [`wait_for`].
pub async fn poll_until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A small, seedable generator (xorshift64*), so a failing run can be replayed exactly.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

pub mod alertmanager;
pub mod args;
pub mod audit;
pub mod bench;
pub mod browser;
pub mod chart;
pub mod cli;
pub mod dashboard;
pub mod fleet;
pub mod flood;
pub mod fresh;
pub mod frozen;
pub mod mcp;
pub mod members;
pub mod nodes;
pub mod operator;
pub mod people;
pub mod pods;
pub mod policy;
pub mod prometheus;
pub mod proxy;
pub mod receiver;
pub mod tenant;
