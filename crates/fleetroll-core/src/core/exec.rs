//! What a member Secret's exec credential plugin may be asked to do. A plugin runs inside the operator, with
//! its rights, its files and its cloud identity, so whoever may write a Secret of the fleet namespace would
//! otherwise choose what the operator runs and where the plugin sends what it holds: the command, its
//! arguments (a flag naming the operator's ServiceAccount token file, a token endpoint of the writer's
//! choosing) and the variables that steer it. All are allowed per plugin: commands by name, arguments by a
//! grammar of subcommands and flags, each flag with the values it may take; nothing that names a file or an
//! endpoint unless the operator allows that very file or endpoint.

mod syntax;

use std::collections::BTreeMap;

pub use syntax::{ArgsEntry, Declared, EnvEntry, Kind, is_loader_variable};

/// The exec credential plugins run by default: those that only fetch a token for a cluster.
pub const DEFAULT_COMMANDS: &[&str] =
    &["argocd-k8s-auth", "aws-iam-authenticator", "gke-gcloud-auth-plugin", "kubelogin"];

/// The arguments the default plugins may be given (`--member-exec-args`), from each one's own flag
/// definitions; what is left out names a file or an endpoint, writes files, or needs a person.
pub const DEFAULT_ARGS: &[&str] = &[
    // argo-cd cmd/argocd-k8s-auth: `aws` takes these three; `gcp` and `azure` none (the environment picks
    // the identity). Not `token-file` nor `oidc`: they hand a file's token (by default the operator's own
    // ServiceAccount token) to whatever server the Secret names.
    "argocd-k8s-auth aws=--cluster-name,--role-arn={arn},--profile",
    "argocd-k8s-auth gcp=",
    "argocd-k8s-auth azure=",
    // aws-iam-authenticator cmd/aws-iam-authenticator/{root,token}.go: not --config (a file), --cache (writes
    // one), --token-only (no ExecCredential), the log and feature-gate flags.
    "aws-iam-authenticator token=--cluster-id|-i,--role|-r={arn},--external-id|-e,--session-name|-s,\
     --forward-session-name={switch}",
    // cloud-provider-gcp cmd/gke-gcloud-auth-plugin: not klog's --log_file and --log_dir (files).
    "gke-gcloud-auth-plugin=--use_application_default_credentials={switch}",
    // Azure/kubelogin pkg/internal/token/options.go: the login modes that need no person and run no other
    // program; the AKS server application (the same in every cloud), so that the operator's own Azure
    // identity (msi, workloadidentity) yields tokens for AKS only. Not --client-certificate,
    // --federated-token-file, --token-cache-dir, --cache-dir (files), --authority-host, --redirect-url
    // (endpoints), --use-azurerm-env-vars (reads other variables, file paths among them).
    "kubelogin get-token=--login|-l=spn|msi|workloadidentity,--server-id=6dae42f8-4368-4678-94ff-3960e28e3630,\
     --client-id={guid},--client-secret={secret},--tenant-id|-t,\
     --environment|-e=AzurePublicCloud|AzureChinaCloud|AzureUSGovernmentCloud,--legacy={switch}",
];

/// The environment variables the default plugins may be given (`--member-exec-env`), each checked against
/// what the plugin documents it for: those that pick an identity or a region, never one that names a file
/// (`AZURE_FEDERATED_TOKEN_FILE`, `AZURE_CLIENT_CERTIFICATE_PATH`, `AWS_WEB_IDENTITY_TOKEN_FILE`,
/// `AWS_CONFIG_FILE`, `GOOGLE_APPLICATION_CREDENTIALS`, `KUBECACHEDIR`) or an endpoint
/// (`AZURE_AUTHORITY_HOST`, `AWS_ENDPOINT_URL_STS`, `GCE_METADATA_HOST`, `IDENTITY_ENDPOINT`), nor one that
/// makes a plugin run other code (`CLOUDSDK_PYTHON_ARGS`, `BASH_ENV`).
pub const DEFAULT_ENV: &[&str] = &[
    // argocd-k8s-auth: `aws` reads the AWS SDK's; `azure` kubelogin's token.OptionsWithEnv and
    // AAD_ENVIRONMENT_NAME (not AAD_SERVER_APPLICATION_ID: the AKS server application stays the audience).
    "argocd-k8s-auth=AWS_REGION={region},AWS_DEFAULT_REGION={region},AWS_PROFILE,AWS_ROLE_ARN={arn},\
     AWS_ROLE_SESSION_NAME,AWS_STS_REGIONAL_ENDPOINTS=legacy|regional,AAD_LOGIN_METHOD=spn|msi|workloadidentity,\
     AAD_SERVICE_PRINCIPAL_CLIENT_ID={guid},AAD_SERVICE_PRINCIPAL_CLIENT_SECRET={secret},AZURE_CLIENT_ID={guid},\
     AZURE_CLIENT_SECRET={secret},AZURE_TENANT_ID,AAD_ENVIRONMENT_NAME=AzurePublicCloud|AzureChinaCloud|AzureUSGovernmentCloud",
    // aws-iam-authenticator: the AWS SDK's region, profile and role.
    "aws-iam-authenticator=AWS_REGION={region},AWS_DEFAULT_REGION={region},AWS_PROFILE,AWS_ROLE_ARN={arn},\
     AWS_ROLE_SESSION_NAME,AWS_STS_REGIONAL_ENDPOINTS=legacy|regional",
    // kubelogin (pkg/internal/env/variables.go): login mode, client and tenant; not the ROPC user's, nor
    // ARM_* (read only with --use-azurerm-env-vars). gke-gcloud-auth-plugin: none (its credentials are the
    // operator's application default credentials or gcloud's, whose variables name files and programs).
    "kubelogin=AAD_LOGIN_METHOD=spn|msi|workloadidentity,AAD_SERVICE_PRINCIPAL_CLIENT_ID={guid},\
     AAD_SERVICE_PRINCIPAL_CLIENT_SECRET={secret},AZURE_CLIENT_ID={guid},AZURE_CLIENT_SECRET={secret},AZURE_TENANT_ID",
];

/// What a switch takes: `true` or `false`, after `=`.
const SWITCH: &[Kind] = &[Kind::Switch];

/// What a flag takes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Takes {
    /// Nothing: given alone, or as `--flag=true|false`.
    Switch,
    /// A value of one of these kinds, after `=` or as the next argument.
    Value(Vec<Kind>),
}

/// What one plugin may be given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Plugin {
    /// By subcommand path (empty: the command itself), the flags that follow it, by name.
    grammar: BTreeMap<Vec<String>, BTreeMap<String, Takes>>,
    /// The variables it may be given, with the values each may take.
    env: BTreeMap<String, Vec<Kind>>,
}

/// What a member Secret's exec credential plugins may be: one of the commands allowed, given only the
/// arguments its grammar allows and the variables allowed for it, each with a value it may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecPolicy {
    plugins: BTreeMap<String, Plugin>,
    /// Why no plugin runs at all here, when none may (`kubectl fleetroll plan`, on a person's machine).
    off: Option<String>,
}

impl Default for ExecPolicy {
    fn default() -> Self {
        let commands: Vec<String> = DEFAULT_COMMANDS.iter().map(|c| c.to_string()).collect();
        // The built-in entries are constants, parsed by a unit test: they cannot fail here.
        let args: Vec<ArgsEntry> = DEFAULT_ARGS.iter().filter_map(|e| e.parse().ok()).collect();
        let env: Vec<EnvEntry> = DEFAULT_ENV.iter().filter_map(|e| e.parse().ok()).collect();
        Self::new(&commands, &args, &env).unwrap_or_else(|_| Self::never(""))
    }
}

impl ExecPolicy {
    /// The policy the operator's flags give: `commands` may run, each given only what the `args` and `env`
    /// entries for it allow. Err when two entries disagree on whether a flag is a switch.
    pub fn new(commands: &[String], args: &[ArgsEntry], env: &[EnvEntry]) -> Result<Self, String> {
        let mut plugins: BTreeMap<String, Plugin> =
            commands.iter().filter(|c| !c.is_empty()).map(|c| (c.clone(), Plugin::default())).collect();
        for entry in args {
            let Some(plugin) = plugins.get_mut(&entry.command) else { continue };
            let flags = plugin.grammar.entry(entry.path.clone()).or_default();
            for declared in &entry.flags {
                let takes = match declared.kinds.as_slice() {
                    [Kind::Switch] => Takes::Switch,
                    kinds => Takes::Value(kinds.to_vec()),
                };
                for name in &declared.names {
                    match (flags.get_mut(name), &takes) {
                        (None, _) => drop(flags.insert(name.clone(), takes.clone())),
                        (Some(Takes::Switch), Takes::Switch) => {}
                        (Some(Takes::Value(had)), Takes::Value(more)) => add(had, more),
                        _ => {
                            return Err(format!(
                                "--member-exec-args: {} {name} is declared both as a {{switch}} and with values",
                                entry.command
                            ));
                        }
                    }
                }
            }
        }
        for entry in env {
            let Some(plugin) = plugins.get_mut(&entry.command) else { continue };
            for declared in &entry.vars {
                for name in &declared.names {
                    add(plugin.env.entry(name.clone()).or_default(), &declared.kinds);
                }
            }
        }
        Ok(Self { plugins, off: None })
    }

    /// No plugin runs: each is refused, saying that it `why` (`is not run by kubectl fleetroll plan`).
    pub fn never(why: &str) -> Self {
        Self { plugins: BTreeMap::new(), off: Some(why.to_string()) }
    }

    /// The commands that may run.
    pub fn commands(&self) -> impl Iterator<Item = &str> {
        self.plugins.keys().map(String::as_str)
    }

    /// Why member `member`'s exec plugin `command` may not run with `args` and the variables `env` (names,
    /// and values where given), if it may not. The refusal names the member, the command and the argument
    /// or variable refused, never a value: a value may be a credential.
    pub fn refusal(
        &self,
        member: &str,
        command: &str,
        args: &[String],
        env: &[(&str, Option<&str>)],
    ) -> Option<String> {
        let plugin = format!("the exec plugin {} of member cluster {}", shown(command), shown(member));
        if let Some(why) = &self.off {
            return Some(format!("{plugin} {why}"));
        }
        let Some(allowed) = self.plugins.get(command) else {
            let commands: Vec<&str> = self.commands().collect();
            return Some(format!(
                "{plugin} is not one this installation runs (--member-exec-commands: {})",
                commands.join(", ")
            ));
        };
        match allowed.check(command, args).and_then(|()| allowed.check_env(env)) {
            Ok(()) => None,
            Err(why) => Some(format!("{plugin} {why}")),
        }
    }
}

impl Plugin {
    /// Whether each variable is one this plugin may be given, with a value it may take. Err names the
    /// variable, never its value.
    fn check_env(&self, env: &[(&str, Option<&str>)]) -> Result<(), String> {
        for (name, value) in env {
            let Some(kinds) = self.env.get(*name) else {
                return Err(format!("may not be given variable {} (--member-exec-env)", shown(name)));
            };
            if value.is_some_and(|v| !kinds.iter().any(|k| k.admits(v))) {
                let wanted: Vec<&str> = kinds.iter().map(Kind::describe).collect();
                return Err(format!(
                    "may not be given that value of variable {} (not shown): it takes {} (--member-exec-env)",
                    shown(name),
                    wanted.join(" or ")
                ));
            }
        }
        Ok(())
    }

    /// Whether `args` follow this plugin's grammar, as its own parser (Go's pflag) reads them: a
    /// subcommand path first, then flags only, `--flag value` or `--flag=value`, `-f value` or `-f=value`.
    /// Err says which argument is refused (by its flag name, or its position), never its value.
    fn check(&self, command: &str, args: &[String]) -> Result<(), String> {
        if args.is_empty() {
            return Ok(());
        }
        let Some((path, flags)) =
            self.grammar.iter().filter(|(p, _)| args.starts_with(p)).max_by_key(|(p, _)| p.len())
        else {
            let forms: Vec<String> = self.grammar.keys().map(|p| usage(command, p)).collect();
            let forms = if forms.is_empty() { "with no argument".into() } else { forms.join(", ") };
            return Err(format!(
                "may not be given these arguments: it runs here only as {forms} (--member-exec-args)"
            ));
        };
        let here = usage(command, path);
        let mut at = path.len();
        while let Some(token) = args.get(at) {
            let n = at + 1;
            at += 1;
            if !token.starts_with('-') || token == "-" {
                return Err(format!(
                    "may not be given argument {n}, a positional argument (not shown): {here} takes none there \
                     (--member-exec-args)"
                ));
            }
            let (name, inline) = match token.split_once('=') {
                Some((name, value)) => (name, Some(value)),
                None => (token.as_str(), None),
            };
            let Some(takes) = flags.get(name) else {
                return Err(format!(
                    "may not be given {} (argument {n}): not a flag this installation allows for {here} \
                     (--member-exec-args)",
                    shown(name)
                ));
            };
            let (value, kinds): (Option<&str>, &[Kind]) = match takes {
                Takes::Switch => (inline, SWITCH),
                Takes::Value(kinds) => {
                    let value = match inline {
                        Some(v) => v,
                        None => {
                            let next = args
                                .get(at)
                                .ok_or_else(|| format!("ends with {}, with no value", shown(name)))?;
                            at += 1;
                            next.as_str()
                        }
                    };
                    (Some(value), kinds)
                }
            };
            if value.is_some_and(|v| !kinds.iter().any(|k| k.admits(v))) {
                let wanted: Vec<&str> = kinds.iter().map(Kind::describe).collect();
                return Err(format!(
                    "may not be given that value of {} (argument {n}, not shown): it takes {} here \
                     (--member-exec-args)",
                    shown(name),
                    wanted.join(" or ")
                ));
            }
        }
        Ok(())
    }
}

/// Adds to `had` the kinds of `more` it lacks: entries for one flag or variable add up.
fn add(had: &mut Vec<Kind>, more: &[Kind]) {
    for kind in more {
        if !had.contains(kind) {
            had.push(kind.clone());
        }
    }
}

/// `kubelogin get-token`, for refusals.
fn usage(command: &str, path: &[String]) -> String {
    std::iter::once(command).chain(path.iter().map(String::as_str)).collect::<Vec<_>>().join(" ")
}

/// A name from a Secret, cut short for messages.
pub fn shown(name: &str) -> String {
    match name.char_indices().nth(64) {
        Some((at, _)) => format!("{:?}...", &name[..at]),
        None => format!("{name:?}"),
    }
}

#[cfg(test)]
mod tests;
