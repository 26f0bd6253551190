//! Open connections, and whom each is charged to. A new connection is charged to its peer's address until
//! a request on it authenticates; from then on to that caller (and its tenant). So a caller's held
//! connections count against its own share, not against its neighbours' addresses, and what an address
//! can hold is only what has not yet shown a token, each for at most [`HEADER_READ_TIMEOUT`].
//!
//! [`HEADER_READ_TIMEOUT`]: super::HEADER_READ_TIMEOUT

use std::{
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError},
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{
    CONNECTIONS, CONNECTIONS_PER_CALLER, CONNECTIONS_PER_TENANT, UNBOUND_CONNECTIONS,
    UNBOUND_CONNECTIONS_PER_PEER,
    shares::{Caller, Held, Key, Ledger},
};

/// The caps on a listener's connections.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caps {
    pub all: usize,
    pub unbound: usize,
    pub unbound_per_peer: usize,
    pub per_caller: usize,
    pub per_tenant: usize,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            all: CONNECTIONS,
            unbound: UNBOUND_CONNECTIONS,
            unbound_per_peer: UNBOUND_CONNECTIONS_PER_PEER,
            per_caller: CONNECTIONS_PER_CALLER,
            per_tenant: CONNECTIONS_PER_TENANT,
        }
    }
}

/// A listener's connections.
#[derive(Clone)]
pub(crate) struct Connections {
    caps: Caps,
    open: Arc<Semaphore>,
    ledger: Ledger,
}

impl Default for Connections {
    fn default() -> Self {
        Self::new(Caps::default())
    }
}

/// One open connection, in its requests' extensions. Its charge is given back when the last of them and
/// the connection itself are gone.
pub(crate) struct Connection {
    caps: Caps,
    ledger: Ledger,
    charge: Mutex<Charge>,
    _open: OwnedSemaphorePermit,
}

/// What a connection is charged to: its peer's address (and all unbound connections) until bound, then a
/// caller and its tenant.
struct Charge {
    _held: Held,
    bound: bool,
}

impl Connections {
    pub fn new(caps: Caps) -> Self {
        Self { caps, open: Arc::new(Semaphore::new(caps.all)), ledger: Ledger::default() }
    }

    /// A new connection from `peer`, or None when it must be closed at once: the server, all unbound
    /// connections or this address's are at their cap.
    pub fn open(&self, peer: IpAddr) -> Option<Arc<Connection>> {
        let open = self.open.clone().try_acquire_owned().ok()?;
        let unbound = self
            .ledger
            .take(&[(Key::Peer(peer), self.caps.unbound_per_peer), (Key::Unbound, self.caps.unbound)])?;
        Some(Arc::new(Connection {
            caps: self.caps,
            ledger: self.ledger.clone(),
            charge: Mutex::new(Charge { _held: unbound, bound: false }),
            _open: open,
        }))
    }

    /// Connections open now.
    pub fn open_now(&self) -> usize {
        self.caps.all - self.open.available_permits()
    }

    /// Waits until every connection is closed.
    pub async fn all_closed(&self) {
        let all = u32::try_from(self.caps.all).unwrap_or(u32::MAX);
        let _ = self.open.acquire_many(all).await;
    }
}

impl Connection {
    /// Charges this connection to `caller` from now on (a connection is charged to the first caller that
    /// authenticates on it). False when that caller or its tenant already holds its share of connections:
    /// this one is then closed after the answer to its request.
    pub fn bind(&self, caller: &Caller) -> bool {
        let mut charge = self.charge.lock().unwrap_or_else(PoisonError::into_inner);
        if charge.bound {
            return true;
        }
        let wants = [(caller.key(), self.caps.per_caller), (caller.tenant_key(), self.caps.per_tenant)];
        match self.ledger.take(&wants) {
            Some(held) => {
                *charge = Charge { _held: held, bound: true };
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> Caps {
        Caps { all: 10, unbound: 6, unbound_per_peer: 4, per_caller: 2, per_tenant: 3 }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn an_address_holds_at_most_its_share_of_unbound_connections() {
        let connections = Connections::new(caps());
        let from_one: Vec<_> = (0..10).filter_map(|_| connections.open(ip(2))).collect();
        assert_eq!(from_one.len(), 4, "the peer's cap");
        let from_two: Vec<_> = (0..10).filter_map(|_| connections.open(ip(3))).collect();
        assert_eq!(from_two.len(), 2, "what is left of the unbound cap");
        assert!(connections.open(ip(4)).is_none());
        // Bound to callers, they no longer count against their addresses.
        let callers = [Caller::of("system:serviceaccount:a:x"), Caller::of("system:serviceaccount:b:y")];
        assert!(from_one[0].bind(&callers[0]) && from_one[1].bind(&callers[1]));
        assert_eq!(connections.ledger.held(&Key::Peer(ip(2))), 2);
        let again: Vec<_> = (0..10).filter_map(|_| connections.open(ip(4))).collect();
        assert_eq!(again.len(), 2, "room made by binding");
        assert_eq!(connections.open_now(), 8);
    }

    #[test]
    fn a_caller_holds_at_most_its_share_of_connections_and_the_rest_close() {
        let connections = Connections::new(caps());
        let attacker = Caller::of("system:serviceaccount:a:x");
        let opened: Vec<_> = (0..4).filter_map(|_| connections.open(ip(2))).collect();
        let bound: Vec<bool> = opened.iter().map(|c| c.bind(&attacker)).collect();
        assert_eq!(bound, [true, true, false, false], "two bound, the others to close after their request");
        assert!(opened[0].bind(&Caller::of("someone-else")), "a bound connection stays bound");
        // The tenant's third, and another tenant's share, are untouched.
        assert!(opened[2].bind(&Caller::of("system:serviceaccount:a:y")));
        assert!(opened[3].bind(&Caller::of("system:serviceaccount:b:z")));
        drop(opened);
        assert_eq!(connections.open_now(), 0);
        assert_eq!(connections.ledger.held(&Key::Unbound), 0, "every charge is given back");
    }

    #[tokio::test]
    async fn the_server_cap_holds_and_closing_waits_for_every_connection() {
        let connections = Connections::new(Caps { all: 3, ..caps() });
        let open: Vec<_> = (0..5).filter_map(|last| connections.open(ip(last))).collect();
        assert_eq!(open.len(), 3);
        let waiting = tokio::spawn({
            let connections = connections.clone();
            async move { connections.all_closed().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(open);
        waiting.await.unwrap();
    }
}
