//! Attacks on separation of duties: who may approve a batch, and the creator the API server records, as
//! tenants with real tokens through `kubectl`.

use super::*;

/// An approval of batch 0 of a rollout (the hashes need not match a plan: admission judges who writes it).
fn approval(approved_by: Option<&str>) -> String {
    let mut a = json!({"batch": 0, "planHash": "0123456789abcdef", "gatesHash": "0123456789abcdef"});
    if let Some(by) = approved_by {
        a["approvedBy"] = json!(by);
    }
    json!({"spec": {"approvals": [a]}}).to_string()
}

async fn approve_as(t: &Tenant, ns: &str, name: &str, approved_by: Option<&str>) -> Ran {
    t.kubectl(&["patch", "fleetrollout", name, "-n", ns, "--type=merge", "-p", &approval(approved_by)]).await
}

async fn rollout(env: &Env, ns: &str, name: &str) -> FleetRollout {
    Api::<FleetRollout>::namespaced(env.admin.clone(), ns).get(name).await.unwrap()
}

pub(super) async fn edit_tenant_approves_a_batch(env: &'static Env) -> Row {
    admin_rollout(env, &env.t1, "edit-approves").await;
    let ran = approve_as(&env.dev1, &env.t1, "edit-approves", None).await;
    let expect = Expect::Policy(format!(
        "{}: approving needs the approve verb",
        may_not(&env.dev1, "approve fleetrollouts", &env.t1)
    ));
    row(
        "approves a batch with the edit role alone (patch, no approve)",
        who(&env.dev1, "edit in t1"),
        expect,
        &ran,
    )
}

pub(super) async fn approver_approves_an_others_rollout(env: &'static Env) -> Row {
    admin_rollout(env, &env.t1, "approved-by-other").await;
    let ran = approve_as(&env.approver, &env.t1, "approved-by-other", None).await;
    let recorded = rollout(env, &env.t1, "approved-by-other").await.spec.approvals;
    let by = recorded.first().and_then(|a| a.approved_by.clone()).unwrap_or_default();
    let mut row = row(
        "baseline: an approver approves someone else's rollout, naming no one",
        who(&env.approver, "edit and approver in t1"),
        Expect::Allowed,
        &ran,
    );
    row.outcome = format!("{}; recorded approvedBy {by}", row.outcome);
    row.contained &= by == env.approver.username;
    row
}

pub(super) async fn approver_approves_its_own_rollout(env: &'static Env) -> Row {
    let created = create_as(&env.approver, &env.t1, "self-approved", deployments_spec()).await;
    assert_eq!(created.code, 0, "{}", created.stderr);
    let ran = approve_as(&env.approver, &env.t1, "self-approved", Some(&env.approver.username)).await;
    let expect = Expect::Policy(format!(
        "FleetRollout denied: {} created this rollout and may not approve it",
        env.approver.username
    ));
    row(
        "approves the rollout it created itself (an agent opening its own gate)",
        who(&env.approver, "edit and approver in t1"),
        expect,
        &ran,
    )
}

pub(super) async fn approver_forges_who_approved(env: &'static Env) -> Row {
    admin_rollout(env, &env.t1, "approved").await;
    let ran = approve_as(&env.approver, &env.t1, "approved", Some("the-cto")).await;
    let expect = Expect::Policy(format!("approvedBy must be {} or left out", env.approver.username));
    row(
        "records an approval in someone else's name",
        who(&env.approver, "edit and approver in t1"),
        expect,
        &ran,
    )
}

pub(super) async fn creator_written_into_the_manifest(env: &'static Env) -> Row {
    let mut spec = deployments_spec();
    spec["creator"] = json!({"username": "the-cto", "groups": ["approvers", "system:masters"]});
    let ran = create_as(&env.dev1, &env.t1, "forged-creator", spec).await;
    let recorded = rollout(env, &env.t1, "forged-creator").await.spec.creator.unwrap_or_default();
    let mut row = row(
        "writes someone else as spec.creator in the manifest it creates",
        who(&env.dev1, "edit in t1"),
        Expect::Allowed,
        &ran,
    );
    row.expected = "admitted, with the creator the API server authenticated".into();
    row.outcome = format!("{}; recorded creator {} in {:?}", row.outcome, recorded.username, recorded.groups);
    row.contained &= recorded.username == env.dev1.username
        && !recorded.groups.iter().any(|g| g == "approvers" || g == "system:masters");
    row
}

pub(super) async fn creator_rewritten_after_create(env: &'static Env) -> Row {
    let created = create_as(&env.dev1, &env.t1, "renamed-creator", deployments_spec()).await;
    assert_eq!(created.code, 0, "{}", created.stderr);
    let patch = json!({"spec": {"creator": {"username": "the-cto"}}}).to_string();
    let ran = env
        .dev1
        .kubectl(&["patch", "fleetrollout", "renamed-creator", "-n", &env.t1, "--type=merge", "-p", &patch])
        .await;
    // The schema's transition rule refuses it (kubectl says `is invalid: spec: Invalid value`).
    row(
        "rewrites the recorded creator of its rollout",
        who(&env.dev1, "edit in t1"),
        Expect::Schema("spec".into()),
        &ran,
    )
}

pub(super) async fn creator_erased_by_an_apply(env: &'static Env) -> Row {
    let created = create_as(&env.dev1, &env.t1, "erased-creator", deployments_spec()).await;
    assert_eq!(created.code, 0, "{}", created.stderr);
    let ran = env
        .dev1
        .kubectl(&[
            "patch",
            "fleetrollout",
            "erased-creator",
            "-n",
            &env.t1,
            "--type=json",
            "-p",
            r#"[{"op": "remove", "path": "/spec/creator"}]"#,
        ])
        .await;
    let kept = rollout(env, &env.t1, "erased-creator").await.spec.creator.map(|c| c.username);
    let mut row = row(
        "removes the recorded creator (as an apply leaving it out would)",
        who(&env.dev1, "edit in t1"),
        Expect::Allowed,
        &ran,
    );
    row.expected = "admitted, the creator kept".into();
    row.outcome = format!("{}; creator now {}", row.outcome, kept.as_deref().unwrap_or("none"));
    row.contained &= kept.as_deref() == Some(env.dev1.username.as_str());
    row
}

pub(super) async fn argo_cd_approve_action_run_by_a_patcher(env: &'static Env) -> Row {
    admin_rollout(env, &env.t1, "argo-approved").await;
    // The rollout as Argo CD shows it while it waits (the status the operator would have written).
    let mut live = serde_json::to_value(rollout(env, &env.t1, "argo-approved").await).unwrap();
    live["status"] = json!({"phase": "WaitingForApproval",
        "pendingApproval": {"batch": 0, "planHash": "0123456789abcdef", "gatesHash": "fedcba9876543210", "since": "2026-12-03T12:00:00Z"}});
    let action = testkit::cli::repo_path(
        "manifests/argocd/resource_customizations/fleetroll.dev/FleetRollout/actions/approve/action.lua",
    );
    let out = testkit::cli::gitops_judge(&["lua-action", &action], &live).await;
    let patch = out["patch"].to_string();
    let patch_as = |t: &'static Tenant| {
        let patch = patch.clone();
        async move {
            t.kubectl(&[
                "patch",
                "fleetrollout",
                "argo-approved",
                "-n",
                &env.t1,
                "--type=merge",
                "-p",
                &patch,
            ])
            .await
        }
    };
    let ran = patch_as(&env.dev1).await;
    let by_approver = patch_as(&env.approver).await;
    let expect = Expect::Policy(format!(
        "{}: approving needs the approve verb",
        may_not(&env.dev1, "approve fleetrollouts", &env.t1)
    ));
    let mut row = row(
        "runs Argo CD's approve action (its Lua, its merge patch) with patch but no approve",
        who(&env.dev1, "edit in t1"),
        expect,
        &ran,
    );
    row.outcome = format!("{}; the same patch by an approver: {}", row.outcome, outcome(&by_approver));
    row.contained &= by_approver.code == 0;
    row
}

/// The chart's admission bindings put back when dropped, whatever happened (a panic too): without them every
/// later test on the shared cluster would meet a cluster without fleetroll's admission.
struct Bindings {
    file: std::path::PathBuf,
}

impl Drop for Bindings {
    fn drop(&mut self) {
        let kubectl = testkit::testenv_dir().join("bin/kubectl");
        let kubeconfig = testkit::cluster().kubeconfig;
        let file = self.file.display().to_string();
        // `apply`, not `create`: the normal path may have put them back already.
        let _ = std::process::Command::new(kubectl)
            .args(["--kubeconfig", &kubeconfig.display().to_string(), "apply", "-f", &file])
            .output();
    }
}

/// The chart's admission bindings taken away while `during` runs (a cluster before creators were recorded),
/// then put back and waited for: the mutating policy records creators again.
async fn without_admission<F: std::future::Future<Output = ()>>(env: &Env, during: F) {
    let bindings = [
        ("validatingadmissionpolicybinding", POLICY.to_string()),
        ("mutatingadmissionpolicybinding", format!("{}-recorded-identities", testkit::tenant::RELEASE)),
    ];
    let mut saved = Vec::new();
    for (kind, name) in &bindings {
        let got = testkit::cli::kubectl(&["get", kind, name, "-o", "json"]).await.ok();
        let mut binding: Value = serde_json::from_str(&got.stdout).unwrap();
        binding["metadata"] = json!({"name": name, "labels": binding["metadata"]["labels"]});
        saved.push(binding);
    }
    let file = std::env::temp_dir().join(format!("{}-bindings.json", short(&env.t1)));
    std::fs::write(&file, json!({"apiVersion": "v1", "kind": "List", "items": saved}).to_string()).unwrap();
    let restore = Bindings { file };
    for (kind, name) in &bindings {
        testkit::cli::kubectl(&["delete", kind, name]).await.ok();
    }
    let probe = |recorded: bool| {
        let admin = env.admin.clone();
        async move {
            let fr: FleetRollout = serde_json::from_value(json!({
                "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": "adoption-probe"},
                "spec": deployments_spec(),
            }))
            .unwrap();
            let dry_run = PostParams { dry_run: true, ..Default::default() };
            let made = Api::<FleetRollout>::namespaced(admin, "default").create(&dry_run, &fr).await;
            made.is_ok_and(|fr| fr.spec.creator.is_some() == recorded)
        }
    };
    testkit::poll_until("the admission bindings to be gone", Duration::from_secs(60), || probe(false)).await;
    during.await;
    drop(restore);
    testkit::poll_until("the admission bindings to be back", Duration::from_secs(60), || probe(true)).await;
    // ...the validating one too: a dry run by a tenant who may patch no workload is refused again.
    let enforced = || async {
        let fr: FleetRollout = serde_json::from_value(json!({
            "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": "adoption-probe"},
            "spec": deployments_spec(),
        }))
        .unwrap();
        let dry_run = PostParams { dry_run: true, ..Default::default() };
        let made =
            Api::<FleetRollout>::namespaced(env.creator.client.clone(), &env.t1).create(&dry_run, &fr).await;
        matches!(made, Err(kube::Error::Api(e)) if e.message.contains(POLICY))
    };
    testkit::poll_until("the validating policy to be enforced again", Duration::from_secs(60), enforced)
        .await;
}

/// A rollout created before creators were recorded has none: the operator acts for no one until someone
/// adopts it, and admission records who did (whatever they wrote), and only if they may change its targets.
pub(super) async fn adopter_without_rights_or_in_someone_elses_name(env: &'static Env) -> Row {
    let legacy = async {
        admin_rollout(env, &env.t1, "legacy").await;
        admin_rollout(env, &env.t1, "legacy-named").await;
    };
    without_admission(env, legacy).await;
    let before = rollout(env, &env.t1, "legacy").await;
    assert!(before.spec.creator.is_none(), "created with a creator: {:?}", before.spec.creator);
    let claim =
        |who: &str| json!({"spec": {"creator": {"username": who, "groups": ["system:masters"]}}}).to_string();
    let patch = |t: &'static Tenant, name: &'static str, body: String| async move {
        t.kubectl(&["patch", "fleetrollout", name, "-n", &env.t1, "--type=merge", "-p", &body]).await
    };
    let refused = patch(&env.rollouts_only, "legacy", claim(&env.rollouts_only.username)).await;
    let adopted = env.dev1.kubectl(&["fleetroll", "adopt", "legacy", "-n", &env.t1]).await;
    let named = patch(&env.dev1, "legacy-named", claim("the-cto")).await;
    let recorded = rollout(env, &env.t1, "legacy-named").await.spec.creator;
    let again = env.approver.kubectl(&["fleetroll", "adopt", "legacy", "-n", &env.t1]).await;
    let mut row = row(
        "adopts a rollout without a recorded creator, with no rights over its targets",
        who(&env.rollouts_only, "every verb on fleetrollouts in t1, none on workloads"),
        Expect::Policy(may_not(&env.rollouts_only, "patch deployments", &env.t1)),
        &refused,
    );
    let by = recorded.as_ref().map(|c| (c.username.as_str(), c.groups.iter().any(|g| g == "system:masters")));
    let adopted_ok = adopted.code == 0 && adopted.stdout.contains(&format!("made as {}", env.dev1.username));
    let again_refused = again.code == 3 && again.stderr.contains("only a rollout without a recorded creator");
    row.outcome = format!(
        "{}; dev adopts with the plugin: exit {}; dev adopts naming the-cto: recorded {by:?}; approver adopts \
         one adopted already: exit {}",
        row.outcome, adopted.code, again.code
    );
    row.contained &=
        adopted_ok && named.code == 0 && by == Some((env.dev1.username.as_str(), false)) && again_refused;
    row
}
