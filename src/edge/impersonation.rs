//! Clients that act as someone else through Kubernetes constrained impersonation: the MCP server's
//! writes as its caller, the operator's changes to targets as a rollout's recorded creator. Who may be
//! impersonated, and how, is decided in [`crate::core::identity`]; kube's own code puts the
//! `Impersonate-*` headers on.

use std::{num::NonZeroUsize, sync::Arc};

use kube::Client;

use crate::{api::Creator, core::identity::Impersonation};

/// Sets an impersonation on a client configuration.
pub fn apply(imp: Impersonation, config: &mut kube::Config) {
    let auth = &mut config.auth_info;
    auth.impersonate = Some(imp.user);
    auth.impersonate_uid = imp.uid;
    auth.impersonate_groups = (!imp.groups.is_empty()).then_some(imp.groups);
    auth.impersonate_user_extra = (!imp.extra.is_empty()).then(|| imp.extra.into_iter().collect());
}

/// A client derived from `base` that acts as `imp`.
pub fn client(base: &kube::Config, imp: Impersonation) -> Result<Client, kube::Error> {
    let mut config = base.clone();
    apply(imp, &mut config);
    Client::try_from(config)
}

/// Whose rights the operator's changes to targets in its own cluster are made with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ActAs {
    /// The rollout's recorded creator, impersonated: RBAC, admission and the audit log see the creator,
    /// and the operator itself needs no right to change targets.
    #[default]
    Creator,
    /// The operator's own ServiceAccount, as before creators were recorded (the chart's `actAs: operator`
    /// grants it the rights to patch workloads, update DaemonSets and delete pods).
    Operator,
}

/// How many creators' clients are kept, the least recently used going first: each holds a connection pool,
/// and a fleet has a few creators.
const CLIENTS_KEPT: NonZeroUsize = match NonZeroUsize::new(64) {
    Some(n) => n,
    None => NonZeroUsize::MIN,
};

/// The clients the operator changes targets with, one per creator, kept between batches.
pub struct Writers {
    act_as: ActAs,
    own: Client,
    base: Arc<kube::Config>,
    clients: std::sync::Mutex<lru::LruCache<Impersonation, Client>>,
}

impl Writers {
    pub fn new(act_as: ActAs, own: Client, base: kube::Config) -> Self {
        let clients = std::sync::Mutex::new(lru::LruCache::new(CLIENTS_KEPT));
        Self { act_as, own, base: Arc::new(base), clients }
    }

    /// Why changes cannot be made for a rollout created by `creator`; None when they can.
    pub fn cannot_act(&self, creator: Option<&Creator>) -> Option<String> {
        match self.act_as {
            ActAs::Operator => None,
            ActAs::Creator => Impersonation::of_creator(creator).err(),
        }
    }

    /// The client to change a rollout's targets with, or why there is none.
    pub fn for_creator(&self, creator: Option<&Creator>) -> Result<Client, String> {
        if self.act_as == ActAs::Operator {
            return Ok(self.own.clone());
        }
        let imp = Impersonation::of_creator(creator)?;
        // A panic elsewhere while holding the lock must not stop every later change.
        let lock = || self.clients.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(found) = lock().get(&imp) {
            return Ok(found.clone());
        }
        // Built outside the lock: a client is a TLS configuration and a connection pool.
        let made =
            client(&self.base, imp.clone()).map_err(|e| format!("cannot act as {:?}: {e}", imp.user))?;
        lock().put(imp, made.clone());
        Ok(made)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> kube::Config {
        kube::Config::new("http://127.0.0.1:9".parse().unwrap())
    }

    #[test]
    fn a_serviceaccount_is_impersonated_by_its_username_only() {
        let imp = Impersonation {
            user: "system:serviceaccount:team:agent".into(),
            uid: None,
            groups: vec![],
            extra: Default::default(),
        };
        let mut config = config();
        apply(imp, &mut config);
        let auth = &config.auth_info;
        assert_eq!(auth.impersonate.as_deref(), Some("system:serviceaccount:team:agent"));
        assert_eq!(auth.impersonate_uid, None, "serviceaccount mode forbids a uid");
        assert_eq!(auth.impersonate_groups, None, "serviceaccount mode forbids groups");
        assert_eq!(auth.impersonate_user_extra, None, "serviceaccount mode forbids extra");
    }

    #[test]
    fn a_user_is_impersonated_with_uid_groups_and_extra() {
        let imp = Impersonation {
            user: "alice".into(),
            uid: Some("uid-1".into()),
            groups: vec!["devs".into()],
            extra: [("example.com/team".to_string(), vec!["a".to_string(), "b".to_string()])].into(),
        };
        let mut config = config();
        apply(imp, &mut config);
        let auth = &config.auth_info;
        assert_eq!(auth.impersonate.as_deref(), Some("alice"));
        assert_eq!(auth.impersonate_uid.as_deref(), Some("uid-1"));
        assert_eq!(auth.impersonate_groups.as_deref(), Some(&["devs".to_string()][..]));
        assert_eq!(auth.impersonate_user_extra.as_ref().unwrap()["example.com/team"], ["a", "b"]);
    }

    #[tokio::test]
    async fn the_operator_acts_as_the_creator_unless_told_to_act_as_itself() {
        let own = Client::try_from(config()).unwrap();
        let agent = Creator {
            username: "system:serviceaccount:team:agent".into(),
            uid: "u".into(),
            groups: vec!["system:serviceaccounts".into()],
        };
        let root =
            Creator { username: "root".into(), uid: String::new(), groups: vec!["system:masters".into()] };
        let writers = Writers::new(ActAs::Creator, own.clone(), config());
        assert!(writers.cannot_act(Some(&agent)).is_none());
        assert!(writers.for_creator(Some(&agent)).is_ok());
        assert!(writers.for_creator(Some(&agent)).is_ok(), "from the cache the second time");
        assert_eq!(writers.clients.lock().unwrap().len(), 1);
        for i in 0..100 {
            let someone = Creator { username: format!("user-{i}"), ..Default::default() };
            assert!(writers.for_creator(Some(&someone)).is_ok());
        }
        assert_eq!(writers.clients.lock().unwrap().len(), CLIENTS_KEPT.get(), "bounded");
        assert!(writers.cannot_act(Some(&root)).unwrap().contains("system:masters"));
        assert!(writers.for_creator(None).err().unwrap().contains("no recorded creator"));
        let as_itself = Writers::new(ActAs::Operator, own, config());
        assert!(as_itself.cannot_act(None).is_none() && as_itself.for_creator(Some(&root)).is_ok());
    }
}
