//! The test environment itself: the control plane behaves like a real cluster in the ways every later test
//! relies on. Images are real, pullable ones, so these tests pass on a user's own cluster too
//! (FLEETROLL_TEST_KUBECONFIG); on the local control plane kwok plays the pods.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::{
    api::{
        apps::v1::{Deployment, ReplicaSet},
        core::v1::{Node, Pod},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, CustomResource, CustomResourceExt, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, conditions, watcher},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use testkit::{wait_for, with_namespace};

const READY_IMAGE: &str = "registry.k8s.io/pause:3.10";
const NEXT_IMAGE: &str = "registry.k8s.io/pause:3.9";
/// Never becomes Ready: kwok's "pod-unready" stage (tests/testenv/kwok-stages.yaml) matches "unready" in
/// the image, and a real cluster cannot pull it.
const UNREADY_IMAGE: &str = "registry.invalid/fleetroll/web:v2-unready";
const DEADLINE: Duration = Duration::from_secs(90);

fn deployment(name: &str, image: &str, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "progressDeadlineSeconds": 10,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "web", "image": image}]}
            }
        }
    }))
    .unwrap()
}

/// The (status, reason) of a Deployment condition.
fn condition(d: &Deployment, type_: &str) -> Option<(String, Option<String>)> {
    let c = d.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_.as_deref() == Some(type_))?;
    Some((c.status.clone()?, c.reason.clone()))
}

fn fully_rolled_out(d: &Deployment) -> bool {
    let want = d.spec.replicas.unwrap_or(1);
    let Some(s) = &d.status else { return false };
    s.observed_generation == d.metadata.generation
        && s.replicas == Some(want)
        && s.updated_replicas == Some(want)
        && s.ready_replicas == Some(want)
        && s.available_replicas == Some(want)
}

#[tokio::test]
async fn nodes_are_ready() {
    let client = testkit::client().await;
    let nodes: Api<Node> = Api::all(client);
    let list = nodes.list(&ListParams::default()).await.unwrap();
    let ready = list
        .items
        .iter()
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count();
    assert!(ready >= 1, "no Ready node in the cluster");
    if testkit::cluster().local {
        let kwok = list.items.iter().filter(|n| n.labels().get("type").is_some_and(|t| t == "kwok")).count();
        assert!(kwok >= 10, "the local control plane should have at least 10 kwok nodes, has {kwok}");
    }
}

#[tokio::test]
async fn deployment_becomes_available_then_rolls_to_a_new_image() {
    with_namespace("deploy", |client: Client, ns: String| async move {
        let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
        api.create(&PostParams::default(), &deployment("web", READY_IMAGE, 3)).await.unwrap();
        let d = wait_for(&api, "web", "Deployment web to become Available", DEADLINE, |d| {
            fully_rolled_out(d) && condition(d, "Available").is_some_and(|(s, _)| s == "True")
        })
        .await;
        assert_eq!(d.status.unwrap().ready_replicas, Some(3));

        // The pods really run on nodes, with the Ready condition set by kwok (or a kubelet).
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let list = pods.list(&ListParams::default().labels("app=web")).await.unwrap();
        assert_eq!(list.items.len(), 3);
        for p in &list.items {
            assert!(
                p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some(),
                "{} is not bound",
                p.name_any()
            );
        }

        // A rolling update to a new image completes: every replica runs the new image and the old
        // ReplicaSet is scaled to zero.
        let patch =
            json!({"spec": {"template": {"spec": {"containers": [{"name": "web", "image": NEXT_IMAGE}]}}}});
        let before = api.get("web").await.unwrap().metadata.generation.unwrap();
        api.patch("web", &PatchParams::default(), &Patch::Strategic(&patch)).await.unwrap();
        let d = wait_for(&api, "web", "the rolling update of web to complete", DEADLINE, |d| {
            d.metadata.generation > Some(before) && fully_rolled_out(d)
        })
        .await;
        let image = &d.spec.template.spec.unwrap().containers[0].image;
        assert_eq!(image.as_deref(), Some(NEXT_IMAGE));
        let rs: Api<ReplicaSet> = Api::namespaced(client, &ns);
        let sets = rs.list(&ListParams::default().labels("app=web")).await.unwrap().items;
        assert_eq!(sets.len(), 2, "one ReplicaSet per template");
        let mut sizes: Vec<i32> = sets.iter().map(|r| r.status.as_ref().map_or(-1, |s| s.replicas)).collect();
        sizes.sort();
        assert_eq!(sizes, vec![0, 3], "the old ReplicaSet is scaled down, the new one is full");
    })
    .await;
}

#[tokio::test]
async fn deployment_whose_pods_never_become_ready_stays_unavailable() {
    with_namespace("unready", |client: Client, ns: String| async move {
        let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
        api.create(&PostParams::default(), &deployment("bad", UNREADY_IMAGE, 2)).await.unwrap();
        // The controller gives up on progress after progressDeadlineSeconds: a positive signal to wait on.
        let d = wait_for(&api, "bad", "Deployment bad to exceed its progress deadline", DEADLINE, |d| {
            condition(d, "Progressing")
                .is_some_and(|(s, r)| s == "False" && r.as_deref() == Some("ProgressDeadlineExceeded"))
        })
        .await;
        assert_eq!(condition(&d, "Available").map(|(s, _)| s), Some("False".to_string()));
        let status = d.status.unwrap();
        assert_eq!(status.available_replicas.unwrap_or(0), 0);
        assert_eq!(status.ready_replicas.unwrap_or(0), 0);
        let pods: Api<Pod> = Api::namespaced(client, &ns);
        let list = pods.list(&ListParams::default().labels("app=bad")).await.unwrap();
        assert_eq!(list.items.len(), 2, "the pods exist, they just never become Ready");
        for p in &list.items {
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready").map(|c| c.status.clone()));
            assert_ne!(ready.as_deref(), Some("True"), "{} became Ready", p.name_any());
        }
    })
    .await;
}

/// A throwaway custom resource for exercising CRDs, the status subresource and watches.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, JsonSchema)]
#[kube(group = "testenv.fleetroll.dev", version = "v1", kind = "Probe", namespaced, status = "ProbeStatus")]
pub struct ProbeSpec {
    message: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, JsonSchema)]
pub struct ProbeStatus {
    seen: i64,
}

#[tokio::test]
async fn crd_status_is_written_by_server_side_apply_and_a_watch_sees_it() {
    let client = testkit::client().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd_name = Probe::crd_name();
    crds.patch(crd_name, &PatchParams::apply("fleetroll-tests").force(), &Patch::Apply(Probe::crd()))
        .await
        .unwrap();
    tokio::time::timeout(
        DEADLINE,
        kube::runtime::wait::await_condition(crds, crd_name, conditions::is_crd_established()),
    )
    .await
    .expect("the CRD was not established in time")
    .unwrap();

    with_namespace("crd", |client: Client, ns: String| async move {
        let api: Api<Probe> = Api::namespaced(client, &ns);
        // Watch first, so every later change must arrive through the watch.
        let mut events = watcher(api.clone(), watcher::Config::default()).applied_objects().boxed();

        let probe = Probe::new("p", ProbeSpec { message: "hello".into() });
        let created = api.create(&PostParams::default(), &probe).await.unwrap();
        assert!(created.status.is_none());

        for seen in 1..=2 {
            let status =
                json!({"apiVersion": "testenv.fleetroll.dev/v1", "kind": "Probe", "status": {"seen": seen}});
            api.patch_status("p", &PatchParams::apply("fleetroll-tests"), &Patch::Apply(&status))
                .await
                .unwrap();
            let observed = tokio::time::timeout(DEADLINE, async {
                while let Some(p) = events.try_next().await.unwrap() {
                    if p.status.as_ref().is_some_and(|s| s.seen == seen) {
                        return p;
                    }
                }
                panic!("the watch ended");
            })
            .await
            .unwrap_or_else(|_| panic!("the watch never showed status.seen = {seen}"));
            // The status subresource leaves spec and generation alone.
            assert_eq!(observed.spec.message, "hello");
            assert_eq!(observed.metadata.generation, created.metadata.generation);
        }

        // Server-side apply recorded our field manager as the owner of the status.
        let p = api.get("p").await.unwrap();
        let managers: Vec<_> =
            p.managed_fields().iter().filter(|m| m.subresource.as_deref() == Some("status")).collect();
        assert!(managers.iter().any(|m| m.manager.as_deref() == Some("fleetroll-tests")), "{managers:?}");

        // Writing status through the main resource is ignored once the status subresource exists.
        let mut p = p;
        p.status = Some(ProbeStatus { seen: 99 });
        let replaced = api.replace("p", &PostParams::default(), &p).await.unwrap();
        assert_eq!(replaced.status.map(|s| s.seen), Some(2));
    })
    .await;
}
