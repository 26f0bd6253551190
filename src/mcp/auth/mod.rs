//! Who is calling, and may they? Bearer tokens are checked with a TokenReview for the MCP audience, then
//! every operation with a SubjectAccessReview for the FleetRollout verb and namespace it needs, so
//! Kubernetes RBAC decides what an agent may do (and `kubectl auth can-i` predicts it).
//!
//! The check runs as axum middleware in front of the MCP service (`guard`), because its answers are HTTP
//! statuses; the handler checks again that the operation it performs is the one that was authorized.
//!
//! - `origins`: which browser `Origin`s may call at all;
//! - `review`: TokenReviews and SubjectAccessReviews, cached and rationed;
//! - `access`: which permission each request needs, and what a grant covers;
//! - `guard`: the middleware, in that order.

mod access;
mod guard;
mod origins;
mod review;

use std::collections::BTreeMap;

pub(crate) use self::{
    access::{Access, Granted, Verb, required_access},
    guard::{Guard, guard, rpc_error},
    origins::Origins,
    review::{Authenticator, Decision},
};

/// How the MCP endpoint authenticates callers.
#[derive(Clone, Debug)]
pub enum Mode {
    /// No authentication (local demos): every caller is `system:anonymous` and may do everything.
    None,
    /// Kubernetes ServiceAccount (or any API-server-accepted) tokens for `audience`.
    ServiceAccount { audience: String },
}

/// The caller, as the API server vouched for it (TokenReview `status.user`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Identity {
    pub username: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Identity {
    /// The caller under `--auth none`.
    pub fn anonymous() -> Self {
        Identity {
            username: crate::mcp::task::ANONYMOUS.into(),
            uid: None,
            groups: vec!["system:unauthenticated".into()],
            extra: BTreeMap::new(),
        }
    }
}
