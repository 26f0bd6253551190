//! Members against a fake hub (what it lists, reads and caches), and member errors classified: no
//! cluster, only loopback.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use k8s_openapi::api::core::v1::Secret;

use kube::client::Body;
use serde_json::json;

use crate::core::exec::{ArgsEntry, Declared, EnvEntry, Kind};

use super::{
    kubeconfig::CONNECT_TIMEOUT,
    tests::{argo, capi, kubeconfig},
    *,
};

const SERVER: &str = "https://member.example.com:6443";

type Labels = BTreeMap<String, String>;

/// What the fake hub holds and what it was asked.
pub(crate) struct Hub {
    secrets: Vec<Secret>,
    /// The v1beta1 Cluster objects' labels, or the status code listing them answers.
    clusters: Result<Vec<(&'static str, Labels)>, u16>,
    /// Whether reading Secrets is forbidden.
    forbidden: bool,
    asked: Vec<String>,
}

impl Default for Hub {
    fn default() -> Self {
        Self { secrets: Vec::new(), clusters: Err(404), forbidden: false, asked: Vec::new() }
    }
}

fn status(code: u16) -> (u16, serde_json::Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "x", "message": "no", "code": code}),
    )
}

fn list(items: Vec<serde_json::Value>) -> (u16, serde_json::Value) {
    (200, json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items}))
}

/// The hub's answer to one request, from its state.
fn answer(hub: &mut Hub, method: &str, path: &str, query: &str) -> (u16, serde_json::Value) {
    hub.asked.push(format!("{method} {path}{}", if query.is_empty() { "" } else { " ?" }));
    let secrets = "/api/v1/namespaces/fleet/secrets";
    if hub.forbidden && path.starts_with(secrets) {
        return status(403);
    }
    if path == secrets {
        let labelled = query.contains("labelSelector");
        let found = hub.secrets.iter().filter(|s| {
            let argo = s
                .metadata
                .labels
                .iter()
                .flatten()
                .any(|(k, v)| k == ARGO_SECRET_TYPE_LABEL && v == "cluster");
            if labelled { argo } else { s.type_.as_deref() == Some(CAPI_SECRET_TYPE) }
        });
        return list(found.map(|s| serde_json::to_value(s).unwrap()).collect());
    }
    if let Some(name) = path.strip_prefix(&format!("{secrets}/")) {
        return match hub.secrets.iter().find(|s| s.metadata.name.as_deref() == Some(name)) {
            Some(s) => (
                200,
                json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": s.metadata}),
            ),
            None => status(404),
        };
    }
    match (path, &hub.clusters) {
        ("/apis/cluster.x-k8s.io/v1beta1/namespaces/fleet/clusters", Ok(clusters)) => list(
            clusters
                .iter()
                .map(|(name, labels)| json!({"metadata": {"name": name, "labels": labels}}))
                .collect(),
        ),
        ("/apis/cluster.x-k8s.io/v1beta1/namespaces/fleet/clusters", Err(code)) => status(*code),
        _ => status(404),
    }
}

/// A hub client answering from `hub`.
fn client_of(hub: &Arc<Mutex<Hub>>) -> Client {
    let hub = hub.clone();
    let service = tower::service_fn(move |request: http::Request<Body>| {
        let (method, path) = (request.method().to_string(), request.uri().path().to_string());
        let query = request.uri().query().unwrap_or_default().to_string();
        let (code, body) = answer(&mut hub.lock().unwrap(), &method, &path, &query);
        let response = http::Response::builder().status(code).body(Body::from(body.to_string().into_bytes()));
        async move { Ok::<_, std::convert::Infallible>(response.unwrap()) }
    });
    Client::new(service, "fleet")
}

/// Members of a fake hub holding `secrets` (also for the member watches' tests), running the plugins
/// `sh`, `sleep` and `fleetroll-no-such-plugin` with the arguments the Secrets give them.
pub(crate) fn fleet(secrets: Vec<Secret>) -> (Members, Arc<Mutex<Hub>>) {
    let plugins = ["sh", "sleep", "fleetroll-no-such-plugin"].map(String::from).to_vec();
    let env = plugins.iter().map(|p| format!("{p}=PLUGIN_SECRET,PLUGIN_PYTHON_ARGS=-c print(1)").parse());
    let env: Vec<EnvEntry> = env.collect::<Result<_, _>>().unwrap();
    let exec = ExecPolicy::new(&plugins, &as_given(&secrets), &env).unwrap();
    let hub = Arc::new(Mutex::new(Hub { secrets, ..Default::default() }));
    (Members::new(client_of(&hub), "fleet".into()).with_exec(exec), hub)
}

/// Entries allowing each Secret's exec plugin the arguments it is given: `sh -c SCRIPT`, `sleep N`.
fn as_given(secrets: &[Secret]) -> Vec<ArgsEntry> {
    let configs = secrets.iter().filter_map(|s| parse(s, None).ok().flatten()).map(|(_, c)| c);
    let entry = |config: MemberConfig| {
        let command = config.exec_command()?.to_string();
        Some(match config.exec_args() {
            [c, script] if c == "-c" => {
                let flags =
                    vec![Declared { names: vec![c.clone()], kinds: vec![Kind::Literal(script.clone())] }];
                ArgsEntry { command, path: vec![], flags }
            }
            path => ArgsEntry { command, path: path.to_vec(), flags: vec![] },
        })
    };
    configs.filter_map(entry).collect()
}

fn asked(hub: &Arc<Mutex<Hub>>) -> Vec<String> {
    std::mem::take(&mut hub.lock().unwrap().asked)
}

/// The error of a call expected to fail (a Client has no Debug, so no unwrap_err).
fn failed(result: Result<Client, MemberError>) -> MemberError {
    match result {
        Ok(_) => panic!("a client where an error was expected"),
        Err(e) => e,
    }
}

fn token(secret: &str, name: &str) -> Secret {
    argo(secret, name, SERVER, &json!({"bearerToken": "t"}))
}

#[tokio::test]
async fn list_reads_both_conventions_with_the_labels_of_their_clusters() {
    let bad = argo("bad", "bad", "http://x", &json!({}));
    let prod = capi("prod-kubeconfig", Some("prod"), &kubeconfig(SERVER, true, ""));
    let ca = capi("prod-ca", Some("prod"), "not a kubeconfig");
    let (members, hub) = fleet(vec![token("cluster-dev", "dev"), prod, ca, bad]);
    let labels = BTreeMap::from([("env".to_string(), "prod".to_string())]);
    hub.lock().unwrap().clusters = Ok(vec![("prod", labels.clone())]);
    let (found, refused) = members.list().await.unwrap();
    let names: Vec<(&str, Source)> = found.iter().map(|m| (m.name.as_str(), m.source)).collect();
    assert_eq!(names, [("dev", Source::ArgoCd), ("prod", Source::ClusterApi)]);
    assert_eq!(found[1].labels, labels);
    assert_eq!(refused.iter().map(|r| r.secret.as_str()).collect::<Vec<_>>(), ["bad"]);
    let v1beta2 = "GET /apis/cluster.x-k8s.io/v1beta2/namespaces/fleet/clusters";
    assert!(asked(&hub).iter().any(|a| a == v1beta2), "v1beta2 first, then v1beta1");

    hub.lock().unwrap().clusters = Err(404);
    let (found, _) = members.list().await.unwrap();
    assert!(found[1].labels.is_empty(), "no Cluster API: no labels");

    hub.lock().unwrap().clusters = Err(403);
    let (found, refused) = members.list().await.unwrap();
    assert_eq!(found.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), ["dev"]);
    let prod = refused.iter().find(|r| r.secret == "prod-kubeconfig").unwrap();
    assert!(prod.reason.contains("labels cannot be read from Cluster prod"), "{}", prod.reason);
}

#[tokio::test]
async fn a_client_is_reused_while_its_secret_is_unchanged() {
    tokio::time::pause();
    let (members, hub) = fleet(vec![token("cluster-dev", "dev")]);
    members.client("dev").await.unwrap();
    assert_eq!(asked(&hub).len(), 2, "two LISTs, Argo CD's and Cluster API's");
    members.client("dev").await.unwrap();
    assert!(asked(&hub).is_empty(), "just built: used as it is");
    tokio::time::advance(SECRET_RECHECK).await;
    members.client("dev").await.unwrap();
    assert_eq!(asked(&hub), ["GET /api/v1/namespaces/fleet/secrets/cluster-dev"], "a metadata GET, no LIST");
    members.client("dev").await.unwrap();
    assert!(asked(&hub).is_empty(), "seen unchanged just now");

    hub.lock().unwrap().secrets[0].metadata.resource_version = Some("2".into());
    tokio::time::advance(SECRET_RECHECK).await;
    members.client("dev").await.unwrap();
    assert_eq!(asked(&hub).len(), 3, "the changed Secret is read again");
    tokio::time::advance(SECRET_RECHECK).await;
    members.client("dev").await.unwrap();
    assert_eq!(asked(&hub).len(), 1);

    members.forget("dev");
    members.client("dev").await.unwrap();
    assert_eq!(asked(&hub).len(), 2, "forgotten: rebuilt without asking the cache");

    hub.lock().unwrap().secrets.push(token("cluster-dev-again", "dev"));
    members.list().await.unwrap();
    asked(&hub);
    let refused = failed(members.client("dev").await);
    assert!(matches!(refused, MemberError::Refused { .. }), "{refused}");
    assert!(refused.to_string().contains("cluster-dev, cluster-dev-again"), "{refused}");
    assert_eq!(asked(&hub).len(), 2, "list dropped the client of a name now given twice");
}

#[tokio::test]
async fn a_missing_or_refused_member_has_no_client() {
    let (members, _) = fleet(vec![argo("s", "dev", "http://x", &json!({}))]);
    let missing = failed(members.client("prod").await);
    assert!(matches!(missing, MemberError::NotFound { .. }), "{missing}");
    assert!(missing.to_string().contains("namespace fleet"), "{missing}");
    let refused = failed(members.client("dev").await);
    assert!(refused.to_string().contains("Secret s: server must be an https URL"), "{refused}");

    let (members, hub) = fleet(vec![]);
    hub.lock().unwrap().forbidden = true;
    let forbidden = members.list().await.unwrap_err().to_string();
    assert!(forbidden.contains("get and list on Secrets there"), "{forbidden}");
}

fn exec(command: &str, args: &[&str], hint: &str) -> Secret {
    let exec = json!({"command": command, "args": args, "env": {"PLUGIN_SECRET": "env-secret"},
        "apiVersion": "client.authentication.k8s.io/v1", "installHint": hint});
    argo("cluster-dev", "dev", SERVER, &json!({"execProviderConfig": exec}))
}

#[tokio::test]
async fn exec_plugins_run_where_their_command_exists_and_failures_show_no_output() {
    let credential =
        r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"t"}}"#;
    let (members, _) = fleet(vec![exec("sh", &["-c", &format!("printf '%s' '{credential}'")], "")]);
    members.client("dev").await.unwrap();

    let (members, _) = fleet(vec![exec("fleetroll-no-such-plugin", &[], "brew install plugin")]);
    let missing = failed(members.client("dev").await).to_string();
    assert!(missing.contains("could not be started") && missing.contains("brew install plugin"), "{missing}");

    let leaky = "echo \"$PLUGIN_SECRET\"; echo \"$PLUGIN_SECRET\" >&2; exit 3";
    let (members, _) = fleet(vec![exec("sh", &["-c", leaky], "")]);
    let failed = failed(members.client("dev").await);
    assert!(matches!(failed, MemberError::Credentials { .. }));
    let failed = failed.to_string();
    assert!(failed.contains("exit status: 3") && !failed.contains("env-secret"), "{failed}");
}

#[tokio::test]
async fn an_exec_plugin_this_installation_does_not_allow_is_never_run() {
    let marker = std::env::temp_dir().join(format!("fleetroll-exec-ran-{}", std::process::id()));
    let secret = exec("sh", &["-c", &format!("touch {}", marker.display())], "");
    let (allowed, _) = fleet(vec![secret.clone()]);
    let (default, _) = fleet(vec![secret.clone()]);
    let default = default.with_exec(ExecPolicy::default());
    let refused = failed(default.client("dev").await).to_string();
    assert!(
        refused.contains("\"sh\" of member cluster \"dev\" is not one this installation runs"),
        "{refused}"
    );
    assert!(!marker.exists(), "the plugin ran");
    // Members given no policy run no plugin.
    let (_, hub) = fleet(vec![secret]);
    let refused = failed(Members::new(client_of(&hub), "fleet".into()).client("dev").await).to_string();
    assert!(refused.contains("\"sh\" of member cluster \"dev\" is not run here"), "{refused}");
    assert!(!marker.exists(), "the plugin ran");
    // The same Secret where sh is allowed: the plugin runs (and fails, printing no credential).
    let _ = allowed.client("dev").await;
    assert!(marker.exists(), "the allowed plugin did not run: the check above proves nothing");
    let _ = std::fs::remove_file(&marker);
}

#[tokio::test]
async fn kubelogin_asked_to_send_the_operators_token_to_an_endpoint_is_never_run() {
    // A stand-in for kubelogin, allowed with the built-in arguments of kubelogin, recording each run.
    let dir = std::env::temp_dir().join(format!("fleetroll-kubelogin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plugin = dir.join("kubelogin");
    std::fs::write(&plugin, "#!/bin/sh\necho \"$@\" >> \"$(dirname \"$0\")/ran\"\nexit 1\n").unwrap();
    std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let command = plugin.display().to_string();
    let builtin = crate::core::exec::DEFAULT_ARGS.iter().find(|e| e.starts_with("kubelogin ")).unwrap();
    let entry: ArgsEntry = builtin.replacen("kubelogin", &command, 1).parse().unwrap();
    let policy = ExecPolicy::new(std::slice::from_ref(&command), &[entry], &[]).unwrap();
    let with_args = |args: &[&str]| {
        let exec = json!({"command": command, "args": args, "apiVersion": "client.authentication.k8s.io/v1"});
        argo("cluster-dev", "dev", SERVER, &json!({"execProviderConfig": exec}))
    };
    let token = "/var/run/secrets/kubernetes.io/serviceaccount/token";
    let attack = ["get-token", "--login", "workloadidentity", "--federated-token-file", token];
    let endpoint = ["get-token", "--login=workloadidentity", "--authority-host=https://collector.example/"];
    for asked in [&attack[..], &endpoint] {
        let (members, _) = fleet(vec![with_args(asked)]);
        let members = members.with_exec(policy.clone());
        let refused = failed(members.client("dev").await).to_string();
        assert!(refused.contains("of member cluster \"dev\" may not be given \"--"), "{refused}");
        assert!(!refused.contains(token) && !refused.contains("collector"), "{refused}");
        let (listed, refused) = members.list().await.unwrap();
        assert!(listed.is_empty() && refused.len() == 1, "refused when listed too: {refused:?}");
    }
    assert!(!dir.join("ran").exists(), "the plugin ran");
    let (members, _) = fleet(vec![with_args(&["get-token", "--login", "msi", "-t", "contoso"])]);
    let _ = members.with_exec(policy).client("dev").await;
    let ran = std::fs::read_to_string(dir.join("ran")).unwrap_or_default();
    assert_eq!(ran, "get-token --login msi -t contoso\n", "the allowed run: the check above proves nothing");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn an_allowed_plugin_given_a_variable_this_installation_does_not_allow_is_never_run() {
    let marker = std::env::temp_dir().join(format!("fleetroll-exec-env-ran-{}", std::process::id()));
    let with_env = |name: &str| {
        let exec = json!({"command": "sh", "args": ["-c", format!("touch {}", marker.display())],
            "env": {name: "-c print(1)"}, "apiVersion": "client.authentication.k8s.io/v1"});
        argo("cluster-dev", "dev", SERVER, &json!({"execProviderConfig": exec}))
    };
    // gcloud runs the Python this names with these arguments: the command is allowed, the variable is not.
    let (members, _) = fleet(vec![with_env("CLOUDSDK_PYTHON_ARGS")]);
    let refused = failed(members.client("dev").await).to_string();
    assert!(refused.contains("may not be given variable \"CLOUDSDK_PYTHON_ARGS\""), "{refused}");
    assert!(!marker.exists(), "the plugin ran");
    // A variable the installation allows for sh (in these tests), with that value: the plugin runs.
    let (members, _) = fleet(vec![with_env("PLUGIN_PYTHON_ARGS")]);
    let _ = members.client("dev").await;
    assert!(marker.exists(), "the allowed plugin did not run: the check above proves nothing");
    let _ = std::fs::remove_file(&marker);
}

#[tokio::test]
async fn a_plugin_that_does_not_return_holds_one_thread_not_the_reconciles() {
    let (mut members, _) = fleet(vec![exec("sleep", &["2"], "")]);
    members.build_timeout = std::time::Duration::from_millis(200);
    let first = failed(members.client("dev").await).to_string();
    assert!(first.contains("took longer than 200ms"), "{first}");
    let second = failed(members.client("dev").await).to_string();
    assert!(second.contains("has not returned yet"), "{second}");
}

/// A member client for `server` that answers nothing (no hub needed: the config is the Secret's).
fn member_client(server: &str) -> Client {
    let (_, config) = parse(&token_at(server), None).unwrap().unwrap();
    Client::try_from(config.into_config()).unwrap()
}

fn token_at(server: &str) -> Secret {
    argo("s", "dev", server, &json!({"bearerToken": "t"}))
}

#[tokio::test]
async fn a_member_that_cannot_be_reached_is_unreachable_not_unauthorized() {
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let refused = member_client(&format!("https://127.0.0.1:{port}")).apiserver_version().await.unwrap_err();
    assert!(is_unreachable(&refused) && !is_unauthorized(&refused), "{refused:?}");

    // Something that accepts and hangs up: the TLS handshake fails.
    let rude = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = rude.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((socket, _)) = rude.accept().await {
            drop(socket);
        }
    });
    let hung_up = member_client(&format!("https://127.0.0.1:{port}")).apiserver_version().await.unwrap_err();
    assert!(is_unreachable(&hung_up), "{hung_up:?}");
    assert!(describe(&hung_up).starts_with("the member cannot be reached: "), "{}", describe(&hung_up));
}

#[tokio::test]
async fn a_frozen_member_fails_within_the_connect_timeout() {
    // Accepts, then says nothing: the TLS handshake never ends.
    let frozen = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = frozen.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = frozen.accept().await {
            held.push(socket);
        }
    });
    let started = std::time::Instant::now();
    let stuck = member_client(&format!("https://127.0.0.1:{port}")).apiserver_version().await.unwrap_err();
    let took = started.elapsed();
    assert!(is_unreachable(&stuck), "{stuck:?}");
    assert!(took >= CONNECT_TIMEOUT && took < CONNECT_TIMEOUT * 2, "{took:?}");
}

fn api(code: u16, reason: &str) -> kube::Error {
    let status = kube::core::Status::failure("the member says no", reason).with_code(code);
    kube::Error::Api(status.boxed())
}

#[test]
fn answers_are_told_from_outages_and_refused_credentials() {
    assert!(is_unauthorized(&api(401, "Unauthorized")) && !is_unreachable(&api(401, "Unauthorized")));
    for code in [502, 503, 504] {
        assert!(is_unreachable(&api(code, "x")) && !is_unauthorized(&api(code, "x")), "{code}");
    }
    for code in [400, 403, 404, 409, 429, 500] {
        assert!(!is_unreachable(&api(code, "x")) && !is_unauthorized(&api(code, "x")), "{code}");
    }
    let timed_out = kube::Error::Service(Box::new(std::io::Error::from(std::io::ErrorKind::TimedOut)));
    assert!(is_unreachable(&timed_out));
    let plugin = kube::client::AuthError::AuthExecRun {
        cmd: "sh -c PLUGIN_SECRET=env-secret".into(),
        out: Box::new(std::process::Output {
            status: std::os::unix::process::ExitStatusExt::from_raw(256),
            stdout: b"stdout-secret".to_vec(),
            stderr: b"stderr-secret".to_vec(),
        }),
    };
    let refreshing = kube::Error::Service(Box::new(plugin));
    assert!(!is_unreachable(&refreshing) && !is_unauthorized(&refreshing));
    let said = describe(&refreshing);
    assert!(said.contains("exec plugin failed") && !said.contains("secret"), "{said}");
    let page = kube::core::Status::failure("<html>huge proxy page</html>", "Failed to parse error data");
    let said = describe(&kube::Error::Api(page.with_code(502).boxed()));
    assert_eq!(said, "the member answered 502 (not a Kubernetes API answer)");
    assert!(describe(&api(403, "Forbidden")).contains("403 Forbidden: the member says no"));
}
