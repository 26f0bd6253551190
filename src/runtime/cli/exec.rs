//! The flags that say what member Secrets' exec credential plugins may be: which commands, with which
//! arguments and variables ([`crate::core::exec`]).

use crate::core::exec::{ArgsEntry, DEFAULT_ARGS, DEFAULT_COMMANDS, DEFAULT_ENV, EnvEntry, ExecPolicy};

#[derive(Debug, clap::Args)]
pub(super) struct ExecArgs {
    /// The exec credential plugins member Secrets may name (comma-separated; "" for none): a command is
    /// run only when it is one of these, as given (looked up in PATH when a bare name). Whoever may write
    /// a Secret of the fleet namespace otherwise chooses what the operator runs, with its rights.
    #[arg(
        long = "member-exec-commands",
        env = "FLEETROLL_MEMBER_EXEC_COMMANDS",
        value_delimiter = ',',
        default_values = DEFAULT_COMMANDS.iter().copied()
    )]
    commands: Vec<String>,

    /// The arguments each exec credential plugin may be given, as entries `COMMAND [SUBCOMMAND...]=FLAG,...`
    /// (`;`-separated or repeated; "" for none): each flag is its names (`--tenant-id|-t`) and, after `=`, the
    /// values it takes, `|`-separated: classes ({id}, the default; {guid}, {arn}, {region}, {secret}, and
    /// {switch} for a flag that takes none) or literal values (`spn|msi`, or the one file or URL allowed).
    /// Entries for one command add up; any other argument is refused and the plugin not run. The default
    /// allows, for each default plugin, only flags that name neither a file nor an endpoint.
    #[arg(
        long = "member-exec-args",
        env = "FLEETROLL_MEMBER_EXEC_ARGS",
        value_delimiter = ';',
        default_values = DEFAULT_ARGS.iter().copied()
    )]
    args: Vec<ArgsEntry>,

    /// The environment variables each exec credential plugin may be given, as entries
    /// `COMMAND=VARIABLE[=VALUES],...` (`;`-separated or repeated; "" for none), values as in
    /// --member-exec-args: any other variable or value is refused and the plugin not run. The default allows,
    /// for each default plugin, only variables that pick an identity or a region, none that names a file or
    /// an endpoint. PATH, LD_* and DYLD_* are refused whatever this allows.
    #[arg(
        long = "member-exec-env",
        env = "FLEETROLL_MEMBER_EXEC_ENV",
        value_delimiter = ';',
        default_values = DEFAULT_ENV.iter().copied()
    )]
    env: Vec<EnvEntry>,
}

impl ExecArgs {
    /// The policy; `--member-exec-commands=""`, `--member-exec-args=""` and `--member-exec-env=""` allow
    /// none. Err when entries contradict each other.
    pub(super) fn policy(&self) -> Result<ExecPolicy, String> {
        ExecPolicy::new(&self.commands, &self.args, &self.env)
    }
}
