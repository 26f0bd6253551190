//! `helm install` for real: on a fresh cluster of its own with a real node (tests/testenv/node.sh), the Helm
//! chapter's commands (docs/src/helm.md, run as written) build the operator's image, push it and the chart
//! to the local registry and install the chart from there, by digest, into a namespace enforcing the
//! restricted Pod Security Standard. Then, through the operator running as pods: a tenant ServiceAccount's
//! rollout completes while the leading pod is deleted mid-batch, another completes across a `helm upgrade`
//! to a second build, and `helm uninstall` leaves the CRDs, the rollouts and their targets as they are.
//! Bad input fails with its cause, not a timeout: an image that cannot be pulled, a registry that is down,
//! a node that never becomes Ready.
//!
//! `make integration` runs this test as a process of its own beside the others, once the image's release
//! binary is built (hack/integration.sh).

use std::time::Duration;

use fleetroll::api::{BatchState, FleetRollout, Phase};
use k8s_openapi::{
    api::{apps::v1::Deployment, coordination::v1::Lease, core::v1::Pod},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;
use testkit::{
    fleet::{Fleet, NEXT_IMAGE, READY_IMAGE, image_of, phase},
    fresh::{FreshCluster, sh_blocks},
    pods::wait_ready,
    tenant::{Grant, Tenant},
    wait_for,
};

const SYSTEM: &str = "fleetroll-system";
const SELECTOR: &str = "app.kubernetes.io/name=fleetroll,app.kubernetes.io/instance=fleetroll";
const THIRD_IMAGE: &str = "registry.k8s.io/pause:3.8";
const DEADLINE: Duration = Duration::from_secs(180);

#[tokio::test]
async fn the_chart_from_the_local_registry_runs_the_operator_on_a_real_node() {
    let fresh = FreshCluster::new("helm-install");

    // The Helm chapter's local commands, as a reader runs them.
    // Its last command waits for the rollout of the operator's pods, without saying why they cannot start:
    // the pods are watched beside it, and one that cannot start fails the test at once with the cause.
    let block = sh_block("docs/src/helm.md", "## On the local cluster");
    let ran = sh(&fresh, &block, Duration::from_secs(1500));
    let unstartable = async {
        let path = fresh.testenv().join("kubeconfig");
        testkit::poll_until("the fresh cluster's kubeconfig", Duration::from_secs(1500), || async {
            // Whole: cluster.sh writes it in steps.
            kube::config::Kubeconfig::read_from(&path).is_ok_and(|k| {
                let current = k.current_context.clone().unwrap_or_default();
                k.contexts.iter().any(|c| c.name == current)
                    && !k.clusters.is_empty()
                    && !k.auth_infos.is_empty()
            })
        })
        .await;
        wait_ready(&fresh.client().await, SYSTEM, SELECTOR, 2, Duration::from_secs(1500), |_| true).await
    };
    tokio::pin!(ran);
    let ran = tokio::select! {
        ran = &mut ran => ran,
        Err(cause) = unstartable => panic!("the chart's pods cannot start: {cause}"),
    };
    assert!(ran.0, "the Helm chapter's commands failed:\n{}", ran.1);
    let env = sh(&fresh, "tests/testenv/cluster.sh env", Duration::from_secs(60)).await.1;
    let registry = env
        .split_whitespace()
        .find_map(|w| w.strip_prefix("REGISTRY="))
        .unwrap_or_else(|| panic!("cluster.sh env names the registry: {env}"))
        .to_string();
    let repository = format!("{registry}/fleetroll");
    let first = built_digest();
    let client = fresh.client().await;

    // Both replicas run the image pulled by digest from the local registry, as the restricted PSS and the
    // chart's securityContext and resources say; one leads.
    let pods =
        running(&client, &format!("{repository}@{first}"), DEADLINE).await.expect("the operator's pods");
    for pod in &pods {
        let status = pod.status.as_ref().unwrap();
        let c = &status.container_statuses.as_ref().unwrap()[0];
        assert!(c.image_id.ends_with(&first), "pulled by digest: {}", c.image_id);
        assert_eq!(c.restart_count, 0, "{} restarted", pod.name_any());
        assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some("fleetroll-node"));
        let process = ContainerProcess::of(c.container_id.as_deref().unwrap());
        assert_eq!(process.status("Uid").split_whitespace().next(), Some("65532"), "non-root");
        assert_eq!(process.status("CapEff"), "0000000000000000", "every capability dropped");
        assert_eq!(process.status("NoNewPrivs"), "1");
        assert_eq!(process.status("Seccomp"), "2", "the RuntimeDefault seccomp profile");
        assert!(process.root_read_only(), "a read-only root filesystem");
        assert_eq!(process.memory_limit(), 256 * 1024 * 1024, "the chart's memory limit");
    }
    let ready = ["/readyz", "/healthz"];
    for path in ready {
        for pod in &pods {
            assert_eq!(get(pod, 8080, path).await.0, 200, "{path} of {}", pod.name_any());
        }
    }
    let leaders = leader_gauges(&pods).await;
    assert_eq!(leaders.iter().filter(|l| **l).count(), 1, "exactly one replica leads: {leaders:?}");
    let leader = lease_holder(&client, &pods, |_| true).await;

    // A tenant's ServiceAccount, with `edit` in its namespace, rolls its six Deployments two at a time;
    // the leading pod is deleted while batch 2 soaks, and the other replica finishes it, each target
    // changed once.
    let team = testkit::create_namespace(&client, "team", &[]).await;
    let fleet = Fleet { client: client.clone(), ns: team.clone(), tenants: vec![] };
    fleet.deployments(&team, 6, READY_IMAGE).await;
    let admin_kubeconfig = fresh.testenv().join("kubeconfig");
    let tenant =
        Tenant::create_on(&client, &admin_kubeconfig, &team, "deployer", &[Grant::cluster_role("edit")])
            .await;
    let rollouts: Api<FleetRollout> = Api::namespaced(tenant.client.clone(), &team);
    let first_rollout = create_rollout(&rollouts, "web", NEXT_IMAGE).await;
    let creator = first_rollout.spec.creator.as_ref().map(|c| c.username.clone());
    assert_eq!(creator.as_deref(), Some(tenant.username.as_str()), "the chart's policy recorded the creator");
    wait_for(&rollouts, "web", "batch 2 to soak", DEADLINE, |fr| {
        batch_state(fr, 1) == Some(BatchState::Verifying)
    })
    .await;
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), SYSTEM);
    pods_api.delete(&leader, &DeleteParams::default()).await.expect("delete the leading pod");
    let pods = running(&client, &format!("{repository}@{first}"), DEADLINE).await.expect("a replacement pod");
    let successor = lease_holder(&client, &pods, |holder| holder != leader).await;
    let done = finished(&rollouts, "web").await;
    assert_eq!(phase(&done), Phase::Succeeded, "{:?}", done.status);
    assert_changed_once(&fleet, NEXT_IMAGE, 2).await;

    // A second build, installed by `helm upgrade` while the next rollout is in flight: it finishes.
    let second = build(&fresh, "0.1.0-second").await;
    assert_ne!(second, first, "another version label, another digest");
    create_rollout(&rollouts, "web-again", THIRD_IMAGE).await;
    wait_for(&rollouts, "web-again", "batch 1 to be applied", DEADLINE, |fr| {
        batch_state(fr, 0).is_some_and(|s| s != BatchState::Pending)
    })
    .await;
    upgrade(&fresh, &registry, &second).await;
    let pods = running(&client, &format!("{repository}@{second}"), DEADLINE).await.expect("the second build");
    assert!(!pods.iter().any(|p| p.name_any() == successor), "every pod replaced");
    let done = finished(&rollouts, "web-again").await;
    assert_eq!(phase(&done), Phase::Succeeded, "{:?}", done.status);
    assert_changed_once(&fleet, THIRD_IMAGE, 3).await;

    // An image that cannot be pulled: the install fails naming the pull and the registry's answer; the
    // replicas of the second build keep running (the PodDisruptionBudget and the rolling update).
    let missing = format!("sha256:{}", "0".repeat(64));
    upgrade(&fresh, &registry, &missing).await;
    let err =
        running(&client, &format!("{repository}@{missing}"), DEADLINE).await.expect_err("no such image");
    assert!(err.contains("ErrImagePull") || err.contains("ImagePullBackOff"), "{err}");
    assert!(err.contains("not found"), "the registry's answer: {err}");
    // A registry that is down: a third build, pushed, then the registry stopped before the node pulls it
    // (the chart installed from a copy pulled while the registry was up).
    let third = build(&fresh, "0.1.0-third").await;
    let pulled = fresh.path("chart");
    let pull = format!(
        "mkdir -p {0} && helm pull oci://{registry}/charts/fleetroll --version 0.1.0 --plain-http --destination {0}",
        pulled.display()
    );
    let pull = sh(&fresh, &pull, DEADLINE).await;
    assert!(pull.0, "{}", pull.1);
    let chart = pulled.join("fleetroll-0.1.0.tgz").display().to_string();
    let registry_pid = std::fs::read_to_string(fresh.testenv().join("pids/registry.pid")).unwrap();
    let stopped = tokio::process::Command::new("kill").arg(registry_pid.trim()).status().await.unwrap();
    assert!(stopped.success(), "stop the registry");
    testkit::poll_until("the registry to stop", DEADLINE, || async {
        tokio::net::TcpStream::connect(&registry).await.is_err()
    })
    .await;
    upgrade_from(&fresh, &chart, &registry, &third).await;
    let err = running(&client, &format!("{repository}@{third}"), DEADLINE).await.expect_err("registry down");
    assert!(err.contains("connection refused") && err.contains(&registry), "names the registry: {err}");
    let restarted = sh(&fresh, "tests/testenv/cluster.sh node-up", Duration::from_secs(120)).await;
    assert!(restarted.0, "node-up starts the registry again: {}", restarted.1);
    testkit::poll_until("the registry to answer", DEADLINE, || async {
        tokio::net::TcpStream::connect(&registry).await.is_ok()
    })
    .await;
    upgrade(&fresh, &registry, &second).await;
    running(&client, &format!("{repository}@{second}"), DEADLINE).await.expect("back on the second build");

    // `helm uninstall`: the operator goes; the CRDs, the rollouts and their targets stay as they are.
    let uninstalled = sh(&fresh, "helm uninstall fleetroll -n fleetroll-system --wait", DEADLINE).await;
    assert!(uninstalled.0, "{}", uninstalled.1);
    // Helm waits for the Deployment; its pods go after it, by the garbage collector, once they stop.
    testkit::poll_until("the operator's pods to go", DEADLINE, || async {
        pods_api.list(&ListParams::default().labels(SELECTOR)).await.is_ok_and(|l| l.items.is_empty())
    })
    .await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    assert!(crds.get_opt("fleetrollouts.fleetroll.dev").await.unwrap().is_some(), "the CRD is kept");
    let kept: Api<FleetRollout> = Api::namespaced(client.clone(), &team);
    assert_eq!(kept.list(&ListParams::default()).await.unwrap().items.len(), 2, "the rollouts are kept");
    assert_changed_once(&fleet, THIRD_IMAGE, 3).await;

    // A node that never becomes Ready (a CNI network that cannot load) fails with the kubelet's reason.
    let down = sh(&fresh, "tests/testenv/cluster.sh node-down", Duration::from_secs(120)).await;
    assert!(down.0, "{}", down.1);
    let broken = fresh.path("broken.conflist");
    std::fs::write(&broken, r#"{"cniVersion": "1.0.0", "name": "broken", "plugins": []}"#).unwrap();
    let script = format!(
        "FLEETROLL_NODE_CNI_CONFLIST={} FLEETROLL_NODE_READY_TIMEOUT=20 tests/testenv/cluster.sh node-up",
        broken.display()
    );
    let never = sh(&fresh, &script, Duration::from_secs(300)).await;
    assert!(!never.0, "a node that is not Ready is an error");
    assert!(never.1.contains("node fleetroll-node not Ready after 20s"), "{}", never.1);
    assert!(never.1.contains("network"), "the kubelet's reason: {}", never.1);
}

/// The first ```sh block after `heading` in a page of the repository.
fn sh_block(page: &str, heading: &str) -> String {
    let text = std::fs::read_to_string(testkit::repo_root().join(page)).unwrap();
    let before = &text[..text.find(heading).unwrap_or_else(|| panic!("{page} has no {heading:?}"))];
    let index = before.matches("```sh\n").count();
    sh_blocks(page).into_iter().nth(index).unwrap_or_else(|| panic!("no sh block under {heading:?}"))
}

/// `script` in a new user's shell pointed at the fresh cluster (with its exports, once it is up).
async fn sh(fresh: &FreshCluster, script: &str, timeout: Duration) -> (bool, String) {
    let exports =
        "if [ -f \"$FLEETROLL_TESTENV/kubeconfig\" ]; then eval \"$(tests/testenv/cluster.sh env)\"; fi";
    fresh.sh(&format!("{exports}\n{script}"), None, timeout).await
}

/// The digest of the image `make image` wrote last.
fn built_digest() -> String {
    let path = testkit::repo_root().join("target/image/fleetroll/digest");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).trim().to_string()
}

/// `make image` with another version label, pushed; its digest.
async fn build(fresh: &FreshCluster, version: &str) -> String {
    let built =
        sh(fresh, &format!("make --no-print-directory image IMAGE_VERSION={version}"), DEADLINE).await;
    assert!(built.0, "{}", built.1);
    built_digest()
}

/// The chapter's `helm upgrade`, with another digest.
async fn upgrade(fresh: &FreshCluster, registry: &str, digest: &str) {
    let chart = format!("oci://{registry}/charts/fleetroll --version 0.1.0 --plain-http");
    upgrade_from(fresh, &chart, registry, digest).await;
}

/// `helm upgrade` of `chart` (a reference and its flags), with the image `digest` from `registry`.
async fn upgrade_from(fresh: &FreshCluster, chart: &str, registry: &str, digest: &str) {
    let script = format!(
        "helm upgrade --install fleetroll {chart} -n {SYSTEM} -f tests/testenv/node-values.yaml \
         --set image.repository={registry}/fleetroll --set image.digest={digest}"
    );
    let upgraded = sh(fresh, &script, DEADLINE).await;
    assert!(upgraded.0, "{}", upgraded.1);
}

/// The operator's two pods of `image`, Ready, or why not.
async fn running(client: &Client, image: &str, timeout: Duration) -> Result<Vec<Pod>, String> {
    let of_image = |p: &Pod| {
        p.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.image.as_deref()) == Some(image)
    };
    let pods = wait_ready(client, SYSTEM, SELECTOR, 2, timeout, of_image).await?;
    // The rolling update is over: no pod of another image is left.
    let api: Api<Pod> = Api::namespaced(client.clone(), SYSTEM);
    testkit::poll_until("the old pods to go", timeout, || async {
        let all =
            api.list(&ListParams::default().labels(SELECTOR)).await.map(|l| l.items).unwrap_or_default();
        all.iter().all(|p| of_image(p) && p.metadata.deletion_timestamp.is_none())
    })
    .await;
    Ok(pods)
}

/// The pod holding the leader Lease, once its holder is one of `pods` and `accept` takes it.
async fn lease_holder(client: &Client, pods: &[Pod], accept: impl Fn(&str) -> bool) -> String {
    let leases: Api<Lease> = Api::namespaced(client.clone(), SYSTEM);
    let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    // The chart sets the identity to the pod's name.
    let pod_of = |lease: &Lease| {
        let holder = lease.spec.as_ref()?.holder_identity.clone()?;
        names.iter().find(|n| **n == holder).cloned()
    };
    let lease = wait_for(&leases, "fleetroll", "a pod of the operator to lead", DEADLINE, |l| {
        pod_of(l).is_some_and(|p| accept(&p))
    })
    .await;
    pod_of(&lease).unwrap()
}

async fn create_rollout(rollouts: &Api<FleetRollout>, name: &str, image: &str) -> FleetRollout {
    let fr: FleetRollout = serde_json::from_value(json!({
        "apiVersion": "fleetroll.dev/v1alpha1",
        "kind": "FleetRollout",
        "metadata": {"name": name},
        "spec": {
            "image": image,
            "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
            "strategy": {"batchSize": 2},
            // Long enough to delete a pod or upgrade the release while a batch is in flight.
            "health": {"soak": "10s"},
        },
    }))
    .unwrap();
    rollouts.create(&PostParams::default(), &fr).await.expect("the tenant creates the rollout")
}

fn batch_state(fr: &FleetRollout, index: u32) -> Option<BatchState> {
    fr.status.as_ref()?.batch(index).map(|b| b.state)
}

async fn finished(rollouts: &Api<FleetRollout>, name: &str) -> FleetRollout {
    wait_for(rollouts, name, "the rollout to finish", DEADLINE, |fr| {
        matches!(phase(fr), Phase::Succeeded | Phase::Failed | Phase::Paused)
    })
    .await
}

/// Every target has `image` and was changed exactly once per rollout (its generation is `generation`).
async fn assert_changed_once(fleet: &Fleet, image: &str, generation: i64) {
    let api: Api<Deployment> = Api::namespaced(fleet.client.clone(), &fleet.ns);
    let all = api.list(&ListParams::default().labels("fleet=web")).await.unwrap().items;
    assert_eq!(all.len(), 6);
    for d in &all {
        assert_eq!(image_of(d), image, "{}", d.name_any());
        assert_eq!(d.metadata.generation, Some(generation), "{} changed once per rollout", d.name_any());
    }
}

/// GET http://<pod IP>:<port><path> from the node's host; status and body.
async fn get(pod: &Pod, port: u16, path: &str) -> (u16, String) {
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("a pod IP");
    let response = reqwest::get(format!("http://{ip}:{port}{path}")).await.expect("the pod answers");
    (response.status().as_u16(), response.text().await.unwrap_or_default())
}

/// Whether each pod's `fleetroll_leader` gauge (on the metrics port) says it leads.
async fn leader_gauges(pods: &[Pod]) -> Vec<bool> {
    let mut out = Vec::new();
    for pod in pods {
        let (code, body) = get(pod, 9090, "/metrics").await;
        assert_eq!(code, 200, "/metrics of {}", pod.name_any());
        let gauge = body.lines().find(|l| l.starts_with("fleetroll_leader ")).expect("the leader gauge");
        out.push(gauge.ends_with(" 1"));
    }
    out
}

/// A container's process, seen from the node's host (the test runs on the node's machine, as root).
struct ContainerProcess {
    pid: u32,
}

impl ContainerProcess {
    /// The process of the container `containerd://<id>` whose command is the operator.
    fn of(container_id: &str) -> ContainerProcess {
        let id = container_id.trim_start_matches("containerd://");
        let pid = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .find(|pid| {
                let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                cgroup.contains(id) && cmdline.starts_with(b"/fleetroll\0")
            })
            .unwrap_or_else(|| panic!("no process of container {id}"));
        ContainerProcess { pid }
    }

    fn status(&self, key: &str) -> String {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        let line =
            status.lines().find(|l| l.starts_with(&format!("{key}:"))).unwrap_or_else(|| panic!("{key}"));
        line[key.len() + 1..].trim().to_string()
    }

    fn root_read_only(&self) -> bool {
        let mounts = std::fs::read_to_string(format!("/proc/{}/mountinfo", self.pid)).unwrap();
        // mountinfo: id parent major:minor root mount-point options ...
        mounts
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .any(|f| f.len() > 5 && f[4] == "/" && f[5].split(',').any(|o| o == "ro"))
    }

    /// The memory limit of the process's cgroup (v1 or v2), in bytes.
    fn memory_limit(&self) -> u64 {
        let cgroups = std::fs::read_to_string(format!("/proc/{}/cgroup", self.pid)).unwrap();
        let file = cgroups
            .lines()
            .find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                match controllers {
                    "" => Some(format!("/sys/fs/cgroup{path}/memory.max")),
                    c if c.split(',').any(|c| c == "memory") => {
                        Some(format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"))
                    }
                    _ => None,
                }
            })
            .expect("a memory cgroup");
        std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file}: {e}")).trim().parse().unwrap()
    }
}
