//! `fleetroll operator`: the HTTP listeners, leader election, and the controller, on one shutdown signal.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use kube::{Api, Client, api::ListParams};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::{
    api::FleetRollout,
    controller::{self, Settings},
    error::{Error, Result},
    mcp,
    metrics::Metrics,
    runtime::http,
    runtime::leader::{Elector, LeaseConfig},
};

/// Where the HTTP endpoints listen.
#[derive(Clone, Copy, Debug)]
pub struct Listen {
    /// `/mcp`, `/healthz`, `/readyz`, and `/metrics` unless it has a listener of its own.
    pub http: SocketAddr,
    /// `/metrics` (with `/healthz` and `/readyz`) on a listener of its own, so that a NetworkPolicy can
    /// admit scrapers to it without admitting them to MCP.
    pub metrics: Option<SocketAddr>,
}

#[derive(Clone, Debug)]
pub struct Options {
    pub listen: Listen,
    pub mcp: mcp::Options,
    pub settings: Settings,
    pub lease_name: String,
    pub lease_namespace: String,
    pub lease_duration: Duration,
}

/// Everything both `operator` and `mcp` run: a client, the HTTP listeners with health, metrics and MCP,
/// and a shutdown signal.
struct Serving {
    client: Client,
    /// The client's configuration, from which clients acting as rollouts' creators derive.
    config: kube::Config,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// `--auth none` hands every permission to anyone who reaches `/mcp`: only on a loopback listener, where
/// that is the local user.
fn check_listener(listen: SocketAddr, auth: &mcp::auth::Mode) -> Result<()> {
    if matches!(auth, mcp::auth::Mode::None) && !listen.ip().is_loopback() {
        return Err(Error::Config(format!(
            "--auth none serves MCP without authentication, so it listens only on loopback: \
             --listen {listen} is reachable from other machines; use e.g. --listen 127.0.0.1:{}, \
             or --auth serviceaccount",
            listen.port()
        )));
    }
    Ok(())
}

async fn serve(listen: Listen, mut mcp_opts: mcp::Options) -> Result<Serving> {
    check_listener(listen.http, &mcp_opts.auth)?;
    let config = kube::Config::infer()
        .await
        .map_err(|e| Error::Config(format!("no Kubernetes configuration: {e}")))?;
    if mcp_opts.authorization_servers.is_empty() {
        mcp_opts.authorization_servers =
            vec![config.cluster_url.to_string().trim_end_matches('/').to_string()];
    }
    // The MCP server keeps the configuration: writes made for a caller derive an impersonating client.
    let client = Client::try_from(config.clone()).map_err(Error::Kube)?;
    let metrics = Arc::new(Metrics::default());
    let ready = Arc::new(AtomicBool::new(false));
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));

    if matches!(mcp_opts.auth, mcp::auth::Mode::None) {
        warn!(
            "MCP AUTHENTICATION IS OFF (--auth none): anyone who can reach /mcp can start, approve and abort \
             rollouts as this server. Use it for local demos only."
        );
    }
    let health = http::Health { metrics: metrics.clone(), ready: ready.clone() };
    let mcp_app = mcp::router(client.clone(), config.clone(), &mcp_opts);
    let server = start_http(listen, health, mcp_app, &mcp_opts.resource, &shutdown).await?;

    Api::<FleetRollout>::all(client.clone())
        .list(&ListParams::default().limit(1))
        .await
        .map_err(Error::CrdMissing)?;
    ready.store(true, Ordering::Relaxed);
    Ok(Serving { client, config, metrics, shutdown, server })
}

/// Starts the HTTP listeners: `/metrics` on the main one, or on its own when `listen.metrics` is set.
async fn start_http(
    listen: Listen,
    health: http::Health,
    mcp_app: axum::Router,
    audience: &str,
    shutdown: &CancellationToken,
) -> Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    let Some(metrics_addr) = listen.metrics else {
        let main = serve_on(listen.http, http::router(health).merge(mcp_app), shutdown.clone()).await?;
        info!(listen = %listen.http, %audience, "serving /healthz, /readyz, /metrics, /mcp");
        return Ok(tokio::spawn(main));
    };
    let main = serve_on(listen.http, http::probes(health.clone()).merge(mcp_app), shutdown.clone()).await?;
    let side = serve_on(metrics_addr, http::router(health), shutdown.clone()).await?;
    info!(listen = %listen.http, %audience, "serving /healthz, /readyz, /mcp");
    info!(listen = %metrics_addr, "serving /metrics, /healthz, /readyz");
    Ok(tokio::spawn(async move {
        let (main, side) = tokio::join!(main, side);
        main.and(side)
    }))
}

/// Binds `addr` (so that a taken port fails the start) and returns the server, to run until `shutdown`.
async fn serve_on(
    addr: SocketAddr,
    app: axum::Router,
    stop: CancellationToken,
) -> Result<impl Future<Output = std::io::Result<()>>> {
    let listener = http::listen(addr).map_err(|source| Error::Listen { addr: addr.to_string(), source })?;
    Ok(http::serve(listener, app, stop))
}

/// Every address the API server answers on that the operator can know of, which health checks may never
/// reach: its URL's host (resolved), in a cluster the `kubernetes` Service's address, and that Service's
/// endpoints.
async fn api_server_addresses(url: &axum::http::Uri, client: &Client) -> Vec<std::net::IpAddr> {
    let mut hosts: Vec<String> =
        url.host().map(|h| h.trim_matches(['[', ']']).to_string()).into_iter().collect();
    hosts.extend(std::env::var("KUBERNETES_SERVICE_HOST").ok());
    let mut addresses = Vec::new();
    for host in hosts {
        match tokio::net::lookup_host((host.as_str(), 443)).await {
            Ok(found) => addresses.extend(found.map(|a| a.ip())),
            Err(e) => warn!(%host, error = %e, "cannot resolve the API server's address"),
        }
    }
    addresses.extend(api_server_endpoints(client).await);
    addresses.sort();
    addresses.dedup();
    addresses
}

/// The addresses the API server itself listens on, from the `kubernetes` Service's EndpointSlice (its
/// ClusterIP alone would let a health check reach the API server by its real address). Best effort: an
/// installation that may not read it still refuses the ClusterIP and the URL's host.
async fn api_server_endpoints(client: &Client) -> Vec<std::net::IpAddr> {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    match Api::<EndpointSlice>::namespaced(client.clone(), "default").get_opt("kubernetes").await {
        Ok(Some(slice)) => slice
            .endpoints
            .unwrap_or_default()
            .iter()
            .flat_map(|e| e.addresses.iter())
            .filter_map(|a| a.parse().ok())
            .collect(),
        Ok(None) => Vec::new(),
        Err(e) => {
            debug!(error = %e, "cannot read the API server's endpoints; health checks refuse its Service address only");
            Vec::new()
        }
    }
}

/// `fleetroll mcp`: the MCP server alone.
pub async fn serve_mcp(listen: Listen, mcp_opts: mcp::Options) -> Result<()> {
    let s = serve(listen, mcp_opts).await?;
    s.shutdown.cancelled().await;
    let _ = s.server.await;
    Ok(())
}

pub async fn run(opts: Options) -> Result<()> {
    let Serving { client, config, metrics, shutdown, server } = serve(opts.listen, opts.mcp.clone()).await?;
    let mut settings = opts.settings;
    settings.http_check.api_server = api_server_addresses(&config.cluster_url, &client).await;
    settings.analysis.policy.api_server = settings.http_check.api_server.clone();
    settings.notify.base.api_server = settings.http_check.api_server.clone();

    let elector = Arc::new(Elector::new(
        client.clone(),
        LeaseConfig {
            name: opts.lease_name.clone(),
            namespace: opts.lease_namespace.clone(),
            identity: settings.identity.clone(),
            duration: opts.lease_duration,
        },
    ));
    let mut leading = elector.leading();
    let campaign = tokio::spawn({
        let elector = elector.clone();
        async move { elector.run().await }
    });
    info!(identity = %settings.identity, lease = %format!("{}/{}", opts.lease_namespace, opts.lease_name), "waiting for leadership");
    tokio::select! {
        _ = shutdown.cancelled() => {
            campaign.abort();
            return Ok(());
        }
        _ = leading.wait_for(|l| *l) => {}
    }
    metrics.leader.set(1);

    let result = tokio::select! {
        r = controller::run(client, config, settings, metrics.clone(), shutdown.clone()) => r,
        _ = campaign => {
            error!("lost the leader lease; stopping so that no two replicas act");
            shutdown.cancel();
            Err(Error::LostLeadership)
        }
    };
    metrics.leader.set(0);
    elector.release().await;
    shutdown.cancel();
    let _ = server.await;
    result
}

async fn stop_on_signal(shutdown: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                shutdown.cancel();
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    info!("shutting down");
    shutdown.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_authentication_only_a_loopback_listener_is_allowed() {
        let none = mcp::auth::Mode::None;
        for ok in ["127.0.0.1:8080", "127.0.0.2:1", "[::1]:8080"] {
            assert!(check_listener(ok.parse().unwrap(), &none).is_ok(), "{ok}");
        }
        for bad in ["0.0.0.0:8080", "[::]:8080", "10.1.2.3:8080", "192.168.1.1:80"] {
            let e = check_listener(bad.parse().unwrap(), &none).unwrap_err().to_string();
            assert!(e.contains("--auth none") && e.contains("127.0.0.1:"), "{bad}: {e}");
        }
        let sa = mcp::auth::Mode::ServiceAccount { audience: "https://x/mcp".into() };
        assert!(check_listener("0.0.0.0:8080".parse().unwrap(), &sa).is_ok());
    }
}
