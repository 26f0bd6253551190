//! Why `kubectl fleetroll` stopped, and the exit code a script reads it by.

use std::process::ExitCode;

use crate::edge::control::ControlError;

/// The exit codes, as `kubectl fleetroll --help` lists them.
pub(super) const EXIT_CODES: &str = "Exit codes: 0 done (status: the rollout succeeded or is still going); \
    1 the rollout ended without succeeding, or an unexpected failure; 2 usage error; 3 refused (RBAC, \
    admission, or the rollout changed: its plan, gates or name); 4 not found; 5 cannot reach the cluster \
    (kubeconfig, connection, API server unavailable); 6 still going when --timeout passed.";

/// The outcome of a command, by exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Exit {
    Done = 0,
    Failed = 1,
    Usage = 2,
    Refused = 3,
    NotFound = 4,
    Unreachable = 5,
    TimedOut = 6,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit as u8)
    }
}

/// Why a command did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub(super) enum PluginError {
    /// A read or a control the API server (or fleetroll) turned down, or could not answer.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// No usable kubeconfig or context, or no client from it.
    #[error("{0}")]
    NoCluster(String),
    /// The command cannot run as given (no name nor manifest, batch 0, a manifest that cannot be read).
    #[error("{0}")]
    Usage(String),
    /// The rollout cannot be planned, or its frozen plan is not trusted.
    #[error("{0}")]
    Refused(String),
    /// Anything else (output that cannot be encoded, a watch that ended).
    #[error("{0}")]
    Failed(String),
}

impl PluginError {
    pub(super) fn exit(&self) -> Exit {
        match self {
            PluginError::Control(e) => match e {
                ControlError::NotFound { .. } => Exit::NotFound,
                ControlError::Forbidden { .. }
                | ControlError::Invalid { .. }
                | ControlError::Changed(_)
                | ControlError::Refused(_) => Exit::Refused,
                // The kubeconfig's credentials, as a cluster that cannot be reached is the kubeconfig's too.
                ControlError::Unauthorized { .. } | ControlError::Unavailable { .. } => Exit::Unreachable,
            },
            PluginError::NoCluster(_) => Exit::Unreachable,
            PluginError::Usage(_) => Exit::Usage,
            PluginError::Refused(_) => Exit::Refused,
            PluginError::Failed(_) => Exit::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::core::Status;

    use super::*;

    fn api(code: u16) -> PluginError {
        let status = Status::failure("no", "Reason").with_code(code);
        ControlError::from_kube(kube::Error::Api(Box::new(status)), "FleetRollout a/b").into()
    }

    #[test]
    fn each_kind_of_failure_has_its_own_exit_code() {
        assert_eq!(api(404).exit(), Exit::NotFound);
        for refused in [403, 422, 400, 409] {
            assert_eq!(api(refused).exit(), Exit::Refused, "{refused}");
        }
        for unavailable in [500, 503, 429, 401] {
            assert_eq!(api(unavailable).exit(), Exit::Unreachable, "{unavailable}");
        }
        let PluginError::Control(expired) = api(401) else { panic!("a control error") };
        assert_eq!(expired.reason(), "Unauthorized");
        assert!(expired.to_string().contains("credentials were not accepted"), "{expired}");
        assert_eq!(PluginError::NoCluster("no context".into()).exit(), Exit::Unreachable);
        assert_eq!(PluginError::Usage("batches are numbered from 1".into()).exit(), Exit::Usage);
        let codes = [Exit::Done, Exit::Failed, Exit::Usage, Exit::Refused, Exit::NotFound, Exit::Unreachable];
        for (code, exit) in codes.into_iter().enumerate() {
            assert_eq!(exit as usize, code);
            assert!(EXIT_CODES.contains(&format!("{code} ")), "{code} is documented");
        }
        assert!(EXIT_CODES.contains(&format!("{} still going", Exit::TimedOut as u8)));
    }
}
