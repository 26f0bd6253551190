//! Open connections, and whom each is charged to. A new connection is charged to its peer's address until
//! a request on it authenticates; from then on to that caller (and its tenant). So a caller's held
//! connections count against its own share, not against its neighbours' addresses, and what an address
//! can hold is only what has not yet shown a token, each for at most [`HEADER_READ_TIMEOUT`].
//!
//! An address's connections beyond its share wait their turn (for [`UNBOUND_WAIT`] at most) instead of
//! being closed: a burst from one address (a flood, or a proxy for many agents) is read as fast as the ones
//! before it authenticate, and an agent sharing the address with a flood waits milliseconds, not forever.
//!
//! A connection whose request head has arrived whole does not wait for a turn: it is read at once (hyper
//! reads it in one go and it authenticates or is refused within milliseconds), so an agent is answered
//! however many connections dribble their headers. And when every connection is open, a new one closes the
//! one that has waited longest without a request in flight or a caller (the flood's oldest), instead of
//! being closed itself: a flood from many addresses holds the server, but cannot keep a caller out.
//!
//! [`HEADER_READ_TIMEOUT`]: super::HEADER_READ_TIMEOUT

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

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
    idle: Idle,
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

/// The connections that may be closed to make room for a new one (unbound, no request in flight), oldest
/// first: each with what closes it.
#[derive(Clone, Default)]
struct Idle(Arc<Mutex<IdleOrder>>);

#[derive(Default)]
struct IdleOrder {
    entered: u64,
    order: BTreeMap<u64, CancellationToken>,
}

impl Idle {
    fn lock(&self) -> MutexGuard<'_, IdleOrder> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes the connection idle longest; false when none may be closed.
    fn close_oldest(&self) -> bool {
        self.lock().order.pop_first().map(|(_, close)| close.cancel()).is_some()
    }
}

/// A connection's place among the idle ones, while it has one.
struct Place {
    idle: Idle,
    close: CancellationToken,
    at: Option<u64>,
}

impl Place {
    fn new(idle: Idle) -> Self {
        let mut place = Place { idle, close: CancellationToken::new(), at: None };
        place.enter();
        place
    }

    /// Last in line to be closed.
    fn enter(&mut self) {
        if self.at.is_none() {
            let mut order = self.idle.lock();
            order.entered += 1;
            let at = order.entered;
            order.order.insert(at, self.close.clone());
            self.at = Some(at);
        }
    }

    fn leave(&mut self) {
        if let Some(at) = self.at.take() {
            self.idle.lock().order.remove(&at);
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.leave();
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
    /// None when it was accepted over the cap, in place of one it closed: it takes that one's slot.
    open: Option<OwnedSemaphorePermit>,
    place: Place,
}

/// How an accepted connection is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Its request head has arrived whole: read at once.
    HeadArrived,
    /// Read when a slot of its address's share and of all addresses' is free.
    Share,
}

/// One open connection, in its requests' extensions. Its charge is given back when the last of them and
/// the connection itself are gone.
pub(crate) struct Connection {
    caps: Caps,
    ledger: Ledger,
    charge: Mutex<Charge>,
    closed: CancellationToken,
    _open: OwnedSemaphorePermit,
}

/// What a connection is charged to: its address's share (and all addresses', unless its head arrived
/// whole) until bound, then a caller's and its tenant's; and its place among the idle.
struct Charge {
    _unbound: Option<(PeerTicket, Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)>)>,
    bound: Option<Held>,
    place: Place,
    serving: usize,
}

/// A request in flight on a connection: while one is, the connection is not closed for a new one.
pub(crate) struct Serving(Arc<Connection>);

impl Connections {
    pub fn new(caps: Caps) -> Self {
        Self {
            caps,
            open: Arc::new(Semaphore::new(caps.all)),
            unbound: Arc::new(Semaphore::new(caps.unbound)),
            peers: Peers::default(),
            ledger: Ledger::default(),
            idle: Idle::default(),
        }
    }

    /// A new connection from `peer`, to be read once [`Accepted::admitted`]; None when it must be closed at
    /// once: the address has as many connections read and waiting as it may, or the server is at its cap
    /// and every connection is bound or serving. At the cap otherwise, the oldest idle one is closed for it.
    pub fn accept(&self, peer: IpAddr) -> Option<Accepted> {
        let mut peers = self.peers.lock();
        let limit = self.caps.unbound_per_peer + self.caps.waiting_per_peer;
        if peers.get(&peer).is_some_and(|p| p.count >= limit) {
            return None;
        }
        let open = match self.open.clone().try_acquire_owned() {
            Ok(open) => Some(open),
            Err(_) if self.idle.close_oldest() => None,
            Err(_) => return None,
        };
        let entry = peers
            .entry(peer)
            .or_insert_with(|| Peer { read: Arc::new(Semaphore::new(self.caps.unbound_per_peer)), count: 0 });
        entry.count += 1;
        let read = entry.read.clone();
        drop(peers);
        let ticket = PeerTicket { peers: self.peers.clone(), ip: peer };
        let place = Place::new(self.idle.clone());
        Some(Accepted { connections: self.clone(), ticket, read, open, place })
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
    /// The connection, once its turn to be read has come: at once when `head_arrived` finds its request
    /// head whole (true) before a slot of its address's share and one of all addresses' are free; None if
    /// neither came within the caps' `wait`, the peer went away (`head_arrived` false) or the connection
    /// was closed for a newer one: it is then closed.
    pub async fn admitted(self, head_arrived: impl Future<Output = bool>) -> Option<(Arc<Connection>, Turn)> {
        let Accepted { connections, ticket, read, open, place } = self;
        let deadline = tokio::time::Instant::now() + connections.caps.wait;
        let closed = place.close.clone();
        let turn = async {
            let open = match open {
                Some(open) => open,
                None => connections.open.clone().acquire_owned().await.ok()?,
            };
            let shares = async {
                let own = read.acquire_owned().await.ok()?;
                Some((own, connections.unbound.clone().acquire_owned().await.ok()?))
            };
            let slots = tokio::select! {
                biased;
                arrived = head_arrived => arrived.then_some(None)?,
                slots = shares => Some(slots?),
            };
            Some((open, slots))
        };
        let (open, slots) = tokio::select! {
            turn = tokio::time::timeout_at(deadline, turn) => turn.ok().flatten()?,
            () = closed.cancelled() => return None,
        };
        let how = if slots.is_some() { Turn::Share } else { Turn::HeadArrived };
        let charge = Charge { _unbound: Some((ticket, slots)), bound: None, place, serving: 0 };
        let connection = Connection {
            caps: connections.caps,
            ledger: connections.ledger.clone(),
            charge: Mutex::new(charge),
            closed,
            _open: open,
        };
        Some((Arc::new(connection), how))
    }
}

impl Connection {
    fn charge(&self) -> MutexGuard<'_, Charge> {
        self.charge.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Cancelled when the connection is closed to make room for a newer one.
    pub fn closed(&self) -> &CancellationToken {
        &self.closed
    }

    /// Marks a request in flight until the guard is dropped.
    pub fn serving(self: &Arc<Self>) -> Serving {
        let mut charge = self.charge();
        charge.serving += 1;
        charge.place.leave();
        Serving(self.clone())
    }

    /// Charges this connection to `caller` from now on (a connection is charged to the first caller that
    /// authenticates on it). False when that caller or its tenant already holds its share of connections:
    /// this one is then closed after the answer to its request.
    pub fn bind(&self, caller: &Caller) -> bool {
        let mut charge = self.charge();
        if charge.bound.is_some() {
            return true;
        }
        let wants = [(caller.key(), self.caps.per_caller), (caller.tenant_key(), self.caps.per_tenant)];
        match self.ledger.take(&wants) {
            Some(held) => {
                (charge._unbound, charge.bound) = (None, Some(held));
                // A caller's connection is never closed for a newer one: its share bounds it.
                charge.place.leave();
                true
            }
            None => false,
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let mut charge = self.0.charge();
        charge.serving = charge.serving.saturating_sub(1);
        if charge.serving == 0 && charge.bound.is_none() {
            charge.place.enter();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::pending;

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
                read.push(accepted.admitted(pending()).await.unwrap().0);
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
        let next = tokio::spawn(waiting.next().unwrap().admitted(pending()));
        tokio::task::yield_now().await;
        assert!(!next.is_finished(), "still waiting for its turn");
        assert!(read[0].bind(&Caller::of("system:serviceaccount:a:x")));
        let _next = next.await.unwrap().expect("read once a slot was given back");
        // One whose turn does not come within the wait is closed (paused time: the runtime jumps to it).
        assert!(waiting.next().unwrap().admitted(pending()).await.is_none());
        assert_eq!(connections.open_now(), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_whose_head_arrived_is_read_at_once_however_full_the_shares() {
        let connections = Connections::new(caps());
        let (_read, waiting) = open_from(&connections, ip(2), 5).await;
        assert_eq!(waiting.len(), 1, "the address's share is full");
        let accepted = connections.accept(ip(2)).expect("one more may wait");
        let (_, turn) = accepted.admitted(std::future::ready(true)).await.expect("read at once");
        assert_eq!(turn, Turn::HeadArrived);
        assert_eq!(connections.unbound.available_permits(), 2, "it holds no slot of the shares");
        // One whose peer went away before its head arrived is closed.
        let gone = connections.accept(ip(3)).unwrap();
        assert!(gone.admitted(std::future::ready(false)).await.is_none());
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

    #[tokio::test(start_paused = true)]
    async fn at_the_cap_a_new_connection_closes_the_oldest_idle_one_never_a_callers() {
        let connections = Connections::new(Caps { all: 3, ..caps() });
        let (opened, _) = open_from(&connections, ip(2), 3).await;
        let Ok([caller, busy, idle]) = <[_; 3]>::try_from(opened) else { panic!("three opened") };
        assert!(caller.bind(&Caller::of("system:serviceaccount:a:x")), "the oldest is a caller's");
        let _busy = busy.serving();
        // Full: the one idle connection is closed for the newcomer, which takes its slot once it is gone.
        let newcomer = connections.accept(ip(9)).expect("accepted in place of the idle one");
        assert!(idle.closed().is_cancelled());
        assert!(!caller.closed().is_cancelled() && !busy.closed().is_cancelled());
        let admitted = tokio::spawn(newcomer.admitted(std::future::ready(true)));
        drop(idle);
        let (newcomer, _) = admitted.await.unwrap().expect("read once the closed one let go of its slot");
        // Now nothing is idle (a caller's, and two serving): a new connection is refused.
        let _serving = newcomer.serving();
        assert!(connections.accept(ip(9)).is_none(), "every connection is bound or serving");
        drop(_busy);
        assert!(connections.accept(ip(9)).is_some(), "once a request ends, its connection is idle again");
    }

    #[tokio::test]
    async fn closing_waits_for_every_connection() {
        let connections = Connections::new(Caps { all: 3, ..caps() });
        let open: Vec<_> = (0..3).filter_map(|last| connections.accept(ip(last))).collect();
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
