//! Open connections, and whom each is charged to. A new connection is charged to its peer's address until
//! a request on it authenticates; from then on to that caller (and its tenant). So a caller's held
//! connections count against its own share, not against its neighbours' addresses, and what an address
//! can hold is only what has not yet shown a token, each for at most [`HEADER_READ_TIMEOUT`].
//!
//! An address (an IPv6 address's whole /64) has a share of the connections not yet bound to a caller.
//! Its connections beyond that share wait their turn (for [`UNBOUND_WAIT`] at most) instead of
//! being closed: a burst from one address (a flood, or a proxy for many agents) is read as fast as the ones
//! before it authenticate, and an agent sharing the address with a flood waits milliseconds, not forever.
//!
//! A connection whose request head has arrived whole does not wait for a turn: it is read at once (hyper
//! reads it in one go and it authenticates or is refused within milliseconds), so an agent is answered
//! however many connections dribble their headers. And when every connection is open, a new one closes the
//! one that has waited longest without a request in flight or a caller (the flood's oldest), else the
//! unbound one serving longest (a client pipelining requests it never reads the answers to), instead of
//! being closed itself: a flood from many addresses holds the server, but cannot keep a caller out.
//!
//! [`HEADER_READ_TIMEOUT`]: super::HEADER_READ_TIMEOUT

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
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

/// The connections that may be closed to make room for a new one, oldest first, each with what closes it:
/// the unbound ones without a request in flight first, then unbound ones serving (a request no caller
/// has shown a token for: a probe, a scrape, or a client that pipelines requests and never reads the
/// answers, which would otherwise hold its place for ever). A caller's connection is never among them.
#[derive(Clone, Default)]
struct Idle(Arc<Mutex<IdleOrder>>);

#[derive(Default)]
struct IdleOrder {
    entered: u64,
    idle: BTreeMap<u64, CancellationToken>,
    serving: BTreeMap<u64, CancellationToken>,
}

impl IdleOrder {
    fn line(&mut self, line: Line) -> &mut BTreeMap<u64, CancellationToken> {
        match line {
            Line::Idle => &mut self.idle,
            Line::Serving => &mut self.serving,
        }
    }
}

/// Which of the two lines a connection waits in to be closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Line {
    Idle,
    Serving,
}

impl Idle {
    fn lock(&self) -> MutexGuard<'_, IdleOrder> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes the connection idle longest, else the unbound one serving longest; false when none may be
    /// closed (every connection is a caller's).
    fn close_oldest(&self) -> bool {
        let mut order = self.lock();
        let oldest = order.idle.pop_first().or_else(|| order.serving.pop_first());
        oldest.map(|(_, close)| close.cancel()).is_some()
    }
}

/// A connection's place among those that may be closed, while it has one.
struct Place {
    idle: Idle,
    close: CancellationToken,
    at: Option<(u64, Line)>,
}

impl Place {
    fn new(idle: Idle) -> Self {
        let mut place = Place { idle, close: CancellationToken::new(), at: None };
        place.enter(Line::Idle);
        place
    }

    /// Last in `line` to be closed (where it is already, it keeps its place).
    fn enter(&mut self, line: Line) {
        if self.at.is_some_and(|(_, now)| now == line) {
            return;
        }
        self.leave();
        let mut order = self.idle.lock();
        order.entered += 1;
        let at = order.entered;
        order.line(line).insert(at, self.close.clone());
        self.at = Some((at, line));
    }

    /// A request has started: the connection moves to the serving line, unless it has left both (bound).
    fn serve(&mut self) {
        if self.at.is_some() {
            self.enter(Line::Serving);
        }
    }

    fn leave(&mut self) {
        if let Some((at, line)) = self.at.take() {
            self.idle.lock().line(line).remove(&at);
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.leave();
    }
}

/// The source an address's connections are charged to: an IPv4 address, or the /64 an IPv6 address is
/// in (one subscriber, one host, is given a whole /64 and may open connections from every address of it).
/// An IPv4-mapped IPv6 address is its IPv4 address.
fn source(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        },
        v4 => v4,
    }
}

/// One unbound connection of a source ([`source`]), counted while it lasts.
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
    /// Kept open after its answers while unbound: set when a request passed without a caller (`--auth none`).
    kept: AtomicBool,
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

/// A request in flight on a connection: while one is, an unbound connection is closed for a new one only
/// once no connection is idle.
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
        let peer = source(peer);
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
            kept: AtomicBool::new(false),
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
        charge.place.serve();
        Serving(self.clone())
    }

    /// Whether a caller has been charged with it.
    pub fn is_bound(&self) -> bool {
        self.charge().bound.is_some()
    }

    /// Keeps this unbound connection open after its answers: a request passed on it with no caller to
    /// charge (under `--auth none`, a loopback listener). It stays charged to its address and among those
    /// closed first for a newer connection, so keeping it alive holds no place a caller needs.
    pub fn keep(&self) {
        self.kept.store(true, Ordering::Relaxed);
    }

    /// Whether its answers leave it open: a caller is charged with it, or it was kept.
    pub fn stays_open(&self) -> bool {
        self.kept.load(Ordering::Relaxed) || self.is_bound()
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
            charge.place.enter(Line::Idle);
        }
    }
}

#[cfg(test)]
mod tests;
