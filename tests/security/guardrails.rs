//! Attacks on the platform's guardrails (FleetRolloutPolicy): an agent's rollouts carry what the platform
//! requires, whatever the agent writes, and the operator holds a plan that breaks a policy admission could
//! not judge. Each attack governs only the ServiceAccounts of a namespace of its own, so the other attacks
//! run as they would without it.

use fleetroll::{api::FleetRolloutPolicy, core::plan::gates_of};
use testkit::people::Person;

use super::*;

/// The guardrails admission policy's name.
const GUARDRAILS: &str = "fleetroll-guardrails";

/// A namespace of the attack's own, an agent (a ServiceAccount with edit there) and a policy governing the
/// namespace's ServiceAccounts (requiring an approval or capping batches), enforced by the time this
/// returns.
pub(super) async fn governed(env: &'static Env, prefix: &str, rules: Value) -> (String, Tenant, String) {
    let ns = env.scratch_namespace(prefix, &[]).await;
    let agent = Tenant::create(&env.admin, &ns, "agent", &[Grant::cluster_role("edit")]).await;
    let name = govern_namespace(env, &ns, rules).await;
    // The admission plugin sees a new parameter from its informer: wait until it refuses (in a dry run) a
    // rollout with no approval and batches of 100000 (each attack's policy caps one or the other).
    let mut unbound = deployments_spec();
    unbound["strategy"] = json!({"batchSize": 100000});
    let bare = manifest(&ns, "probe", unbound);
    testkit::poll_until("the FleetRolloutPolicy to be enforced", Duration::from_secs(60), || async {
        let ran = agent.kubectl(&["create", "--dry-run=server", "-f", &bare]).await;
        ran.code != 0 && ran.stderr.contains(GUARDRAILS)
    })
    .await;
    (ns, agent, name)
}

/// Writes the policy governing the ServiceAccounts of `ns` with `rules`; returns its name.
async fn govern_namespace(env: &Env, ns: &str, rules: Value) -> String {
    let name = policy_name(ns);
    let mut spec = json!({"subjects": {"groups": [format!("system:serviceaccounts:{ns}")]}});
    merge(&mut spec, &rules);
    let policy: FleetRolloutPolicy = serde_json::from_value(json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRolloutPolicy", "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    let policies: Api<FleetRolloutPolicy> = Api::all(env.admin.clone());
    policies.create(&PostParams::default(), &policy).await.unwrap();
    name
}

/// The policy an attack makes for its namespace `ns` (deleted with the namespace at the end).
pub(super) fn policy_name(ns: &str) -> String {
    format!("{ns}-agents")
}

/// A refusal by the guardrails policy naming `policy` and `rule`.
fn refused_by(ran: &Ran, policy: &str, rule: &str) -> bool {
    ran.code != 0
        && ran.stderr.contains(&format!("ValidatingAdmissionPolicy '{GUARDRAILS}'"))
        && ran.stderr.contains(&format!("FleetRollout denied by FleetRolloutPolicy {policy} ({rule})"))
}

fn judged(attack: &str, who: String, expected: &str, ran: &Ran, contained: bool) -> Row {
    Row { attack: attack.into(), who, expected: expected.into(), outcome: outcome(ran), contained }
}

pub(super) async fn agent_omits_the_approval_a_policy_requires(env: &'static Env) -> Row {
    let rules = json!({"approval": "FirstBatch", "maxBatchSize": 2});
    let (ns, agent, policy) = governed(env, "sec-guard", rules).await;
    let ran = create_as(&agent, &ns, "unapproved", deployments_spec()).await;
    let mut spec = deployments_spec();
    spec["strategy"] = json!({"approval": "FirstBatch", "batchSize": 2});
    let compliant = create_as(&agent, &ns, "compliant", spec).await;
    let mut row = judged(
        "starts a rollout without the first-batch approval its platform's policy requires",
        who(&agent, "edit; governed by a policy"),
        "denied, naming the policy and the rule; the same with the approval admitted",
        &ran,
        refused_by(&ran, &policy, "approval") && compliant.code == 0,
    );
    row.outcome = format!("{}; with it: {}", row.outcome, outcome(&compliant));
    row
}

pub(super) async fn agent_exceeds_a_policys_batch_cap(env: &'static Env) -> Row {
    let rules = json!({"approval": "FirstBatch", "maxBatchSize": 2});
    let (ns, agent, policy) = governed(env, "sec-cap", rules).await;
    let mut spec = deployments_spec();
    spec["strategy"] = json!({"approval": "FirstBatch", "steps": [1], "batchSize": 50});
    let ran = create_as(&agent, &ns, "wide", spec.clone()).await;
    // A person the policy does not govern writes the very same spec: admitted.
    let person = Person::x509(&env.admin, "carol", &["developers"]).await;
    testkit::tenant::bind(&env.admin, &ns, "carol", "User", "carol", "edit").await;
    person.wait_allowed(&env.admin, &ns, "fleetroll.dev", "fleetrollouts", "create").await;
    let theirs = person.kubectl(&["create", "-f", &manifest(&ns, "wide-by-a-person", spec)]).await;
    let mut row = judged(
        "starts a rollout of 50 targets a batch under a policy capping batches at 2",
        who(&agent, "edit; governed by a policy"),
        "denied, naming the policy; a person outside the policy writing the same spec is admitted",
        &ran,
        refused_by(&ran, &policy, "maxBatchSize") && theirs.code == 0,
    );
    row.outcome = format!("{}; by carol (x509, not governed): {}", row.outcome, outcome(&theirs));
    row
}

pub(super) async fn approver_outside_a_policys_approvers(env: &'static Env) -> Row {
    let rules = json!({"approval": "FirstBatch", "approvers": {"groups": ["release-managers"]}});
    let (ns, agent, policy) = governed(env, "sec-appr", rules).await;
    let mut spec = deployments_spec();
    spec["strategy"] = json!({"approval": "FirstBatch"});
    create_as(&agent, &ns, "gated", spec).await.ok();
    // dave holds the approve verb, but is not one of the policy's approvers.
    let dave = Person::x509(&env.admin, "dave", &["developers"]).await;
    testkit::tenant::bind(&env.admin, &ns, "dave", "User", "dave", APPROVER_ROLE).await;
    dave.wait_allowed(&env.admin, &ns, "fleetroll.dev", "fleetrollouts", "approve").await;
    let approval = json!({"spec": {"approvals": [{"batch": 0, "planHash": "0123456789abcdef"}]}}).to_string();
    let ran =
        dave.kubectl(&["patch", "fleetrollout", "gated", "-n", &ns, "--type=merge", "-p", &approval]).await;
    judged(
        "approves an agent's rollout with the approve verb, outside the approvers the policy names",
        "dave (x509 user, approver role)".into(),
        "denied, naming the policy and its approvers",
        &ran,
        refused_by(&ran, &policy, "approvers")
            && ran.stderr.contains("its approvers are the groups release-managers"),
    )
}

pub(super) async fn a_plan_beyond_a_policys_caps_is_held(env: &'static Env) -> Row {
    let rules = json!({"maxBatchSize": 2, "maxTargets": 3});
    let (ns, agent, policy) = governed(env, "sec-held", rules).await;
    let fleet = Fleet { client: env.admin.clone(), ns: ns.clone(), tenants: vec![] };
    fleet.deployments(&ns, 4, READY_IMAGE).await;
    let _op = Operator::start(&ns, &[], &[]);
    // A percentage admission cannot judge: 100% of four targets.
    let spec = json!({"image": testkit::fleet::NEXT_IMAGE, "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}},
                      "strategy": {"batchSize": "100%"}});
    let ran = create_as(&agent, &ns, "everything", spec).await;
    let held = |f: &FleetRollout| f.status.as_ref().is_some_and(|s| s.policy_hold.is_some());
    let fr = fleet.wait_rollout("everything", "the policy to hold it", Duration::from_secs(120), held).await;
    let s = fr.status.clone().unwrap();
    let hold = s.policy_hold.clone().unwrap();
    let deployments = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(env.admin.clone(), &ns);
    let listed = deployments.list(&Default::default()).await.unwrap().items;
    let untouched = listed.len() == 4 && listed.iter().all(|d| testkit::fleet::image_of(d) == READY_IMAGE);
    Row {
        attack: "starts a rollout whose percentage batch reaches every target, past the policy's caps".into(),
        who: who(&agent, "edit; governed by a policy"),
        expected: "admitted, then held before its first batch naming the policy and rule; nothing changes"
            .into(),
        outcome: format!(
            "{}; {}/{}: {}; targets untouched: {untouched}",
            outcome(&ran),
            s.phase,
            s.reason.unwrap_or_default(),
            s.message.unwrap_or_default()
        ),
        contained: ran.code == 0
            && s.phase == Phase::Paused
            && hold.policy == policy
            && hold.rule == "maxTargets"
            && untouched,
    }
}

pub(super) async fn governed_agent_loosens_someone_elses_rollout(env: &'static Env) -> Row {
    let (ns, agent, policy) = governed(env, "sec-edit", json!({"approval": "FirstBatch"})).await;
    // A person's rollout (the cluster admin's), with the approval the policy asks of agents.
    let mut spec = deployments_spec();
    spec["strategy"] = json!({"approval": "FirstBatch"});
    let fr: FleetRollout = serde_json::from_value(json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": "persons"}, "spec": spec,
    }))
    .unwrap();
    Api::<FleetRollout>::namespaced(env.admin.clone(), &ns)
        .create(&PostParams::default(), &fr)
        .await
        .unwrap();
    let loosen = json!({"spec": {"strategy": {"approval": "None"}}}).to_string();
    let ran =
        agent.kubectl(&["patch", "fleetrollout", "persons", "-n", &ns, "--type=merge", "-p", &loosen]).await;
    judged(
        "drops the approval of a rollout someone else created (its creator is not governed; the agent is)",
        who(&agent, "edit; governed by a policy"),
        "denied, naming the policy: a policy governs the writes of its subjects too",
        &ran,
        refused_by(&ran, &policy, "approval"),
    )
}

pub(super) async fn governed_agent_repoints_an_ungoverned_rollout(env: &'static Env) -> Row {
    let rules = json!({"approval": "FirstBatch", "maxBatchSize": 2, "requireAnalysis": true});
    let (ns, agent, policy) = governed(env, "sec-repoint", rules).await;
    // A person's rollout (the cluster admin's), which no policy governs: no approval, no analysis.
    let fr: FleetRollout = serde_json::from_value(json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": "persons"},
        "spec": deployments_spec(),
    }))
    .unwrap();
    Api::<FleetRollout>::namespaced(env.admin.clone(), &ns)
        .create(&PostParams::default(), &fr)
        .await
        .unwrap();
    // The agent gives it an image of its choosing, all at once: no rule it newly breaks, yet the operator
    // would plan it by the person's policies (none).
    let repoint = json!({"spec": {"image": "registry.example/evil:1", "strategy": {"batchSize": "100%"}}});
    let ran = agent
        .kubectl(&["patch", "fleetrollout", "persons", "-n", &ns, "--type=merge", "-p", &repoint.to_string()])
        .await;
    // Pausing it stays allowed.
    let pause = json!({"spec": {"paused": true}}).to_string();
    let paused =
        agent.kubectl(&["patch", "fleetrollout", "persons", "-n", &ns, "--type=merge", "-p", &pause]).await;
    let mut row = judged(
        "changes the image and batch size of a rollout someone ungoverned created (no rule is newly broken)",
        who(&agent, "edit; governed by a policy"),
        "denied, naming the policy: what is planned of another's rollout is not the governed agent's to change; pausing it is",
        &ran,
        refused_by(&ran, &policy, "writers") && paused.code == 0,
    );
    row.outcome = format!("{}; pausing it: exit {}", row.outcome, paused.code);
    row
}

pub(super) async fn approval_given_before_a_policy_named_approvers(env: &'static Env) -> Row {
    let ns = env.scratch_namespace("sec-early", &[]).await;
    let agent = Tenant::create(&env.admin, &ns, "agent", &[Grant::cluster_role("edit")]).await;
    let fleet = Fleet { client: env.admin.clone(), ns: ns.clone(), tenants: vec![] };
    fleet.deployments(&ns, 2, READY_IMAGE).await;
    let _op = Operator::start(&ns, &[], &[]);
    // The agent's rollout, gated by an approval of its first batch and paused, so the approval waits.
    let targets = json!({"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}}});
    let gated = |paused: bool| {
        json!({"image": testkit::fleet::NEXT_IMAGE, "targets": targets, "paused": paused,
                                      "strategy": {"approval": "FirstBatch", "batchSize": 1}})
    };
    create_as(&agent, &ns, "early", gated(true)).await.ok();
    let fr = fleet.wait_rollout("early", "a plan", Duration::from_secs(120), testkit::fleet::has_plan).await;
    let (plan, gates) = (fr.status.unwrap().plan.unwrap().hash, fleet.gates("early").await);
    // erin holds the approve verb and approves it while no policy names approvers: admitted.
    let erin = Person::x509(&env.admin, "erin", &["developers"]).await;
    testkit::tenant::bind(&env.admin, &ns, "erin", "User", "erin", APPROVER_ROLE).await;
    erin.wait_allowed(&env.admin, &ns, "fleetroll.dev", "fleetrollouts", "approve").await;
    let approval = json!({"spec": {"approvals": [{"batch": 0, "planHash": plan, "gatesHash": gates}]}});
    let ran = erin
        .kubectl(&["patch", "fleetrollout", "early", "-n", &ns, "--type=merge", "-p", &approval.to_string()])
        .await;
    // Then the platform names who approves its agents' rollouts, and the operator sees it (a rollout the
    // agent starts now waits for them).
    let policy = govern_namespace(env, &ns, json!({"approvers": {"groups": ["release-managers"]}})).await;
    create_as(&agent, &ns, "probe", gated(false)).await.ok();
    let named = |f: &FleetRollout| {
        let pending = f.status.as_ref().and_then(|s| s.pending_approval.as_ref());
        pending.is_some_and(|p| p.approvers.iter().any(|a| a.policy == policy))
    };
    fleet.wait_rollout("probe", "the approvers named", Duration::from_secs(120), named).await;
    // The agent lets its rollout go: erin's approval is not the approvers', so the batch waits for theirs.
    let resume = json!({"spec": {"paused": false}}).to_string();
    agent.kubectl(&["patch", "fleetrollout", "early", "-n", &ns, "--type=merge", "-p", &resume]).await.ok();
    let decided = |f: &FleetRollout| named(f) || f.status.as_ref().is_some_and(|s| !s.batches.is_empty());
    let fr = fleet.wait_rollout("early", "the approval judged", Duration::from_secs(120), decided).await;
    let s = fr.status.clone().unwrap();
    let deployments = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(env.admin.clone(), &ns);
    let listed = deployments.list(&Default::default()).await.unwrap().items;
    let untouched = listed.len() == 2 && listed.iter().all(|d| testkit::fleet::image_of(d) == READY_IMAGE);
    let pending = s.pending_approval.clone();
    let rebound = pending.as_ref().is_some_and(|p| p.gates_hash != gates && p.gates_hash == gates_of(&fr));
    // One of the approvers the policy names approves what the batch now waits for: on it goes.
    let rita = Person::x509(&env.admin, "rita", &["release-managers"]).await;
    testkit::tenant::bind(&env.admin, &ns, "release-managers", "Group", "release-managers", APPROVER_ROLE)
        .await;
    rita.wait_allowed(&env.admin, &ns, "fleetroll.dev", "fleetrollouts", "approve").await;
    let theirs = pending.map(|p| json!({"batch": 0, "planHash": p.plan_hash, "gatesHash": p.gates_hash}));
    let approval = json!({"spec": {"approvals": [theirs]}}).to_string();
    let approved =
        rita.kubectl(&["patch", "fleetrollout", "early", "-n", &ns, "--type=merge", "-p", &approval]).await;
    let started = |f: &FleetRollout| f.status.as_ref().is_some_and(|s| !s.batches.is_empty());
    if approved.code == 0 {
        fleet
            .wait_rollout("early", "rita's approval to start batch 1", Duration::from_secs(120), started)
            .await;
    }
    Row {
        attack: "approves an agent's paused rollout before the platform names its approvers, then lets it go"
            .into(),
        who: "erin (x509 user, approver role) and the agent (edit)".into(),
        expected:
            "the approval admitted; once the policy names approvers, the batch waits for theirs (its gates \
                   bind a nonce drawn then); nothing changes until rita (release-managers) approves"
                .into(),
        outcome: format!(
            "{}; {}/{}: {}; targets untouched: {untouched}; rita's approval: {}",
            outcome(&ran),
            s.phase,
            s.reason.unwrap_or_default(),
            s.message.unwrap_or_default(),
            outcome(&approved)
        ),
        contained: ran.code == 0
            && s.phase == Phase::WaitingForApproval
            && rebound
            && untouched
            && approved.code == 0,
    }
}

/// The two subjects platforms name most: every ServiceAccount, and a group of people (`agents`). Exclusive:
/// the policy governs every ServiceAccount in the cluster while it runs (with a cap no other attack reaches),
/// and is deleted before the next attack.
pub(super) async fn every_serviceaccount_and_the_group_agents_are_governed(env: &'static Env) -> Row {
    let ns = env.scratch_namespace("sec-every", &[]).await;
    let agent = Tenant::create(&env.admin, &ns, "agent", &[Grant::cluster_role("edit")]).await;
    let (otto, carol) = tokio::join!(
        Person::x509(&env.admin, "otto", &["agents"]),
        Person::x509(&env.admin, "carol", &["developers"]),
    );
    for who in ["otto", "carol"] {
        testkit::tenant::bind(&env.admin, &ns, who, "User", who, "edit").await;
    }
    otto.wait_allowed(&env.admin, &ns, "fleetroll.dev", "fleetrollouts", "create").await;
    carol.wait_allowed(&env.admin, &ns, "fleetroll.dev", "fleetrollouts", "create").await;
    let name = policy_name(&ns);
    let policy: FleetRolloutPolicy = serde_json::from_value(json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRolloutPolicy", "metadata": {"name": name},
        "spec": {"subjects": {"groups": ["system:serviceaccounts", "agents"]}, "maxBatchSize": 50000},
    }))
    .unwrap();
    let policies: Api<FleetRolloutPolicy> = Api::all(env.admin.clone());
    policies.create(&PostParams::default(), &policy).await.unwrap();
    let mut wide = deployments_spec();
    wide["strategy"] = json!({"batchSize": 60000});
    let probe = manifest(&ns, "probe", wide.clone());
    testkit::poll_until("the FleetRolloutPolicy to be enforced", Duration::from_secs(60), || async {
        let ran = agent.kubectl(&["create", "--dry-run=server", "-f", &probe]).await;
        ran.code != 0 && ran.stderr.contains(&name)
    })
    .await;
    let by_agent = create_as(&agent, &ns, "by-agent", wide.clone()).await;
    let by_otto = otto.kubectl(&["create", "-f", &manifest(&ns, "by-otto", wide.clone())]).await;
    let by_carol = carol.kubectl(&["create", "-f", &manifest(&ns, "by-carol", wide)]).await;
    policies.delete(&name, &DeleteParams::default()).await.unwrap();
    let mut row = judged(
        "a ServiceAccount, and a person in group agents, start rollouts of 60000 targets a batch under a \
         policy capping every ServiceAccount and the group agents at 50000",
        format!("{} and otto (x509, group agents)", who(&agent, "edit")),
        "both denied, naming the policy; carol (x509, group developers) writing the same spec is admitted",
        &by_agent,
        refused_by(&by_agent, &name, "maxBatchSize")
            && refused_by(&by_otto, &name, "maxBatchSize")
            && by_carol.code == 0,
    );
    row.outcome = format!("{}; otto: {}; carol: {}", row.outcome, outcome(&by_otto), outcome(&by_carol));
    row
}

pub(super) async fn override_of_a_tenants_window_lifts_the_platforms_freeze(env: &'static Env) -> Row {
    let freeze =
        json!({"name": "platform-freeze", "kind": "Deny", "schedule": "* * * * *", "duration": "1h"});
    let (ns, agent, policy) =
        governed(env, "sec-freeze", json!({"maxBatchSize": 2, "windows": [freeze]})).await;
    let fleet = Fleet { client: env.admin.clone(), ns: ns.clone(), tenants: vec![] };
    fleet.deployments(&ns, 2, READY_IMAGE).await;
    let _op = Operator::start(&ns, &[], &[]);
    // The tenant's own window is one the schema admits and no day matches: unreadable, named first.
    let mut spec = deployments_spec();
    spec["strategy"] =
        json!({"batchSize": 2, "windows": [{"kind": "Allow", "schedule": "0 0 30 2 *", "duration": "1h"}]});
    create_as(&agent, &ns, "frozen", spec).await.ok();
    let held = |f: &FleetRollout| f.status.as_ref().is_some_and(|s| s.window_hold.is_some());
    let fr = fleet.wait_rollout("frozen", "a window to hold it", Duration::from_secs(120), held).await;
    let hold = fr.status.and_then(|s| s.window_hold).unwrap();
    // erin may approve (and so override windows): the policy names no approvers.
    let erin = Person::x509(&env.admin, "erin", &["developers"]).await;
    testkit::tenant::bind(&env.admin, &ns, "erin", "User", "erin", APPROVER_ROLE).await;
    erin.wait_allowed(&env.admin, &ns, "fleetroll.dev", "fleetrollouts", "approve").await;
    let ran = erin.kubectl(&["fleetroll", "approve", "frozen", "-n", &ns, "--override-windows"]).await;
    let recorded = |f: &FleetRollout| f.status.as_ref().is_some_and(|s| !s.window_overrides.is_empty());
    let fr = fleet.wait_rollout("frozen", "the override", Duration::from_secs(120), recorded).await;
    let overrode = fr.status.map(|s| s.window_overrides[0].overrode.clone()).unwrap_or_default();
    let freeze_named =
        |text: &str| text.contains(&format!("deny window platform-freeze of FleetRolloutPolicy {policy}"));
    Row {
        attack: "overrides the hold of a rollout whose own windows cannot be read, while a platform freeze holds it too"
            .into(),
        who: "erin (x509 user, approver role; the policy names no approvers)".into(),
        expected: "the hold names the freeze as well, and the override lifts it only as recorded: its record names the freeze"
            .into(),
        outcome: format!("hold: invalid {:?}, also {:?}; {}; overrode: {overrode}", hold.invalid, hold.also, outcome(&ran)),
        contained: ran.code == 0
            && hold.invalid.is_some()
            && hold.also.iter().any(|a| freeze_named(a))
            && freeze_named(&overrode),
    }
}
