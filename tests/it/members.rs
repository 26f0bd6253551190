//! Rollouts across member clusters, against a hub and two member control planes of the test environment
//! (`make cluster MEMBERS=2`), reached through an Argo CD cluster Secret (member-1) and a Cluster API
//! kubeconfig Secret (member-2) in the fleet namespace: two waves with a canary cluster; a rollback across
//! both; approvals and a metric per cluster gating each member's batch; a member whose namespace is not
//! opted in (left out); a member frozen mid-batch; a token rotated and the old one revoked mid-rollout; the operator
//! SIGKILLed 20 times; a member answering without end; exec plugins asked for what they may not do.

pub(crate) mod support;

use fleetroll::api::{APPLIED_ANNOTATION, FleetRollout, Phase};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::{DEADLINE, OPERATOR_ACCOUNT, Site, register, site, spec, tidy, unique};
use testkit::{
    fleet::{NEXT_IMAGE, READY_IMAGE, condition, phase, with_fleet},
    mcp::drive,
    operator::Operator,
};

mod exec;
mod faults;
mod gates;
mod hostile;
mod nodes;
mod previews;
mod windows;

/// The batch (0-based) of each Deployment's `fleetroll.dev/applied` key.
async fn batches_of(s: &Site) -> Vec<u32> {
    let list = s.deployments().list(&Default::default()).await.unwrap();
    let mut out: Vec<u32> = list
        .items
        .iter()
        .filter_map(|d| d.annotations().get(APPLIED_ANNOTATION)?.rsplit('/').next()?.parse().ok())
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn a_rollout_across_two_members_goes_canary_cluster_first_and_changes_each_target_once() {
    if !support::members_up() {
        return;
    }
    let _shared = support::FREEZE.read().await;
    with_fleet("waves", 0, |fleet| async move {
        let team = unique("waves");
        let one = site("member-1", &team, &team, 3, READY_IMAGE, true).await;
        let two = site("member-2", &team, &team, 4, READY_IMAGE, true).await;
        let before = (one.state().await, two.state().await);
        register(&fleet, &[&one, &two], OPERATOR_ACCOUNT).await;
        let _op = Operator::start(&fleet.ns, &[], &[]);
        fleet.rollout("across", spec(NEXT_IMAGE, &team, 2)).await;
        let fr = fleet
            .wait_rollout("across", "the rollout to succeed", DEADLINE, |fr| phase(fr) == Phase::Succeeded)
            .await;

        // Every target changed exactly once (generation +1), on both members.
        for (site, before) in [(&one, &before.0), (&two, &before.1)] {
            let after = site.state().await;
            assert_eq!(after.len(), before.len());
            for (name, (image, generation)) in &after {
                assert_eq!(image, NEXT_IMAGE, "{}/{name}", site.member.name);
                assert_eq!(
                    *generation,
                    before[name].1 + 1,
                    "{}/{name} changed more than once",
                    site.member.name
                );
            }
        }
        // The canary cluster's targets are in the first batches, member-2's after; one cluster per batch.
        assert_eq!(batches_of(&one).await, [0, 0, 1]);
        assert_eq!(batches_of(&two).await, [2, 2, 3, 3]);
        let s = fr.status.clone().unwrap();
        let clusters = s.clusters.clone().expect("status.clusters");
        let waves: Vec<(&str, u32, u32, u32, u32)> = clusters
            .waves
            .iter()
            .map(|w| (w.name.as_str(), w.first_batch, w.last_batch, w.total, w.updated))
            .collect();
        assert_eq!(waves, [("canary", 0, 1, 3, 3), ("prod", 2, 3, 4, 4)]);
        let members: Vec<(&str, u32, u32)> =
            clusters.members.iter().map(|m| (m.name.as_str(), m.total, m.updated)).collect();
        assert_eq!(members, [("member-1", 3, 3), ("member-2", 4, 4)]);
        assert!(clusters.trouble.is_empty());
        assert_eq!((s.counts.total, s.counts.updated, s.counts.failed), (7, 7, 0));
        // The plan names each target with its cluster.
        let plan = fleet.plan(&fr).await;
        assert_eq!(plan.batches[0][0].key(), format!("member-1/{team}/web-00"));

        // Rolled back across both clusters: every target has its old image again.
        fleet.patch_spec("across", json!({"rollback": true})).await;
        fleet.wait_rollout("across", "the rollback", DEADLINE, |fr| phase(fr) == Phase::RolledBack).await;
        for site in [&one, &two] {
            for (name, (image, _)) in site.state().await {
                assert_eq!(image, READY_IMAGE, "{}/{name} not restored", site.member.name);
            }
        }
        tidy(&[&one, &two]).await;
    })
    .await;
}

#[tokio::test]
async fn a_member_namespace_not_opted_in_there_is_left_out_as_if_it_did_not_exist() {
    if !support::members_up() {
        return;
    }
    let _shared = support::FREEZE.read().await;
    with_fleet("optin", 0, |fleet| async move {
        let team = unique("optin");
        let one = site("member-1", &team, &team, 1, READY_IMAGE, true).await;
        let two = site("member-2", &team, &team, 1, READY_IMAGE, false).await;
        let untouched = two.state().await;
        register(&fleet, &[&one, &two], OPERATOR_ACCOUNT).await;
        let _op = Operator::start(&fleet.ns, &[], &[]);
        fleet.rollout("optin", spec(NEXT_IMAGE, &team, 2)).await;
        let fr =
            fleet.wait_rollout("optin", "the rollout to end", DEADLINE, |fr| phase(fr).is_terminal()).await;
        assert_eq!(phase(&fr), Phase::Succeeded, "{:?}", fr.status);
        let s = fr.status.clone().unwrap();
        assert_eq!((s.counts.total, s.counts.updated), (1, 1), "only member-1's namespace opted in");
        for (name, (image, _)) in one.state().await {
            assert_eq!(image, NEXT_IMAGE, "member-1/{name}");
        }
        // member-2's namespace never opted in: not changed, and nothing in the status tells it exists.
        assert_eq!(two.state().await, untouched);
        let status = serde_json::to_string(&fr.status).unwrap();
        assert!(!status.contains("opted in") && !status.contains("NamespaceNotOptedIn"), "{status}");
        // A rollout outside the fleet namespace reaches no member at all.
        let tenant = testkit::create_namespace(&fleet.client, "optin-tenant", &[]).await;
        let elsewhere: Api<FleetRollout> = Api::namespaced(fleet.client.clone(), &tenant);
        let fr: FleetRollout = serde_json::from_value(json!({"apiVersion": "fleetroll.dev/v1alpha1",
            "kind": "FleetRollout", "metadata": {"name": "tenant"}, "spec": spec(NEXT_IMAGE, &team, 2)}))
        .unwrap();
        elsewhere.create(&Default::default(), &fr).await.unwrap();
        // An operator watching that namespace, with the same fleet namespace (tests scope each operator).
        let _tenant_op = Operator::start(&tenant, &["--fleet-namespace", &fleet.ns], &[]);
        let refused = testkit::wait_for(&elsewhere, "tenant", "the rollout to be refused", DEADLINE, |fr| {
            condition(fr, "Degraded").is_some_and(|c| c.reason == "CrossNamespaceNotAllowed")
        })
        .await;
        assert!(condition(&refused, "Degraded").unwrap().message.contains("no member cluster was contacted"));
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(fleet.client.clone());
        namespaces.delete(&tenant, &Default::default()).await.unwrap();
        // The refused rollout changed nothing: member-1 is as the first left it, member-2 as it was.
        assert!(one.state().await.values().all(|(image, _)| image == NEXT_IMAGE), "member-1 changed");
        assert_eq!(two.state().await, untouched, "member-2 changed");
        tidy(&[&one, &two]).await;
    })
    .await;
}

#[tokio::test]
async fn a_canary_cluster_without_targets_leaves_its_wave_out_and_one_server_under_two_names_is_refused() {
    if !support::members_up() {
        return;
    }
    let _shared = support::FREEZE.read().await;
    with_fleet("wavesout", 0, |fleet| async move {
        let team = unique("wavesout");
        let one = site("member-1", &team, &team, 0, READY_IMAGE, true).await;
        let two = site("member-2", &team, &team, 2, READY_IMAGE, true).await;
        register(&fleet, &[&one, &two], OPERATOR_ACCOUNT).await;
        let _op = Operator::start(&fleet.ns, &[], &[]);

        // The canary cluster has the namespace but no matching workload: its wave is left out, said so.
        fleet.rollout("prod-only", spec(NEXT_IMAGE, &team, 2)).await;
        let fr = fleet
            .wait_rollout("prod-only", "the rollout to succeed", DEADLINE, |fr| phase(fr) == Phase::Succeeded)
            .await;
        let clusters = fr.status.clone().unwrap().clusters.expect("status.clusters");
        let waves: Vec<(&str, u32, u32, u32, u32)> = clusters
            .waves
            .iter()
            .map(|w| (w.name.as_str(), w.first_batch, w.last_batch, w.total, w.updated))
            .collect();
        assert_eq!(waves, [("prod", 0, 0, 2, 2)]);
        let events = fleet.wait_events("prod-only", &["ClusterRefused"], DEADLINE).await;
        assert!(
            events
                .iter()
                .any(|(_, note)| note.contains("wave canary reaches no member cluster with targets")),
            "{events:?}"
        );

        // member-2 registered again, as `argocd cluster add` names a cluster from an EKS context.
        let token =
            testkit::members::service_account_token(&two.admin, OPERATOR_ACCOUNT.0, OPERATOR_ACCOUNT.1).await;
        let arn = "arn:aws:eks:eu-west-1:123456789012:cluster/member-2";
        let again = testkit::members::Member { name: arn.into(), ..two.member.clone() };
        let labels = [("env", "prod"), ("registered-by", "argocd")];
        testkit::members::write_argo_secret(&fleet.client, &fleet.ns, &again, &token, &labels).await;
        let before = two.state().await;
        fleet.rollout("twice", spec(READY_IMAGE, &team, 2)).await;
        let fr = fleet
            .wait_rollout("twice", "the plan to be refused", DEADLINE, |fr| {
                condition(fr, "Degraded").is_some_and(|c| c.reason == "DuplicateCluster")
            })
            .await;
        let message = condition(&fr, "Degraded").unwrap().message.clone();
        assert!(
            message.contains(arn) && message.contains("and member-2 are the same API server"),
            "{message}"
        );
        assert_eq!(two.state().await, before, "nothing changes while the plan is refused");

        // Picking one of the two names rolls the cluster once, under that name.
        let mut one_name = spec(READY_IMAGE, &team, 2);
        one_name["targets"]["clusters"]["selector"] = json!({"matchLabels": {"registered-by": "argocd"}});
        fleet.patch_spec("twice", json!({"targets": one_name["targets"]})).await;
        let fr = fleet
            .wait_rollout("twice", "the rollout to succeed", DEADLINE, |fr| phase(fr) == Phase::Succeeded)
            .await;
        let plan = fleet.plan(&fr).await;
        assert_eq!(plan.batches[0][0].key(), format!("{arn}/{team}/web-00"));
        for (name, (image, generation)) in two.state().await {
            assert_eq!((image.as_str(), generation), (READY_IMAGE, before[&name].1 + 1), "{name}");
        }
        tidy(&[&one, &two]).await;
    })
    .await;
}

#[tokio::test]
async fn an_agent_previews_and_rolls_across_members_through_an_mcp_task() {
    if !support::members_up() {
        return;
    }
    let _shared = support::FREEZE.read().await;
    with_fleet("members-mcp", 0, |fleet| async move {
        let team = unique("mcp");
        let one = site("member-1", &team, &team, 2, READY_IMAGE, true).await;
        let two = site("member-2", &team, &team, 2, READY_IMAGE, true).await;
        register(&fleet, &[&one, &two], OPERATOR_ACCOUNT).await;
        let op = Operator::start(&fleet.ns, &[], &[]);
        let mut args = spec(NEXT_IMAGE, &team, 1);
        args["namespace"] = json!(fleet.ns);
        let preview_args = json!({"namespace": fleet.ns, "image": NEXT_IMAGE, "targets": args["targets"],
            "strategy": args["strategy"]});
        let preview = drive(&["call", &op.mcp_url(), "preview_rollout", &preview_args.to_string()]).await;
        let text = preview["content"][0]["text"].as_str().unwrap_or_default().to_string();
        assert!(
            text.contains(
                "waves: canary: member-1 (2 targets, batches 1-2); prod: member-2 (2 targets, batches 3-4)"
            ),
            "{preview}"
        );
        let waves = &preview["structuredContent"]["waves"];
        assert_eq!(
            (waves[0]["name"].as_str(), waves[1]["name"].as_str()),
            (Some("canary"), Some("prod")),
            "{preview}"
        );
        assert_eq!(
            preview["structuredContent"]["batches"][2]["targets"][0]["cluster"], "member-2",
            "{preview}"
        );

        let created = drive(&["start", &op.mcp_url(), &args.to_string()]).await;
        assert_eq!(created["resultType"], "task", "{created}");
        let id = created["taskId"].as_str().unwrap().to_string();
        let done = drive(&["wait", &op.mcp_url(), &id]).await;
        assert_eq!(done["status"], "completed", "{done}");
        let result = &done["result"];
        let text = result["content"][0]["text"].as_str().unwrap_or_default();
        assert!(
            text.contains("waves: canary 2/2 updated (member-1 2/2); prod 2/2 updated (member-2 2/2)"),
            "{text}"
        );
        let clusters = &result["structuredContent"]["clusters"]["members"];
        assert_eq!(
            (clusters[0]["name"].as_str(), clusters[1]["updated"].as_u64()),
            (Some("member-1"), Some(2)),
            "{done}"
        );
        for site in [&one, &two] {
            assert!(
                site.state().await.values().all(|(image, _)| image == NEXT_IMAGE),
                "{}",
                site.member.name
            );
        }
        tidy(&[&one, &two]).await;
    })
    .await;
}

/// An example manifest with its placeholders filled in for `member`, in the fleet namespace `ns`.
fn example(file: &str, ns: &str, member: &testkit::members::Member, token: &str) -> String {
    let text =
        std::fs::read_to_string(testkit::cli::repo_path(&format!("manifests/examples/{file}"))).unwrap();
    let host = format!("https://{}.example.com:6443", member.name);
    text.replace("fleetroll-fleet", ns)
        .replace(&host, &member.server)
        .replace("<a ServiceAccount token of the member>", token)
        .replace("<base64 PEM of the member's CA>", &member.ca_data())
}

#[tokio::test]
async fn the_example_secrets_of_both_styles_and_the_example_rollout_roll_across_the_members() {
    if !support::members_up() {
        return;
    }
    let _shared = support::FREEZE.read().await;
    with_fleet("members-ex", 0, |fleet| async move {
        testkit::members::ensure_cluster_crd(&fleet.client).await;
        let ns = unique("storefront");
        let mut sites = Vec::new();
        let mut manifests = Vec::new();
        for (name, file) in [("member-1", "member-argocd.yaml"), ("member-2", "member-capi.yaml")] {
            let s = support::storefront(name, &ns, 2).await;
            let token =
                testkit::members::service_account_token(&s.admin, OPERATOR_ACCOUNT.0, OPERATOR_ACCOUNT.1)
                    .await;
            manifests.push(example(file, &fleet.ns, &s.member, &token));
            sites.push(s);
        }
        manifests.push(
            std::fs::read_to_string(testkit::cli::repo_path("manifests/examples/across-clusters.yaml"))
                .unwrap()
                .replace("fleetroll-fleet", &fleet.ns),
        );
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("target/test-logs/{}-examples.yaml", fleet.ns));
        std::fs::write(&path, manifests.join("\n---\n")).unwrap();
        let _op = Operator::start(&fleet.ns, &[], &[]);
        testkit::cli::kubectl(&["apply", "-f", &path.to_string_lossy()]).await.ok();
        let fr = fleet
            .wait_rollout("storefront-everywhere", "the example rollout to succeed", DEADLINE, |fr| {
                phase(fr) == Phase::Succeeded
            })
            .await;
        let clusters = fr.status.unwrap().clusters.unwrap();
        let waves: Vec<(&str, u32)> = clusters.waves.iter().map(|w| (w.name.as_str(), w.updated)).collect();
        assert_eq!(waves, [("canary", 2), ("prod", 2)]);
        for s in &sites {
            assert!(s.state().await.values().all(|(image, _)| image == NEXT_IMAGE), "{}", s.member.name);
        }
        tidy(&sites.iter().collect::<Vec<_>>()).await;
    })
    .await;
}
