//! The controller, as wiring: the watches that wake a rollout, the context every reconcile shares, retries
//! with backoff, and the gauges. What a reconcile does is in [`reconcile`]; how each kind of target is
//! found, seen and changed is in [`fleet`].

mod analysis;
mod fleet;
mod namespaces;
mod notifications;
mod reconcile;
mod revision;
mod wakes;

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::ListParams,
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::{
    api::{FleetRollout, FleetRolloutPolicy, FleetRolloutStatus, Phase},
    core::{
        http_check, scope,
        workload::{self, WorkloadFacts},
    },
    edge::{
        cached::Cached,
        plans::{self, PlanStore},
        rollouts::Rollouts,
        {probe::Prober, workloads::Stores},
    },
    error::{Error, Result},
    metrics::{ErrorLabel, Metrics, PhaseLabel, StateLabel},
};

/// How long a shutdown waits for reconciles in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

#[derive(Clone, Debug)]
pub struct Settings {
    /// Cross-namespace rollouts are honoured only in this namespace.
    pub fleet_namespace: String,
    /// Only FleetRollouts in this namespace are reconciled (all namespaces when None).
    pub watch_namespace: Option<String>,
    /// Name of this replica, for events.
    pub identity: String,
    /// When plans move from status to ConfigMaps.
    pub plan_limits: plans::Limits,
    /// Namespaces whose workloads no rollout changes.
    pub protected_namespaces: Vec<String>,
    /// The operator's own workloads, which no rollout changes.
    pub self_workloads: Vec<scope::WorkloadRef>,
    /// Whether node rollouts are served (the installation granted the rights they need).
    pub node_rollouts: bool,
    /// Whose rights changes to targets in this cluster are made with.
    pub act_as: crate::edge::impersonation::ActAs,
    /// What member Secrets' exec credential plugins may be.
    pub member_exec: crate::edge::members::ExecPolicy,
    /// Where health checks may go besides the targets (`--http-check-allow`), and the API server's
    /// addresses, which they may not reach.
    pub http_check: http_check::Policy,
    /// The default analysis backend and where rollouts may point theirs (`--analysis-*`).
    pub analysis: crate::core::analysis::provider::Backends,
    /// Where notifications may go besides public and cluster addresses (`--notify-allow`, by namespace).
    pub notify: http_check::BoundPolicy,
}

/// Shared by every reconcile.
pub struct Context {
    client: Client,
    settings: Settings,
    /// What rollouts may touch (from the settings).
    rules: Arc<scope::Rules>,
    stores: Stores,
    rollouts: Store<FleetRollout>,
    /// The platform's FleetRolloutPolicies (cluster-scoped, written by the platform team alone).
    policies: Store<FleetRolloutPolicy>,
    plans: PlanStore,
    prober: Prober,
    /// Sends analysis queries, under `settings.analysis.policy`.
    querier: crate::edge::prometheus::Querier,
    /// Member clusters from the Secrets of the fleet namespace, a client for each, and watch caches of
    /// their workloads.
    members: crate::edge::members::watch::MemberWatches,
    metrics: Arc<Metrics>,
    /// The clients targets in this cluster are changed with: as each rollout's creator, by default.
    writers: crate::edge::impersonation::Writers,
    /// Status writes, events, the finalizer and deletion of the rollouts themselves.
    rollouts_io: Rollouts,
    /// Sends the outboxes' notifications, and remembers what was delivered until a write takes it out.
    deliveries: notifications::Deliveries,
    /// Consecutive failed reconciles per rollout, for the retry backoff.
    failures: std::sync::Mutex<HashMap<ObjectRef<FleetRollout>, u32>>,
}

fn update_gauges(ctx: &Context) {
    let mut phases: HashMap<Phase, i64> = Phase::ALL.iter().map(|p| (*p, 0)).collect();
    let (mut updated, mut healthy, mut failed, mut pending) = (0i64, 0i64, 0i64, 0i64);
    for fr in ctx.rollouts.state() {
        let s = fr.status.clone().unwrap_or_default();
        *phases.entry(s.phase).or_default() += 1;
        updated += i64::from(s.counts.updated);
        healthy += i64::from(s.counts.healthy);
        failed += i64::from(s.counts.failed);
        pending += i64::from(s.counts.total.saturating_sub(s.counts.updated));
    }
    for (phase, n) in phases {
        ctx.metrics.rollouts.get_or_create(&PhaseLabel { phase: phase.to_string() }).set(n);
    }
    for (state, n) in [("updated", updated), ("healthy", healthy), ("failed", failed), ("pending", pending)] {
        ctx.metrics.targets.get_or_create(&StateLabel { state: state.into() }).set(n);
    }
}

fn error_policy(fr: Arc<FleetRollout>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_errors.get_or_create(&ErrorLabel { error: err.metric_label().into() }).inc();
    let failures = ctx.count_failure(&ObjectRef::from_obj(&*fr));
    let wait = retry_after(failures);
    warn!(rollout = %fr.name_any(), error = %err, failures, retry_in = ?wait, "reconcile failed; retrying");
    Action::requeue(wait)
}

/// First retry after a failed reconcile; each further failure doubles it, up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(500);
/// A rollout failing for good (an API it may not use, say) is retried this often, not hammered.
const RETRY_MAX: Duration = Duration::from_secs(300);
/// Failure counts kept before those of deleted rollouts are dropped.
const FAILURES_KEPT: usize = 4096;

/// How long to wait before retrying after `failures` consecutive failed reconciles (1 for the first).
fn retry_after(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(20);
    RETRY_FIRST.saturating_mul(1 << doublings).min(RETRY_MAX)
}

impl Context {
    /// The client a rollout's targets in this cluster are changed with, or why there is none.
    fn writer(&self, fr: &FleetRollout) -> std::result::Result<Client, String> {
        self.writers.for_creator(fr.spec.creator.as_ref())
    }

    /// Records how long each batch that just finished took.
    fn observe_batches(&self, before: &FleetRolloutStatus, after: &FleetRolloutStatus) {
        for b in &after.batches {
            let was_open = before.batches.iter().any(|x| x.index == b.index && x.finished_at.is_none());
            if let (true, Some(start), Some(end)) = (was_open, &b.started_at, &b.finished_at) {
                let secs = end.0.duration_since(start.0).as_secs_f64();
                self.metrics.batch_duration.observe(secs.max(0.0));
            }
        }
    }

    /// Whether the node rollout's DaemonSet may still carry its hold: it does in the cache, or the cache does
    /// not have it (the edge reads it live before handing it back).
    fn daemonset_held(&self, fr: &FleetRollout) -> bool {
        let name = fr.spec.targets.daemon_set.clone().unwrap_or_default();
        let cached =
            self.stores.daemonsets.get(&ObjectRef::new(&name).within(&fr.namespace().unwrap_or_default()));
        cached.is_none_or(|ds| crate::core::nodes::is_held(&ds.annotations))
    }

    /// Counts one more consecutive failure of a rollout's reconcile; returns how many there have been.
    fn count_failure(&self, key: &ObjectRef<FleetRollout>) -> u32 {
        // A panic elsewhere while holding the lock must not switch the backoff off.
        let mut failures = self.failures.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if failures.len() >= FAILURES_KEPT {
            // Rollouts deleted while failing leave their count behind: drop those.
            failures.retain(|k, _| self.rollouts.get(k).is_some());
        }
        let n = failures.entry(key.clone()).or_default();
        *n = n.saturating_add(1);
        *n
    }

    fn forget_failures(&self, key: &ObjectRef<FleetRollout>) {
        self.failures.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(key);
    }
}

/// Caches one workload kind as facts, and says which rollout each change concerns (the one that last
/// changed the workload, from our annotation), if it may wake it.
fn watch_workloads<K>(
    client: &Client,
    config: &watcher::Config,
    facts: fn(&K) -> WorkloadFacts,
    wakes: wakes::Wakes,
) -> (Store<Cached<K>>, impl Stream<Item = ObjectRef<FleetRollout>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, mut writer) = reflector::store::<Cached<K>>();
    let cached = store.clone();
    let triggers = watcher(Api::<K>::all(client.clone()), config.clone())
        .default_backoff()
        .map_ok(move |event| cached_event(event, facts))
        .filter_map(move |event| {
            futures::future::ready(match event {
                Ok(event) => {
                    // Judged against the cache before it takes the change in.
                    let woken = changed(&cached, &event)
                        .and_then(|c| c.rollout().and_then(|named| wakes.of(&c.facts.namespace, named)));
                    writer.apply_watcher_event(&event);
                    woken
                }
                Err(e) => {
                    warn!(kind = %K::kind(&()), error = %e, "watch failed; retrying with backoff");
                    None
                }
            })
        });
    (store, triggers)
}

/// The workload an event changes as a decision sees it, if any: a change no decision reads (an annotation
/// or a label of no use, a new resourceVersion alone, a relist of what is already known) wakes nothing,
/// however often its writer makes it.
fn changed<'a, K>(cache: &Store<Cached<K>>, event: &'a watcher::Event<Cached<K>>) -> Option<&'a Cached<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    use watcher::Event;
    match event {
        Event::Apply(c) | Event::InitApply(c) => {
            let known = cache.get(&ObjectRef::<Cached<K>>::new(&c.facts.name).within(&c.facts.namespace));
            known.is_none_or(|known| !known.decides_as(c)).then_some(c)
        }
        Event::Delete(c) => Some(c),
        Event::Init | Event::InitDone => None,
    }
}

fn cached_event<K: Resource>(
    event: watcher::Event<K>,
    facts: fn(&K) -> WorkloadFacts,
) -> watcher::Event<Cached<K>> {
    use watcher::Event;
    match event {
        Event::Apply(o) => Event::Apply(Cached::new(&o, facts)),
        Event::Delete(o) => Event::Delete(Cached::new(&o, facts)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(Cached::new(&o, facts)),
        Event::InitDone => Event::InitDone,
    }
}

/// The controller over the FleetRollouts, woken by changes of the workloads they changed last (as far as
/// they may wake them), and the caches of the workloads and namespaces. `other_wakes`: wakes from
/// elsewhere (member clusters), held to the same shares.
async fn watches(
    client: &Client,
    rollouts: Api<FleetRollout>,
    rules: Arc<scope::Rules>,
    other_wakes: impl Stream<Item = ObjectRef<FleetRollout>> + Send + 'static,
) -> (Controller<FleetRollout>, Stores) {
    let watch_cfg = crate::edge::lists::watch_config(client).await;
    let (rollout_store, rollout_writer) = reflector::store::<FleetRollout>();
    let rollout_events = watcher(rollouts, watch_cfg.clone())
        .default_backoff()
        .modify(|fr| crate::api::kept_for_cache(fr, &[crate::api::TASK_TOKEN_HASH_ANNOTATION]))
        .reflect(rollout_writer)
        .applied_objects();
    let (namespaces, namespaces_w) = reflector::store::<Namespace>();
    let namespace_events = watcher(Api::<Namespace>::all(client.clone()), watch_cfg.clone())
        .default_backoff()
        .modify(namespaces::kept)
        .reflect(namespaces_w)
        .touched_objects();
    let wakes = wakes::Wakes { rollouts: rollout_store.clone(), namespaces: namespaces.clone(), rules };
    let (deployments, deployment_triggers) =
        watch_workloads(client, &watch_cfg, workload::deployment_facts, wakes.clone());
    let (statefulsets, statefulset_triggers) =
        watch_workloads(client, &watch_cfg, workload::statefulset_facts, wakes.clone());
    let (daemonsets, daemonset_triggers) =
        watch_workloads(client, &watch_cfg, workload::daemonset_facts, wakes);
    let triggers = futures::stream::select_all([
        deployment_triggers.boxed(),
        statefulset_triggers.boxed(),
        daemonset_triggers.boxed(),
        other_wakes.boxed(),
    ]);
    let held = rollout_store.clone();
    let controller = Controller::for_stream(rollout_events, rollout_store)
        .reconcile_on(wakes::shared(triggers))
        .watches_stream(namespace_events, move |ns| namespaces::held_by(&held, &ns))
        .with_config(kube::runtime::controller::Config::default().concurrency(RECONCILES_AT_ONCE));
    (controller, Stores::new(deployments, statefulsets, daemonsets, namespaces))
}

/// The FleetRolloutPolicies, cached, and a wake of every rollout whenever one changes (a platform team
/// writes them, rarely). Returns once the cache holds them all: until then no rollout is reconciled, so
/// none starts a batch a policy forbids. Without the CRD (or the right to list it) the operator does not
/// start: a policy it cannot see must not be taken for no policy.
async fn watch_policies(
    client: &Client,
) -> Result<(Store<FleetRolloutPolicy>, impl Stream<Item = ()> + Send + 'static)> {
    let api: Api<FleetRolloutPolicy> = Api::all(client.clone());
    api.list(&ListParams::default().limit(1)).await.map_err(Error::PolicyCrdMissing)?;
    let (store, writer) = reflector::store::<FleetRolloutPolicy>();
    let events = watcher(api, watcher::Config::default()).default_backoff().reflect(writer).touched_objects();
    // One slot, shared by the one sender: a full channel already holds a wake of every rollout.
    let (wake, mut woken) = tokio::sync::mpsc::channel(1);
    tokio::spawn(events.for_each(move |event| {
        match event {
            Ok(_) => drop(wake.try_send(())),
            Err(e) => warn!(error = %e, "watching FleetRolloutPolicies"),
        }
        futures::future::ready(())
    }));
    store.wait_until_ready().await.map_err(|e| Error::Config(format!("FleetRolloutPolicy cache: {e}")))?;
    Ok((store, futures::stream::poll_fn(move |cx| woken.poll_recv(cx))))
}

/// The scope rules of these settings (a function, not `Rules::of`: the type is the core crate's).
fn scope_rules(settings: &Settings) -> scope::Rules {
    scope::Rules {
        fleet_namespace: settings.fleet_namespace.clone(),
        protected_namespaces: settings.protected_namespaces.clone(),
        self_workloads: settings.self_workloads.clone(),
    }
}

/// Reconciles at once: each may hold probes, queries and lists, so their number bounds what the operator
/// holds; a reconcile waiting on slow probes or queries holds its slot up to their budgets (15 s, 40 s), so
/// there are enough that one tenant's slow rollouts do not hold every other tenant's off (a share per
/// namespace would be better still).
const RECONCILES_AT_ONCE: u16 = 256;

/// The FleetRollouts this operator reconciles; an error saying so when their CRD is not installed.
async fn rollouts_watched(client: &Client, settings: &Settings) -> Result<Api<FleetRollout>> {
    let rollouts: Api<FleetRollout> = match &settings.watch_namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    rollouts.list(&ListParams::default().limit(1)).await.map_err(Error::CrdMissing)?;
    Ok(rollouts)
}

/// Runs the controller until `shutdown` fires. Call only while holding the leader lease.
pub async fn run(
    client: Client,
    config: kube::Config,
    settings: Settings,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Result<()> {
    let rollouts = rollouts_watched(&client, &settings).await?;

    // Changes in member clusters wake their rollouts as changes here do.
    let (member_wake, member_changes) = futures::channel::mpsc::unbounded();
    // Deliveries wake a rollout for the write that takes what was delivered out of its outbox.
    let (delivered_wake, delivered) = futures::channel::mpsc::unbounded();
    let rules = Arc::new(scope_rules(&settings));
    let wakes = futures::stream::select(member_changes, delivered);
    let (controller, stores) = watches(&client, rollouts, rules.clone(), wakes).await;
    let (policies, policy_changes) = watch_policies(&client).await?;
    let controller = controller.reconcile_all_on(policy_changes);
    let prober = Prober::new(settings.http_check.clone(), Some(client.clone())).map_err(Error::Config)?;
    let querier =
        crate::edge::prometheus::Querier::new(settings.analysis.policy.clone(), Some(client.clone()))
            .map_err(Error::Config)?;
    let sender = crate::edge::notify::Sender::new(settings.notify.clone(), client.clone());
    let ctx = Arc::new(Context {
        deliveries: notifications::Deliveries::new(sender.map_err(Error::Config)?, delivered_wake),
        rollouts_io: Rollouts::new(client.clone(), &settings.identity, metrics.clone()),
        rollouts: controller.store(),
        policies,
        writers: crate::edge::impersonation::Writers::new(settings.act_as, client.clone(), config),
        members: crate::edge::members::watch::MemberWatches::new(
            crate::edge::members::Members::new(client.clone(), settings.fleet_namespace.clone())
                .with_exec(settings.member_exec.clone()),
            crate::edge::members::watch::MemberWakes::new(member_wake, controller.store()),
        ),
        client,
        plans: PlanStore::new(settings.plan_limits),
        prober,
        querier,
        rules,
        settings,
        stores: stores.clone(),
        metrics,
        failures: Default::default(),
    });

    tokio::spawn(notifications::run(ctx.clone(), shutdown.clone()));
    serve(controller, ctx, shutdown).await;
    info!("controller stopped");
    Ok(())
}

/// Runs the reconciles until `shutdown`, then gives those in flight a moment.
async fn serve(controller: Controller<FleetRollout>, ctx: Arc<Context>, shutdown: CancellationToken) {
    let stop = shutdown.clone();
    info!("controller starting");
    let running = controller
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(reconcile::reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                match e {
                    kube::runtime::controller::Error::ObjectNotFound(_) => {}
                    other => error!(error = %other, "controller error"),
                }
            }
        });
    tokio::pin!(running);
    tokio::select! {
        _ = &mut running => {}
        _ = shutdown.cancelled() => {
            // Give reconciles in flight a moment to finish; stopping mid-step is safe anyway (it is a crash,
            // and every step survives one).
            if tokio::time::timeout(SHUTDOWN_GRACE, &mut running).await.is_err() {
                warn!("reconciles still running after {SHUTDOWN_GRACE:?}; stopping anyway");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_reconciles_back_off_exponentially_up_to_a_cap() {
        let waits: Vec<Duration> = (1..=12).map(retry_after).collect();
        assert_eq!(waits[0], Duration::from_millis(500));
        assert_eq!(waits[1], Duration::from_secs(1));
        assert_eq!(waits[4], Duration::from_secs(8));
        assert!(waits.windows(2).all(|w| w[0] <= w[1]), "{waits:?}");
        assert_eq!(retry_after(11), RETRY_MAX);
        assert_eq!(retry_after(u32::MAX), RETRY_MAX, "no overflow, however long it fails");
    }
}
