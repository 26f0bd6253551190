//! The operator's error type.

use crate::core::text::cut;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[source] kube::Error),

    #[error("the FleetRollout status changed while this replica was working on it")]
    Conflict,

    #[error("cannot encode JSON: {0}")]
    Json(#[source] serde_json::Error),

    #[error("the FleetRollout CRD is not installed (kubectl apply -f crds/): {0}")]
    CrdMissing(#[source] kube::Error),

    #[error(
        "cannot list FleetRolloutPolicies (is the CRD installed, and may the operator list them?): {0}; \
         install crds/fleetroll.dev_fleetrolloutpolicies.yaml or upgrade the chart"
    )]
    PolicyCrdMissing(#[source] kube::Error),

    #[error("cannot serve HTTP on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },

    #[error("lost the leader lease")]
    LostLeadership,

    #[error("invalid configuration: {0}")]
    Config(String),

    #[error("reconcile did not finish within {0:?}")]
    Timeout(std::time::Duration),

    #[error("cannot change the target: {0}")]
    Target(String),

    #[error("the reconcile panicked: {0}")]
    Panicked(String),
}

impl Error {
    /// A low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Conflict => "conflict",
            Error::Json(_) => "json",
            Error::CrdMissing(_) | Error::PolicyCrdMissing(_) => "crd_missing",
            Error::Listen { .. } => "listen",
            Error::LostLeadership => "lost_leadership",
            Error::Config(_) => "config",
            Error::Timeout(_) => "timeout",
            Error::Target(_) => "target",
            Error::Panicked(_) => "panic",
        }
    }
}

impl From<kube::Error> for Error {
    fn from(e: kube::Error) -> Self {
        if is_conflict(&e) { Error::Conflict } else { Error::Kube(e) }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// True for a 404 from the API server.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// True for a 409 from the API server: the object changed since it was read, or already exists.
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// The longest part of a refusal's message kept: a batch holds one per target until it ends, and a
/// member (or a webhook) may answer megabytes.
const DENIAL_MESSAGE_MAX: usize = 512;

/// The API server's words when it refused a change for good: RBAC (403), or an admission webhook or
/// policy (400, 403, 422). Retrying would not help; the change fails with this message, cut to
/// [`DENIAL_MESSAGE_MAX`] bytes.
pub fn denial(e: &kube::Error) -> Option<String> {
    match e {
        kube::Error::Api(s) if matches!(s.code, 400 | 403 | 422) => {
            let (reason, message) = (cut(&s.reason, 64), cut(&s.message, DENIAL_MESSAGE_MAX));
            Some(format!("the API server refused the change ({} {reason}): {message}", s.code))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(kube::core::Status::failure(message, "Forbidden").with_code(code).boxed())
    }

    #[test]
    fn a_denial_keeps_the_servers_words_cut_to_a_bound_whatever_it_sent() {
        let said = denial(&refused(403, "no, by policy")).unwrap();
        assert_eq!(said, "the API server refused the change (403 Forbidden): no, by policy");
        // Megabytes from a member or a webhook, multi-byte characters across the bound.
        let huge = "é".repeat(2 * 1024 * 1024);
        let said = denial(&refused(422, &huge)).unwrap();
        assert!(said.len() < DENIAL_MESSAGE_MAX + 64, "{}", said.len());
        assert!(said.ends_with("é…"), "{said}");
        assert_eq!(denial(&refused(500, "webhook down")), None, "a 500 is retried, not a denial");
    }
}
