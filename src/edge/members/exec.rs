//! What a member Secret's exec credential plugin may be. A plugin runs inside the operator, with its
//! rights, so whoever may write a Secret of the fleet namespace would otherwise choose what the operator
//! runs: the command, and the variables that steer it.

use super::{MemberConfig, kubeconfig};

/// The exec credential plugins run by default: those that only fetch a token for a cluster.
const EXEC_COMMANDS: &[&str] =
    &["argocd-k8s-auth", "aws-iam-authenticator", "gke-gcloud-auth-plugin", "kubelogin"];

/// The environment variables an exec plugin may be given by default (`*` ends a prefix): those the default
/// plugins document for picking a cloud identity. Others can make an allowed plugin run other code
/// (`CLOUDSDK_PYTHON_ARGS` for gcloud, `AWS_CONFIG_FILE` with a `credential_process`, `BASH_ENV`).
const EXEC_ENV: &[&str] = &[
    "AAD_*",
    "AZURE_*",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_STS_REGIONAL_ENDPOINTS",
    "GOOGLE_APPLICATION_CREDENTIALS",
];

/// What a member Secret's exec credential plugin may be: one of `commands`, given only variables `env`
/// names (exactly, or by a prefix ending in `*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecPolicy {
    pub commands: Vec<String>,
    pub env: Vec<String>,
}

impl Default for ExecPolicy {
    fn default() -> Self {
        let owned = |list: &[&str]| list.iter().map(|c| c.to_string()).collect();
        Self { commands: owned(EXEC_COMMANDS), env: owned(EXEC_ENV) }
    }
}

impl ExecPolicy {
    /// Why `config`'s exec plugin may not run here, if it may not.
    pub(super) fn refusal(&self, config: &MemberConfig) -> Option<String> {
        let command = config.exec_command()?;
        if !self.commands.iter().any(|a| a == command) {
            return Some(format!(
                "its exec plugin {} is not one this installation runs (--member-exec-commands: {})",
                kubeconfig::shown(command),
                self.commands.join(", ")
            ));
        }
        let allowed = |name: &str| {
            self.env.iter().any(|a| match a.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => a == name,
            })
        };
        let name = config.exec_env_names().find(|n| !allowed(n))?;
        Some(format!(
            "its exec plugin's env sets {}, which this installation lets no Secret set (--member-exec-env: {})",
            kubeconfig::shown(name),
            self.env.join(", ")
        ))
    }
}
