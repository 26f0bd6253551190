//! The reconcile loop: reads facts, asks the state machine (`engine`) for the next step, performs it, and
//! repeats until the machine says to wait. All decisions are the engine's; this module only does IO.

use std::{
    collections::HashMap,
    panic::AssertUnwindSafe,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{FutureExt, Stream, StreamExt, TryStreamExt};
use k8s_openapi::{api::core::v1::Namespace, jiff::Timestamp};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ListParams, PostParams},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        events::{Event as KubeEvent, EventType as KubeEventType, Recorder, Reporter},
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::{
    api::{
        BatchState, FleetRollout, FleetRolloutStatus, Phase, PlannedTarget, RevisionInputs, TargetFailure,
        TargetKind,
    },
    core::plan,
    core::rollout::{self, EventType, Facts, NewRevision, Step, Transition},
    core::scope,
    core::workload::{self, Cached, WorkloadFacts},
    edge::own_writes::OwnWrites,
    error::{Error, Result},
    runtime::failpoint,
    runtime::metrics::{Metrics, PhaseLabel, StateLabel},
};

use crate::edge::{
    daemonset_pods, discovery,
    plans::{self, PlanStore},
    targets::{self, Change, Prober, Stores},
};

/// How many steps one reconcile may take before yielding (a safety net, never reached in practice).
const MAX_STEPS: usize = 64;
/// Re-check rollouts that wait on nothing in particular this often (reads only; writes happen on change).
const RESYNC: Duration = Duration::from_secs(300);
/// Longest a single reconcile may take.
const RECONCILE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a shutdown waits for reconciles in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// How soon a node rollout in progress looks at its nodes and pods again (they are not watched).
const NODE_RECHECK: Duration = Duration::from_secs(2);
/// Re-try a spec that cannot be acted on (targets or namespaces may appear).
const BLOCKED_RETRY: Duration = Duration::from_secs(30);

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
    /// Where health checks may go besides the targets (`--http-check-allow`), and the API server's
    /// addresses, which they may not reach.
    pub http_check: crate::core::http_check::Policy,
}

/// Shared by every reconcile.
pub struct Context {
    client: Client,
    settings: Settings,
    /// What rollouts may touch (from the settings).
    rules: scope::Rules,
    stores: Stores,
    rollouts: Store<FleetRollout>,
    plans: PlanStore,
    prober: Prober,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    /// The cache may lag behind our own writes, and acting on a stale status would only earn a conflict.
    written: OwnWrites<FleetRollout>,
    /// Consecutive failed reconciles per rollout, for the retry backoff.
    failures: std::sync::Mutex<HashMap<ObjectRef<FleetRollout>, u32>>,
}

fn api(ctx: &Context, fr: &FleetRollout) -> Api<FleetRollout> {
    Api::namespaced(ctx.client.clone(), &fr.namespace().unwrap_or_default())
}

async fn reconcile(obj: Arc<FleetRollout>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    ctx.metrics.reconciles.inc();
    let key = ObjectRef::from_obj(&*obj);
    let span = info_span!("reconcile", rollout = %format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any()));
    // Every step survives being cut short, so a reconcile that hangs (a stuck connection, say) is cut short
    // and retried rather than left to hold the rollout forever. A panic (a bug meeting some input) fails
    // this rollout's step only: the process, its other rollouts and MCP keep running.
    let steps = AssertUnwindSafe(run_steps(ctx.written.newest(obj), &ctx, started).instrument(span));
    let result = match tokio::time::timeout(RECONCILE_TIMEOUT, steps.catch_unwind()).await {
        Ok(Ok(r)) => r,
        Ok(Err(panic)) => {
            ctx.metrics.reconcile_panics.inc();
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            error!(rollout = %key, %message, "reconcile panicked; this rollout will be retried with backoff");
            Err(Error::Panicked(message))
        }
        Err(_) => Err(Error::Timeout(RECONCILE_TIMEOUT)),
    };
    if result.is_ok() {
        ctx.forget_failures(&key);
    }
    ctx.metrics.reconcile_duration.observe(started.elapsed().as_secs_f64());
    update_gauges(&ctx);
    result
}

async fn run_steps(mut fr: Arc<FleetRollout>, ctx: &Context, started: Instant) -> Result<Action> {
    if fr.meta().deletion_timestamp.is_some() {
        daemonset_pods::finalize(&ctx.client, &fr).await?;
        return Ok(Action::await_change());
    }
    // Target health is read from the caches: never decide on a cache that has not been filled yet (every
    // target would look deleted).
    ctx.stores.wait_until_ready().await;
    let uid = fr.uid().unwrap_or_default();
    let mut batch_settled_at: Option<Instant> = None;
    for _ in 0..MAX_STEPS {
        let status = fr.status.clone().unwrap_or_default();
        let generation = fr.metadata.generation.unwrap_or(0);
        let now = Timestamp::now();

        // A rollout this installation may not run halts before anything changes.
        if let Some(why) = (!status.phase.is_terminal()).then(|| not_served(ctx, &fr.spec)).flatten() {
            match halt(ctx, &fr, &status, &why, now, generation).await? {
                Some(written) => {
                    fr = written;
                    continue;
                }
                None => return Ok(Action::requeue(BLOCKED_RETRY)),
            }
        }

        if rollout::needs_new_revision(&fr.spec, &status) {
            match plan_revision(ctx, &fr, &status, generation, now).await? {
                Some(t) => {
                    fr = match write_status(ctx, &fr, t).await {
                        Ok(f) => f,
                        Err(Error::Conflict) => refetch(ctx, &fr).await?,
                        Err(e) => return Err(e),
                    };
                    continue;
                }
                None => return Ok(Action::requeue(BLOCKED_RETRY)),
            }
        }

        let Some(plan_ref) = status.plan.clone() else {
            return Ok(Action::requeue(BLOCKED_RETRY));
        };
        // A finished rollout needs its plan only to roll back.
        let loaded = if status.phase.is_terminal() && !fr.spec.rollback {
            plans::LoadedPlan::none()
        } else {
            match ctx.plans.load(&ctx.client, &fr, &plan_ref).await? {
                Ok(loaded) => loaded,
                // An abort needs no plan: honour it, so a halted rollout can still be stopped for good.
                Err(_) if fr.spec.abort && status.phase != Phase::RollingBack => plans::LoadedPlan::none(),
                Err(why) => {
                    warn!(reason = why.reason, message = %why.message, "the stored plan is refused; nothing changes");
                    match halt(ctx, &fr, &status, &why, now, generation).await? {
                        Some(written) => {
                            fr = written;
                            continue;
                        }
                        None => return Ok(Action::requeue(BLOCKED_RETRY)),
                    }
                }
            }
        };
        let kind = fr.spec.targets.kind;
        if kind == TargetKind::Node
            && !status.phase.is_terminal()
            && let Some(written) = daemonset_pods::set_finalizer(&ctx.client, &fr, true).await?
        {
            // From now until it hands its DaemonSet back, deleting the rollout releases the DaemonSet first.
            fr = Arc::new(written);
            continue;
        }
        let container = status.revision.as_ref().and_then(|r| r.inputs.container.clone());
        // Node targets are read live (see controller::nodes), and only while there is something to do.
        // Not while it waits for a person (paused, awaiting approval): no batch is in flight then, and a
        // rollout left waiting must not list every node every few seconds.
        let waiting = matches!(status.phase, Phase::Paused | Phase::WaitingForApproval);
        let view = match kind == TargetKind::Node && !status.phase.is_terminal() && !waiting {
            true => Some(daemonset_pods::View::read(&ctx.client, &fr).await?),
            false => None,
        };
        let node_states = view.as_ref().map(|v| node_states(v, &uid, &status, container.as_deref()));
        let http = http_checks(ctx, &fr, &status, &loaded.plan, view.as_ref(), node_states.as_ref()).await;
        let lookup = |t: &PlannedTarget| match &node_states {
            Some(states) => states.get(&t.name).cloned().map(|mut s| {
                s.http = http.get(&(t.namespace.clone(), t.name.clone())).cloned();
                s
            }),
            None => ctx.stores.state(kind, container.as_deref(), t, &http),
        };
        let unplanned = || match &view {
            Some(v) => Some(v.unplanned(&loaded.members)),
            None => discovery::unplanned(&fr, &ctx.settings.fleet_namespace, &ctx.stores, &loaded.members),
        };
        let own_namespace = fr.namespace().unwrap_or_default();
        let scope_of = scope::Rollout {
            namespace: &own_namespace,
            kind,
            cross_namespace: status.revision.as_ref().is_some_and(|r| r.inputs.namespace_selector.is_some()),
        };
        let running = std::sync::OnceLock::new();
        let rollout = format!("{own_namespace}/{}", fr.name_any());
        // A node rollout's nodes are all held when another existing rollout holds the DaemonSet.
        let daemonset_holder = view
            .as_ref()
            .and_then(|v| v.daemonset.as_ref())
            .and_then(|ds| crate::core::nodes::held_by_other(ds.annotations(), &rollout))
            .filter(|other| rollout_known(ctx, other))
            .map(String::from);
        let in_scope = |t: &PlannedTarget| {
            let namespace = (t.namespace != own_namespace)
                .then(|| ctx.stores.namespaces.get(&ObjectRef::new(&t.namespace)))
                .flatten();
            let held_by = match kind {
                TargetKind::Node => daemonset_holder.clone(),
                _ => ctx.stores.facts(kind, &t.namespace, &t.name).and_then(|f| f.applied).and_then(|key| {
                    running.get_or_init(|| running_rollouts(ctx, &uid)).get(scope::key_owner(&key)).cloned()
                }),
            };
            let seen = scope::Seen {
                namespace_labels: namespace.as_ref().map(|n| n.labels()),
                held_by: held_by.as_deref(),
            };
            ctx.rules.check(scope_of, t, seen)
        };
        let step = rollout::advance(&Facts {
            now,
            uid: &uid,
            generation,
            spec: &fr.spec,
            status: &status,
            plan: &loaded.plan,
            target: &lookup,
            unplanned: &unplanned,
            scope: &in_scope,
        });

        let base_change =
            Change { kind, container: container.as_deref(), key: "", rollout: &rollout, between: "" };
        let outcome = match step {
            Step::Wait { after } => {
                let mut wait = after.map_or(RESYNC, |d| d.min(RESYNC) + Duration::from_millis(10));
                if view.is_some() {
                    // Pods and nodes are not watched: look again soon (a NotReady node fails, never hangs).
                    wait = wait.min(NODE_RECHECK);
                }
                if kind == TargetKind::Node && status.phase.is_terminal() {
                    release_daemonset(ctx, &fr, &status).await?;
                }
                // A node rollout that failed or was aborted still holds its DaemonSet: its TTL waits until it
                // does not (roll it back, or delete it, which hands the DaemonSet back as it was).
                let holding = kind == TargetKind::Node
                    && !matches!(status.phase, Phase::Succeeded | Phase::RolledBack)
                    && fr.finalizers().iter().any(|f| f == daemonset_pods::FINALIZER);
                if let Some(expiry) = rollout::expires_at(&fr.spec, &status).filter(|_| !holding) {
                    if now >= expiry {
                        info!("deleting: ttlSecondsAfterFinished has passed");
                        match api(ctx, &fr).delete(&fr.name_any(), &Default::default()).await {
                            Ok(_) => {}
                            Err(e) if crate::error::is_not_found(&e) => {}
                            Err(e) => return Err(Error::Kube(e)),
                        }
                        return Ok(Action::await_change());
                    }
                    wait = wait.min(Duration::try_from(expiry.duration_since(now)).unwrap_or(Duration::ZERO));
                }
                return Ok(Action::requeue(wait));
            }
            Step::Write(t) => {
                let intent = is_intent(&status, &t.status);
                if t.events.iter().any(|e| e.reason == rollout::reason::BATCH_SUCCEEDED) {
                    batch_settled_at = Some(started);
                }
                observe_batches(ctx, &status, &t.status);
                let written = write_status(ctx, &fr, t).await;
                if intent && written.is_ok() {
                    failpoint::hit(failpoint::AFTER_INTENT).await;
                }
                written
            }
            Step::Apply { key, image, targets, after } => {
                let out = if targets.is_empty() {
                    // Every target of the batch was refused: there is nothing to take over or patch.
                    targets::Outcome::default()
                } else if kind == TargetKind::Node {
                    let revision = crate::core::nodes::revision_key(&uid, revision_number(&status));
                    daemonset_pods::apply(
                        &ctx.client,
                        &ctx.metrics,
                        &fr,
                        &revision,
                        &image,
                        &rollout,
                        &targets,
                    )
                    .await?
                } else {
                    let change = Change { key: &key, between: failpoint::BETWEEN_PATCHES, ..base_change };
                    targets::patch_all(&ctx.client, &ctx.stores, &ctx.metrics, &change, &targets, |_| {
                        image.clone()
                    })
                    .await?
                };
                if let Some(at) = batch_settled_at.take() {
                    ctx.metrics.batch_transition.observe(at.elapsed().as_secs_f64());
                }
                info!(key = %key, changed = out.changed, unchanged = out.unchanged, skipped = out.skipped, denied = out.denied.len(), "batch applied");
                failpoint::hit(failpoint::AFTER_APPLY).await;
                let batch = after.status.current_batch.unwrap_or_default();
                write_status(ctx, &fr, rollout::denied(after, batch, out.denied)).await
            }
            Step::Restore { key, targets, refused } => {
                let out = if targets.is_empty() {
                    targets::Outcome::default()
                } else if kind == TargetKind::Node {
                    daemonset_pods::restore(&ctx.client, &ctx.metrics, &fr, &targets).await?
                } else {
                    let change = Change { key: &key, between: failpoint::BETWEEN_RESTORES, ..base_change };
                    targets::patch_all(&ctx.client, &ctx.stores, &ctx.metrics, &change, &targets, |t| {
                        t.previous_image.clone()
                    })
                    .await?
                };
                info!(key = %key, changed = out.changed, unchanged = out.unchanged, skipped = out.skipped, "rollback applied");
                let batch = status.current_batch.unwrap_or_default();
                let mut not_restored = refused;
                not_restored.extend(out.denied.iter().map(|(t, message)| TargetFailure {
                    namespace: t.namespace.clone(),
                    name: t.name.clone(),
                    batch,
                    reason: rollout::reason::CHANGE_DENIED.into(),
                    message: message.clone(),
                }));
                let t = rollout::restored(
                    now,
                    generation,
                    &status,
                    out.changed + out.unchanged,
                    out.skipped,
                    not_restored,
                );
                write_status(ctx, &fr, t).await
            }
        };
        fr = match outcome {
            Ok(f) => f,
            Err(Error::Conflict) => {
                debug!("status changed underneath us; re-reading");
                refetch(ctx, &fr).await?
            }
            Err(e) => return Err(e),
        };
    }
    Ok(Action::requeue(Duration::from_millis(100)))
}

/// Why this installation will not run a spec at all: node rollouts it was not given the rights for, or a
/// health check that may not go where it points.
fn not_served(ctx: &Context, spec: &crate::api::FleetRolloutSpec) -> Option<rollout::Blocked> {
    if spec.targets.kind == TargetKind::Node && !ctx.settings.node_rollouts {
        return Some(rollout::Blocked {
            reason: NODE_ROLLOUTS_DISABLED,
            message:
                "node rollouts (targets.kind Node) are disabled in this installation: the operator runs \
                      with --node-rollouts=false (Helm value nodeRollouts.enabled); nothing was changed"
                    .into(),
        });
    }
    let check = spec.health.http.as_ref()?;
    let message = ctx.prober.policy().check_template(&check.url, spec.targets.kind).err()?;
    Some(rollout::Blocked { reason: crate::core::http_check::REFUSED, message })
}

/// The reason of a node rollout in an installation without node rollouts.
pub const NODE_ROLLOUTS_DISABLED: &str = "NodeRolloutsDisabled";

/// Records that the rollout cannot go on (Pending, Degraded with `why`), unless the status says so already.
/// Some: the rollout as it is now, to look at again; None: nothing was written.
async fn halt(
    ctx: &Context,
    fr: &Arc<FleetRollout>,
    status: &FleetRolloutStatus,
    why: &rollout::Blocked,
    now: Timestamp,
    generation: i64,
) -> Result<Option<Arc<FleetRollout>>> {
    let Some(t) = rollout::blocked(now, generation, status, why) else { return Ok(None) };
    match write_status(ctx, fr, t).await {
        Ok(written) => Ok(Some(written)),
        Err(Error::Conflict) => refetch(ctx, fr).await.map(Some),
        Err(e) => Err(e),
    }
}

/// A write that moves a batch to Applying: the intent before any target of it changes.
fn is_intent(before: &FleetRolloutStatus, after: &FleetRolloutStatus) -> bool {
    after.current_batch.is_some()
        && after.current_batch != before.current_batch
        && after.batches.last().is_some_and(|b| b.state == BatchState::Applying)
}

fn observe_batches(ctx: &Context, before: &FleetRolloutStatus, after: &FleetRolloutStatus) {
    for b in &after.batches {
        let was_open = before.batches.iter().any(|x| x.index == b.index && x.finished_at.is_none());
        if let (true, Some(start), Some(end)) = (was_open, &b.started_at, &b.finished_at) {
            let secs = end.0.duration_since(start.0).as_secs_f64();
            ctx.metrics.batch_duration.observe(secs.max(0.0));
        }
    }
}

async fn refetch(ctx: &Context, fr: &FleetRollout) -> Result<Arc<FleetRollout>> {
    Ok(Arc::new(api(ctx, fr).get(&fr.name_any()).await?))
}

/// Discovers the fleet and freezes the plan of a new revision; None when the spec cannot be acted on and
/// the status already says so.
async fn plan_revision(
    ctx: &Context,
    fr: &Arc<FleetRollout>,
    status: &FleetRolloutStatus,
    generation: i64,
    now: Timestamp,
) -> Result<Option<Transition>> {
    let candidates = match discovery::discover(&ctx.client, &ctx.settings.fleet_namespace, fr).await? {
        Ok(c) => c,
        Err(why) => return Ok(rollout::blocked(now, generation, status, &why)),
    };
    let namespace = fr.namespace().unwrap_or_default();
    let rollout = scope::Rollout {
        namespace: &namespace,
        kind: fr.spec.targets.kind,
        cross_namespace: fr.spec.targets.namespace_selector.is_some(),
    };
    if let Some(r) = ctx.rules.refuse_plan(rollout, fr.spec.targets.daemon_set.as_deref(), &candidates) {
        let why = rollout::Blocked { reason: r.reason, message: r.message };
        return Ok(rollout::blocked(now, generation, status, &why));
    }
    let inputs = RevisionInputs::of(&fr.spec);
    let spec_hash = plan::sha256_hex(&inputs);
    // A superseded revision's targets keep the image they had before this rollout first changed them. A
    // superseded plan that is not the one frozen is not believed: previous images then come from the
    // targets as they are now (re-planning is how a rollout recovers from a tampered plan).
    let mut previous = HashMap::new();
    if let Some(old_ref) = &status.plan {
        match ctx.plans.load(&ctx.client, fr, old_ref).await? {
            Ok(old) => {
                for t in old.plan.batches.iter().flatten() {
                    previous.insert((t.namespace.clone(), t.name.clone()), t.previous_image.clone());
                }
            }
            Err(why) => {
                warn!(message = %why.message, "previous images of the superseded revision are not known")
            }
        }
    }
    let plan = match plan::build(candidates, &inputs, &spec_hash, &previous) {
        Ok(p) => p,
        Err(e) => {
            let why = rollout::Blocked { reason: rollout::reason::INVALID_SPEC, message: e.to_string() };
            return Ok(rollout::blocked(now, generation, status, &why));
        }
    };
    let plan_ref = match ctx.plans.store(&ctx.client, fr, &plan).await? {
        Ok(r) => r,
        Err(why) => return Ok(rollout::blocked(now, generation, status, &why)),
    };
    Ok(Some(rollout::start_revision(
        now,
        generation,
        &fr.spec,
        status,
        NewRevision { inputs, spec_hash, plan: &plan, plan_ref },
    )))
}

async fn http_checks(
    ctx: &Context,
    fr: &FleetRollout,
    status: &FleetRolloutStatus,
    plan: &plan::Plan,
    view: Option<&daemonset_pods::View>,
    node_states: Option<&HashMap<String, rollout::TargetState>>,
) -> HashMap<(String, String), Result<(), String>> {
    let Some(check) = &fr.spec.health.http else {
        return HashMap::new();
    };
    let Some(batch) = status.current_batch.and_then(|i| status.batches.iter().find(|b| b.index == i)) else {
        return HashMap::new();
    };
    if batch.state != BatchState::Verifying {
        return HashMap::new();
    }
    // Probe only targets whose own rollout is complete: the others are not healthy anyway.
    let container = status.revision.as_ref().and_then(|r| r.inputs.container.clone());
    let ready = |t: &PlannedTarget| {
        let state = match node_states {
            Some(states) => states.get(&t.name).cloned(),
            None => ctx.stores.state(fr.spec.targets.kind, container.as_deref(), t, &HashMap::new()),
        };
        state.is_some_and(|s| s.readiness == crate::core::workload::Readiness::Ready)
    };
    let checks: Vec<((String, String), String)> = plan
        .batch(batch.index)
        .iter()
        .filter(|t| ready(t))
        .map(|t| {
            let url = match view {
                Some(v) => v.url_for(&check.url, &t.name),
                None => check.url.replace("{name}", &t.name).replace("{namespace}", &t.namespace),
            };
            ((t.namespace.clone(), t.name.clone()), url)
        })
        .collect();
    ctx.prober.check_all(check.expect_status, checks).await
}

/// What the state machine sees of each node target of a node rollout.
fn node_states(
    view: &daemonset_pods::View,
    uid: &str,
    status: &FleetRolloutStatus,
    container: Option<&str>,
) -> HashMap<String, rollout::TargetState> {
    let revision = crate::core::nodes::revision_key(uid, revision_number(status));
    let batch = status
        .current_batch
        .and_then(|i| status.batches.iter().find(|b| b.index == i))
        .map(|b| b.idempotency_key.clone())
        .unwrap_or_default();
    let image = status.revision.as_ref().map(|r| r.inputs.image.clone()).unwrap_or_default();
    view.states(&revision, &batch, &image, container)
}

/// Whether the rollout `namespace/name` exists (in this operator's view of the FleetRollouts).
fn rollout_known(ctx: &Context, key: &str) -> bool {
    key.split_once('/').is_some_and(|(ns, name)| ctx.rollouts.get(&ObjectRef::new(name).within(ns)).is_some())
}

/// The other rollouts still running, by uid (`namespace/name`): a target one of them changed last is held.
fn running_rollouts(ctx: &Context, own_uid: &str) -> HashMap<String, String> {
    ctx.rollouts
        .state()
        .iter()
        .filter(|fr| !fr.status.as_ref().is_some_and(|s| s.phase.is_terminal()))
        .filter_map(|fr| {
            let uid = fr.uid()?;
            (uid != own_uid)
                .then(|| (uid, format!("{}/{}", fr.namespace().unwrap_or_default(), fr.name_any())))
        })
        .collect()
}

fn revision_number(status: &FleetRolloutStatus) -> u32 {
    status.revision.as_ref().map_or(0, |r| r.number)
}

/// Hands a node rollout's DaemonSet back once the rollout succeeded or was rolled back. After a failure or
/// an abort it stays on OnDelete, so that no further node changes behind the rollout's back.
async fn release_daemonset(ctx: &Context, fr: &FleetRollout, status: &FleetRolloutStatus) -> Result<()> {
    if !matches!(status.phase, Phase::Succeeded | Phase::RolledBack) {
        return Ok(());
    }
    let name = fr.spec.targets.daemon_set.clone().unwrap_or_default();
    let cached =
        ctx.stores.daemonsets.get(&ObjectRef::new(&name).within(&fr.namespace().unwrap_or_default()));
    if cached.is_none_or(|ds| crate::core::nodes::is_held(&ds.annotations)) {
        daemonset_pods::release(&ctx.client, fr, true).await?;
    }
    daemonset_pods::set_finalizer(&ctx.client, fr, false).await.map(drop)
}

/// Persists a status with the resourceVersion we read: if anything changed since, the API server refuses
/// (409) and we re-read instead of overwriting.
async fn write_status(ctx: &Context, fr: &FleetRollout, t: Transition) -> Result<Arc<FleetRollout>> {
    let mut next = fr.clone();
    next.status = Some(t.status);
    next.metadata.managed_fields = None;
    let pp = PostParams { field_manager: Some(crate::api::FIELD_MANAGER.into()), ..Default::default() };
    let written = Arc::new(api(ctx, fr).replace_status(&fr.name_any(), &pp, &next).await?);
    ctx.metrics.status_writes.inc();
    ctx.written.remember(&written);
    if let Some(s) = &written.status {
        debug!(phase = %s.phase, batch = ?s.current_batch, "status written");
    }
    publish(ctx, &written, t.events);
    Ok(written)
}

/// Events are best effort and must not slow the rollout down: they are sent in the background.
fn publish(ctx: &Context, fr: &FleetRollout, events: Vec<rollout::Event>) {
    if events.is_empty() {
        return;
    }
    let recorder = ctx.recorder.clone();
    let reference = fr.object_ref(&());
    tokio::spawn(async move {
        for e in events {
            let event = KubeEvent {
                type_: match e.type_ {
                    EventType::Normal => KubeEventType::Normal,
                    EventType::Warning => KubeEventType::Warning,
                },
                reason: e.reason.to_string(),
                note: Some(e.message),
                action: e.batch.map_or_else(|| "Rollout".to_string(), |b| format!("Batch{}", b + 1)),
                secondary: None,
            };
            if let Err(err) = recorder.publish(&event, &reference).await {
                warn!(error = %err, "could not publish an event");
            }
        }
    });
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
    ctx.metrics
        .reconcile_errors
        .get_or_create(&crate::runtime::metrics::ErrorLabel { error: err.metric_label().into() })
        .inc();
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
/// changed the workload, from our annotation).
fn watch_workloads<K>(
    client: &Client,
    config: &watcher::Config,
    facts: fn(&K) -> WorkloadFacts,
) -> (Store<Cached<K>>, impl Stream<Item = ObjectRef<FleetRollout>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store::<Cached<K>>();
    let events = watcher(Api::<K>::all(client.clone()), config.clone())
        .default_backoff()
        .map_ok(move |event| cached_event(event, facts));
    let triggers = reflector::reflector(writer, events).touched_objects().filter_map(|touched| {
        futures::future::ready(match touched {
            Ok(c) => c.rollout().map(|(ns, name)| ObjectRef::new(name).within(ns)),
            Err(e) => {
                warn!(kind = %K::kind(&()), error = %e, "watch failed; retrying with backoff");
                None
            }
        })
    });
    (store, triggers)
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

/// Runs the controller until `shutdown` fires. Call only while holding the leader lease.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Result<()> {
    let rollouts: Api<FleetRollout> = match &settings.watch_namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    rollouts.list(&ListParams::default().limit(1)).await.map_err(Error::CrdMissing)?;

    let watch_cfg = watcher::Config::default().any_semantic();
    let (deployments, deployment_triggers) = watch_workloads(&client, &watch_cfg, workload::deployment_facts);
    let (statefulsets, statefulset_triggers) =
        watch_workloads(&client, &watch_cfg, workload::statefulset_facts);
    let (daemonsets, daemonset_triggers) = watch_workloads(&client, &watch_cfg, workload::daemonset_facts);
    let (namespaces, namespaces_w) = reflector::store::<Namespace>();
    let namespace_events = watcher(Api::<Namespace>::all(client.clone()), watch_cfg.clone())
        .default_backoff()
        .modify(|n| {
            n.metadata.managed_fields = None;
            n.metadata.annotations = None;
        })
        .reflect(namespaces_w)
        .touched_objects();

    let controller = Controller::new(rollouts, watch_cfg)
        .reconcile_on(deployment_triggers)
        .reconcile_on(statefulset_triggers)
        .reconcile_on(daemonset_triggers)
        .watches_stream(namespace_events, |_| None);
    let stores = Stores::new(deployments, statefulsets, daemonsets, namespaces);
    let prober = Prober::new(settings.http_check.clone(), Some(client.clone())).map_err(Error::Config)?;
    let ctx = Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter { controller: "fleetroll".into(), instance: Some(settings.identity.clone()) },
        ),
        rollouts: controller.store(),
        client,
        plans: PlanStore::new(settings.plan_limits),
        prober,
        rules: scope::Rules {
            fleet_namespace: settings.fleet_namespace.clone(),
            protected_namespaces: settings.protected_namespaces.clone(),
            self_workloads: settings.self_workloads.clone(),
        },
        settings,
        stores: stores.clone(),
        metrics,
        written: OwnWrites::default(),
        failures: Default::default(),
    });

    let stop = shutdown.clone();
    info!("controller starting");
    let running = controller
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(reconcile, error_policy, ctx)
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
    info!("controller stopped");
    Ok(())
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
