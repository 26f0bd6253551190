//! Member clusters, from the Secrets users already have: Argo CD cluster Secrets (labelled
//! `argocd.argoproj.io/secret-type: cluster`) and Cluster API kubeconfig Secrets (`<cluster>-kubeconfig`,
//! their labels on the `Cluster` object). Only Secrets of the operator's fleet namespace are read, live;
//! each is hostile input: bounded, https only, no file paths, no proxy, names that are DNS labels, a
//! name given twice refused. A member's client is cached while its Secret is unchanged, and rebuilt
//! after a 401 ([`Members::forget`]), so rotated credentials are used without a restart.
//!
//! Trust: whoever may write Secrets in the fleet namespace chooses what an exec plugin runs, inside the
//! operator (as Argo CD does). `insecure` (Argo CD) and `insecure-skip-tls-verify` are honoured, as
//! Argo CD honours them, and shown on the [`Member`].

// Nothing calls this module until the controller reaches member clusters (issue 17, written beside it):
// remove this then.
#![allow(dead_code, unused_imports)]

mod argo;
mod kubeconfig;
mod secrets;

use std::collections::BTreeMap;

pub use self::{
    kubeconfig::{CONNECT_TIMEOUT, MemberConfig, READ_TIMEOUT},
    secrets::{
        ARGO_CLUSTER, ARGO_SECRET_TYPE_LABEL, CAPI_CLUSTER_NAME_LABEL, CAPI_SECRET_TYPE, MAX_CONFIG_BYTES,
        parse,
    },
};

/// A member cluster as its Secret describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The cluster's name: Argo CD's `name` key, or Cluster API's cluster name. A DNS label.
    pub name: String,
    /// What rollouts select it by: the Argo CD Secret's labels (Argo CD's own left out), or the
    /// Cluster API `Cluster` object's.
    pub labels: BTreeMap<String, String>,
    /// Which convention its Secret follows.
    pub source: Source,
    /// The name of its Secret, in the fleet namespace.
    pub secret: String,
    /// Its API server's URL, as the Secret gives it (https).
    pub server: String,
    /// Whether its server's certificate goes unverified (the Secret asks for it).
    pub insecure: bool,
}

/// The convention a member Secret follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// An Argo CD cluster Secret.
    ArgoCd,
    /// A Cluster API kubeconfig Secret.
    ClusterApi,
}

/// Why a Secret gives no member, for users (status, events): the Secret and the problem, never a
/// credential.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Secret {secret}: {reason}")]
pub struct Refused {
    /// The Secret's name, in the fleet namespace.
    pub secret: String,
    /// The cluster name the Secret gives, when it could be read.
    pub cluster: Option<String>,
    /// What is wrong with it, naming keys and fields, never values.
    pub reason: String,
}

#[cfg(test)]
mod tests;
