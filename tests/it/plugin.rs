//! `kubectl fleetroll`, run through the real kubectl (which finds the plugin on PATH as
//! `kubectl-fleetroll`): the live status view (of workload and node rollouts), the plan, the controls,
//! output formats and exit codes.

use std::time::Duration;

use fleetroll::api::{BatchState, Phase};
use kube::ResourceExt;
use serde_json::{Value, json};
use testkit::{
    cli::{kubectl, repo_path, validate_krew_manifest},
    fleet::{NEXT_IMAGE, READY_IMAGE, UNREADY_IMAGE, phase, with_fleet},
    mcp::drive,
    nodes::{self, DAEMONSET, POOL_LABEL, with_pool},
    operator::Operator,
    people::Person,
    tenant::{self, APPROVER_ROLE, Grant, Tenant},
};

const DEADLINE: Duration = Duration::from_secs(180);

#[tokio::test]
async fn status_follows_a_rollout_to_its_end_and_exits_with_its_outcome() {
    with_fleet("plugin-status", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        fleet.deployments(&ns, 4, READY_IMAGE).await;
        let _op = Operator::start(&ns, &[], &[]);
        fleet
            .rollout(
                "web",
                json!({"image": NEXT_IMAGE, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
                       "strategy": {"batchSize": 2, "approval": "FirstBatch"}}),
            )
            .await;
        fleet.wait_rollout("web", "the approval gate", DEADLINE, |f| phase(f) == Phase::WaitingForApproval).await;

        // Follow it while it waits, approve from another shell once the view shows the gate, and see it end.
        let mut follower = testkit::cli::spawn_kubectl(&["fleetroll", "status", "web", "-n", &ns, "--timeout", "3m"]);
        let shown = follower.read_until("kubectl fleetroll approve web", Duration::from_secs(60)).await;
        assert!(shown.contains("WaitingForApproval"), "it showed the gate:\n{shown}");
        kubectl(&["fleetroll", "approve", "web", "-n", &ns]).await.ok();
        let followed = follower.finish(Duration::from_secs(120)).await.ok();
        assert!(followed.stdout.contains("Succeeded"), "and the end:\n{}", followed.stdout);
        let last = followed.stdout.rsplit("---").next().unwrap();
        assert_eq!(last.matches("[########################]").count(), 2, "two full batch bars:\n{last}");

        let once = kubectl(&["fleetroll", "status", "web", "-n", &ns, "--no-follow"]).await.ok();
        assert!(once.stdout.starts_with(&format!("FleetRollout {ns}/web")), "{}", once.stdout);
        let json = kubectl(&["fleetroll", "status", "web", "-n", &ns, "-o", "json"]).await.ok();
        let object: Value = serde_json::from_str(&json.stdout).unwrap();
        assert_eq!((object["kind"].as_str(), object["status"]["phase"].as_str()), (Some("FleetRollout"), Some("Succeeded")));
        let yaml = kubectl(&["fleetroll", "status", "web", "-n", &ns, "-o", "yaml"]).await.ok();
        assert!(yaml.stdout.contains("phase: Succeeded"), "{}", yaml.stdout);
        let plan = kubectl(&["fleetroll", "plan", "web", "-n", &ns, "-o", "json"]).await.ok();
        let plan: Value = serde_json::from_str(&plan.stdout).unwrap();
        assert_eq!((plan["totalTargets"].as_u64(), plan["preview"].as_bool()), (Some(4), Some(false)));

        // A rollout that rolled back: status exits 1.
        fleet
            .rollout(
                "bad",
                json!({"image": UNREADY_IMAGE, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
                       "strategy": {"batchSize": 2, "onFailure": "Rollback"}, "health": {"timeout": "3s"}}),
            )
            .await;
        let failed = kubectl(&["fleetroll", "status", "bad", "-n", &ns, "--timeout", "2m"]).await;
        assert_eq!(failed.code, 1, "{}\n{}", failed.stdout, failed.stderr);
        assert!(failed.stdout.contains("RolledBack"), "{}", failed.stdout);
        assert!(failed.stdout.contains("failed:"), "the failures are named:\n{}", failed.stdout);
    })
    .await;
}

#[tokio::test]
async fn controls_plan_previews_and_kubectl_conventions() {
    with_fleet("plugin-controls", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        fleet.deployments(&ns, 3, READY_IMAGE).await;
        let _op = Operator::start(&ns, &[], &[]);

        // A preview of a manifest writes nothing.
        let manifest = std::env::temp_dir().join(format!("{ns}-preview.yaml"));
        std::fs::write(
            &manifest,
            "apiVersion: fleetroll.dev/v1alpha1\nkind: FleetRollout\nmetadata: {name: next}\nspec:\n  image: registry.k8s.io/pause:3.9\n  \
             targets: {kind: Deployment, selector: {matchLabels: {fleet: web}}}\n  strategy: {batchSize: 2}\n",
        )
        .unwrap();
        let preview = kubectl(&["fleetroll", "plan", "-f", &manifest.display().to_string(), "-n", &ns]).await.ok();
        assert!(preview.stdout.contains("would roll 3 targets in 2 batches"), "{}", preview.stdout);
        assert!(preview.stdout.contains("Nothing was written."));
        assert!(fleet.rollouts().list(&Default::default()).await.unwrap().items.is_empty());

        fleet
            .rollout(
                "web",
                json!({"image": NEXT_IMAGE, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
                       "strategy": {"batchSize": 1, "approval": "EveryBatch"}}),
            )
            .await;
        fleet.wait_rollout("web", "the approval gate", DEADLINE, |f| phase(f) == Phase::WaitingForApproval).await;
        let paused = kubectl(&["fleetroll", "pause", "web", "-n", &ns]).await.ok();
        assert_eq!(paused.stdout.trim(), "fleetrollout.fleetroll.dev/web paused");
        assert!(fleet.rollouts().get("web").await.unwrap().spec.paused);
        kubectl(&["fleetroll", "resume", "web", "-n", &ns]).await.ok();
        assert!(!fleet.rollouts().get("web").await.unwrap().spec.paused);
        let approved = kubectl(&["fleetroll", "approve", "web", "-n", &ns, "--batch", "1"]).await.ok();
        assert!(approved.stdout.contains("approved batch 1 of plan"), "{}", approved.stdout);
        let stale = kubectl(&["fleetroll", "approve", "web", "-n", &ns, "--plan-hash", "0000000000000000"]).await;
        assert_eq!(stale.code, 3, "refused: the plan changed");
        assert!(stale.stderr.contains("is not the rollout's plan"), "{}", stale.stderr);
        let aborted = kubectl(&["fleetroll", "abort", "web", "-n", &ns, "-o", "json"]).await.ok();
        assert_eq!(serde_json::from_str::<Value>(&aborted.stdout).unwrap()["spec"]["abort"], true);
        fleet.wait_rollout("web", "the abort", DEADLINE, |f| phase(f) == Phase::Aborted).await;
        kubectl(&["fleetroll", "rollback", "web", "-n", &ns]).await.ok();
        fleet.wait_rollout("web", "the rollback", DEADLINE, |f| phase(f) == Phase::RolledBack).await;

        // kubectl's conventions (--context, 2 on usage errors), and an exit code per kind of failure.
        let context = kubectl(&["config", "current-context"]).await.ok().stdout.trim().to_string();
        let rolled_back = kubectl(&["fleetroll", "status", "web", "-n", &ns, "--no-follow", "--context", &context]).await;
        assert_eq!(rolled_back.code, 1, "a rollout that did not succeed exits 1: {}", rolled_back.stderr);
        let wrong_context = kubectl(&["fleetroll", "status", "web", "-n", &ns, "--context", "no-such-context"]).await;
        assert_eq!(wrong_context.code, 5, "cannot reach the cluster: {}", wrong_context.stderr);
        let missing = kubectl(&["fleetroll", "status", "nope", "-n", &ns, "--no-follow"]).await;
        assert_eq!(missing.code, 4, "not found");
        assert!(missing.stderr.contains("not found"), "{}", missing.stderr);
        let usage = kubectl(&["fleetroll", "frobnicate"]).await;
        assert_eq!(usage.code, 2, "{}", usage.stderr);
    })
    .await;
}

#[tokio::test]
async fn status_counts_the_healthy_nodes_of_a_node_rollout() {
    with_fleet("plugin-nodes", 0, |fleet| async move {
        let client = fleet.client.clone();
        let pool = fleet.ns.clone();
        with_pool(client.clone(), pool.clone(), 2, |_| async move {
            let ns = fleet.ns.clone();
            nodes::daemonset(&client, &ns, &pool, READY_IMAGE, 2).await;
            let _op = Operator::start(&ns, &[], &[]);
            // A long soak holds the one batch in Verifying once both new pods are Ready: the view counts them.
            let fr = fleet
                .rollout(
                    "agents",
                    json!({"image": NEXT_IMAGE,
                           "targets": {"kind": "Node", "daemonSet": DAEMONSET, "nodeSelector": {"matchLabels": {POOL_LABEL: pool}}},
                           "strategy": {"batchSize": 2}, "health": {"timeout": "2m", "soak": "10m"}}),
                )
                .await;
            fleet
                .wait_rollout("agents", "both nodes healthy, soaking", DEADLINE, |f| {
                    f.status.as_ref().is_some_and(|s| {
                        s.batches.first().is_some_and(|b| b.state == BatchState::Verifying && b.healthy_since.is_some())
                    })
                })
                .await;

            let mut follower =
                testkit::cli::spawn_kubectl(&["fleetroll", "status", "agents", "-n", &ns, "--timeout", "3m"]);
            let shown = follower.read_until("(2/2 healthy)", Duration::from_secs(60)).await;
            assert!(shown.contains("batch   1/1"), "the one batch of nodes:\n{shown}");

            // Aborted, the view ends and exits 1; deleting the rollout then hands the DaemonSet back.
            kubectl(&["fleetroll", "abort", "agents", "-n", &ns]).await.ok();
            let followed = follower.finish(Duration::from_secs(60)).await;
            assert_eq!(followed.code, 1, "{}\n{}", followed.stdout, followed.stderr);
            assert!(followed.stdout.contains("Aborted"), "{}", followed.stdout);
            fleet.rollouts().delete("agents", &Default::default()).await.unwrap();
            assert!(fleet.wait_deleted("agents", &fr.uid().unwrap(), DEADLINE).await, "the rollout was not finalized");
        })
        .await;
    })
    .await;
}

/// `.krew.yaml` as krew-release-bot renders it for a release `tag`: `{{ .TagName }}` becomes the tag and
/// `{{addURIAndSha "URL" .TagName }}` the asset's `uri` and `sha256` (a fake one: no release to download).
fn render_krew_template(template: &str, tag: &str) -> String {
    const CALL: &str = "{{addURIAndSha \"";
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find(CALL) {
        out.push_str(&rest[..start]);
        let after = &rest[start + CALL.len()..];
        let (url, tail) = after.split_once("\" .TagName }}").expect("addURIAndSha \"URL\" .TagName }}");
        out.push_str(&format!("uri: {url}\n    sha256: {}", "0123456789abcdef".repeat(4)));
        rest = tail;
    }
    out.push_str(rest);
    out.replace("{{ .TagName }}", tag)
}

#[tokio::test]
async fn the_krew_manifest_is_valid_for_every_platform() {
    let template = std::fs::read_to_string(repo_path(".krew.yaml")).unwrap();
    let rendered = render_krew_template(&template, "v0.1.0");
    assert!(!rendered.contains("{{"), "an action the release bot renders is left over:\n{rendered}");
    let manifest: Value = serde_saphyr::from_str(&rendered).unwrap();
    // Each platform downloads its own archive, named as `make dist` names it.
    let platforms: Vec<String> = manifest["spec"]["platforms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|platform| {
            let labels = &platform["selector"]["matchLabels"];
            let (os, arch) = (labels["os"].as_str().unwrap(), labels["arch"].as_str().unwrap());
            let archive = format!("/releases/download/v0.1.0/kubectl-fleetroll_v0.1.0_{os}_{arch}.tar.gz");
            assert!(platform["uri"].as_str().unwrap().ends_with(&archive), "{platform}");
            format!("{os}/{arch}")
        })
        .collect();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64"]);
    // The validator takes the plugin's name from the file's.
    let dir = std::env::temp_dir().join(format!("fleetroll-krew-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("fleetroll.yaml");
    std::fs::write(&file, &rendered).unwrap();
    // -skip-install: installing would download the release archives.
    let ran = validate_krew_manifest(&["-manifest", &file.display().to_string(), "-skip-install"]).await;
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(ran.code, 0, "krew rejects the manifest:\n{}{}\n{rendered}", ran.stdout, ran.stderr);
}

/// Separation of duties with real identities, under a platform policy: a FleetRolloutPolicy says that the
/// agent's rollouts need a first-batch approval by the group approvers. The agent (a ServiceAccount with
/// edit and even the approver role) starts a rollout over MCP; it may not approve it, over MCP or with
/// kubectl, nor may a person with edit alone; alice, a person (an x509 user in the group approvers),
/// approves with the plugin, and the rollout completes, each target changed as the agent (the audit log).
/// `kubectl get -o wide` and the plugin name the creator the API server recorded and who may approve.
#[tokio::test]
async fn an_agents_rollout_waits_for_a_person_to_approve_it() {
    with_fleet("plugin-duties", 0, |fleet| async move {
        let ns = fleet.ns.clone();
        fleet.deployments(&ns, 2, READY_IMAGE).await;
        let approver = Grant::cluster_role(APPROVER_ROLE);
        let agent = Tenant::create(&fleet.client, &ns, "agent", &[Grant::cluster_role("edit"), approver]).await;
        let (alice, bob) = tokio::join!(
            Person::x509(&fleet.client, "alice", &["approvers"]),
            Person::x509(&fleet.client, "bob", &["developers"]),
        );
        tenant::bind(&fleet.client, &ns, "approvers", "Group", "approvers", APPROVER_ROLE).await;
        tenant::bind(&fleet.client, &ns, "developers", "Group", "developers", "edit").await;
        alice.wait_allowed(&fleet.client, &ns, "fleetroll.dev", "fleetrollouts", "approve").await;
        // She reads rollouts everywhere (her inbox spans the cluster).
        let view = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": format!("{ns}-alice-view")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "fleetroll-view"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
        });
        let view: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(view).unwrap();
        kube::Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(fleet.client.clone())
            .create(&Default::default(), &view)
            .await
            .unwrap();
        alice.wait_allowed(&fleet.client, "", "fleetroll.dev", "fleetrollouts", "list").await;
        bob.wait_allowed(&fleet.client, &ns, "fleetroll.dev", "fleetrollouts", "patch").await;
        let targets = json!({"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}});
        let policy = format!("{ns}-people-approve");
        let rules = json!({"subjects": {"serviceAccounts": [{"namespace": ns, "name": "agent"}]},
                           "approval": "FirstBatch", "approvers": {"groups": ["approvers"]}});
        let probe = json!({"image": NEXT_IMAGE, "targets": targets});
        testkit::policy::govern(&fleet.client, &ns, &policy, rules, &agent.username, probe).await;
        let op = Operator::start(&ns, &["--auth", "serviceaccount", "--mcp-audience", "http://127.0.0.1:{port}/mcp"], &[]);
        let url = op.mcp_url();
        let token = tenant::token_for(&fleet.client, &ns, "agent", Some(&url)).await;

        // Over MCP, the agent's rollout without the approval the policy asks for is refused, naming it.
        let args = |strategy: Value| {
            json!({"namespace": ns, "name": "agents", "image": NEXT_IMAGE, "targets": targets, "strategy": strategy})
                .to_string()
        };
        let unapproved = drive(&["call", &url, "rollout_fleet", &args(json!({"batchSize": 1})), "--no-tasks", "--token", &token]).await;
        assert_eq!(unapproved["isError"], true, "{unapproved}");
        let named = format!("FleetRollout denied by FleetRolloutPolicy {policy} (approval)");
        assert!(unapproved.to_string().contains(&named), "{unapproved}");
        let started = drive(&["start", &url, &args(json!({"batchSize": 1, "approval": "FirstBatch"})), "--token", &token]).await;
        assert_eq!(started["resultType"], "task", "{started}");
        let task = started["taskId"].as_str().unwrap().to_string();
        let waiting = |f: &fleetroll::api::FleetRollout| phase(f) == Phase::WaitingForApproval;
        let fr = fleet.wait_rollout("agents", "the approval gate", DEADLINE, waiting).await;
        assert_eq!(fr.spec.creator.as_ref().map(|c| c.username.as_str()), Some(agent.username.as_str()));
        let approvers = &fr.status.as_ref().unwrap().pending_approval.as_ref().unwrap().approvers;
        assert_eq!((approvers[0].policy.as_str(), &approvers[0].groups[..]), (policy.as_str(), &["approvers".to_string()][..]));

        // The agent holds the approve verb, but created the rollout: refused over MCP, and with kubectl below.
        let approve = json!({"namespace": ns, "name": "agents"}).to_string();
        let own = drive(&["call", &url, "approve_batch", &approve, "--no-tasks", "--token", &token]).await;
        assert_eq!(own["isError"], true, "{own}");
        let refused = |text: &str| {
            text.contains("created this rollout and may not approve it")
                || text.contains(&format!("FleetRolloutPolicy {policy} (approvers)"))
        };
        assert!(refused(&own.to_string()), "{own}");
        let own = agent.kubectl(&["fleetroll", "approve", "agents", "-n", &ns]).await;
        assert_eq!(own.code, 3, "refused: {}", own.stdout);
        assert!(refused(&own.stderr), "{}", own.stderr);
        // bob may edit the rollout but holds no approve verb, nor is he one of the policy's approvers: two
        // admission policies refuse him, and the API server names whichever it evaluated first.
        let unapproved = bob.kubectl(&["fleetroll", "approve", "agents", "-n", &ns]).await;
        assert_eq!(unapproved.code, 3, "refused: {}", unapproved.stdout);
        let no_verb = unapproved.stderr.contains("bob may not approve fleetrollouts");
        let not_named = unapproved.stderr.contains(&format!("FleetRolloutPolicy {policy} (approvers): bob may not approve"));
        assert!(no_verb || not_named, "{}", unapproved.stderr);
        let still = fleet.rollouts().get("agents").await.unwrap();
        assert!(still.spec.approvals.is_empty(), "nothing changed: {:?}", still.spec.approvals);
        assert_eq!(phase(&still), Phase::WaitingForApproval);

        let wide = kubectl(&["get", "fro", "agents", "-n", &ns, "-o", "wide"]).await.ok();
        assert!(wide.stdout.contains("CREATOR") && wide.stdout.contains(&agent.username), "{}", wide.stdout);
        let shown = kubectl(&["fleetroll", "status", "agents", "-n", &ns, "--no-follow"]).await.ok();
        assert!(shown.stdout.contains(&format!("created by {}", agent.username)), "{}", shown.stdout);
        let who = format!("by a member of group approvers (FleetRolloutPolicy {policy})");
        assert!(shown.stdout.contains(&who), "{}", shown.stdout);

        // The inbox lists it for alice (across the namespaces she can read), and for no one else.
        let inbox = alice.kubectl(&["fleetroll", "inbox", "-A"]).await.ok();
        let row = inbox.stdout.lines().find(|l| l.contains("agents")).unwrap_or_default().to_string();
        assert_eq!(row.split_whitespace().take(3).collect::<Vec<_>>(), [ns.as_str(), "agents", "1/2"], "{}", inbox.stdout);
        assert!(row.contains(&agent.username), "{}", inbox.stdout);
        for (who, kubeconfig) in [("the agent", &agent.kubeconfig), ("bob", &bob.kubeconfig)] {
            let theirs = testkit::cli::kubectl_as(kubeconfig, &["fleetroll", "inbox", "-n", &ns, "-o", "json"]).await.ok();
            assert_eq!(theirs.stdout.trim(), "[]", "{who}'s inbox: {}", theirs.stdout);
        }
        let approved = alice.kubectl(&["fleetroll", "approve", "agents", "-n", &ns]).await.ok();
        assert!(approved.stdout.contains("approved batch 1") && approved.stdout.contains("as alice"), "{}", approved.stdout);
        let done = fleet.wait_rollout("agents", "success", DEADLINE, |f| phase(f) == Phase::Succeeded).await;
        let record = &done.status.unwrap().approvals[0];
        let finished = drive(&["wait", &url, &task, "--token", &token]).await;
        assert_eq!(finished["status"], "completed", "the agent's task: {finished}");
        assert_eq!(record.approved_by.as_deref(), Some("alice"), "the approver the API server authenticated");
        // Each target was changed as the agent, by the operator impersonating it: the audit log says so.
        let targets = ["web-00", "web-01"];
        let patched = |c: &[testkit::audit::Change]| {
            targets.iter().all(|t| c.iter().any(|c| c.verb == "patch" && c.name == *t && c.code == 200))
        };
        if let Some(changes) = testkit::audit::changes(&ns, DEADLINE, patched).await {
            let patches: Vec<_> = changes.iter().filter(|c| c.verb == "patch" && c.resource == "deployments").collect();
            assert!(
                patches.iter().all(|c| c.as_user.as_deref() == Some(agent.username.as_str()) && c.user == "fleetroll-admin"),
                "a target changed other than as its rollout's creator: {patches:#?}"
            );
        }
        kube::Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(fleet.client.clone())
            .delete(&format!("{ns}-alice-view"), &Default::default())
            .await
            .unwrap();
    })
    .await;
}
