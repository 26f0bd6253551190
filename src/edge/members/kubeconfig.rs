//! A member's kubeconfig turned into a kube `Config`, through kube's own loader (tokens, client
//! certificates and exec plugins all work as kube implements them). A Secret is hostile input, so only
//! what it can ask for safely is accepted: no file paths (they would read the operator's own files, its
//! ServiceAccount token among them), no auth-provider, no proxy, https only.

use std::time::Duration;

use k8s_openapi::ByteString;
use kube::config::{AuthInfo, Cluster, ExecConfig, ExecInteractiveMode, Kubeconfig, KubeconfigError};

use crate::core::exec::is_loader_variable;
/// A name from the Secret, cut short for messages.
pub(super) use crate::core::exec::shown;

/// How long connecting to a member (TCP and TLS) may take: an unreachable member must not hold a
/// reconcile, which has 60 s in all.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a member may take to answer once asked, and to take a request: a frozen member fails a
/// request within this. It also ends a watch that stays silent this long, so these clients are for
/// requests, not watches.
pub const READ_TIMEOUT: Duration = Duration::from_secs(15);

/// The exec credential versions client-go accepts.
const EXEC_API_VERSIONS: [&str; 2] =
    ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"];

/// The longest server URL accepted.
const MAX_SERVER_BYTES: usize = 2048;

/// How to reach one member: a kube `Config` with the member timeouts, no proxy and no automatic retry.
/// Its Debug output says how it authenticates, never with what.
#[derive(Clone)]
pub struct MemberConfig {
    config: kube::Config,
}

impl MemberConfig {
    /// The kube configuration, for `Client::try_from` (which runs an exec plugin, so not on an async
    /// worker thread).
    pub fn config(&self) -> &kube::Config {
        &self.config
    }

    /// The kube configuration, owned.
    pub fn into_config(self) -> kube::Config {
        self.config
    }

    /// The exec plugin's command, when the member's credentials come from one.
    pub fn exec_command(&self) -> Option<&str> {
        self.config.auth_info.exec.as_ref().and_then(|e| e.command.as_deref())
    }

    /// The exec plugin's arguments.
    pub fn exec_args(&self) -> &[String] {
        self.config.auth_info.exec.as_ref().and_then(|e| e.args.as_deref()).unwrap_or_default()
    }

    /// The environment variables the exec plugin is given: each name, with its value where given (kube
    /// sets only those with both).
    pub fn exec_env(&self) -> impl Iterator<Item = (&str, Option<&str>)> {
        let env = self.config.auth_info.exec.as_ref().and_then(|e| e.env.as_ref());
        env.into_iter()
            .flatten()
            .filter_map(|e| Some((e.get("name")?.as_str(), e.get("value").map(String::as_str))))
    }

    /// What the Secret says to install when the exec plugin's command is missing.
    pub fn install_hint(&self) -> Option<&str> {
        self.config.auth_info.exec.as_ref().and_then(|e| e.install_hint.as_deref())
    }
}

impl std::fmt::Debug for MemberConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (c, user) = (&self.config, &self.config.auth_info);
        f.debug_struct("MemberConfig")
            .field("server", &c.cluster_url.to_string())
            .field("ca", &c.root_cert.is_some())
            .field("insecure", &c.accept_invalid_certs)
            .field("tls_server_name", &c.tls_server_name)
            .field("token", &user.token.is_some())
            .field("basic", &user.username.is_some())
            .field("client_certificate", &user.client_certificate_data.is_some())
            .field("exec", &self.exec_command())
            .finish()
    }
}

/// Reads a kubeconfig YAML document. Errors say where, never what: the text holds credentials.
pub(super) fn from_yaml(text: &str) -> Result<Kubeconfig, String> {
    Kubeconfig::from_yaml(text).map_err(|e| match &e {
        KubeconfigError::Parse(p) => match p.location() {
            Some(at) => {
                format!("is not a kubeconfig (YAML error at line {}, column {})", at.line(), at.column())
            }
            None => "is not a kubeconfig (invalid YAML)".into(),
        },
        _ => "is not a kubeconfig".into(),
    })
}

/// The configuration of `kubeconfig`'s current context, or of its only context when none is current;
/// and the server it names. Errors name fields, never values.
pub(super) fn to_config(mut kubeconfig: Kubeconfig) -> Result<(MemberConfig, String), String> {
    let context_name = match kubeconfig.current_context.as_deref().filter(|c| !c.is_empty()) {
        Some(name) => name.to_string(),
        None => match kubeconfig.contexts.as_slice() {
            [only] => only.name.clone(),
            [] => return Err("has no context".into()),
            many => {
                return Err(format!(
                    "has {} contexts and no current-context: set current-context to the one to use",
                    many.len()
                ));
            }
        },
    };
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.clone())
        .ok_or_else(|| format!("has no context {}", shown(&context_name)))?;
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| {
            format!("has no cluster {} (of context {})", shown(&context.cluster), shown(&context_name))
        })?;
    let server = check_cluster(cluster)?;
    if let Some(user_name) = &context.user {
        let user = kubeconfig
            .auth_infos
            .iter_mut()
            .find(|u| &u.name == user_name)
            .and_then(|u| u.auth_info.as_mut())
            .ok_or_else(|| {
                format!("has no user {} (of context {})", shown(user_name), shown(&context_name))
            })?;
        check_user(user)?;
    }
    kubeconfig.current_context = Some(context_name);
    let config = kube::Config::try_from(kubeconfig).map_err(|e| explain(&e))?;
    Ok((MemberConfig { config: for_members(config) }, server))
}

/// The settings every member client has, whatever its Secret says.
fn for_members(mut config: kube::Config) -> kube::Config {
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(READ_TIMEOUT);
    config.write_timeout = Some(READ_TIMEOUT);
    // A pooled connection's idle time must not count against the next answer (kube's advice).
    config.reset_reader_on_write = true;
    // kube takes a proxy from HTTPS_PROXY too; members are reached directly, like analysis backends.
    config.proxy_url = None;
    // kube's default retry honours Retry-After for up to 15 attempts: a member (or a proxy before it)
    // could hold a reconcile for as long as it likes. The reconcile is the retry.
    config.default_retry = false;
    config.headers.clear();
    config
}

/// The server, once the cluster entry asks for nothing a Secret may not.
fn check_cluster(cluster: &Cluster) -> Result<String, String> {
    if cluster.certificate_authority.is_some() {
        return Err("names a certificate-authority file: the operator reads no file a Secret names; \
                    use certificate-authority-data"
            .into());
    }
    if cluster.proxy_url.as_deref().is_some_and(|p| !p.is_empty()) {
        return Err("sets proxy-url: members are reached directly, proxies are not supported".into());
    }
    let server = cluster.server.as_deref().ok_or("names no server")?;
    check_server("server", server)?;
    if let Some(ca) = &cluster.certificate_authority_data {
        check_ca("certificate-authority-data", ca)?;
    }
    Ok(server.to_string())
}

/// Refuses what a user entry may not ask for, and makes an exec plugin non-interactive.
fn check_user(user: &mut AuthInfo) -> Result<(), String> {
    for (set, field) in [
        (user.token_file.is_some(), "tokenFile"),
        (user.client_certificate.is_some(), "client-certificate"),
        (user.client_key.is_some(), "client-key"),
    ] {
        if set {
            return Err(format!(
                "names a {field} file: the operator reads no file a Secret names (its own ServiceAccount token \
                 is one); put the data in the kubeconfig"
            ));
        }
    }
    if user.auth_provider.is_some() {
        return Err("uses an auth-provider, which client-go no longer supports: use an exec plugin".into());
    }
    let basic = user.username.is_some() || user.password.is_some();
    match (user.token.is_some(), basic, user.exec.is_some()) {
        (true, true, _) => return Err("sets both token and username/password: keep one".into()),
        (true, _, true) | (_, true, true) => {
            return Err("sets exec and a token or username/password: keep one".into());
        }
        _ => {}
    }
    if user.username.is_some() != user.password.is_some() {
        return Err("sets only one of username and password".into());
    }
    // kube keeps these as secret strings; its serializer writes them out, for the checks only.
    let exposed = serde_json::to_value(&*user).unwrap_or_default();
    let text = |key: &str| exposed.get(key).and_then(|v| v.as_str()).map(str::to_string);
    if text("token").is_some_and(|t| t.chars().any(char::is_control)) {
        return Err("token holds control characters or line breaks".into());
    }
    match (&user.client_certificate_data, text("client-key-data")) {
        (Some(cert), Some(key)) => {
            check_identity(("client-certificate-data", cert), ("client-key-data", &key))?;
        }
        (None, None) => {}
        _ => return Err("sets only one of client-certificate-data and client-key-data".into()),
    }
    if let Some(exec) = &mut user.exec {
        check_exec("exec", exec)?;
        exec.interactive_mode = Some(ExecInteractiveMode::Never);
    }
    Ok(())
}

/// An exec plugin kube can run without a terminal: a command, a version client-go knows, no NUL bytes
/// and environment names without `=` (the process would not start, or would see other variables).
pub(super) fn check_exec(field: &str, exec: &ExecConfig) -> Result<(), String> {
    let command = exec.command.as_deref().unwrap_or_default();
    if command.is_empty() {
        return Err(format!("{field} names no command"));
    }
    match exec.api_version.as_deref() {
        Some(v) if EXEC_API_VERSIONS.contains(&v) => {}
        _ => return Err(format!("{field}.apiVersion must be one of {}", EXEC_API_VERSIONS.join(", "))),
    }
    // A line break in a value would let a file that shows the environment (/proc/self/environ) read as a
    // config file of the plugin's, written by the Secret.
    let args = exec.args.iter().flatten();
    let env = exec.env.iter().flatten().flat_map(|e| e.iter()).flat_map(|(k, v)| [k, v]);
    if std::iter::once(command)
        .chain(args.map(String::as_str))
        .chain(env.map(String::as_str))
        .any(|s| s.chars().any(char::is_control))
    {
        return Err(format!("{field} holds a control character (a NUL byte, a line break)"));
    }
    let names: Vec<&String> = exec.env.iter().flatten().filter_map(|e| e.get("name")).collect();
    if names.iter().any(|n| n.is_empty() || n.contains('=')) {
        return Err(format!("{field}.env has a name that is empty or holds '='"));
    }
    // Whatever variables an installation allows (--member-exec-env), these would choose which file runs
    // under an allowed command's name, or what it loads, and so run anything the Secret's writer likes.
    if let Some(n) = names.iter().find(|n| is_loader_variable(n)) {
        return Err(format!(
            "{field}.env sets {}, which would choose which program runs or what it loads: refused",
            shown(n)
        ));
    }
    Ok(())
}

/// An https URL with a host and nothing a credential or a surprise could hide in (user information, a
/// query, a fragment). Only the scheme of a refused URL is shown: the rest may hold credentials.
pub(super) fn check_server(field: &str, server: &str) -> Result<(), String> {
    if server.len() > MAX_SERVER_BYTES {
        return Err(format!("{field} is longer than {MAX_SERVER_BYTES} bytes"));
    }
    if !server.contains("://") {
        return Err(format!("{field} must be an https URL (https://host:port), not a bare host"));
    }
    let url = url::Url::parse(server).map_err(|e| format!("{field} is not a URL ({e})"))?;
    if url.scheme() != "https" {
        return Err(format!(
            "{field} must be an https URL: fleetroll reaches members only over TLS ({}:// is refused)",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{field} names no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!("{field} carries a user name or password: credentials go in the config"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("{field} has a query or a fragment"));
    }
    Ok(())
}

/// Base64 of PEM certificates, at least one.
pub(super) fn check_ca(field: &str, data: &str) -> Result<(), String> {
    let pem = decode(field, data)?;
    match reqwest::Certificate::from_pem_bundle(&pem) {
        Ok(certs) if !certs.is_empty() => Ok(()),
        _ => Err(format!("{field} holds no PEM certificate")),
    }
}

/// Base64 of a PEM certificate and of its PEM private key.
pub(super) fn check_identity(cert: (&str, &str), key: (&str, &str)) -> Result<(), String> {
    let pem = [decode(cert.0, cert.1)?, b"\n".to_vec(), decode(key.0, key.1)?].concat();
    reqwest::Identity::from_pem(&pem)
        .map(|_| ())
        .map_err(|_| format!("{} and {} are not a PEM certificate and its private key", cert.0, key.0))
}

/// Standard base64, as kube decodes it (through k8s-openapi's ByteString, which uses the same engine).
fn decode(field: &str, data: &str) -> Result<Vec<u8>, String> {
    serde_json::from_value::<ByteString>(serde_json::Value::String(data.to_string()))
        .map(|b| b.0)
        .map_err(|_| format!("{field} is not base64"))
}

/// kube's refusal, in words that name no credential (its messages name fields and names only).
fn explain(e: &KubeconfigError) -> String {
    match e {
        KubeconfigError::Parse(_) => "is not a kubeconfig".into(),
        other => format!("cannot be used: {other}"),
    }
}
