//! A TCP proxy in front of the test API server that a test can cut: every open connection closed and new ones
//! refused, as an API server restart looks to its clients, without disturbing the other tests that share the
//! API server.
//!
//! ```ignore
//! let proxy = Proxy::to_cluster(&cluster.kubeconfig).await;
//! let kubeconfig = proxy.kubeconfig_through(&cluster.kubeconfig);
//! let dashboard = Dashboard::start(&kubeconfig, &[]).await;
//! proxy.cut().await;   // its watches break
//! proxy.restore();     // and can come back
//! ```

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use kube::config::Kubeconfig;
use tokio::{
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
};

/// How long [`Proxy::cut`] may take to see every connection closed.
const CUT_DEADLINE: Duration = Duration::from_secs(10);

/// A proxy on 127.0.0.1:<free port> forwarding each connection to `upstream`, as bytes (TLS passes through
/// untouched). Its tasks run on the runtime that started it; stopped when dropped.
pub struct Proxy {
    addr: SocketAddr,
    upstream: String,
    /// True while cut.
    cut: watch::Sender<bool>,
    /// How many connections are open.
    open: watch::Sender<usize>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// A proxy to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy on 127.0.0.1:0");
        let addr = listener.local_addr().expect("the proxy's address");
        let (cut, _) = watch::channel(false);
        let (open, _) = watch::channel(0usize);
        let accept = tokio::spawn(accept_loop(listener, upstream.to_string(), cut.clone(), open.clone()));
        Proxy { addr, upstream: upstream.to_string(), cut, open, accept }
    }

    /// A proxy to the API server of `kubeconfig`'s current context.
    pub async fn to_cluster(kubeconfig: &Path) -> Proxy {
        let (_, server) = current_cluster(&read(kubeconfig));
        Proxy::start(&host_port(&server)).await
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every open connection and refuses new ones (accepts, then closes them at once) until
    /// [`Proxy::restore`]; returns once every connection is closed.
    pub async fn cut(&self) {
        self.cut.send_replace(true);
        let mut open = self.open.subscribe();
        let closed = tokio::time::timeout(CUT_DEADLINE, open.wait_for(|n| *n == 0)).await;
        assert!(
            matches!(closed, Ok(Ok(_))),
            "{} connections still open {CUT_DEADLINE:?} after the cut",
            *self.open.borrow()
        );
    }

    /// Forwards new connections again.
    pub fn restore(&self) {
        self.cut.send_replace(false);
    }

    /// How many connections are open now.
    pub fn open_connections(&self) -> usize {
        *self.open.borrow()
    }

    /// Waits until the number of open connections satisfies `ok`; panics after `deadline`, naming `what`.
    pub async fn wait_connections(&self, what: &str, deadline: Duration, ok: impl FnMut(&usize) -> bool) {
        let mut open = self.open.subscribe();
        let reached = tokio::time::timeout(deadline, open.wait_for(ok)).await;
        assert!(
            matches!(reached, Ok(Ok(_))),
            "timed out after {deadline:?} waiting for {what}: {} connections open",
            *self.open.borrow()
        );
    }

    /// How many connections are open once none has opened or closed for `quiet`; panics if that never
    /// happens within `deadline`.
    pub async fn settled_connections(&self, quiet: Duration, deadline: Duration) -> usize {
        let mut open = self.open.subscribe();
        let end = tokio::time::Instant::now() + deadline;
        loop {
            let seen = *open.borrow_and_update();
            // The quiet spell is what is waited for: no change within it is the answer.
            if tokio::time::timeout(quiet, open.changed()).await.is_err() {
                return seen;
            }
            assert!(tokio::time::Instant::now() < end, "the proxy's connections never settled (last {seen})");
        }
    }

    /// A copy of `original` whose current cluster's server is this proxy (`target/test-logs/proxy-<n>.
    /// kubeconfig`). TLS still verifies the API server's certificate: when its server's host is not 127.0.0.1
    /// (which the test API server's certificate names), `tls-server-name` keeps naming that host.
    pub fn kubeconfig_through(&self, original: &Path) -> PathBuf {
        let mut kubeconfig = read(original);
        let (index, server) = current_cluster(&kubeconfig);
        assert_eq!(
            host_port(&server),
            self.upstream,
            "{} points at another server than this proxy's",
            original.display()
        );
        let mut url = url::Url::parse(&server).unwrap_or_else(|e| panic!("server {server:?}: {e}"));
        let host = url.host_str().expect("a server URL has a host").to_string();
        url.set_ip_host(self.addr.ip()).expect("an http(s) URL takes an IP host");
        url.set_port(Some(self.addr.port())).expect("an http(s) URL takes a port");
        let cluster = kubeconfig.clusters[index].cluster.as_mut().expect("the current cluster");
        cluster.server = Some(url.as_str().trim_end_matches('/').to_string());
        if host != self.addr.ip().to_string() && cluster.tls_server_name.is_none() {
            cluster.tls_server_name = Some(host.trim_start_matches('[').trim_end_matches(']').to_string());
        }
        let dir = crate::repo_root().join("target/test-logs");
        std::fs::create_dir_all(&dir).expect("target/test-logs");
        static SERIAL: AtomicUsize = AtomicUsize::new(0);
        let path = dir.join(format!("proxy-{}.kubeconfig", SERIAL.fetch_add(1, Ordering::Relaxed)));
        let json = serde_json::to_string_pretty(&kubeconfig).expect("a kubeconfig as JSON");
        std::fs::write(&path, json).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut.send_replace(true);
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: String,
    cut: watch::Sender<bool>,
    open: watch::Sender<usize>,
) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            // Out of file descriptors, say: let the open connections end first.
            tokio::task::yield_now().await;
            continue;
        };
        if *cut.borrow() {
            drop(inbound);
            continue;
        }
        // Subscribed before the task runs, so a cut sent meanwhile is seen.
        let mut cut = cut.subscribe();
        open.send_modify(|n| *n += 1);
        let open = open.clone();
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let mut inbound = inbound;
            let pipe = async {
                let mut outbound = TcpStream::connect(&upstream).await?;
                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await
            };
            tokio::select! {
                _ = pipe => {}
                _ = cut.wait_for(|cut| *cut) => {}
            }
            // Both sockets are closed here, when the pipe is dropped, before the count says so.
            open.send_modify(|n| *n -= 1);
        });
    }
}

fn read(kubeconfig: &Path) -> Kubeconfig {
    Kubeconfig::read_from(kubeconfig).unwrap_or_else(|e| panic!("read {}: {e}", kubeconfig.display()))
}

/// The index in `clusters` of the current context's cluster, and its server URL.
fn current_cluster(kubeconfig: &Kubeconfig) -> (usize, String) {
    let current = kubeconfig.current_context.as_deref().expect("a current context");
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == current)
        .and_then(|c| c.context.as_ref())
        .unwrap_or_else(|| panic!("no context {current:?}"));
    let index = kubeconfig
        .clusters
        .iter()
        .position(|c| c.name == context.cluster)
        .unwrap_or_else(|| panic!("no cluster {:?}", context.cluster));
    let server = kubeconfig.clusters[index].cluster.as_ref().and_then(|c| c.server.clone());
    (index, server.unwrap_or_else(|| panic!("cluster {:?} has no server", context.cluster)))
}

/// `https://host:port/...` → `host:port` (the scheme's port when there is none).
fn host_port(server: &str) -> String {
    let url = url::Url::parse(server).unwrap_or_else(|e| panic!("server {server:?}: {e}"));
    let host = url.host_str().unwrap_or_else(|| panic!("server {server:?} has no host"));
    let port = url.port_or_known_default().unwrap_or_else(|| panic!("server {server:?} has no port"));
    format!("{host}:{port}")
}
