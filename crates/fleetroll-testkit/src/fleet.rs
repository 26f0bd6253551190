//! A fleet to roll: a namespace of its own (where the FleetRollout and the operator's lease live), tenant
//! namespaces opted in to cross-namespace rollouts, and Deployments in them. Everything is deleted
//! afterwards, whether the test passed or not.

use std::{
    collections::{BTreeMap, HashMap},
    future::Future,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;

use fleetroll::api::{FleetRollout, OPT_IN_LABEL, OPT_IN_VALUE};
use k8s_openapi::{
    api::apps::v1::Deployment,
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, conditions, wait::await_condition, watcher},
};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use super::{client, create_namespace, wait_for};

pub const READY_IMAGE: &str = "registry.k8s.io/pause:3.10";
pub const NEXT_IMAGE: &str = "registry.k8s.io/pause:3.9";
/// Never becomes Ready (see tests/testenv/kwok-stages.yaml).
pub const UNREADY_IMAGE: &str = "registry.invalid/fleetroll/web:v2-unready";
/// Label on the tenant namespaces of one test, so its namespaceSelector matches nothing else.
pub const FLEET_LABEL: &str = "fleetroll.dev/test-fleet";

/// Installs (or updates) the CRD once per test process, with the chart's admission policy and roles for
/// people, so every test runs under the policy a real installation has.
pub async fn ensure_crd(client: &Client) {
    install_crd(client).await;
    super::tenant::ensure_aggregated_roles(client).await;
    super::tenant::ensure_admission_policy(client).await;
}

async fn install_crd(client: &Client) {
    static DONE: OnceCell<()> = OnceCell::const_new();
    DONE.get_or_init(|| async {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in [fleetroll::api::crd(), fleetroll::api::policy_crd()] {
            let name = crd.metadata.name.clone().unwrap_or_default();
            crds.patch(&name, &PatchParams::apply("fleetroll-tests").force(), &Patch::Apply(&crd))
                .await
                .expect("apply the CRD");
            tokio::time::timeout(
                Duration::from_secs(60),
                await_condition(crds.clone(), &name, conditions::is_crd_established()),
            )
            .await
            .expect("the CRD was not established in time")
            .expect("watching the CRD");
        }
    })
    .await;
}

pub struct Fleet {
    pub client: Client,
    /// The fleet namespace: FleetRollouts and the operator's lease live here.
    pub ns: String,
    /// Tenant namespaces, opted in and labelled `FLEET_LABEL=<ns>`.
    pub tenants: Vec<String>,
}

/// Runs `body` with a fleet namespace and `tenants` opted-in tenant namespaces, then deletes them all.
pub async fn with_fleet<F, Fut>(prefix: &str, tenants: usize, body: F)
where
    F: FnOnce(Fleet) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let client = client().await;
    ensure_crd(&client).await;
    let ns = create_namespace(&client, prefix, &[]).await;
    let mut tenant_names = Vec::new();
    for i in 0..tenants {
        let labels = [(OPT_IN_LABEL, OPT_IN_VALUE), (FLEET_LABEL, ns.as_str())];
        tenant_names.push(create_namespace(&client, &format!("{prefix}-t{i}"), &labels).await);
    }
    let fleet_client = client.clone();
    let fleet = Fleet { client, ns: ns.clone(), tenants: tenant_names.clone() };
    let outcome = tokio::spawn(body(fleet)).await;
    for name in std::iter::once(&ns).chain(tenant_names.iter()) {
        if let Err(e) = crate::delete_namespace(&fleet_client, name).await {
            eprintln!("warning: could not delete test namespace {name}: {e}");
        }
    }
    if let Err(e) = outcome {
        match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => panic!("test body in {ns} did not finish: {e}"),
        }
    }
}

pub fn deployment(name: &str, image: &str, labels: &[(&str, &str)]) -> Deployment {
    let mut all: BTreeMap<String, String> =
        labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    all.insert("app".into(), name.into());
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": all},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "web", "image": image}]}
            }
        }
    }))
    .expect("a valid Deployment")
}

impl Fleet {
    /// Creates `n` Deployments `web-00..` (label `fleet=web`) in `ns`, and waits until they are Available.
    pub async fn deployments(&self, ns: &str, n: usize, image: &str) -> Vec<String> {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), ns);
        let mut names = Vec::new();
        for i in 0..n {
            let name = format!("web-{i:02}");
            api.create(&PostParams::default(), &deployment(&name, image, &[("fleet", "web")]))
                .await
                .expect("create");
            names.push(name);
        }
        for name in &names {
            wait_for(&api, name, "the Deployment to be available", Duration::from_secs(120), |d| {
                d.status.as_ref().and_then(|s| s.available_replicas) == Some(1)
            })
            .await;
        }
        names
    }

    /// Ten Deployments in each tenant namespace.
    pub async fn tenant_deployments(&self, per_tenant: usize) {
        for t in &self.tenants {
            self.deployments(t, per_tenant, READY_IMAGE).await;
        }
    }

    pub fn rollouts(&self) -> Api<FleetRollout> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Creates a FleetRollout from a JSON spec.
    pub async fn rollout(&self, name: &str, spec: Value) -> FleetRollout {
        let fr: FleetRollout = serde_json::from_value(json!({
            "apiVersion": "fleetroll.dev/v1alpha1",
            "kind": "FleetRollout",
            "metadata": {"name": name},
            "spec": spec,
        }))
        .expect("a FleetRollout");
        self.rollouts().create(&PostParams::default(), &fr).await.expect("create the FleetRollout")
    }

    /// The gates hash an approval of rollout `name` must name now (status.pendingApproval.gatesHash).
    pub async fn gates(&self, name: &str) -> String {
        fleetroll::core::plan::gates_of(&self.rollouts().get(name).await.expect("the rollout"))
    }

    /// Approves `batches` of plan `plan_hash` under the rollout's gates as they are now (spec.approvals,
    /// replaced; approvedBy left out).
    pub async fn approve(&self, name: &str, batches: &[u32], plan_hash: &str) {
        let gates = self.gates(name).await;
        let approvals: Vec<Value> =
            batches.iter().map(|b| json!({"batch": b, "planHash": plan_hash, "gatesHash": gates})).collect();
        self.patch_spec(name, json!({ "approvals": approvals })).await;
    }

    /// Patches the spec the way a person or agent would (merge patch).
    pub async fn patch_spec(&self, name: &str, spec: Value) {
        self.rollouts()
            .patch(name, &PatchParams::default(), &Patch::Merge(json!({ "spec": spec })))
            .await
            .expect("patch the FleetRollout");
    }

    pub async fn wait_rollout(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        cond: impl Fn(&FleetRollout) -> bool,
    ) -> FleetRollout {
        wait_for(&self.rollouts(), name, what, timeout, cond).await
    }

    /// Whether the FleetRollout `name` (of `uid`) is gone within `timeout`, driven by a watch.
    pub async fn wait_deleted(&self, name: &str, uid: &str, timeout: Duration) -> bool {
        let gone = await_condition(self.rollouts(), name, conditions::is_deleted(uid));
        tokio::time::timeout(timeout, gone).await.is_ok()
    }

    /// Every Deployment of the fleet (the tenants', or the fleet namespace's when there are none).
    pub async fn all_deployments(&self) -> Vec<Deployment> {
        let mut out = Vec::new();
        let namespaces = if self.tenants.is_empty() { vec![self.ns.clone()] } else { self.tenants.clone() };
        for ns in namespaces {
            let api: Api<Deployment> = Api::namespaced(self.client.clone(), &ns);
            out.extend(api.list(&ListParams::default().labels("fleet=web")).await.expect("list").items);
        }
        out
    }

    /// A rollout's frozen plan, from its status or its ConfigMaps, as the operator reads it.
    pub async fn plan(&self, fr: &FleetRollout) -> fleetroll::core::plan::Plan {
        let plan_ref = fr.status.as_ref().and_then(|s| s.plan.as_ref()).expect("the rollout has a plan");
        let store = fleetroll::edge::plans::PlanStore::default();
        store
            .load(&self.client, fr, plan_ref)
            .await
            .expect("the plan is readable")
            .expect("the plan is authentic")
            .plan
            .clone()
    }

    /// The events recorded for a FleetRollout, as (reason, message), once one of each of `reasons` is among
    /// them: the operator sends events in the background, after the status they announce, so a test that
    /// saw the status waits for them (driven by a watch), up to `timeout`.
    pub async fn wait_events(
        &self,
        name: &str,
        reasons: &[&str],
        timeout: Duration,
    ) -> Vec<(String, String)> {
        let complete = |seen: &[(String, String)]| reasons.iter().all(|r| seen.iter().any(|(x, _)| x == r));
        self.wait_events_until(name, complete, timeout).await
    }

    /// The events recorded for a FleetRollout, as (reason, message), once they are `complete`, up to
    /// `timeout` (see [`Fleet::wait_events`]).
    pub async fn wait_events_until(
        &self,
        name: &str,
        complete: impl Fn(&[(String, String)]) -> bool,
        timeout: Duration,
    ) -> Vec<(String, String)> {
        let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(self.client.clone(), &self.ns);
        let mut seen = Vec::new();
        let events = watcher(api, watcher::Config::default()).default_backoff().applied_objects();
        futures::pin_mut!(events);
        let waited = tokio::time::timeout(timeout, async {
            while let Some(event) = events.next().await {
                let Ok(e) = event else { continue };
                if e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name) {
                    seen.push((e.reason.unwrap_or_default(), e.note.unwrap_or_default()));
                    if complete(&seen) {
                        return;
                    }
                }
            }
        })
        .await;
        assert!(waited.is_ok() && complete(&seen), "the events of {name} within {timeout:?}: {seen:?}");
        seen
    }
}

pub fn image_of(d: &Deployment) -> String {
    template_image(&d.spec.template)
}

/// The image of a pod template's first container.
pub fn template_image(t: &k8s_openapi::api::core::v1::PodTemplateSpec) -> String {
    t.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.image.clone()).unwrap_or_default()
}

pub fn phase(fr: &FleetRollout) -> fleetroll::api::Phase {
    fr.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

/// Whether the rollout's plan is frozen (status names it).
pub fn has_plan(fr: &FleetRollout) -> bool {
    fr.status.as_ref().is_some_and(|s| s.plan.is_some())
}

pub fn condition<'a>(
    fr: &'a FleetRollout,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    fr.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
}

pub fn fully_rolled_out(d: &Deployment) -> bool {
    let want = d.spec.replicas.unwrap_or(1);
    d.status.as_ref().is_some_and(|s| {
        s.observed_generation == d.metadata.generation
            && s.updated_replicas == Some(want)
            && s.ready_replicas == Some(want)
            && s.available_replicas == Some(want)
            && s.replicas == Some(want)
    })
}

/// What a watch of the fleet saw: when each target first had the new image and when it was rolled out on
/// it, and the most targets ever in flight (changed, not yet rolled out) at once.
#[derive(Default)]
pub struct Observed {
    pub changed: HashMap<String, Instant>,
    pub rolled: HashMap<String, Instant>,
    pub max_in_flight: usize,
}

pub fn observe_fleet(
    fleet: &Fleet,
    image: &'static str,
) -> (Arc<Mutex<Observed>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Observed::default()));
    let namespaces = if fleet.tenants.is_empty() { vec![fleet.ns.clone()] } else { fleet.tenants.clone() };
    let api: Api<Deployment> = Api::all(fleet.client.clone());
    let out = seen.clone();
    let task = tokio::spawn(async move {
        // A watch error must not end the observation: back off and keep watching.
        let mut events = watcher(api, watcher::Config::default().labels("fleet=web"))
            .default_backoff()
            .applied_objects()
            .filter_map(|event| async move { event.ok() })
            .boxed();
        while let Some(d) = events.next().await {
            let ns = d.namespace().unwrap_or_default();
            if !namespaces.contains(&ns) {
                continue;
            }
            let key = format!("{ns}/{}", d.name_any());
            let mut o = out.lock().unwrap();
            if image_of(&d) == image {
                o.changed.entry(key.clone()).or_insert_with(Instant::now);
                if fully_rolled_out(&d) {
                    o.rolled.entry(key.clone()).or_insert_with(Instant::now);
                }
            }
            let in_flight = o.changed.keys().filter(|k| !o.rolled.contains_key(*k)).count();
            o.max_in_flight = o.max_in_flight.max(in_flight);
        }
    });
    (seen, task)
}

/// The run of `metric` in batch `index` (0-based) of a rollout's status.
pub fn metric_run(fr: &FleetRollout, index: u32, metric: &str) -> fleetroll::api::MetricRun {
    let status = fr.status.clone().unwrap_or_default();
    let analysis = status.batch(index).and_then(|b| b.analysis.clone());
    let runs = analysis.map(|a| a.metrics).unwrap_or_default();
    runs.into_iter()
        .find(|r| r.name == metric)
        .unwrap_or_else(|| panic!("no run of {metric} in batch {index}: {status:?}"))
}

/// A change window opening at a whole second `seconds` from now, in UTC: the opening, and a cron schedule
/// of six fields (seconds first) that names exactly it.
pub fn opening_in(seconds: i64) -> (k8s_openapi::jiff::Timestamp, String) {
    use k8s_openapi::jiff::{Timestamp, tz::TimeZone};
    let opening = Timestamp::from_second(Timestamp::now().as_second() + seconds).expect("a time in range");
    let c = opening.to_zoned(TimeZone::UTC);
    (opening, format!("{} {} {} {} {} *", c.second(), c.minute(), c.hour(), c.day(), c.month()))
}
