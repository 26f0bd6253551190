//! fleetroll next to GitOps tools that manage its targets too (docs/src/gitops-managed-targets.md). Argo CD
//! and Flux re-apply each target's Git manifest the way they do (`coexistence/tools.rs`) before a rollout
//! (creating the fleet), while a batch is in flight, and after the rollout succeeded. With the configuration
//! that chapter gives, the image fleetroll set stays and everything else Git changes applies; without it,
//! the image is reverted and the batch in flight fails with `ImageChangedByOthers`, in status, in a Warning
//! event and in the MCP message.

mod tools;

use std::time::Duration;

use fleetroll::api::{APPLIED_ANNOTATION, BatchState, FIELD_MANAGER, Phase};
use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};
use testkit::{
    fleet::{Fleet, NEXT_IMAGE, READY_IMAGE, image_of, phase, with_fleet},
    operator::Operator,
    poll_until, wait_for,
};
use tools::{ArgoApply, FLUX_IMAGE_PATH, argocd_sync, flux_apply, manifest};

const DEADLINE: Duration = Duration::from_secs(120);
const TARGETS: usize = 4;

/// The GitOps tool managing one target, configured as docs/src/gitops-managed-targets.md recommends or left
/// as it comes.
#[derive(Clone, Copy, Debug)]
enum Tool {
    /// Argo CD; `respect`: `ignoreDifferences` with `managedFieldsManagers: [fleetroll]`, and
    /// `RespectIgnoreDifferences=true`.
    ArgoCd { apply: ArgoApply, respect: bool },
    /// Flux; `ignore`: the Kustomization's `.spec.ignore` names the image's path.
    Flux { ignore: bool },
}

impl Tool {
    async fn sync(self, client: &Client, manifest: &Value) {
        match self {
            Tool::ArgoCd { apply, respect } => {
                let trusted: &[&str] = if respect { &[FIELD_MANAGER] } else { &[] };
                argocd_sync(client, manifest, apply, trusted).await;
            }
            Tool::Flux { ignore } => {
                let paths: &[&str] = if ignore { &[FLUX_IMAGE_PATH] } else { &[] };
                flux_apply(client, manifest, paths).await;
            }
        }
    }
}

fn name(i: usize) -> String {
    format!("web-{i:02}")
}

/// Every target synced from Git at `revision`. Git keeps READY_IMAGE throughout: fleetroll rolls NEXT_IMAGE.
async fn sync_all(fleet: &Fleet, tools: &[Tool; TARGETS], revision: u32) {
    for (i, tool) in tools.iter().enumerate() {
        tool.sync(&fleet.client, &manifest(&fleet.ns, &name(i), READY_IMAGE, revision)).await;
    }
}

/// What a target is now: its image, and the Git revision its label and its environment variable come from.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    image: String,
    label: String,
    env: String,
}

fn seen(d: &Deployment) -> Seen {
    let env = d.spec.template.spec.as_ref().and_then(|p| p.containers.first());
    let env = env.and_then(|c| c.env.as_ref()).and_then(|e| e.first()).and_then(|v| v.value.clone());
    Seen {
        image: image_of(d),
        label: d.labels().get("git-revision").cloned().unwrap_or_default(),
        env: env.unwrap_or_default(),
    }
}

async fn deployments(fleet: &Fleet) -> Vec<Deployment> {
    let api: Api<Deployment> = Api::namespaced(fleet.client.clone(), &fleet.ns);
    let mut out = Vec::new();
    for i in 0..TARGETS {
        out.push(api.get(&name(i)).await.unwrap());
    }
    out
}

/// Asserts each target's image (`images[i]`) and that Git's `revision` applied to all of them.
async fn assert_targets(fleet: &Fleet, images: [&str; TARGETS], revision: u32, when: &str) {
    let r = revision.to_string();
    let want: Vec<Seen> =
        images.iter().map(|i| Seen { image: i.to_string(), label: r.clone(), env: r.clone() }).collect();
    let got: Vec<Seen> = deployments(fleet).await.iter().map(seen).collect();
    assert_eq!(got, want, "{when}");
}

/// The fleet as the tools create it from Git, available, and a rollout of NEXT_IMAGE in two batches whose
/// first batch soaks until the test lets it go: a batch in flight to sync against. `held`: a target whose
/// own rollout is paused, so that batch 1 is not judged before the test has synced every target.
async fn fleet_and_rollout(fleet: &Fleet, tools: &[Tool; TARGETS], held: Option<usize>) -> Operator {
    sync_all(fleet, tools, 1).await;
    let api: Api<Deployment> = Api::namespaced(fleet.client.clone(), &fleet.ns);
    for i in 0..TARGETS {
        wait_for(&api, &name(i), "the Deployment to be available", DEADLINE, |d| {
            d.status.as_ref().and_then(|s| s.available_replicas) == Some(1)
        })
        .await;
    }
    if let Some(i) = held {
        let pause = Patch::Merge(json!({"spec": {"paused": true}}));
        api.patch(&name(i), &PatchParams::default(), &pause).await.unwrap();
    }
    let op = Operator::start(&fleet.ns, &[], &[]);
    fleet
        .rollout(
            "web",
            json!({
                "image": NEXT_IMAGE,
                "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
                "strategy": {"batchSize": 2},
                "health": {"soak": "1h", "timeout": "2m"},
            }),
        )
        .await;
    // Verifying: its targets were changed before the status said so.
    let fr = fleet
        .wait_rollout("web", "batch 1 in flight", DEADLINE, |f| {
            f.status.as_ref().is_some_and(|s| s.current().is_some_and(|b| b.state == BatchState::Verifying))
        })
        .await;
    let plan = fleet.plan(&fr).await;
    let first: Vec<&str> = plan.batches[0].iter().map(|t| t.name.as_str()).collect();
    assert_eq!(first, ["web-00", "web-01"], "the tests give each tool one target of batch 1");
    op
}

/// With the recommended configuration: the tools create the fleet, sync while batch 1 is in flight and again
/// after success; fleetroll's image stays, Git's other changes apply, the rollout succeeds with no failure.
async fn coexists(prefix: &'static str, tools: [Tool; TARGETS]) {
    with_fleet(prefix, 0, move |fleet| async move {
        let _op = fleet_and_rollout(&fleet, &tools, None).await;
        sync_all(&fleet, &tools, 2).await;
        let mid = [NEXT_IMAGE, NEXT_IMAGE, READY_IMAGE, READY_IMAGE];
        assert_targets(&fleet, mid, 2, "synced while batch 1 was in flight").await;

        // Let the soak go: batch 1 is judged on what the sync left, then batch 2 runs.
        fleet.patch_spec("web", json!({"health": {"soak": "0s"}})).await;
        let fr = fleet.wait_rollout("web", "success", DEADLINE, |f| phase(f) == Phase::Succeeded).await;
        let s = fr.status.unwrap();
        let c = &s.counts;
        assert_eq!((c.total, c.updated, c.healthy, c.failed), (4, 4, 4, 0));
        assert!(s.failures.is_empty(), "{:?}", s.failures);

        sync_all(&fleet, &tools, 3).await;
        assert_targets(&fleet, [NEXT_IMAGE; TARGETS], 3, "synced after success").await;
        let s = fleet.rollouts().get("web").await.unwrap().status.unwrap();
        assert_eq!((s.phase, s.counts.failed), (Phase::Succeeded, 0));
    })
    .await;
}

#[tokio::test]
async fn argo_cd_trusting_fleetrolls_fields_keeps_its_image_before_during_and_after_a_rollout() {
    // An Application's resources sync one way; here each target is its own Application, both ways covered.
    let [client_side, server_side] =
        [ArgoApply::ClientSide, ArgoApply::ServerSide].map(|apply| Tool::ArgoCd { apply, respect: true });
    coexists("coexist-argo", [client_side, server_side, client_side, server_side]).await;
}

#[tokio::test]
async fn flux_ignoring_the_image_keeps_fleetrolls_before_during_and_after_a_rollout() {
    coexists("coexist-flux", [Tool::Flux { ignore: true }; TARGETS]).await;
}

/// Argo CD and Flux as they come, each managing one target of batch 1: their sync while it is in flight
/// reverts both images, and fleetroll fails both targets with ImageChangedByOthers, saying so in status, in
/// a Warning event and in the MCP message. The targets of batch 2 are left alone.
#[tokio::test]
async fn gitops_as_it_comes_reverts_the_image_and_the_batch_fails_with_image_changed_by_others() {
    with_fleet("coexist-revert", 0, |fleet| async move {
        let argo = Tool::ArgoCd { apply: ArgoApply::ClientSide, respect: false };
        let flux = Tool::Flux { ignore: false };
        let tools = [argo, flux, argo, flux];
        // web-01 (Flux's) is held: the batch is judged once both syncs are done, whatever their timing.
        let op = fleet_and_rollout(&fleet, &tools, Some(1)).await;
        sync_all(&fleet, &tools, 2).await;
        assert_targets(&fleet, [READY_IMAGE; TARGETS], 2, "synced while batch 1 was in flight").await;

        let fr =
            fleet.wait_rollout("web", "the batch to fail", DEADLINE, |f| phase(f) == Phase::Paused).await;
        let s = fr.status.unwrap();
        assert_eq!(s.reason.as_deref(), Some("FailureBudgetExceeded"));
        let changed = |n: usize| {
            format!(
                "{}/{} was changed to {READY_IMAGE} by someone else after fleetroll set {NEXT_IMAGE}",
                fleet.ns,
                name(n)
            )
        };
        let failures: Vec<(&str, &str)> =
            s.failures.iter().map(|f| (f.reason.as_str(), f.message.as_str())).collect();
        let (first, second) = (changed(0), changed(1));
        assert_eq!(
            failures,
            [("ImageChangedByOthers", first.as_str()), ("ImageChangedByOthers", second.as_str())]
        );

        let events = fleet.wait_events("web", &["BatchFailed", "ImageChangedByOthers"], DEADLINE).await;
        let warning = events.iter().find(|(r, _)| r == "ImageChangedByOthers").unwrap();
        assert_eq!(warning.1, format!("{first} (and 1 more targets of this batch)"));

        // MCP answers from a watch of its own, which may not have seen the failure yet.
        op.ready().await;
        let said = "ImageChangedByOthers: someone else changed the image of ";
        poll_until("MCP to name the failure", DEADLINE, || {
            let (op, ns) = (&op, &fleet.ns);
            async move { get_rollout(op, ns).await.contains(said) }
        })
        .await;
        let text = get_rollout(&op, &fleet.ns).await;
        let (a, b) = (format!("{}/web-00", fleet.ns), format!("{}/web-01", fleet.ns));
        assert!(text.contains(said) && text.contains(&a) && text.contains(&b), "{text}");

        for d in &deployments(&fleet).await[2..] {
            assert!(!d.annotations().contains_key(APPLIED_ANNOTATION), "{} was changed", d.name_any());
        }
    })
    .await;
}

/// The text an MCP client reads from `get_rollout` for the rollout `web`.
async fn get_rollout(op: &Operator, ns: &str) -> String {
    let params = json!({"name": "get_rollout", "arguments": {"namespace": ns, "name": "web"}});
    let http = reqwest::Client::new();
    let r =
        testkit::mcp::post(&http, &op.mcp_url(), None, "tools/call", "get_rollout", params, json!({})).await;
    let body: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    body["result"]["content"][0]["text"].as_str().unwrap_or_else(|| panic!("no text in {body}")).to_string()
}
