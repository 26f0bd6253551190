//! The installation's exec policy ([`ExecPolicy`], decided in the core) applied to what a member Secret
//! asks: a Secret whose exec plugin may not run as it asks is refused, like any other Secret that asks
//! for what it may not, and the plugin never runs.

pub use crate::core::exec::ExecPolicy;

use super::{MemberConfig, Parsed, Refused};

/// `parsed`, or a refusal when its exec plugin may not run under `policy`.
pub(super) fn judged(policy: &ExecPolicy, parsed: Parsed) -> Parsed {
    let Ok(Some((member, (config, version)))) = parsed else { return parsed };
    match refusal(policy, &member.name, &config) {
        None => Ok(Some((member, (config, version)))),
        Some(reason) => Err(Refused { secret: member.secret, cluster: Some(member.name), reason }),
    }
}

/// Why `config`'s exec plugin may not run for member `member`, if it may not.
fn refusal(policy: &ExecPolicy, member: &str, config: &MemberConfig) -> Option<String> {
    let command = config.exec_command()?;
    let env: Vec<(&str, Option<&str>)> = config.exec_env().collect();
    policy.refusal(member, command, config.exec_args(), &env)
}
