//! Open connections, and whom each is charged to. A new connection is charged to its peer's address until
//! a request on it authenticates; from then on to that caller (and its tenant). So a caller's held
//! connections count against its own share, not against its neighbours' addresses, and what an address
//! can hold is only what has not yet shown a token, each for at most [`HEADER_READ_TIMEOUT`].
//!
//! An address's connections beyond its share wait their turn (for [`UNBOUND_WAIT`] at most) instead of
//! being closed: a burst from one address (a flood, or a proxy for many agents) is read as fast as the ones
//! before it authenticate, and an agent sharing the address with a flood waits milliseconds, not forever.
//!
//! [`HEADER_READ_TIMEOUT`]: super::HEADER_READ_TIMEOUT

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{
    CONNECTIONS, CONNECTIONS_PER_CALLER, CONNECTIONS_PER_TENANT, UNBOUND_CONNECTIONS,
    UNBOUND_CONNECTIONS_PER_PEER, UNBOUND_WAIT, UNBOUND_WAITING_PER_PEER,
    shares::{Caller, Held, Ledger},
};

/// The caps on a listener's connections.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caps {
    /// Open at once, whatever their state.
    pub all: usize,
    /// Read at once before a request authenticates on them, from all addresses...
    pub unbound: usize,
    /// ... and from one.
    pub unbound_per_peer: usize,
    /// Waiting to be read, from one address, and for how long.
    pub waiting_per_peer: usize,
    pub wait: Duration,
    /// Tied to one caller, and to one tenant's callers.
    pub per_caller: usize,
    pub per_tenant: usize,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            all: CONNECTIONS,
            unbound: UNBOUND_CONNECTIONS,
            unbound_per_peer: UNBOUND_CONNECTIONS_PER_PEER,
            waiting_per_peer: UNBOUND_WAITING_PER_PEER,
            wait: UNBOUND_WAIT,
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
    unbound: Arc<Semaphore>,
    peers: Peers,
    ledger: Ledger,
}

impl Default for Connections {
    fn default() -> Self {
        Self::new(Caps::default())
    }
}

/// The addresses with unbound connections (read or waiting): only those, so the map is as large as they.
#[derive(Clone, Default)]
struct Peers(Arc<Mutex<HashMap<IpAddr, Peer>>>);

struct Peer {
    /// Its share of connections read at once.
    read: Arc<Semaphore>,
    /// Its unbound connections, read or waiting.
    count: usize,
}

impl Peers {
    fn lock(&self) -> MutexGuard<'_, HashMap<IpAddr, Peer>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One unbound connection of an address, counted while it lasts.
struct PeerTicket {
    peers: Peers,
    ip: IpAddr,
}

impl Drop for PeerTicket {
    fn drop(&mut self) {
        let mut peers = self.peers.lock();
        if let Some(peer) = peers.get_mut(&self.ip) {
            peer.count = peer.count.saturating_sub(1);
            if peer.count == 0 {
                peers.remove(&self.ip);
            }
        }
    }
}

/// A connection accepted, waiting to be read.
pub(crate) struct Accepted {
    connections: Connections,
    ticket: PeerTicket,
    read: Arc<Semaphore>,
    open: OwnedSemaphorePermit,
}

/// One open connection, in its requests' extensions. Its charge is given back when the last of them and
/// the connection itself are gone.
pub(crate) struct Connection {
    caps: Caps,
    ledger: Ledger,
    charge: Mutex<Charge>,
    _open: OwnedSemaphorePermit,
}

/// What a connection is charged to: its address's share (and all addresses') until bound, then a caller's
/// and its tenant's.
struct Charge {
    _unbound: Option<(PeerTicket, OwnedSemaphorePermit, OwnedSemaphorePermit)>,
    bound: Option<Held>,
}

impl Connections {
    pub fn new(caps: Caps) -> Self {
        Self {
            caps,
            open: Arc::new(Semaphore::new(caps.all)),
            unbound: Arc::new(Semaphore::new(caps.unbound)),
            peers: Peers::default(),
            ledger: Ledger::default(),
        }
    }

    /// A new connection from `peer`, to be read once [`Accepted::admitted`]; None when it must be closed at
    /// once: the server is at its cap, or the address has as many connections read and waiting as it may.
    pub fn accept(&self, peer: IpAddr) -> Option<Accepted> {
        let open = self.open.clone().try_acquire_owned().ok()?;
        let mut peers = self.peers.lock();
        let limit = self.caps.unbound_per_peer + self.caps.waiting_per_peer;
        if peers.get(&peer).is_some_and(|p| p.count >= limit) {
            return None;
        }
        let entry = peers
            .entry(peer)
            .or_insert_with(|| Peer { read: Arc::new(Semaphore::new(self.caps.unbound_per_peer)), count: 0 });
        entry.count += 1;
        let read = entry.read.clone();
        drop(peers);
        let ticket = PeerTicket { peers: self.peers.clone(), ip: peer };
        Some(Accepted { connections: self.clone(), ticket, read, open })
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

impl Accepted {
    /// The connection, once its turn to be read has come (a slot of its address's share and one of all
    /// addresses'); None if it did not come within the caps' `wait`: the connection is then closed.
    pub async fn admitted(self) -> Option<Arc<Connection>> {
        let deadline = tokio::time::Instant::now() + self.connections.caps.wait;
        let own = tokio::time::timeout_at(deadline, self.read.acquire_owned()).await.ok()?.ok()?;
        let all = self.connections.unbound.clone();
        let all = tokio::time::timeout_at(deadline, all.acquire_owned()).await.ok()?.ok()?;
        Some(Arc::new(Connection {
            caps: self.connections.caps,
            ledger: self.connections.ledger.clone(),
            charge: Mutex::new(Charge { _unbound: Some((self.ticket, own, all)), bound: None }),
            _open: self.open,
        }))
    }
}

impl Connection {
    /// Charges this connection to `caller` from now on (a connection is charged to the first caller that
    /// authenticates on it). False when that caller or its tenant already holds its share of connections:
    /// this one is then closed after the answer to its request.
    pub fn bind(&self, caller: &Caller) -> bool {
        let mut charge = self.charge.lock().unwrap_or_else(PoisonError::into_inner);
        if charge.bound.is_some() {
            return true;
        }
        let wants = [(caller.key(), self.caps.per_caller), (caller.tenant_key(), self.caps.per_tenant)];
        match self.ledger.take(&wants) {
            Some(held) => {
                *charge = Charge { _unbound: None, bound: Some(held) };
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
        Caps {
            all: 10,
            unbound: 6,
            unbound_per_peer: 4,
            waiting_per_peer: 2,
            wait: Duration::from_secs(1),
            per_caller: 2,
            per_tenant: 3,
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    /// Connections from `ip` until one is refused at once, each admitted unless it would wait.
    async fn open_from(
        connections: &Connections,
        ip: IpAddr,
        n: usize,
    ) -> (Vec<Arc<Connection>>, Vec<Accepted>) {
        let (mut read, mut waiting) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let Some(accepted) = connections.accept(ip) else { break };
            if accepted.read.available_permits() > 0 && connections.unbound.available_permits() > 0 {
                read.push(accepted.admitted().await.unwrap());
            } else {
                waiting.push(accepted);
            }
        }
        (read, waiting)
    }

    #[tokio::test(start_paused = true)]
    async fn an_address_has_its_share_read_a_few_more_waiting_and_the_rest_closed() {
        let connections = Connections::new(caps());
        let (read, waiting) = open_from(&connections, ip(2), 10).await;
        assert_eq!((read.len(), waiting.len()), (4, 2), "its share read, two waiting, then closed at once");
        assert!(connections.accept(ip(2)).is_none());
        // Another address is read within what is left of all unbound connections.
        let (others, _) = open_from(&connections, ip(3), 2).await;
        assert_eq!(others.len(), 2);
        // A waiting connection is read as soon as one before it is bound to a caller.
        let mut waiting = waiting.into_iter();
        let next = tokio::spawn(waiting.next().unwrap().admitted());
        tokio::task::yield_now().await;
        assert!(!next.is_finished(), "still waiting for its turn");
        assert!(read[0].bind(&Caller::of("system:serviceaccount:a:x")));
        let _next = next.await.unwrap().expect("read once a slot was given back");
        // One whose turn does not come within the wait is closed (paused time: the runtime jumps to it).
        assert!(waiting.next().unwrap().admitted().await.is_none());
        assert_eq!(connections.open_now(), 7);
    }

    #[tokio::test]
    async fn a_caller_holds_at_most_its_share_of_connections_and_the_rest_close() {
        let connections = Connections::new(Caps { unbound_per_peer: 6, ..caps() });
        let attacker = Caller::of("system:serviceaccount:a:x");
        let (opened, _) = open_from(&connections, ip(2), 4).await;
        let bound: Vec<bool> = opened.iter().map(|c| c.bind(&attacker)).collect();
        assert_eq!(bound, [true, true, false, false], "two bound, the others to close after their request");
        assert!(opened[0].bind(&Caller::of("someone-else")), "a bound connection stays bound");
        // The tenant's third, and another tenant's share, are untouched.
        assert!(opened[2].bind(&Caller::of("system:serviceaccount:a:y")));
        assert!(opened[3].bind(&Caller::of("system:serviceaccount:b:z")));
        drop(opened);
        assert_eq!(connections.open_now(), 0);
        assert!(connections.peers.lock().is_empty(), "every charge is given back");
        assert_eq!(connections.unbound.available_permits(), 6);
    }

    #[tokio::test]
    async fn the_server_cap_holds_and_closing_waits_for_every_connection() {
        let connections = Connections::new(Caps { all: 3, ..caps() });
        let open: Vec<_> = (0..5).filter_map(|last| connections.accept(ip(last))).collect();
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
