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

use std::{collections::BTreeMap, sync::Arc};

use kube::Client;

use super::auth::Identity;

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
    pub fn client_for(&self, who: &Identity) -> Result<Client, String> {
        match self {
            Writer::Server(client) => Ok(client.clone()),
            Writer::Caller(base) => {
                let mut config = (**base).clone();
                Impersonation::of(who)?.apply(&mut config);
                Client::try_from(config).map_err(|e| format!("cannot act as {}: {e}", who.username))
            }
        }
    }
}

/// The `Impersonate-*` fields for one caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Impersonation {
    pub user: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

const SERVICEACCOUNT_PREFIX: &str = "system:serviceaccount:";
const NODE_PREFIX: &str = "system:node:";

impl Impersonation {
    /// How `who` is impersonated, or why it cannot be.
    pub fn of(who: &Identity) -> Result<Impersonation, String> {
        let refuse = |why: &str| Err(format!("cannot act as {:?}: {why}; nothing was written", who.username));
        let user = who.username.clone();
        if user.is_empty() {
            return refuse("the identity has no username");
        }
        if let Some(rest) = user.strip_prefix(SERVICEACCOUNT_PREFIX) {
            // Only a ServiceAccount's own token says so; another authenticator's user who merely bears
            // such a name must not be impersonated as that ServiceAccount.
            if !who.groups.iter().any(|g| g == "system:serviceaccounts") {
                return refuse("a ServiceAccount username without the system:serviceaccounts group");
            }
            let mut parts = rest.split(':');
            let well_formed = matches!((parts.next(), parts.next(), parts.next()), (Some(ns), Some(name), None) if !ns.is_empty() && !name.is_empty());
            if !well_formed {
                return refuse("not a well-formed ServiceAccount username");
            }
            // serviceaccount mode: the username only; the API server derives the groups.
            return Ok(Impersonation { user, uid: None, groups: Vec::new(), extra: BTreeMap::new() });
        }
        if user.starts_with(NODE_PREFIX) {
            return refuse("node identities are not impersonated");
        }
        if who.groups.iter().any(|g| g == "system:masters") {
            return refuse("members of system:masters cannot be impersonated");
        }
        if who.groups.iter().any(String::is_empty) {
            return refuse("an empty group name cannot be impersonated");
        }
        let mut extra = BTreeMap::new();
        for (key, values) in &who.extra {
            // A key without values says nothing; the API server refuses one, so leave it out.
            if values.is_empty() {
                continue;
            }
            if let Err(why) = valid_extra_key(key) {
                return refuse(&format!("its extra key {key:?} {why}"));
            }
            if values.iter().any(String::is_empty) {
                return refuse(&format!("its extra {key:?} has an empty value"));
            }
            extra.insert(key.clone(), values.clone());
        }
        let imp = Impersonation { user, uid: who.uid.clone(), groups: who.groups.clone(), extra };
        // Header values must be visible ASCII: say so here rather than as an HTTP error later.
        let values = std::iter::once(&imp.user)
            .chain(imp.uid.iter())
            .chain(imp.groups.iter())
            .chain(imp.extra.values().flatten());
        if let Some(v) = values.into_iter().find(|v| !v.bytes().all(|b| (0x20..0x7f).contains(&b))) {
            return refuse(&format!(
                "{v:?} is not printable ASCII, which impersonation headers cannot carry"
            ));
        }
        Ok(imp)
    }

    /// Sets the impersonation on a client configuration.
    pub fn apply(self, config: &mut kube::Config) {
        let auth = &mut config.auth_info;
        auth.impersonate = Some(self.user);
        auth.impersonate_uid = self.uid;
        auth.impersonate_groups = (!self.groups.is_empty()).then_some(self.groups);
        auth.impersonate_user_extra = (!self.extra.is_empty()).then(|| self.extra.into_iter().collect());
    }
}

/// The API server's rule for impersonated extra keys: a lowercase domain-prefixed path (`acme.io/foo`).
/// Header names are case-insensitive, so an uppercase key would silently become another key.
fn valid_extra_key(key: &str) -> Result<(), &'static str> {
    if key != key.to_lowercase() {
        return Err("is not lowercase");
    }
    let Some((domain, path)) = key.split_once('/') else {
        return Err("is not a domain-prefixed path such as acme.io/foo");
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if domain.is_empty() || domain.len() > 253 || !domain.split('.').all(label_ok) {
        return Err("does not start with a DNS subdomain");
    }
    let path_ok = |b: u8| b.is_ascii_alphanumeric() || b"/-._~%!$&'()*+,;=:".contains(&b);
    if path.is_empty() || !path.bytes().all(path_ok) {
        return Err("has an invalid path after the domain");
    }
    Ok(())
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

    #[test]
    fn a_serviceaccount_is_impersonated_by_its_username_only() {
        let who = identity(
            "system:serviceaccount:team:agent",
            &["system:serviceaccounts", "system:serviceaccounts:team", "system:authenticated"],
            &[("authentication.kubernetes.io/credential-id", &["JTI=abc"])],
        );
        let imp = Impersonation::of(&who).unwrap();
        assert_eq!(
            imp,
            Impersonation {
                user: "system:serviceaccount:team:agent".into(),
                uid: None,
                groups: vec![],
                extra: BTreeMap::new()
            }
        );
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        imp.apply(&mut config);
        assert_eq!(config.auth_info.impersonate.as_deref(), Some("system:serviceaccount:team:agent"));
        assert_eq!(config.auth_info.impersonate_uid, None, "serviceaccount mode forbids a uid");
        assert_eq!(config.auth_info.impersonate_groups, None, "serviceaccount mode forbids groups");
        assert_eq!(config.auth_info.impersonate_user_extra, None, "serviceaccount mode forbids extra");
    }

    #[tokio::test]
    async fn any_other_user_is_impersonated_with_uid_groups_and_extra() {
        let who = identity(
            "alice@example.com",
            &["devs", "system:authenticated"],
            &[("example.com/team", &["a", "b"]), ("example.com/empty", &[])],
        );
        let imp = Impersonation::of(&who).unwrap();
        assert_eq!(imp.uid.as_deref(), Some("uid-1"));
        assert_eq!(imp.groups, ["devs", "system:authenticated"]);
        assert_eq!(imp.extra.len(), 1, "a key without values is left out: {imp:?}");
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        imp.apply(&mut config);
        let auth = &config.auth_info;
        assert_eq!(auth.impersonate.as_deref(), Some("alice@example.com"));
        assert_eq!(auth.impersonate_uid.as_deref(), Some("uid-1"));
        assert_eq!(
            auth.impersonate_groups.as_deref(),
            Some(&["devs".to_string(), "system:authenticated".into()][..])
        );
        let extra = auth.impersonate_user_extra.as_ref().unwrap();
        assert_eq!(extra["example.com/team"], ["a", "b"]);
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
    fn identities_the_api_server_would_refuse_are_refused_here_with_a_reason() {
        let refused = |who: Identity, why: &str| {
            let e = Impersonation::of(&who).unwrap_err();
            assert!(e.contains(why) && e.contains("nothing was written"), "{e}");
        };
        refused(identity("root", &["system:masters"], &[]), "system:masters");
        refused(identity("system:node:n1", &["system:nodes"], &[]), "node");
        refused(identity("bob", &["devs", ""], &[]), "empty group");
        refused(identity("bob", &[], &[("Example.com/Team", &["a"])]), "not lowercase");
        refused(identity("bob", &[], &[("team", &["a"])]), "domain-prefixed");
        refused(identity("bob", &[], &[("-x.com/team", &["a"])]), "DNS subdomain");
        refused(identity("bob", &[], &[("x.com/team", &[""])]), "empty value");
        refused(identity("bob", &[], &[("x.com/te am", &["a"])]), "invalid path");
        refused(identity("bøb", &[], &[]), "printable ASCII");
        refused(identity("system:serviceaccount:team", &["system:serviceaccounts"], &[]), "well-formed");
        // Named like a ServiceAccount by another authenticator: not the ServiceAccount.
        refused(
            identity("system:serviceaccount:team:agent", &["oidc:devs"], &[]),
            "system:serviceaccounts group",
        );
        refused(identity("", &[], &[]), "no username");
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
