//! An Argo CD cluster Secret's `config` (JSON) as a kubeconfig in memory, so that kube's own code handles
//! tokens, client certificates and exec plugins. Errors name Argo CD's fields, never their values.

use std::collections::{BTreeMap, HashMap};

use kube::config::{
    AuthInfo, Cluster, Context, ExecConfig, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};
use serde::Deserialize;

use super::kubeconfig::{check_ca, check_exec, check_identity};

/// Argo CD's `ClusterConfig`, the fields fleetroll reads (others are ignored). No Debug: it holds
/// credentials.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct ArgoConfig {
    bearer_token: Option<String>,
    username: Option<String>,
    password: Option<String>,
    tls_client_config: Option<TlsClientConfig>,
    exec_provider_config: Option<ExecProviderConfig>,
    aws_auth_config: Option<serde_json::Value>,
    proxy_url: Option<String>,
}

/// Argo CD's `TLSClientConfig`: the certificates are base64 (Go's encoding of bytes).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct TlsClientConfig {
    insecure: bool,
    server_name: Option<String>,
    ca_data: Option<String>,
    cert_data: Option<String>,
    key_data: Option<String>,
}

/// Argo CD's `ExecProviderConfig`: a kubeconfig exec plugin with its environment as a map.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct ExecProviderConfig {
    command: Option<String>,
    args: Option<Vec<String>>,
    env: Option<BTreeMap<String, String>>,
    api_version: Option<String>,
    install_hint: Option<String>,
}

/// Go's JSON treats an empty string as absent.
fn given(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

/// The kubeconfig that Argo CD's `config` describes for `server`: one cluster, user and context, all
/// named `cluster`.
pub(super) fn kubeconfig(cluster: &str, server: &str, config: &[u8]) -> Result<Kubeconfig, String> {
    let argo: ArgoConfig = serde_json::from_slice(config).map_err(|e| {
        // serde_json quotes values in some messages: say where and what kind of error, not what.
        let kind = match e.classify() {
            serde_json::error::Category::Data => "a field of the wrong type",
            _ => "invalid JSON",
        };
        format!(
            "config is not Argo CD cluster config JSON ({kind} at line {}, column {})",
            e.line(),
            e.column()
        )
    })?;
    if argo.aws_auth_config.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(
            "config.awsAuthConfig is not supported: use config.execProviderConfig with a plugin the \
                    installation allows and the operator's image has (e.g. argocd-k8s-auth aws --cluster-name NAME)"
                .into(),
        );
    }
    if given(argo.proxy_url).is_some() {
        return Err("config.proxyUrl is set: members are reached directly, proxies are not supported".into());
    }
    let tls = argo.tls_client_config.unwrap_or_default();
    let named = |name: &str| name.to_string();
    let kubeconfig = Kubeconfig {
        clusters: vec![NamedCluster {
            name: named(cluster),
            cluster: Some(cluster_of(server, &tls)?),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: named(cluster),
            auth_info: Some(user_of(
                argo.bearer_token,
                argo.username,
                argo.password,
                argo.exec_provider_config,
                tls,
            )?),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: named(cluster),
            context: Some(Context {
                cluster: named(cluster),
                user: Some(named(cluster)),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some(named(cluster)),
        ..Default::default()
    };
    Ok(kubeconfig)
}

/// The kubeconfig cluster: `insecure` is honoured as Argo CD honours it, but not beside a CA (client-go
/// refuses that pair too).
fn cluster_of(server: &str, tls: &TlsClientConfig) -> Result<Cluster, String> {
    let ca = given(tls.ca_data.clone());
    if let Some(ca) = &ca {
        check_ca("config.tlsClientConfig.caData", ca)?;
        if tls.insecure {
            return Err("config.tlsClientConfig sets both insecure and caData: keep one".into());
        }
    }
    let server_name = given(tls.server_name.clone());
    if server_name.as_ref().is_some_and(|n| n.len() > 253 || n.chars().any(char::is_control)) {
        return Err("config.tlsClientConfig.serverName is not a host name".into());
    }
    Ok(Cluster {
        server: Some(server.to_string()),
        insecure_skip_tls_verify: tls.insecure.then_some(true),
        certificate_authority_data: ca,
        tls_server_name: server_name,
        ..Default::default()
    })
}

/// The kubeconfig user: one of a bearer token, a user name and password, or an exec plugin; and
/// optionally a client certificate.
fn user_of(
    token: Option<String>,
    username: Option<String>,
    password: Option<String>,
    exec: Option<ExecProviderConfig>,
    tls: TlsClientConfig,
) -> Result<AuthInfo, String> {
    let (token, username, password) = (given(token), given(username), given(password));
    match (&token, username.is_some() || password.is_some(), &exec) {
        (Some(_), true, _) => {
            return Err("config sets both bearerToken and username/password: keep one".into());
        }
        (Some(_), _, Some(_)) | (_, true, Some(_)) => {
            return Err(
                "config sets execProviderConfig and bearerToken or username/password: keep one".into()
            );
        }
        _ => {}
    }
    if username.is_some() != password.is_some() {
        return Err("config sets only one of username and password".into());
    }
    for (value, field) in [(&token, "bearerToken"), (&username, "username"), (&password, "password")] {
        if value.as_ref().is_some_and(|v| v.chars().any(char::is_control)) {
            return Err(format!("config.{field} holds control characters or line breaks"));
        }
    }
    let (cert, key) = (given(tls.cert_data), given(tls.key_data));
    match (&cert, &key) {
        (Some(c), Some(k)) => {
            check_identity(("config.tlsClientConfig.certData", c), ("config.tlsClientConfig.keyData", k))?
        }
        (None, None) => {}
        _ => return Err("config.tlsClientConfig sets only one of certData and keyData".into()),
    }
    Ok(AuthInfo {
        token: token.map(Into::into),
        username,
        password: password.map(Into::into),
        client_certificate_data: cert,
        client_key_data: key.map(Into::into),
        exec: exec.map(exec_of).transpose()?,
        ..Default::default()
    })
}

/// The kubeconfig exec plugin: Argo CD's environment map becomes kubeconfig's list of name/value pairs.
fn exec_of(exec: ExecProviderConfig) -> Result<ExecConfig, String> {
    let env = exec.env.map(|env| {
        env.into_iter()
            .map(|(name, value)| HashMap::from([("name".to_string(), name), ("value".to_string(), value)]))
            .collect()
    });
    let config = ExecConfig {
        api_version: given(exec.api_version),
        command: given(exec.command),
        args: exec.args,
        env,
        install_hint: given(exec.install_hint),
        ..Default::default()
    };
    check_exec("config.execProviderConfig", &config)?;
    Ok(config)
}
