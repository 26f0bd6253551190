//! Exec credential plugins as member Secrets ask for them, with a stand-in for kubelogin on the PATH that
//! records each run and answers with a real token of member-1. One Secret asks only what the policy
//! allows; one asks kubelogin to send the operator's ServiceAccount token to an endpoint of its choosing
//! (by arguments), one the same by variables. The operator refuses the two (ClusterRefused, naming the
//! member, the command and the flag or variable, never a value) and never runs them, and rolls the member
//! through the first; `kubectl fleetroll plan` runs none unless asked.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::support::{DEADLINE, OPERATOR_ACCOUNT, site, tidy, unique};
use fleetroll::api::Phase;
use testkit::{
    cli::kubectl_with_path,
    fleet::{Fleet, NEXT_IMAGE, READY_IMAGE, phase, with_fleet},
    members::{service_account_token, write_argo_config, write_capi_secret},
    operator::Operator,
};

const TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
const COLLECTOR: &str = "https://collector.example/";
const AKS: &str = "6dae42f8-4368-4678-94ff-3960e28e3630";
const CLIENT: &str = "0b9c2a9e-5f4e-4f0e-9d6a-3c1f2b7a8e11";

/// A directory holding `kubelogin`: it appends its arguments and the two variables that would send a
/// token elsewhere to `ran`, and prints an ExecCredential with the token in `token`.
fn stand_in(token: &str) -> PathBuf {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("target/test-bin/exec-{}", unique("kl")));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("token"), token).unwrap();
    let script = r#"#!/bin/sh
dir=$(dirname "$0")
echo "$* file=${AZURE_FEDERATED_TOKEN_FILE:-} host=${AZURE_AUTHORITY_HOST:-}" >> "$dir/ran"
printf '{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"token":"%s"}}' "$(cat "$dir/token")"
"#;
    let plugin = dir.join("kubelogin");
    std::fs::write(&plugin, script).unwrap();
    std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    dir
}

fn runs(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("ran")).unwrap_or_default().lines().map(str::to_string).collect()
}

/// kubelogin's exec configuration, with `args` and `env`.
fn kubelogin(args: &[&str], env: &[(&str, &str)]) -> Value {
    // Argo CD gives a plugin's environment as a map.
    let env: serde_json::Map<String, Value> = env.iter().map(|(n, v)| (n.to_string(), json!(v))).collect();
    json!({"execProviderConfig": {"command": "kubelogin", "args": args, "env": env,
        "apiVersion": "client.authentication.k8s.io/v1beta1"}})
}

/// The three Secrets of member-1 (all labelled `exec-test`), and member-2's, with a token.
async fn secrets(fleet: &Fleet, one: &super::support::Site, two: &super::support::Site) {
    let login = ["get-token", "--login", "workloadidentity", "--server-id", AKS];
    let allowed = [&login[..], &["--client-id", CLIENT, "--tenant-id", "ok-tenant"]].concat();
    let by_args =
        [&login[..], &["--federated-token-file", TOKEN_FILE, "--authority-host", COLLECTOR]].concat();
    let by_args = [&by_args[..], &["--tenant-id", "args-tenant"]].concat();
    let by_env = [&login[..], &["--tenant-id", "env-tenant"]].concat();
    let sent = [("AZURE_FEDERATED_TOKEN_FILE", TOKEN_FILE), ("AZURE_AUTHORITY_HOST", COLLECTOR)];
    for (name, config) in [
        ("exec-ok", kubelogin(&allowed, &[("AZURE_CLIENT_ID", CLIENT)])),
        ("exec-args", kubelogin(&by_args, &[])),
        ("exec-env", kubelogin(&by_env, &sent)),
    ] {
        write_argo_config(&fleet.client, &fleet.ns, &one.member, name, config, &[("exec-test", name)]).await;
    }
    let token = service_account_token(&two.admin, OPERATOR_ACCOUNT.0, OPERATOR_ACCOUNT.1).await;
    write_capi_secret(&fleet.client, &fleet.ns, &two.member, &token, &[("exec-test", "token")]).await;
}

fn spec(team: &str) -> Value {
    json!({
        "image": NEXT_IMAGE,
        "targets": {
            "kind": "Deployment",
            "selector": {"matchLabels": {"fleet": "web"}},
            "namespaceSelector": {"matchLabels": {"team": team}},
            "clusters": {"selector": {"matchExpressions": [{"key": "exec-test", "operator": "Exists"}]}},
        },
        "strategy": {"batchSize": 2},
    })
}

#[tokio::test]
async fn a_plugin_asked_to_send_the_operators_token_elsewhere_never_runs_and_one_asked_rightly_does() {
    if !super::support::members_up() {
        return;
    }
    let _shared = super::support::FREEZE.read().await;
    with_fleet("members-exec", 0, |fleet| async move {
        let team = unique("exec");
        let one = site("member-1", &team, &team, 2, READY_IMAGE, true).await;
        let two = site("member-2", &team, &team, 2, READY_IMAGE, true).await;
        let token = service_account_token(&one.admin, OPERATOR_ACCOUNT.0, OPERATOR_ACCOUNT.1).await;
        let dir = stand_in(&token);
        secrets(&fleet, &one, &two).await;
        let manifest = dir.join("rollout.json");
        let fr = json!({"apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
            "metadata": {"name": "exec", "namespace": fleet.ns}, "spec": spec(&team)});
        std::fs::write(&manifest, fr.to_string()).unwrap();
        let plan = ["fleetroll", "plan", "-f", manifest.to_str().unwrap(), "--fleet-namespace", &fleet.ns];

        // kubectl fleetroll plan runs no plugin on the user's machine: the member is left out, and said so.
        let preview = kubectl_with_path(&dir, None, &plan).await.ok().stdout;
        assert!(runs(&dir).is_empty(), "the plan ran a plugin: {:?}", runs(&dir));
        let left_out = "the exec plugin \"kubelogin\" of member cluster \"exec-ok\" is not run by kubectl fleetroll plan";
        assert!(preview.contains(left_out) && preview.contains("--run-exec-plugins"), "{preview}");
        assert!(preview.contains("would roll 2 targets") && !preview.contains("exec-ok/"), "{preview}");
        // Asked to, it runs the allowed one only.
        let asked = [&plan[..], &["--run-exec-plugins"]].concat();
        let preview = kubectl_with_path(&dir, None, &asked).await.ok().stdout;
        assert!(preview.contains("would roll 4 targets") && preview.contains("exec-ok/"), "{preview}");
        assert!(!runs(&dir).is_empty() && runs(&dir).iter().all(|r| r.contains("ok-tenant")), "{:?}", runs(&dir));
        assert!(preview.contains("\"exec-args\" may not be given \"--federated-token-file\""), "{preview}");

        let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
        let _op = Operator::start(&fleet.ns, &[], &[("PATH", &path)]);
        fleet.rollout("exec", spec(&team)).await;
        let done = fleet.wait_rollout("exec", "the rollout to succeed", DEADLINE, |f| phase(f) == Phase::Succeeded);
        let status = done.await.status.unwrap_or_default();
        assert_eq!(status.counts.updated, 4, "member-1 through exec-ok, member-2 through its token");
        for d in one.deployments().list(&Default::default()).await.unwrap().items {
            assert_eq!(testkit::fleet::image_of(&d), NEXT_IMAGE);
        }

        let refused = |seen: &[(String, String)]| {
            let notes: Vec<&str> = seen.iter().filter(|(r, _)| r == "ClusterRefused").map(|(_, n)| n.as_str()).collect();
            notes.iter().any(|n| n.contains("\"exec-args\" may not be given \"--federated-token-file\""))
                && notes.iter().any(|n| n.contains("\"exec-env\" may not be given variable \"AZURE_AUTHORITY_HOST\""))
        };
        let events = fleet.wait_events_until("exec", refused, DEADLINE).await;
        for (_, note) in &events {
            assert!(!note.contains(TOKEN_FILE) && !note.contains("collector"), "a value in an event: {note}");
        }
        let ran = runs(&dir);
        assert!(ran.iter().all(|r| r.contains("ok-tenant") && r.ends_with("file= host=")), "{ran:?}");
        let _ = std::fs::remove_dir_all(&dir);
        tidy(&[&one, &two]).await;
    })
    .await;
}
