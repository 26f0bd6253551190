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
async fn open_from(connections: &Connections, ip: IpAddr, n: usize) -> (Vec<Arc<Connection>>, Vec<Accepted>) {
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
async fn the_addresses_of_one_ipv6_slash_64_share_one_share() {
    let connections = Connections::new(caps());
    let in_64 = |host: u16| IpAddr::from([0x2001, 0xdb8, 0, 7, 0, 0, 0, host]);
    let mut held = Vec::new();
    for host in 1..=6 {
        held.push(connections.accept(in_64(host)).expect("within the /64's share and waiting room"));
    }
    assert!(
        connections.accept(in_64(7)).is_none(),
        "a seventh address of the same /64 is one source too many"
    );
    assert!(
        connections.accept(IpAddr::from([0x2001, 0xdb8, 0, 8, 0, 0, 0, 1])).is_some(),
        "the next /64 is another"
    );
    // An IPv4-mapped address is its IPv4 address.
    let mapped = IpAddr::from(std::net::Ipv4Addr::new(127, 0, 0, 5).to_ipv6_mapped());
    assert_eq!(source(mapped), ip(5));
    drop(held);
    assert!(connections.accept(in_64(7)).is_some(), "the share comes back as its connections close");
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
async fn at_the_cap_a_new_connection_closes_the_oldest_idle_then_serving_one_never_a_callers() {
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
    // Now nothing is idle (a caller's, and two serving): the unbound one serving longest is closed,
    // never the caller's (a client that pipelines and never reads holds no place for ever).
    let serving = newcomer.serving();
    assert!(connections.accept(ip(9)).is_some(), "accepted in place of the oldest serving one");
    assert!(busy.closed().is_cancelled() && !newcomer.closed().is_cancelled());
    assert!(!caller.closed().is_cancelled());
    // Once its request ends, a connection is idle again, and first in line.
    drop(serving);
    assert!(connections.accept(ip(9)).is_some());
    assert!(newcomer.closed().is_cancelled());
    assert!(!caller.closed().is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn when_every_connection_is_a_callers_a_new_one_is_refused() {
    let connections = Connections::new(Caps { all: 2, ..caps() });
    let (opened, _) = open_from(&connections, ip(2), 2).await;
    for (i, c) in opened.iter().enumerate() {
        assert!(c.bind(&Caller::of(&format!("system:serviceaccount:a:x{i}"))));
    }
    let _serving = opened[0].serving();
    assert!(connections.accept(ip(9)).is_none());
    assert!(opened.iter().all(|c| !c.closed().is_cancelled()));
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
