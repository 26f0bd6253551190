//! Hostile HTTP clients of the MCP endpoint, over raw TCP, for the security suite and the bench: bodies
//! sent slowly, connections held open, headers dribbled, each from a loopback address of the test's
//! choosing (all of 127/8 is this machine, so 127.0.0.2 is another peer to the server).

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddr},
    time::Duration,
};

use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpSocket, TcpStream},
    time::Instant,
};

/// 127.0.0.1: where the test's other clients (reqwest) come from.
pub const HOME: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// `host:port` of an `http://host:port/...` URL.
pub fn addr_of(url: &str) -> SocketAddr {
    let authority = url.strip_prefix("http://").and_then(|rest| rest.split('/').next());
    authority.and_then(|a| a.parse().ok()).unwrap_or_else(|| panic!("{url}: not http://ip:port/..."))
}

/// A connection to `addr` from `source`.
pub async fn connect_from(source: Ipv4Addr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((source, 0)))?;
    socket.connect(addr).await
}

/// A JSON-RPC POST to `/mcp`, as `common::mcp::post` sends it: its head and its body apart, for the caller
/// to send as slowly as it likes.
pub fn post(
    addr: SocketAddr,
    token: Option<&str>,
    method: &str,
    name: &str,
    mut params: Value,
) -> (String, String) {
    params["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}});
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
    let mut head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMcp-Protocol-Version: 2026-07-28\r\n\
         Mcp-Method: {method}\r\nMcp-Name: {name}\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    head.push_str("\r\n");
    (head, body)
}

/// An answer: its status, and whether it said the connection closes after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub close: bool,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The next response on `stream`, read within `within`; None when the connection closed (or nothing came)
/// first.
pub async fn read_answer(stream: &mut TcpStream, within: Duration) -> Option<Answer> {
    let read = async {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let end = loop {
            if let Some(i) = find(&buf, b"\r\n\r\n") {
                break i + 4;
            }
            let n = stream.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let status = head.split(' ').nth(1)?.parse().ok()?;
        let header = |name: &str| head.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
        let length: usize = header("content-length:").and_then(|v| v.parse().ok()).unwrap_or(0);
        let close = header("connection:").is_some_and(|v| v.contains("close"));
        let mut have = buf.len() - end;
        while have < length {
            let n = stream.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
            have += n;
        }
        Some(Answer { status, close })
    };
    tokio::time::timeout(within, read).await.ok().flatten()
}

/// How long until the server closes `stream` (what it sends is read and dropped); None: still open after
/// `within`.
pub async fn closed_within(stream: &mut TcpStream, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    let drain = async {
        let mut chunk = [0u8; 4096];
        while stream.read(&mut chunk).await.is_ok_and(|n| n > 0) {}
    };
    tokio::time::timeout(within, drain).await.ok().map(|()| started.elapsed())
}

/// What a slow-body flood met.
#[derive(Debug, Default)]
pub struct SlowBodies {
    /// Answers, by status.
    pub statuses: BTreeMap<u16, usize>,
    /// The longest a body was held before its answer.
    pub longest: Duration,
    /// Connections closed without an answer (over a connection cap).
    pub unanswered: usize,
}

/// `workers` connections at a time from [`HOME`], each a `tools/call` as `token` whose body stops after its
/// first byte of those its `Content-Length` promised, until `until`. Holding a slot is the point, so a
/// worker refused with 503 (or a connection closed unanswered) comes back after a second, as `Retry-After`
/// says; one answered otherwise, at once.
pub async fn slow_bodies(url: &str, token: &str, workers: usize, until: Instant) -> SlowBodies {
    let addr = addr_of(url);
    let (head, body) =
        post(addr, Some(token), "tools/call", "list_rollouts", json!({"name": "list_rollouts"}));
    let first = format!("{head}{}", &body[..1]);
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let first = first.clone();
            tokio::spawn(async move {
                let mut seen = SlowBodies::default();
                while Instant::now() < until {
                    let sent = Instant::now();
                    let answer = match connect_from(HOME, addr).await {
                        Ok(mut stream) => match stream.write_all(first.as_bytes()).await {
                            Ok(()) => read_answer(&mut stream, Duration::from_secs(60)).await,
                            Err(_) => None,
                        },
                        Err(_) => None,
                    };
                    match answer {
                        Some(answer) => {
                            seen.longest = seen.longest.max(sent.elapsed());
                            *seen.statuses.entry(answer.status).or_default() += 1;
                        }
                        None => seen.unanswered += 1,
                    }
                    if answer.is_none_or(|a| a.status == 503) {
                        // The attacker's pacing, as told by Retry-After: not a wait for anything.
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
                seen
            })
        })
        .collect();
    let mut all = SlowBodies::default();
    for task in tasks {
        let seen = task.await.unwrap();
        all.longest = all.longest.max(seen.longest);
        all.unanswered += seen.unanswered;
        for (status, n) in seen.statuses {
            *all.statuses.entry(status).or_default() += n;
        }
    }
    all
}

/// A connection that sent one request and then nothing: its answer, and how long after it the server
/// closed the connection (None: still open after the wait).
#[derive(Clone, Copy, Debug)]
pub struct Held {
    pub answer: Option<Answer>,
    pub closed_after: Option<Duration>,
}

/// A connection that sent one request and waits for nothing more (None: it could not be opened or sent).
pub type Opened = Option<(TcpStream, Option<Answer>)>;

/// `n` connections from `source`, opened one after another, each sending one `tools/list` as `token` and
/// reading its answer, then nothing more.
pub async fn open_idle(url: &str, token: &str, source: Ipv4Addr, n: usize) -> Vec<Opened> {
    let addr = addr_of(url);
    let (head, body) = post(addr, Some(token), "tools/list", "", json!({}));
    let mut opened = Vec::new();
    for _ in 0..n {
        let Ok(mut stream) = connect_from(source, addr).await else {
            opened.push(None);
            continue;
        };
        let answer = match stream.write_all(format!("{head}{body}").as_bytes()).await {
            Ok(()) => read_answer(&mut stream, Duration::from_secs(30)).await,
            Err(_) => None,
        };
        opened.push(Some((stream, answer)));
    }
    opened
}

/// The connections of [`open_idle`], each watched until the server closes it (at most `wait`).
pub async fn watch_idle(opened: Vec<Opened>, wait: Duration) -> Vec<Held> {
    let watched: Vec<_> = opened
        .into_iter()
        .map(|opened| {
            tokio::spawn(async move {
                let Some((mut stream, answer)) = opened else {
                    return Held { answer: None, closed_after: Some(Duration::ZERO) };
                };
                Held { answer, closed_after: closed_within(&mut stream, wait).await }
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in watched {
        all.push(task.await.unwrap());
    }
    all
}

/// `n` connections from `source` that send nothing: for each, how long from connecting until the server
/// closed it (None: still open after `wait`; zero: it could not connect).
pub async fn silent_connections(
    addr: SocketAddr,
    source: Ipv4Addr,
    n: usize,
    wait: Duration,
) -> Vec<Option<Duration>> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            tokio::spawn(async move {
                let Ok(mut stream) = connect_from(source, addr).await else { return Some(Duration::ZERO) };
                closed_within(&mut stream, wait).await
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.push(task.await.unwrap());
    }
    all
}

/// A client from `source` sending a request's headers a byte every `every`, never finishing them: how
/// long until the server cut it off (None: not within `wait`).
pub async fn slow_headers(
    addr: SocketAddr,
    source: Ipv4Addr,
    every: Duration,
    wait: Duration,
) -> Option<Duration> {
    let mut stream = connect_from(source, addr).await.ok()?;
    let started = Instant::now();
    tokio::time::timeout(wait, dribble_until_cut(&mut stream, addr, every))
        .await
        .ok()
        .map(|()| started.elapsed())
}

/// Sends a `/mcp` request's headers on `stream` a byte every `every`, never finishing them, until the
/// server cuts the connection off.
async fn dribble_until_cut(stream: &mut TcpStream, addr: SocketAddr, every: Duration) {
    let (mut reader, mut writer) = stream.split();
    let head = format!("POST /mcp HTTP/1.1\r\nHost: {addr}\r\nX-Padding: ");
    let dribble = async {
        for byte in head.bytes().chain(std::iter::repeat(b'a')) {
            if writer.write_all(&[byte]).await.is_err() {
                return;
            }
            // The attacker's pacing: not a wait for anything.
            tokio::time::sleep(every).await;
        }
    };
    let closed = async {
        let mut chunk = [0u8; 1024];
        while reader.read(&mut chunk).await.is_ok_and(|n| n > 0) {}
    };
    tokio::select! {
        () = dribble => {}
        () = closed => {}
    }
}

/// A POST from `source` with a bearer token no one issued, whose body stops after its first byte: its
/// answer and when it came, and when the server closed the connection.
pub async fn unauthenticated_slow_body(
    addr: SocketAddr,
    source: Ipv4Addr,
) -> (Option<Answer>, Duration, Option<Duration>) {
    let Ok(mut stream) = connect_from(source, addr).await else { return (None, Duration::ZERO, None) };
    let (head, body) = post(addr, Some("not-a-token-anyone-issued"), "tools/list", "", json!({}));
    let started = Instant::now();
    if stream.write_all(format!("{head}{}", &body[..1]).as_bytes()).await.is_err() {
        return (None, Duration::ZERO, None);
    }
    let answer = read_answer(&mut stream, Duration::from_secs(60)).await;
    let answered = started.elapsed();
    let closed = closed_within(&mut stream, Duration::from_secs(60)).await.map(|_| started.elapsed());
    (answer, answered, closed)
}

/// What a slow-header flood did: connections it opened, and how many of them the server closed (or
/// refused) before the flood ended.
#[derive(Debug, Default, Clone, Copy)]
pub struct HeaderFlood {
    pub opened: usize,
    pub closed: usize,
}

/// `per_source` connections from each of `sources`, each sending a `/mcp` request's headers a byte every
/// `every` and never finishing them, each opened again as soon as the server closes it, until `until`:
/// as many addresses as a botnet (or a NAT'd fleet) would come from.
pub async fn slow_header_flood(
    addr: SocketAddr,
    sources: &[Ipv4Addr],
    per_source: usize,
    every: Duration,
    until: Instant,
) -> HeaderFlood {
    let workers: Vec<_> = sources
        .iter()
        .flat_map(|source| std::iter::repeat_n(*source, per_source))
        .map(|source| tokio::spawn(dribbler(addr, source, every, until)))
        .collect();
    let mut flood = HeaderFlood::default();
    for worker in workers {
        let (opened, closed) = worker.await.unwrap_or_default();
        flood.opened += opened;
        flood.closed += closed;
    }
    flood
}

/// One of [`slow_header_flood`]'s connections, again and again: (opened, closed by the server).
async fn dribbler(addr: SocketAddr, source: Ipv4Addr, every: Duration, until: Instant) -> (usize, usize) {
    let (mut opened, mut closed) = (0, 0);
    while Instant::now() < until {
        let Ok(mut stream) = connect_from(source, addr).await else {
            closed += 1;
            // The attacker's pacing before it tries again: not a wait for anything.
            tokio::time::sleep(every).await;
            continue;
        };
        opened += 1;
        match tokio::time::timeout_at(until, dribble_until_cut(&mut stream, addr, every)).await {
            Ok(()) => closed += 1,
            Err(_) => break,
        }
    }
    (opened, closed)
}

/// `per_source` connections from each of `sources`, each sending `pipelined` requests for `path` in one
/// write on a small receive window and never reading an answer, each opened again once the server closes
/// it, until `until`: a client that keeps its connection serving for as long as the server lets it.
pub async fn unread_pipeline_flood(
    addr: SocketAddr,
    sources: &[Ipv4Addr],
    per_source: usize,
    path: &str,
    pipelined: usize,
    until: Instant,
) -> HeaderFlood {
    let requests = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").repeat(pipelined);
    let workers: Vec<_> = sources
        .iter()
        .flat_map(|source| std::iter::repeat_n(*source, per_source))
        .map(|source| tokio::spawn(never_reader(addr, source, requests.clone(), until)))
        .collect();
    let mut flood = HeaderFlood::default();
    for worker in workers {
        let (opened, closed) = worker.await.unwrap_or_default();
        flood.opened += opened;
        flood.closed += closed;
    }
    flood
}

/// One of [`unread_pipeline_flood`]'s connections, again and again: (opened, closed by the server).
async fn never_reader(
    addr: SocketAddr,
    source: Ipv4Addr,
    requests: String,
    until: Instant,
) -> (usize, usize) {
    let (mut opened, mut closed) = (0, 0);
    while Instant::now() < until {
        let connected = async {
            let socket = TcpSocket::new_v4()?;
            // The kernel's least: the answers fill it at once, and the server's send buffer after it.
            socket.set_recv_buffer_size(1)?;
            socket.bind(SocketAddr::from((source, 0)))?;
            socket.connect(addr).await
        };
        let Ok(mut stream) = connected.await else {
            closed += 1;
            // The attacker's pacing before it tries again: not a wait for anything.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        opened += 1;
        if stream.write_all(requests.as_bytes()).await.is_err() {
            closed += 1;
            continue;
        }
        // Never read: learn that the server closed from a write failing (its RST), a blank line (which a
        // server skips between requests) at a time, never waiting on a full window.
        let closed_by_server = async {
            loop {
                match stream.try_write(b"\r\n") {
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => return,
                }
                // The attacker's pacing between probes of its own connection: not a wait for anything.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        match tokio::time::timeout_at(until, closed_by_server).await {
            Ok(()) => closed += 1,
            Err(_) => break,
        }
    }
    (opened, closed)
}
