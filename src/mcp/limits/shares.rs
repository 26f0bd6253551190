//! Fair shares: how many requests in flight (and, in `connections`, connections) each caller, each tenant
//! and everyone together may hold at once. A share is counted, not reserved: taking one checks every
//! cap it falls under at once, and dropping it gives all back. Only keys holding something are kept, so the
//! ledger is as large as what is in flight.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use super::{REQUESTS_IN_FLIGHT, REQUESTS_PER_CALLER, REQUESTS_PER_TENANT};

/// Whom a request or a connection is charged to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    /// Everyone together.
    All,
    /// One caller, by username.
    Caller(String),
    /// The callers of one tenant (see [`Caller`]).
    Tenant(String),
}

/// A caller as shares see it: its username, and its tenant. The ServiceAccounts of a namespace are one
/// tenant, because whoever may edit the namespace can create ServiceAccounts there and tokens for them:
/// minting identities must not multiply shares. Any other user is a tenant of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    name: String,
    tenant: String,
}

impl Caller {
    pub fn of(username: &str) -> Caller {
        let namespace = username.strip_prefix("system:serviceaccount:").and_then(|rest| rest.split_once(':'));
        let tenant =
            namespace.map_or_else(|| username.to_string(), |(ns, _)| format!("system:serviceaccount:{ns}"));
        Caller { name: username.to_string(), tenant }
    }

    pub fn key(&self) -> Key {
        Key::Caller(self.name.clone())
    }

    pub fn tenant_key(&self) -> Key {
        Key::Tenant(self.tenant.clone())
    }
}

/// How much each key holds.
#[derive(Clone, Default)]
pub(crate) struct Ledger(Arc<Mutex<HashMap<Key, usize>>>);

/// A share taken from a [`Ledger`]: given back when dropped.
pub(crate) struct Held {
    ledger: Ledger,
    keys: Vec<Key>,
}

impl Ledger {
    fn lock(&self) -> MutexGuard<'_, HashMap<Key, usize>> {
        // A panic while holding the lock left the counts consistent (each update is one statement).
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One more for every key, if none is at its cap; else nothing.
    pub fn take(&self, wants: &[(Key, usize)]) -> Option<Held> {
        let mut counts = self.lock();
        if wants.iter().any(|(key, cap)| counts.get(key).copied().unwrap_or(0) >= *cap) {
            return None;
        }
        for (key, _) in wants {
            *counts.entry(key.clone()).or_default() += 1;
        }
        Some(Held { ledger: self.clone(), keys: wants.iter().map(|(key, _)| key.clone()).collect() })
    }

    /// What `key` holds now.
    #[cfg(test)]
    pub fn held(&self, key: &Key) -> usize {
        self.lock().get(key).copied().unwrap_or(0)
    }

    #[cfg(test)]
    fn keys(&self) -> usize {
        self.lock().len()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut counts = self.ledger.lock();
        for key in &self.keys {
            if let Some(count) = counts.get_mut(key) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    counts.remove(key);
                }
            }
        }
    }
}

/// The requests in flight on `/mcp`.
#[derive(Clone)]
pub(crate) struct InFlight {
    ledger: Ledger,
    all: usize,
    tenant: usize,
    caller: usize,
}

impl Default for InFlight {
    fn default() -> Self {
        Self::new(REQUESTS_IN_FLIGHT, REQUESTS_PER_TENANT, REQUESTS_PER_CALLER)
    }
}

impl InFlight {
    pub fn new(all: usize, tenant: usize, caller: usize) -> Self {
        Self { ledger: Ledger::default(), all, tenant, caller }
    }

    /// A slot for a request of `caller` (None: authentication is off, and there is no one to charge but
    /// everyone), or None when the caller, its tenant or the server is at its cap.
    pub fn take(&self, caller: Option<&Caller>) -> Option<Held> {
        match caller {
            Some(c) => self.ledger.take(&[
                (c.key(), self.caller),
                (c.tenant_key(), self.tenant),
                (Key::All, self.all),
            ]),
            None => self.ledger.take(&[(Key::All, self.all)]),
        }
    }

    /// Requests in flight now, all callers together.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.ledger.held(&Key::All)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(namespace: &str, name: &str) -> Caller {
        Caller::of(&format!("system:serviceaccount:{namespace}:{name}"))
    }

    #[test]
    fn serviceaccounts_of_a_namespace_are_one_tenant_and_users_their_own() {
        assert_eq!(sa("team", "a").tenant_key(), sa("team", "b").tenant_key());
        assert_ne!(sa("team", "a").key(), sa("team", "b").key());
        assert_ne!(sa("team", "a").tenant_key(), sa("other", "a").tenant_key());
        let alice = Caller::of("alice@example.com");
        assert_eq!(alice.tenant_key(), Key::Tenant("alice@example.com".into()));
        // A user named like a ServiceAccount prefix without a name is still a user of its own.
        assert_eq!(
            Caller::of("system:serviceaccount:x").tenant_key(),
            Key::Tenant("system:serviceaccount:x".into())
        );
    }

    #[test]
    fn one_caller_takes_at_most_its_share_and_others_are_still_served() {
        let in_flight = InFlight::new(10, 6, 4);
        let attacker = sa("a", "x");
        let held: Vec<Held> = (0..100).filter_map(|_| in_flight.take(Some(&attacker))).collect();
        assert_eq!(held.len(), 4, "the caller's cap");
        // A neighbour in the same namespace gets what is left of the tenant's share; another tenant, its own.
        let neighbour: Vec<Held> = (0..100).filter_map(|_| in_flight.take(Some(&sa("a", "y")))).collect();
        assert_eq!(neighbour.len(), 2);
        let other: Vec<Held> = (0..100).filter_map(|_| in_flight.take(Some(&sa("b", "z")))).collect();
        assert_eq!(other.len(), 4);
        assert_eq!(in_flight.held(), 10);
        assert!(in_flight.take(Some(&sa("c", "w"))).is_none(), "the server's cap holds for everyone");
        assert!(in_flight.take(None).is_none());
        drop(held);
        assert_eq!(in_flight.held(), 6, "dropped shares are given back");
        assert!(in_flight.take(Some(&attacker)).is_some());
        drop((neighbour, other));
        assert_eq!(in_flight.ledger.keys(), 0, "only keys holding something are kept");
    }

    #[test]
    fn a_refused_take_takes_nothing() {
        let ledger = Ledger::default();
        let _full = ledger.take(&[(Key::All, 1)]).unwrap();
        let caller = Key::Caller("x".into());
        assert!(ledger.take(&[(caller.clone(), 5), (Key::All, 1)]).is_none());
        assert_eq!(ledger.held(&caller), 0);
    }
}
