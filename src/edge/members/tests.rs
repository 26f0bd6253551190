//! parse() and group() on Secrets as Argo CD and Cluster API write them, and as an attacker might.

use std::collections::BTreeMap;

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::api::ObjectMeta;
use serde_json::json;

use super::{
    kubeconfig::{CONNECT_TIMEOUT, READ_TIMEOUT},
    secrets::{MAX_CONFIG_BYTES, group},
    *,
};

/// A throwaway self-signed certificate and its key, made for these tests only.
pub(super) const CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBmDCCAT2gAwIBAgIUETUomKs+QUh4St2lu3ssXtk9Y9YwCgYIKoZIzj0EAwIw
IDEeMBwGA1UEAwwVZmxlZXRyb2xsLW1lbWJlci10ZXN0MCAXDTI2MTEzMDIxMDgw
MloYDzIxMjYxMTA2MjEwODAyWjAgMR4wHAYDVQQDDBVmbGVldHJvbGwtbWVtYmVy
LXRlc3QwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAASkiuFGrvOdA247flSZ77wm
I+X9KmUNK93/PpYXBveN5Kd3L7Q1EWTpr8YVW84ATJBM8+SBlJHq8ZSYpt3c8H7h
o1MwUTAdBgNVHQ4EFgQUc08h48Sr1E/hUTfJ/gAl/CIIxEAwHwYDVR0jBBgwFoAU
c08h48Sr1E/hUTfJ/gAl/CIIxEAwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQD
AgNJADBGAiEA2WcFnISX2N1smI76O5EZTkuxlXBK5Z/fRSMqzU9Smq4CIQC45mz/
FniHWHD0JiHMUvGUpN/qZZIs1MowPfRIuDebqQ==
-----END CERTIFICATE-----
";
const KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgVkDiH1tH1dxQybAr
BvUkycHEnJjmf9HxT005p5zd75WhRANCAASkiuFGrvOdA247flSZ77wmI+X9KmUN
K93/PpYXBveN5Kd3L7Q1EWTpr8YVW84ATJBM8+SBlJHq8ZSYpt3c8H7h
-----END PRIVATE KEY-----
";
const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.member-token-never-shown";
const SERVER: &str = "https://prod.example.com:6443";

pub(super) fn b64(bytes: &[u8]) -> String {
    serde_json::to_value(ByteString(bytes.to_vec())).unwrap().as_str().unwrap().to_string()
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn data(pairs: &[(&str, &[u8])]) -> Option<BTreeMap<String, ByteString>> {
    Some(pairs.iter().map(|(k, v)| (k.to_string(), ByteString(v.to_vec()))).collect())
}

/// An Argo CD cluster Secret named `secret` giving cluster `name` at `server` with `config`.
pub(super) fn argo(secret: &str, name: &str, server: &str, config: &serde_json::Value) -> Secret {
    let config = config.to_string();
    Secret {
        metadata: ObjectMeta {
            name: Some(secret.into()),
            namespace: Some("fleet".into()),
            labels: Some(map(&[
                ("argocd.argoproj.io/secret-type", "cluster"),
                ("argocd.argoproj.io/auto-label-cluster-info", "true"),
                ("env", "prod"),
            ])),
            uid: Some(format!("uid-{secret}")),
            resource_version: Some("1".into()),
            ..Default::default()
        },
        data: data(&[
            ("name", name.as_bytes()),
            ("server", server.as_bytes()),
            ("config", config.as_bytes()),
        ]),
        ..Default::default()
    }
}

/// A Cluster API Secret named `secret`, labelled for `cluster`, holding `kubeconfig`.
pub(super) fn capi(secret: &str, cluster: Option<&str>, kubeconfig: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(secret.into()),
            namespace: Some("fleet".into()),
            labels: cluster.map(|c| map(&[("cluster.x-k8s.io/cluster-name", c)])),
            uid: Some(format!("uid-{secret}")),
            resource_version: Some("1".into()),
            ..Default::default()
        },
        type_: Some("cluster.x-k8s.io/secret".into()),
        data: data(&[("value", kubeconfig.as_bytes())]),
        ..Default::default()
    }
}

/// A kubeconfig as Cluster API writes one (client certificate), with `extra` YAML at the end.
pub(super) fn kubeconfig(server: &str, current: bool, extra: &str) -> String {
    let current = if current { "current-context: prod-admin@prod\n" } else { "" };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: prod\n  cluster:\n    server: {server}\n    \
         certificate-authority-data: {ca}\ncontexts:\n- name: prod-admin@prod\n  context:\n    cluster: prod\n    \
         user: prod-admin\n{current}users:\n- name: prod-admin\n  user:\n    client-certificate-data: {ca}\n    \
         client-key-data: {key}\n{extra}",
        ca = b64(CERT.as_bytes()),
        key = b64(KEY.as_bytes()),
    )
}

fn member(secret: &Secret) -> (Member, MemberConfig) {
    parse(secret, None).unwrap().expect("a member Secret")
}

fn refused(secret: &Secret) -> String {
    let refused = parse(secret, None).unwrap_err();
    assert_eq!(refused.secret, secret.metadata.name.clone().unwrap());
    refused.reason
}

#[test]
fn an_argo_secret_with_a_bearer_token_and_a_ca_is_a_member_with_its_labels() {
    let config = json!({"bearerToken": TOKEN, "tlsClientConfig": {"caData": b64(CERT.as_bytes())}});
    let (m, c) = member(&argo("cluster-prod", "prod", SERVER, &config));
    assert_eq!(
        m,
        Member {
            name: "prod".into(),
            labels: map(&[("env", "prod")]),
            source: Source::ArgoCd,
            secret: "cluster-prod".into(),
            server: SERVER.into(),
            tls_server_name: None,
            insecure: false,
            windows: None,
        }
    );
    // Its Secret's windows annotation is its windows; one too long to read is a marker that fails to parse.
    let mut annotated = argo("cluster-prod", "prod", SERVER, &config);
    let windows = r#"[{"schedule": "0 2 * * *", "duration": "3h"}]"#;
    annotated.metadata.annotations =
        Some([(crate::api::WINDOWS_ANNOTATION.to_string(), windows.to_string())].into());
    assert_eq!(member(&annotated).0.windows.as_deref(), Some(windows));
    let long = "x".repeat(crate::core::window::ANNOTATION_MAX + 1);
    annotated.metadata.annotations = Some([(crate::api::WINDOWS_ANNOTATION.to_string(), long)].into());
    assert_eq!(member(&annotated).0.windows.as_deref(), Some(crate::core::window::ANNOTATION_TOO_LONG));
    let config = c.config();
    assert_eq!(config.cluster_url.to_string(), format!("{SERVER}/"));
    assert_eq!(config.root_cert.as_ref().map(Vec::len), Some(1));
    assert!(config.auth_info.token.is_some() && config.auth_info.username.is_none());
    assert_eq!((config.connect_timeout, config.read_timeout), (Some(CONNECT_TIMEOUT), Some(READ_TIMEOUT)));
    assert!(!config.default_retry && config.proxy_url.is_none() && !config.accept_invalid_certs);
    let shown = format!("{:?}", (&m, &c));
    assert!(!shown.contains(TOKEN) && !shown.contains("member-token"), "{shown}");
    assert!(shown.contains("token: true"), "{shown}");
}

#[test]
fn client_certificates_and_basic_auth_are_mapped_and_never_shown() {
    let tls =
        json!({"certData": b64(CERT.as_bytes()), "keyData": b64(KEY.as_bytes()), "serverName": "api.prod"});
    let (m, c) = member(&argo("s", "prod", SERVER, &json!({"tlsClientConfig": tls})));
    assert_eq!(m.tls_server_name.as_deref(), Some("api.prod"), "the member says whom it reaches");
    assert!(
        c.config().auth_info.client_certificate_data.is_some()
            && c.config().auth_info.client_key_data.is_some()
    );
    assert_eq!(c.config().tls_server_name.as_deref(), Some("api.prod"));
    let shown = format!("{c:?}");
    assert!(!shown.contains(&b64(KEY.as_bytes())[..20]) && !shown.contains("PRIVATE"), "{shown}");

    let (_, c) = member(&argo("s", "prod", SERVER, &json!({"username": "admin", "password": "hunter2"})));
    assert_eq!(c.config().auth_info.username.as_deref(), Some("admin"));
    assert!(c.config().auth_info.password.is_some());
    assert!(!format!("{c:?}").contains("hunter2"));

    for (config, expected) in [
        (json!({"username": "admin"}), "only one of username and password"),
        (json!({"bearerToken": TOKEN, "username": "a", "password": "b"}), "both bearerToken and username"),
        (json!({"tlsClientConfig": {"certData": b64(CERT.as_bytes())}}), "only one of certData and keyData"),
        (
            json!({"tlsClientConfig": {"certData": b64(CERT.as_bytes()), "keyData": b64(b"not a key")}}),
            "not a PEM certificate and its private key",
        ),
        (json!({"bearerToken": "tok\nSECRET"}), "bearerToken holds control characters"),
    ] {
        let reason = refused(&argo("s", "prod", SERVER, &config));
        assert!(reason.contains(expected), "{config}: {reason}");
        assert!(!reason.contains(TOKEN) && !reason.contains("SECRET"), "{reason}");
    }
}

#[test]
fn an_exec_provider_becomes_a_non_interactive_exec_plugin() {
    let exec = json!({
        "command": "argocd-k8s-auth",
        "args": ["aws", "--cluster-name", "prod"],
        "env": {"AWS_REGION": "eu-west-1", "AWS_SECRET_ACCESS_KEY": "env-secret-never-shown"},
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "installHint": "install argocd-k8s-auth",
    });
    let (_, c) = member(&argo("s", "prod", SERVER, &json!({"execProviderConfig": exec})));
    let plugin = c.config().auth_info.exec.clone().unwrap();
    assert_eq!(plugin.command.as_deref(), Some("argocd-k8s-auth"));
    assert_eq!(plugin.args, Some(vec!["aws".into(), "--cluster-name".into(), "prod".into()]));
    assert_eq!(plugin.api_version.as_deref(), Some("client.authentication.k8s.io/v1beta1"));
    assert_eq!(plugin.interactive_mode, Some(kube::config::ExecInteractiveMode::Never));
    let env = plugin.env.unwrap();
    assert_eq!(env.len(), 2);
    assert_eq!(env[0].get("name").map(String::as_str), Some("AWS_REGION"));
    assert_eq!(env[0].get("value").map(String::as_str), Some("eu-west-1"));
    assert_eq!(
        (c.exec_command(), c.install_hint()),
        (Some("argocd-k8s-auth"), Some("install argocd-k8s-auth"))
    );
    let shown = format!("{c:?}");
    assert!(!shown.contains("env-secret") && shown.contains("argocd-k8s-auth"), "{shown}");

    for (exec, expected) in [
        (json!({"command": "x"}), "execProviderConfig.apiVersion must be one of"),
        (
            json!({"command": "x", "apiVersion": "client.authentication.k8s.io/v1alpha1"}),
            "apiVersion must be",
        ),
        (json!({"apiVersion": "client.authentication.k8s.io/v1"}), "execProviderConfig names no command"),
        (json!({"command": "x\u{0}y", "apiVersion": "client.authentication.k8s.io/v1"}), "NUL"),
        // The allow-list names a command: nothing may choose which file runs under that name.
        (
            json!({"command": "kubelogin", "apiVersion": "client.authentication.k8s.io/v1", "env": {"PATH": "/tmp"}}),
            "env sets \"PATH\", which would choose which program runs",
        ),
        (
            json!({"command": "kubelogin", "apiVersion": "client.authentication.k8s.io/v1",
                   "env": {"LD_PRELOAD": "/tmp/x.so"}}),
            "env sets \"LD_PRELOAD\"",
        ),
    ] {
        let reason = refused(&argo("s", "prod", SERVER, &json!({"execProviderConfig": exec})));
        assert!(reason.contains(expected), "{reason}");
    }
    let both = json!({"bearerToken": TOKEN, "execProviderConfig": exec});
    assert!(refused(&argo("s", "prod", SERVER, &both)).contains("keep one"));
}

#[test]
fn the_server_must_be_there_and_https() {
    let mut no_server = argo("s", "prod", SERVER, &json!({}));
    no_server.data.as_mut().unwrap().remove("server");
    assert_eq!(refused(&no_server), "has no key server");
    let http = refused(&argo("s", "prod", "http://prod.example.com", &json!({})));
    assert!(http.contains("must be an https URL") && http.contains("http://"), "{http}");
    let credentials = refused(&argo("s", "prod", "https://admin:pa55word@prod.example.com", &json!({})));
    assert!(
        credentials.contains("user name or password") && !credentials.contains("pa55word"),
        "{credentials}"
    );
    for (server, expected) in [
        ("prod.example.com:6443", "not a bare host"),
        ("https://", "not a URL"),
        ("https://prod.example.com/?x=1", "query"),
        ("ftp://prod.example.com", "ftp://"),
    ] {
        let reason = refused(&argo("s", "prod", server, &json!({})));
        assert!(reason.contains(expected), "{server}: {reason}");
    }
}

#[test]
fn a_bad_or_huge_config_is_refused_without_echoing_it() {
    let mut bad = argo("s", "prod", SERVER, &json!({}));
    let data = bad.data.as_mut().unwrap();
    data.insert("config".into(), ByteString(format!("{{\"bearerToken\": \"{TOKEN}").into_bytes()));
    let reason = refused(&bad);
    assert!(reason.contains("invalid JSON at line 1") && !reason.contains("member-token"), "{reason}");

    let wrong = json!({"tlsClientConfig": format!("tls-{TOKEN}")});
    let reason = refused(&argo("s", "prod", SERVER, &wrong));
    assert!(reason.contains("a field of the wrong type") && !reason.contains("member-token"), "{reason}");

    let huge = json!({"bearerToken": "x".repeat(MAX_CONFIG_BYTES)});
    assert_eq!(refused(&argo("s", "prod", SERVER, &huge)), "config is larger than 64 KiB");
    let mut huge_server = argo("s", "prod", SERVER, &json!({}));
    huge_server.data.as_mut().unwrap().insert("server".into(), ByteString(vec![b'a'; 10_000]));
    assert_eq!(refused(&huge_server), "server is larger than 2 KiB");

    let ca = |data: &str| json!({"tlsClientConfig": {"caData": data}});
    assert!(refused(&argo("s", "prod", SERVER, &ca("%%%"))).contains("caData is not base64"));
    assert!(
        refused(&argo("s", "prod", SERVER, &ca(&b64(b"nope")))).contains("caData holds no PEM certificate")
    );
    for unsupported in
        [json!({"awsAuthConfig": {"clusterName": "prod"}}), json!({"proxyUrl": "https://p:3128"})]
    {
        assert!(refused(&argo("s", "prod", SERVER, &unsupported)).contains("not supported"));
    }
}

#[test]
fn insecure_is_honoured_and_shown_but_not_beside_a_ca() {
    let (m, c) = member(&argo("s", "prod", SERVER, &json!({"tlsClientConfig": {"insecure": true}})));
    assert!(m.insecure && c.config().accept_invalid_certs);
    let both = json!({"tlsClientConfig": {"insecure": true, "caData": b64(CERT.as_bytes())}});
    assert!(refused(&argo("s", "prod", SERVER, &both)).contains("both insecure and caData"));
}

#[test]
fn a_cluster_name_is_printable_ascii_and_bounded() {
    // Argo CD names clusters after kubeconfig contexts: taken as they are.
    for good in
        ["prod", "Prod_EU", "arn:aws:eks:eu-west-1:123456789012:cluster/prod", "gke_shop_europe-west1-b_prod"]
    {
        let (m, _) = member(&argo("s", good, SERVER, &json!({})));
        assert_eq!(m.name, good);
    }
    for bad in ["prod eu", "pröd", &"a".repeat(254)] {
        let r = parse(&argo("s", bad, SERVER, &json!({})), None).unwrap_err();
        assert!(r.reason.contains("not printable ASCII without spaces"), "{bad}: {}", r.reason);
    }
    let r = parse(&argo("s", "prod eu", SERVER, &json!({})), None).unwrap_err();
    assert_eq!(r.cluster.as_deref(), Some("prod eu"));
    let escape = parse(&argo("s", "prod\u{1b}[2J", SERVER, &json!({})), None).unwrap_err();
    assert!(escape.reason.contains("control characters"), "{}", escape.reason);
    let mut nameless = argo("s", "prod", SERVER, &json!({}));
    nameless.data.as_mut().unwrap().remove("name");
    assert_eq!(
        parse(&nameless, None).unwrap_err(),
        Refused { secret: "s".into(), cluster: None, reason: "has no key name".into() }
    );
    assert_eq!(member(&argo("s", &"a".repeat(63), SERVER, &json!({}))).0.name.len(), 63);
}

#[test]
fn a_cluster_api_kubeconfig_secret_is_a_member_labelled_by_its_cluster() {
    let secret = capi("prod-kubeconfig", Some("prod"), &kubeconfig(SERVER, true, ""));
    let labels = map(&[("env", "prod"), ("region", "eu")]);
    let (m, c) = parse(&secret, Some(&labels)).unwrap().unwrap();
    assert_eq!((m.name.as_str(), m.source, m.labels), ("prod", Source::ClusterApi, labels));
    assert_eq!((m.secret.as_str(), m.server.as_str(), m.insecure), ("prod-kubeconfig", SERVER, false));
    assert!(c.config().auth_info.client_certificate_data.is_some() && c.config().root_cert.is_some());
    assert_eq!(c.config().read_timeout, Some(READ_TIMEOUT));
    assert!(!format!("{c:?}").contains("PRIVATE") && !format!("{c:?}").contains(&b64(KEY.as_bytes())[..20]));
    assert!(member(&secret).0.labels.is_empty(), "no Cluster object: no labels");
}

#[test]
fn a_kubeconfig_without_current_context_uses_its_only_context() {
    let (m, _) = member(&capi("prod-kubeconfig", Some("prod"), &kubeconfig(SERVER, false, "")));
    assert_eq!(m.server, SERVER);
    let two = kubeconfig(SERVER, false, "").replace(
        "contexts:\n",
        "contexts:\n- name: other\n  context:\n    cluster: prod\n    user: prod-admin\n",
    );
    let reason = refused(&capi("prod-kubeconfig", Some("prod"), &two));
    assert!(reason.contains("has 2 contexts and no current-context"), "{reason}");
}

#[test]
fn a_kubeconfig_may_not_name_files_providers_or_proxies_nor_be_garbage() {
    let with = |from: &str, to: &str| kubeconfig(SERVER, true, "").replacen(from, to, 1);
    for (yaml, expected) in [
        (
            with(
                "  user:\n",
                "  user:\n    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n",
            ),
            "tokenFile",
        ),
        (
            with("    server:", "    certificate-authority: /etc/ssl/ca.pem\n    server:"),
            "certificate-authority file",
        ),
        (with("  user:\n", "  user:\n    client-key: /key.pem\n"), "client-key file"),
        (with("  user:\n", "  user:\n    auth-provider:\n      name: gcp\n"), "auth-provider"),
        (with("    server:", "    proxy-url: http://proxy:3128\n    server:"), "proxy-url"),
        (kubeconfig("http://prod.example.com", true, ""), "https"),
        (with("current-context: prod-admin@prod", "current-context: other"), "has no context \"other\""),
        (format!("clusters: [\n{TOKEN}"), "YAML error at line"),
    ] {
        let reason = refused(&capi("prod-kubeconfig", Some("prod"), &yaml));
        assert!(reason.contains(expected), "{expected}: {reason}");
        assert!(!reason.contains("member-token"), "{reason}");
    }
    let huge = kubeconfig(SERVER, true, &format!("# {}\n", "x".repeat(MAX_CONFIG_BYTES)));
    assert_eq!(refused(&capi("prod-kubeconfig", Some("prod"), &huge)), "value is larger than 64 KiB");

    let exec = "users:\n- name: prod-admin\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      \
                command: kubelogin\n";
    let yaml = kubeconfig(SERVER, true, "").split("users:").next().unwrap().to_string() + exec;
    let (_, c) = member(&capi("prod-kubeconfig", Some("prod"), &yaml));
    let plugin = c.config().auth_info.exec.clone().unwrap();
    assert_eq!(plugin.interactive_mode, Some(kube::config::ExecInteractiveMode::Never));
}

#[test]
fn only_member_secrets_are_read() {
    let mut plain = argo("s", "prod", SERVER, &json!({}));
    plain.metadata.labels = None;
    let mut repository = argo("s", "prod", SERVER, &json!({}));
    repository.metadata.labels = Some(map(&[("argocd.argoproj.io/secret-type", "repository")]));
    let ca = capi("prod-ca", Some("prod"), "not a kubeconfig");
    let user = capi("prod-user-kubeconfig", Some("prod"), "not a kubeconfig");
    let mut opaque = capi("prod-kubeconfig", Some("prod"), "not a kubeconfig");
    opaque.type_ = Some("Opaque".into());
    for secret in [plain, repository, ca, user, opaque] {
        assert!(matches!(parse(&secret, None), Ok(None)), "{:?}", secret.metadata.name);
    }
    let unlabelled = parse(&capi("prod-kubeconfig", None, "x"), None).unwrap_err();
    assert!(unlabelled.reason.contains("no label cluster.x-k8s.io/cluster-name"), "{}", unlabelled.reason);
}

#[test]
fn a_name_given_by_two_secrets_is_refused_naming_both() {
    let found = |secret: &str, name: &str| {
        parse(&argo(secret, name, SERVER, &json!({})), None).map(|m| m.map(|(m, _)| (m, ())))
    };
    let broken = parse(&argo("z-stage-broken", "stage", "http://x", &json!({})), None).map(|_| None);
    let parsed = vec![
        found("b-prod", "prod"),
        found("a-prod", "prod"),
        found("dev", "dev"),
        found("stage", "stage"),
        broken,
    ];
    let (members, refused) = group(parsed);
    assert_eq!(members.iter().map(|(m, _)| m.name.as_str()).collect::<Vec<_>>(), ["dev"]);
    let secrets: Vec<&str> = refused.iter().map(|r| r.secret.as_str()).collect();
    assert_eq!(secrets, ["a-prod", "b-prod", "stage", "z-stage-broken"]);
    assert!(refused[0].reason.contains("a-prod, b-prod") && refused[1].reason.contains("a-prod, b-prod"));
    assert_eq!(refused[0].cluster.as_deref(), Some("prod"));
    assert!(refused[2].reason.contains("stage, z-stage-broken"), "{}", refused[2].reason);
    assert!(refused[3].reason.contains("https"), "the broken Secret keeps its own reason");
    assert_eq!(refused[0].to_string(), format!("Secret a-prod: {}", refused[0].reason));
}

proptest::proptest! {
    /// Whatever a Secret holds, parse answers (a member, nothing or a refusal) and never panics.
    #[test]
    fn parse_never_panics(
        name in "[a-z0-9-]{0,70}|\\PC{0,20}",
        server in "https://[a-z0-9.:-]{0,30}(/[a-z]{0,5})?|\\PC{0,40}",
        config in proptest::collection::vec(proptest::num::u8::ANY, 0..200),
        json in "\\{\"(bearerToken|tlsClientConfig|execProviderConfig|username)\": (\"\\PC{0,9}\"|\\{\\}|null|\\[1\\])\\}",
        yaml in "\\PC{0,200}",
    ) {
        let _ = parse(&argo("s", &name, &server, &serde_json::Value::Null), None);
        let mut raw = argo("s", &name, &server, &json!({}));
        raw.data.as_mut().unwrap().insert("config".into(), ByteString(config.clone()));
        let _ = parse(&raw, None);
        let mut typed = argo("s", &name, &server, &json!({}));
        typed.data.as_mut().unwrap().insert("config".into(), ByteString(json.into_bytes()));
        let _ = parse(&typed, None);
        let _ = parse(&capi("prod-kubeconfig", Some("prod"), &yaml), None);
        let _ = parse(&capi("prod-kubeconfig", Some("prod"), &kubeconfig(&server, false, &yaml)), None);
    }
}
