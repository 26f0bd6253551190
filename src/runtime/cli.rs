//! The command line: one binary, one subcommand per role.

use std::{net::SocketAddr, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand, ValueEnum};
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

use crate::{
    controller::Settings,
    runtime::{self, operator},
};

/// Durable, batched image rollouts across a fleet of Kubernetes workloads.
#[derive(Debug, Parser)]
#[command(name = "fleetroll", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,

    /// Log level (or a full tracing filter such as `fleetroll=debug,kube=info`); RUST_LOG overrides it.
    #[arg(long, global = true, env = "FLEETROLL_LOG_LEVEL", default_value = "info")]
    log_level: String,

    /// Log format.
    #[arg(long, global = true, env = "FLEETROLL_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the FleetRollout CustomResourceDefinition as YAML.
    Crd {
        /// Print both CRDs as the Helm chart's template (installed when crds.install is set, kept on
        /// uninstall).
        #[arg(long)]
        helm: bool,
        /// Print the FleetRolloutPolicy CRD instead.
        #[arg(long, conflicts_with = "helm")]
        policy: bool,
    },
    /// Run the operator: the controller (when leader) and its HTTP listener (/healthz, /readyz, /metrics, /mcp).
    Operator(Box<OperatorArgs>),
    /// Run only the MCP server (and /healthz, /readyz, /metrics), without the controller.
    Mcp(Box<McpServeArgs>),
    /// Print a generated page of the manual (docs/src/reference/), for `make generate`.
    #[command(hide = true)]
    Reference { page: reference::Page },
}

#[derive(Debug, clap::Args)]
struct McpServeArgs {
    #[command(flatten)]
    listen: ListenArgs,

    /// The namespace whose FleetRollouts may span namespaces (used by preview_rollout).
    #[arg(long, env = "FLEETROLL_FLEET_NAMESPACE", default_value = "fleetroll-system")]
    fleet_namespace: String,

    #[command(flatten)]
    mcp: McpArgs,
}

#[derive(Clone, Copy, Debug, clap::Args)]
struct ListenArgs {
    /// Address of the HTTP listener: /mcp, /healthz, /readyz, and /metrics unless --metrics-listen is set.
    #[arg(long, env = "FLEETROLL_LISTEN", default_value = "0.0.0.0:8080")]
    listen: SocketAddr,

    /// Serve /metrics (and /healthz, /readyz) on this address instead of the main listener, e.g.
    /// 0.0.0.0:9090, so that a NetworkPolicy can let scrapers in without letting them reach /mcp.
    #[arg(long, env = "FLEETROLL_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
}

impl ListenArgs {
    fn listen(self) -> operator::Listen {
        operator::Listen { http: self.listen, metrics: self.metrics_listen }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum AuthMode {
    /// Bearer tokens checked by TokenReview for the MCP audience; RBAC decides each operation.
    Serviceaccount,
    /// No authentication: for local demos only, and only on a loopback --listen address.
    None,
}

#[derive(Debug, clap::Args)]
struct McpArgs {
    /// How MCP callers authenticate.
    #[arg(long, env = "FLEETROLL_AUTH", value_enum, default_value_t = AuthMode::Serviceaccount)]
    auth: AuthMode,

    /// The MCP endpoint's canonical URL; tokens must be issued for it (audience). Default:
    /// http://localhost:<port>/mcp.
    #[arg(long, env = "FLEETROLL_MCP_AUDIENCE")]
    mcp_audience: Option<String>,

    /// Also accept people's ID tokens issued for this audience (an OpenID Connect client ID the API
    /// server's JWT authenticator accepts; comma-separated or repeated). The API server vouches for such a
    /// token only as for a request to itself, so never name an audience ServiceAccount tokens carry.
    #[arg(long = "mcp-id-token-audience", env = "FLEETROLL_MCP_ID_TOKEN_AUDIENCES", value_delimiter = ',')]
    mcp_id_token_audiences: Vec<String>,

    /// Host header values accepted on /mcp (comma-separated or repeated); localhost, 127.0.0.1, ::1 and the
    /// audience's host are always accepted.
    #[arg(long = "mcp-allowed-host", env = "FLEETROLL_MCP_ALLOWED_HOSTS", value_delimiter = ',')]
    mcp_allowed_hosts: Vec<String>,

    /// Origin header values accepted on /mcp (browser clients), as scheme://host[:port|:*]; localhost on any
    /// port and the audience's origin are always accepted, any other Origin gets 403.
    #[arg(long = "mcp-allowed-origin", env = "FLEETROLL_MCP_ALLOWED_ORIGINS", value_delimiter = ',')]
    mcp_allowed_origins: Vec<String>,

    /// OAuth authorization servers named in the Protected Resource Metadata (default: the API server).
    #[arg(
        long = "mcp-authorization-server",
        env = "FLEETROLL_MCP_AUTHORIZATION_SERVERS",
        value_delimiter = ','
    )]
    mcp_authorization_servers: Vec<String>,

    /// Expose only the read-only tools (preview_rollout, get_rollout, list_rollouts).
    #[arg(long, env = "FLEETROLL_READ_ONLY")]
    read_only: bool,

    /// How long a finished rollout started over MCP (and its task) is kept before the operator deletes it.
    #[arg(long, env = "FLEETROLL_TASK_RETENTION", default_value = "24h", value_parser = crate::core::duration::parse)]
    task_retention: Duration,

    #[command(flatten)]
    exec: exec::ExecArgs,

    /// Also serve the MCP conformance suite's fixture tools (tests only: built with the `conformance`
    /// feature, never into a release).
    #[cfg(feature = "conformance")]
    #[arg(long, hide = true)]
    conformance_fixtures: bool,
}

impl McpArgs {
    fn options(&self, listen: SocketAddr, fleet_namespace: &str) -> Result<crate::mcp::Options, String> {
        let audience =
            self.mcp_audience.clone().unwrap_or_else(|| format!("http://localhost:{}/mcp", listen.port()));
        Ok(crate::mcp::Options {
            auth: match self.auth {
                AuthMode::None => crate::mcp::auth::Mode::None,
                AuthMode::Serviceaccount => {
                    crate::mcp::auth::Mode::ServiceAccount { audience: audience.clone() }
                }
            },
            read_only: self.read_only,
            fleet_namespace: fleet_namespace.to_string(),
            retention: self.task_retention,
            allowed_hosts: crate::mcp::allowed_hosts(&audience, &self.mcp_allowed_hosts),
            allowed_origins: self.mcp_allowed_origins.clone(),
            resource: audience,
            authorization_servers: self.mcp_authorization_servers.clone(),
            id_token_audiences: self
                .mcp_id_token_audiences
                .iter()
                .filter(|a| !a.is_empty())
                .cloned()
                .collect(),
            member_exec: self.exec.policy()?,
            #[cfg(feature = "conformance")]
            conformance_fixtures: self.conformance_fixtures,
        })
    }
}

#[derive(Debug, clap::Args)]
struct OperatorArgs {
    #[command(flatten)]
    listen: ListenArgs,

    /// The namespace whose FleetRollouts may span namespaces (targets.namespaceSelector).
    #[arg(long, env = "FLEETROLL_FLEET_NAMESPACE", default_value = "fleetroll-system")]
    fleet_namespace: String,

    /// Reconcile only the FleetRollouts of this namespace (default: all namespaces).
    #[arg(long, env = "FLEETROLL_NAMESPACE")]
    namespace: Option<String>,

    /// Name of the leader-election Lease.
    #[arg(long, env = "FLEETROLL_LEASE_NAME", default_value = "fleetroll-operator")]
    lease_name: String,

    /// Namespace of the Lease (default: the fleet namespace).
    #[arg(long, env = "FLEETROLL_LEASE_NAMESPACE")]
    lease_namespace: Option<String>,

    /// How long a leader's lease lasts without renewal before another replica takes over.
    #[arg(long, env = "FLEETROLL_LEASE_DURATION", default_value = "15s", value_parser = crate::core::duration::parse)]
    lease_duration: Duration,

    /// This replica's name in the Lease and in events (default: POD_NAME, else host name and pid).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,

    /// Plans larger than this (JSON bytes) are stored in ConfigMaps instead of status.
    #[arg(long, hide = true, default_value_t = crate::edge::plans::INLINE_MAX_BYTES)]
    plan_inline_max_bytes: usize,

    /// Targets per plan ConfigMap.
    #[arg(long, hide = true, default_value_t = crate::edge::plans::SHARD_TARGETS)]
    plan_shard_targets: usize,

    /// Namespaces whose workloads no rollout may change (comma-separated; "" for none).
    #[arg(
        long,
        env = "FLEETROLL_PROTECTED_NAMESPACES",
        value_delimiter = ',',
        default_value = "kube-system"
    )]
    protected_namespaces: Vec<String>,

    /// The operator's own workload, which no rollout may change, as Kind/namespace/name (comma-separated
    /// or repeated). The Helm chart sets it.
    #[arg(long = "self-workload", env = "FLEETROLL_SELF_WORKLOADS", value_delimiter = ',')]
    self_workloads: Vec<crate::core::scope::WorkloadRef>,

    /// Whether node rollouts (targets.kind Node) are served. They need rights to delete pods and update
    /// DaemonSets; the Helm chart grants those only when its nodeRollouts.enabled is set, and passes false
    /// otherwise.
    #[arg(long, env = "FLEETROLL_NODE_ROLLOUTS", default_value_t = true, action = clap::ArgAction::Set)]
    node_rollouts: bool,

    /// Whose rights changes to targets in this cluster are made with: `creator` impersonates each
    /// rollout's recorded creator (constrained impersonation, Kubernetes 1.36+), `operator` uses this
    /// process's own.
    #[arg(long, env = "FLEETROLL_ACT_AS", value_enum, default_value_t = crate::edge::impersonation::ActAs::Creator)]
    act_as: crate::edge::impersonation::ActAs,

    /// Hosts, addresses or CIDRs health-check URLs may name besides their targets (comma-separated or
    /// repeated; none by default). A CIDR also lets checks reach loopback or link-local addresses in it.
    #[arg(long = "http-check-allow", env = "FLEETROLL_HTTP_CHECK_ALLOW", value_delimiter = ',')]
    http_check_allow: Vec<crate::core::http_check::Allowed>,

    /// Hosts, addresses or CIDRs sinks may be at besides public and cluster addresses, each bound to the
    /// namespaces whose sink Secrets may use it: NAMESPACES=ENTRY (`platform=10.0.5.0/24`, `*=` for all;
    /// none by default). A CIDR lets them reach loopback, link-local or API server addresses in it.
    #[arg(long = "notify-allow", env = "FLEETROLL_NOTIFY_ALLOW", value_delimiter = ',')]
    notify_allow: Vec<crate::core::http_check::BoundAllowed>,

    /// The cluster's DNS domain: health checks name a target's Service as {name}.{namespace}.svc, or with
    /// this domain, and resolve it as the absolute name in it.
    #[arg(long, env = "FLEETROLL_CLUSTER_DOMAIN", default_value = crate::core::http_check::CLUSTER_DOMAIN)]
    cluster_domain: String,

    /// The Prometheus-compatible backend a rollout's analysis queries when it names none, e.g.
    /// http://prometheus.monitoring:9090, for every namespace; or, as NAMESPACES=URL, for the namespaces
    /// a name or pattern (`team-*`) gives (comma-separated or repeated; the first bound entry matching a
    /// rollout's namespace wins, the unbound one serves the rest). A rollout may name its own exactly.
    #[arg(
        long = "analysis-prometheus-address",
        env = "FLEETROLL_ANALYSIS_PROMETHEUS_ADDRESS",
        value_delimiter = ','
    )]
    analysis_prometheus_address: Vec<crate::core::analysis::binding::DefaultBackend>,

    /// Backends a rollout's analysis may name besides its default, each bound to the namespaces whose
    /// rollouts may name it, as NAMESPACES=BACKEND: a host, an address or a CIDR with an optional :port
    /// (`team-a=prom-a.monitoring.svc:9090`, `team-*=10.0.5.0/24`; `*=thanos.example.com` for every
    /// namespace; comma-separated or repeated; none by default). A CIDR also lets queries reach loopback or
    /// link-local addresses in it.
    #[arg(long = "analysis-allow", env = "FLEETROLL_ANALYSIS_ALLOW", value_delimiter = ',')]
    analysis_allow: Vec<crate::core::analysis::binding::AllowEntry>,

    /// A header every analysis query carries, set to the rollout's namespace (e.g. X-Scope-OrgID for a
    /// Mimir or Cortex whose tenants are namespaces, or prom-label-proxy's -header-name): a backend shared
    /// by tenants and reached only by the operator can then scope each query to its rollout's namespace.
    #[arg(long, env = "FLEETROLL_ANALYSIS_NAMESPACE_HEADER", value_parser = namespace_header)]
    analysis_namespace_header: Option<String>,

    #[command(flatten)]
    mcp: McpArgs,
}

/// A header name the operator may set on analysis queries: none that carries credentials or framing.
fn namespace_header(text: &str) -> Result<String, String> {
    let name = reqwest::header::HeaderName::from_bytes(text.as_bytes())
        .map_err(|_| format!("{text:?} is not an HTTP header name"))?;
    let reserved = [
        "authorization",
        "proxy-authorization",
        "cookie",
        "host",
        "content-type",
        "content-length",
        "transfer-encoding",
        "connection",
        "te",
        "upgrade",
        "accept",
    ];
    match reserved.contains(&name.as_str()) {
        true => Err(format!("{text:?} is a header the operator sets itself, or that carries credentials")),
        false => Ok(text.to_string()),
    }
}

impl OperatorArgs {
    /// The analysis backends: a literal default address may be reached even when loopback or link-local,
    /// a host name resolves under the usual rules; every allowed address or CIDR (whichever namespaces it
    /// is bound to: which rollout may name it is judged before connecting) may be reached.
    fn analysis(&self, cluster_domain: &str) -> crate::core::analysis::provider::Backends {
        use crate::core::http_check::Allowed;
        let mut allowed: Vec<Allowed> = self.analysis_allow.iter().map(|a| a.place.host.clone()).collect();
        for default in &self.analysis_prometheus_address {
            let host = url::Url::parse(&default.address).ok().and_then(|u| u.host_str().map(str::to_string));
            if let Some(host) = host {
                allowed.extend(host.trim_start_matches('[').trim_end_matches(']').parse::<Allowed>());
            }
        }
        crate::core::analysis::provider::Backends {
            defaults: self.analysis_prometheus_address.clone(),
            allow: self.analysis_allow.clone(),
            policy: crate::core::http_check::Policy {
                allowed,
                api_server: Vec::new(),
                cluster_domain: cluster_domain.to_string(),
            },
            namespace_header: self.analysis_namespace_header.clone(),
        }
    }

    fn options(self) -> Result<operator::Options, String> {
        let cluster_domain = self.cluster_domain.trim_matches('.').to_ascii_lowercase();
        let analysis = self.analysis(&cluster_domain);
        let member_exec = self.mcp.exec.policy()?;
        Ok(operator::Options {
            listen: self.listen.listen(),
            mcp: self.mcp.options(self.listen.listen, &self.fleet_namespace)?,
            lease_namespace: self.lease_namespace.unwrap_or_else(|| self.fleet_namespace.clone()),
            lease_name: self.lease_name,
            lease_duration: self.lease_duration,
            settings: Settings {
                fleet_namespace: self.fleet_namespace,
                watch_namespace: self.namespace,
                identity: self.identity.unwrap_or_else(default_identity),
                plan_limits: crate::edge::plans::Limits {
                    inline_max_bytes: self.plan_inline_max_bytes,
                    shard_targets: self.plan_shard_targets,
                },
                // `--protected-namespaces=""` protects none.
                protected_namespaces: self
                    .protected_namespaces
                    .into_iter()
                    .filter(|n| !n.is_empty())
                    .collect(),
                self_workloads: self.self_workloads,
                node_rollouts: self.node_rollouts,
                act_as: self.act_as,
                member_exec,
                http_check: crate::core::http_check::Policy {
                    allowed: self.http_check_allow,
                    api_server: Vec::new(),
                    cluster_domain: cluster_domain.clone(),
                },
                notify: crate::core::http_check::BoundPolicy {
                    base: crate::core::http_check::Policy { cluster_domain, ..Default::default() },
                    allow: self.notify_allow,
                },
                analysis,
            },
        })
    }
}

fn init_tracing(level: &str, format: LogFormat) {
    let filter = EnvFilter::try_new(log_filter(std::env::var("RUST_LOG").ok(), level))
        .unwrap_or_else(|_| EnvFilter::new(log_filter(None, level)));
    let registry = tracing_subscriber::registry().with(filter);
    let _ = match format {
        LogFormat::Text => registry.with(fmt::layer().with_writer(std::io::stderr)).try_init(),
        LogFormat::Json => registry.with(fmt::layer().json().with_writer(std::io::stderr)).try_init(),
    };
}

/// The log filter: `RUST_LOG` if set, else the level. rmcp logs three INFO lines for every stateless MCP
/// request (one per `tasks/get` poll), so it is held to warnings unless the filter names it. kube's client
/// logs, as a warning, the whole of an answer it cannot decode (a member's may be 32 MiB, each time it is
/// asked), so it is held to errors unless the filter names it.
fn log_filter(rust_log: Option<String>, level: &str) -> String {
    let mut spec = rust_log.filter(|s| !s.trim().is_empty()).unwrap_or_else(|| level.to_string());
    if !spec.contains("rmcp") {
        spec.push_str(",rmcp=warn");
    }
    if !spec.contains("kube_client") {
        spec.push_str(",kube_client::client=error");
    }
    spec
}

fn default_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string()))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "fleetroll".into());
    format!("{host}-{}", std::process::id())
}

/// Parses the command line and runs the chosen subcommand.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd { helm, policy } => reference::print_crd(helm, policy),
        Command::Reference { page } => reference::print_page(page),
        Command::Operator(args) => {
            init_tracing(&cli.log_level, cli.log_format);
            let options = match args.options() {
                Ok(options) => options,
                Err(e) => return refused(&e),
            };
            runtime::block_on(async { operator::run(options).await.map(|()| ExitCode::SUCCESS) })
        }
        Command::Mcp(args) => {
            init_tracing(&cli.log_level, cli.log_format);
            let mcp = match args.mcp.options(args.listen.listen, &args.fleet_namespace) {
                Ok(mcp) => mcp,
                Err(e) => return refused(&e),
            };
            runtime::block_on(async {
                operator::serve_mcp(args.listen.listen(), mcp).await.map(|()| ExitCode::SUCCESS)
            })
        }
    }
}

/// Settings that parse one by one but not together: said as clap says a bad flag.
fn refused(why: &str) -> ExitCode {
    eprintln!("error: {why}");
    ExitCode::from(2)
}

mod exec;
mod reference;
#[cfg(test)]
mod tests;
