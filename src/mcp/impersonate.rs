//! FleetRollout writes made for a caller are made *as* the caller: through a client that impersonates the
//! identity the TokenReview vouched for, so that RBAC, admission policies (fleetroll's own requires the
//! requesting user to be allowed to patch the targets) and the audit log all see the caller, never this
//! server. Nothing anyone does through MCP can then exceed what they could do with kubectl.
//!
//! It uses Kubernetes *constrained* impersonation (KEP-5284, on by default since 1.36), which lets this
//! server impersonate only for the FleetRollout verbs it needs:
//!
//! - a ServiceAccount caller (`system:serviceaccount:NS:NAME`) in `serviceaccount` mode: the username only
//!   (the API server adds the ServiceAccount's groups; that mode forbids uid, groups and extra);
//! - any other caller in `user-info` mode: username, uid, groups and extra, as the TokenReview gave them.
//!   That mode refuses `system:masters`, node identities, and extra keys that are not lowercase
//!   domain-prefixed paths; such a caller gets an error and nothing is written.
//!
//! The RBAC this needs (a ClusterRole bound to the server's ServiceAccount):
//!
//! ```yaml
//! - apiGroups: [authentication.k8s.io]
//!   resources: [serviceaccounts]
//!   verbs: ["impersonate:serviceaccount"]
//! - apiGroups: [authentication.k8s.io]
//!   # users, groups, uids and userextras/<key> for every key a caller's token may carry. RBAC has no
//!   # "userextras/*" wildcard (it matches only "*" or "*/<subresource>"), hence "*"; the verb limits it to
//!   # user-info impersonation, which cannot reach system:masters, nodes or ServiceAccounts.
//!   resources: ["*"]
//!   verbs: ["impersonate:user-info"]
//! - apiGroups: [fleetroll.dev]
//!   resources: [fleetrollouts]
//!   verbs: ["impersonate-on:serviceaccount:get", "impersonate-on:serviceaccount:create",
//!           "impersonate-on:serviceaccount:patch", "impersonate-on:user-info:get",
//!           "impersonate-on:user-info:create", "impersonate-on:user-info:patch"]
//! # preview_rollout's discovery, as the caller
//! - apiGroups: [apps]
//!   resources: [deployments, statefulsets, daemonsets]
//!   verbs: ["impersonate-on:serviceaccount:get", "impersonate-on:serviceaccount:list",
//!           "impersonate-on:user-info:get", "impersonate-on:user-info:list"]
//! - apiGroups: [""]
//!   resources: [namespaces, nodes, pods]
//!   verbs: ["impersonate-on:serviceaccount:list", "impersonate-on:user-info:list"]
//! ```
//!
//! (`get`: an approval reads the rollout before it patches it, and a replayed start reads the rollout it
//! collided with. A preview discovers the fleet as the caller, so it shows only what the caller could list;
//! across member clusters, `create` is a dry run proving the caller may create that rollout, see
//! `preview`.) Writes are rare, so each derives its client from the server's own `kube::Config`,
//! and kube's own code puts the `Impersonate-*` headers on.

use std::sync::Arc;

use kube::Client;

use super::auth::Identity;
use crate::{
    core::identity::{Impersonation, User},
    edge::{control::ControlError, impersonation},
};

/// Who the MCP server's writes are made as.
#[derive(Clone)]
pub enum Writer {
    /// `--auth none`: the server itself (there is no caller identity to act as).
    Server(Client),
    /// The caller, impersonated by the server whose configuration this is.
    Caller(Arc<kube::Config>),
}

impl Writer {
    /// The client to write with for `who`. Err: why `who` cannot be impersonated (for the caller).
    pub fn client_for(&self, who: &Identity) -> Result<Client, ControlError> {
        match self {
            Writer::Server(client) => Ok(client.clone()),
            Writer::Caller(base) => {
                let imp = impersonation_of(who)
                    .map_err(|e| ControlError::Refused(format!("{e}; nothing was written")))?;
                impersonation::client(base, imp)
                    .map_err(|e| ControlError::from_kube(e, format!("acting as {:?}", who.username)))
            }
        }
    }
}

/// How a caller is impersonated, or why it cannot be.
pub fn impersonation_of(who: &Identity) -> Result<Impersonation, String> {
    Impersonation::of(User {
        username: &who.username,
        uid: who.uid.as_deref(),
        groups: &who.groups,
        extra: &who.extra,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(username: &str, groups: &[&str], extra: &[(&str, &[&str])]) -> Identity {
        Identity {
            username: username.into(),
            uid: Some("uid-1".into()),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            extra: extra
                .iter()
                .map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect()))
                .collect(),
        }
    }

    /// What a client sends: the headers of one request to a stand-in API server.
    async fn headers_sent(
        writer: impl FnOnce(kube::Config) -> Writer,
        who: &Identity,
    ) -> Vec<(String, String)> {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
            let mut all: Vec<(String, String)> = headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_string()))
                .collect();
            all.sort();
            *record.lock().unwrap() = all;
            async { "{}" }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = writer(kube::Config::new(url.parse().unwrap())).client_for(who).unwrap();
        client.request_text(axum::http::Request::get("/version").body(Vec::new()).unwrap()).await.unwrap();
        let headers = seen.lock().unwrap().clone();
        headers.into_iter().filter(|(k, _)| k.starts_with("impersonate-")).collect()
    }

    #[tokio::test]
    async fn the_derived_client_sends_exactly_the_impersonation_headers() {
        let caller = |c| Writer::Caller(Arc::new(c));
        let sa =
            identity("system:serviceaccount:team:agent", &["system:serviceaccounts"], &[("a.io/x", &["1"])]);
        assert_eq!(
            headers_sent(caller, &sa).await,
            [("impersonate-user".to_string(), "system:serviceaccount:team:agent".to_string())]
        );
        let alice = identity("alice", &["devs"], &[("example.com/team", &["blue"])]);
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        assert_eq!(
            headers_sent(caller, &alice).await,
            [
                pair("impersonate-extra-example.com%2fteam", "blue"),
                pair("impersonate-group", "devs"),
                pair("impersonate-uid", "uid-1"),
                pair("impersonate-user", "alice"),
            ]
        );
        let server = |c| Writer::Server(Client::try_from(c).unwrap());
        assert_eq!(headers_sent(server, &alice).await, [], "--auth none: the server's own identity");
    }

    #[test]
    fn a_refusal_says_nothing_was_written() {
        let caller = Writer::Caller(Arc::new(kube::Config::new("http://127.0.0.1:9".parse().unwrap())));
        let e = caller.client_for(&identity("root", &["system:masters"], &[])).err().unwrap().to_string();
        assert!(e.contains("system:masters") && e.ends_with("nothing was written"), "{e}");
    }

    #[tokio::test]
    async fn without_authentication_writes_stay_with_the_server() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let server = Writer::Server(Client::try_from(config.clone()).unwrap());
        let root = identity("root", &["system:masters"], &[]);
        assert!(server.client_for(&root).is_ok(), "--auth none: no impersonation, nothing to refuse");
        let caller = Writer::Caller(Arc::new(config));
        assert!(caller.client_for(&root).is_err());
        assert!(
            caller
                .client_for(&identity("system:serviceaccount:a:b", &["system:serviceaccounts"], &[]))
                .is_ok()
        );
    }
}
