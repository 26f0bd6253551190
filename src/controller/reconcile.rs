//! One reconcile: gather the facts, ask the core for the next step, perform it, and repeat until the core
//! says to wait. Every decision is the core's; this only reads and carries out.

use std::{
    collections::BTreeMap,
    collections::HashMap,
    panic::AssertUnwindSafe,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::FutureExt;
use k8s_openapi::jiff::Timestamp;
use kube::{
    Resource, ResourceExt,
    runtime::{controller::Action, reflector::ObjectRef},
};
use tracing::{Instrument, debug, error, info, info_span, warn};

use super::{
    Context,
    fleet::{Batch, Fleet, MemberNodes, MemberWorkloads, Nodes, Seen, Workloads, finalize_member_nodes},
};
use crate::{
    api::{FleetRollout, FleetRolloutSpec, FleetRolloutStatus, PlannedTarget, TargetFailure, TargetKind},
    core::{
        Blocked,
        plan::Plan,
        reason,
        rollout::{self, Facts, Prep, Step, Transition},
        scope,
    },
    edge::{
        nodes,
        plans::LoadedPlan,
        rollouts::{FINALIZER, holds_daemonset},
        workloads::Outcome,
    },
    error::{Error, Result},
    failpoint,
};

/// How many steps one reconcile may take before yielding (a safety net, never reached in practice).
const MAX_STEPS: usize = 64;
/// Re-check rollouts that wait on nothing in particular this often (reads only; writes happen on change).
const RESYNC: Duration = Duration::from_secs(300);
/// Longest a single reconcile may take.
const RECONCILE_TIMEOUT: Duration = Duration::from_secs(60);

/// One reconcile's timing: when it started, and when it saw a batch settle (for the transition metric).
struct Round {
    started: Instant,
    batch_settled_at: Option<Instant>,
}

/// What a step leaves: the rollout to look at again, or how the reconcile ends.
enum Next {
    Again(Arc<FleetRollout>),
    Done(Action),
}

pub(super) async fn reconcile(obj: Arc<FleetRollout>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    ctx.metrics.reconciles.inc();
    let key = ObjectRef::from_obj(&*obj);
    let span = info_span!("reconcile", rollout = %format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any()));
    // Every step survives being cut short, so a reconcile that hangs (a stuck connection, say) is cut short
    // and retried rather than left to hold the rollout forever. A panic (a bug meeting some input) fails
    // this rollout's step only: the process, its other rollouts and MCP keep running.
    let steps = AssertUnwindSafe(run_steps(ctx.rollouts_io.newest(obj), &ctx, started).instrument(span));
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
    super::update_gauges(&ctx);
    result
}

async fn run_steps(fr: Arc<FleetRollout>, ctx: &Context, started: Instant) -> Result<Action> {
    if fr.meta().deletion_timestamp.is_some() {
        if !holds_daemonset(&fr) {
            return super::notifications::farewell(ctx, &fr).await;
        }
        match fr.spec.targets.clusters {
            Some(_) if fr.spec.targets.kind == TargetKind::Node => finalize_member_nodes(ctx, &fr).await?,
            _ => nodes::finalize(&ctx.client, ctx.writer(&fr), &fr).await?,
        }
        // The DaemonSet first; the finalizer's removal wakes it again for the platform's farewell.
        return Ok(Action::await_change());
    }
    // Target health is read from the caches: never decide on a cache that has not been filled yet (every
    // target would look deleted).
    ctx.stores.wait_until_ready().await;
    let mut fr = super::notifications::held(ctx, fr).await?;
    let mut round = Round { started, batch_settled_at: None };
    for _ in 0..MAX_STEPS {
        let next = match fr.spec.targets.kind {
            TargetKind::Node if fr.spec.targets.clusters.is_some() => {
                step::<MemberNodes>(ctx, fr, &mut round).await?
            }
            TargetKind::Node => step::<Nodes>(ctx, fr, &mut round).await?,
            _ if fr.spec.targets.clusters.is_some() => step::<MemberWorkloads>(ctx, fr, &mut round).await?,
            _ => step::<Workloads>(ctx, fr, &mut round).await?,
        };
        match next {
            Next::Again(written) => fr = written,
            Next::Done(action) => return Ok(action),
        }
    }
    Ok(Action::requeue(Duration::from_millis(100)))
}

/// One step: gather the facts, let the core decide, act. Before the targets are looked at, the core says
/// whether the rollout may run at all, needs a new revision, and needs its frozen plan.
async fn step<F: Fleet>(ctx: &Context, fr: Arc<FleetRollout>, round: &mut Round) -> Result<Next> {
    let status = fr.status.clone().unwrap_or_default();
    let now = Timestamp::now();
    let generation = fr.metadata.generation.unwrap_or(0);
    let not_served = not_served(ctx, &fr);
    let load = match rollout::prepare(now, generation, &fr.spec, &status, not_served.as_ref()) {
        Prep::Proceed { load } => load,
        Prep::PlanRevision => {
            let planned = super::revision::plan_revision::<F>(ctx, &fr, &status, now).await?;
            return act::<F>(ctx, fr, &status, planned, None, now, round).await;
        }
        Prep::Take(step) => return act::<F>(ctx, fr, &status, *step, None, now, round).await,
    };
    let loaded = match load {
        Some(plan_ref) => match ctx.plans.load(&ctx.client, &fr, plan_ref).await? {
            Ok(loaded) => loaded,
            Err(why) => match rollout::plan_refused(now, generation, &fr.spec, &status, &why) {
                Some(halt) => {
                    warn!(reason = why.reason, message = %why.message, "the stored plan is refused; nothing changes");
                    return act::<F>(ctx, fr, &status, halt, None, now, round).await;
                }
                None => LoadedPlan::none(),
            },
        },
        None => LoadedPlan::none(),
    };
    // What is due before the targets are even looked at (a node rollout holds its DaemonSet first).
    if let Some(first) = rollout::before_observing(&fr.spec, &status, holds_daemonset(&fr)) {
        return act::<F>(ctx, fr, &status, first, None, now, round).await;
    }
    let seen = F::observe(ctx, &fr, &status, &loaded.plan).await?;
    let members = super::namespaces::member_windows(ctx, &fr).await?;
    let decided = decide(ctx, &fr, &status, &loaded, (&seen, &members), now).await;
    act::<F>(ctx, fr, &status, decided, seen.recheck(), now, round).await
}

/// Probes what the core says to probe, then asks it for the next step.
async fn decide(
    ctx: &Context,
    fr: &FleetRollout,
    status: &FleetRolloutStatus,
    loaded: &LoadedPlan,
    (seen, members): (&impl Seen, &super::namespaces::MemberWindows),
    now: Timestamp,
) -> Step {
    let http = probe(ctx, &fr.spec, status, &loaded.plan, seen).await;
    let measured = super::analysis::measure(ctx, fr, status, &loaded.plan, now).await;
    // A measurement is taken when its answers arrived: the next one is due an interval after that.
    let now = if measured.is_empty() { now } else { Timestamp::now() };
    let target = |t: &PlannedTarget| {
        seen.target(t).map(|mut s| {
            s.http = http.get(&(t.namespace.clone(), t.name.clone())).cloned();
            s
        })
    };
    let unplanned = || seen.unplanned(&loaded.members);
    let own_namespace = fr.namespace().unwrap_or_default();
    let scope_of = scope::Rollout {
        namespace: &own_namespace,
        kind: fr.spec.targets.kind,
        cross_namespace: status.revision.as_ref().is_some_and(|r| r.inputs.namespace_selector.is_some()),
    };
    let in_scope = |t: &PlannedTarget| {
        let labels = match t.cluster.is_empty() {
            true => (t.namespace != own_namespace)
                .then(|| ctx.stores.namespaces.get(&ObjectRef::new(&t.namespace)))
                .flatten()
                .map(|n| n.labels().clone()),
            false => seen.member_namespace(t),
        };
        let held_by = seen.held_by(t);
        let seen = scope::Seen { namespace_labels: labels.as_ref(), held_by: held_by.as_deref() };
        ctx.rules.check(scope_of, t, seen)
    };
    let uid = fr.uid().unwrap_or_default();
    let guardrails = crate::core::policy::guardrails(&ctx.policies.state(), fr.spec.creator.as_ref());
    // In member clusters the members' credentials act, whoever created the rollout.
    let cannot_act = match fr.spec.targets.clusters {
        None => ctx.writers.cannot_act(fr.spec.creator.as_ref()),
        Some(_) => None,
    };
    let mut nonce = uuid::Uuid::new_v4().simple().to_string();
    nonce.truncate(16);
    rollout::decide(&Facts {
        nonce: &nonce,
        cannot_act: cannot_act.as_deref(),
        now,
        uid: &uid,
        generation: fr.metadata.generation.unwrap_or(0),
        namespace: &own_namespace,
        guardrails: &guardrails,
        spec: &fr.spec,
        status,
        plan: &loaded.plan,
        holds_daemonset: holds_daemonset(fr),
        target: &target,
        unplanned: &unplanned,
        scope: &in_scope,
        declared_windows: &|owner| super::namespaces::declared_windows(ctx, members, owner),
        carrying: &|prefix| seen.carrying(prefix),
        measured: &measured,
        unreachable: &seen.unreachable(),
    })
}

/// The HTTP checks of the targets the core says to probe now, keyed by (namespace, name).
async fn probe(
    ctx: &Context,
    spec: &FleetRolloutSpec,
    status: &FleetRolloutStatus,
    plan: &Plan,
    seen: &impl Seen,
) -> HashMap<(String, String), Result<(), String>> {
    let Some(check) = &spec.health.http else { return HashMap::new() };
    let checks = rollout::probes(spec, status, plan, &|t| seen.target(t))
        .into_iter()
        .filter_map(|t| {
            let url = seen.probe_url(&check.url, &t)?;
            Some(((t.namespace, t.name), url))
        })
        .collect();
    ctx.prober.check_all(check.expect_status, checks).await
}

/// Performs the core's step.
async fn act<F: Fleet>(
    ctx: &Context,
    fr: Arc<FleetRollout>,
    status: &FleetRolloutStatus,
    step: Step,
    recheck: Option<Duration>,
    now: Timestamp,
    round: &mut Round,
) -> Result<Next> {
    let written = match super::notifications::acknowledging(ctx, &fr, status, step) {
        Step::Wait { after } => {
            let wait = after.map_or(RESYNC, |d| d.min(RESYNC) + Duration::from_millis(10));
            return Ok(Next::Done(Action::requeue(recheck.map_or(wait, |r| wait.min(r)))));
        }
        // A period, not a deadline: no slack, no cap.
        Step::Retry { write: None, after } => return Ok(Next::Done(Action::requeue(after))),
        Step::Retry { write: Some(t), after } => match write(ctx, &fr, status, t, round).await {
            Ok(_) => return Ok(Next::Done(Action::requeue(after))),
            // Settled as any write: a conflict is read again, at once.
            failed => failed,
        },
        Step::Delete => {
            info!("deleting: ttlSecondsAfterFinished has passed");
            ctx.rollouts_io.delete(&fr).await?;
            return Ok(Next::Done(Action::await_change()));
        }
        Step::HoldDaemonSet => {
            let written = ctx.rollouts_io.set_finalizer(&fr, FINALIZER, true).await?;
            return Ok(Next::Again(written.unwrap_or(fr)));
        }
        Step::ReleaseDaemonSet => {
            F::release(ctx, &fr, true).await?;
            return Ok(match ctx.rollouts_io.set_finalizer(&fr, FINALIZER, false).await? {
                Some(written) => Next::Again(written),
                // Deleted and finalized meanwhile: nothing is left to do.
                None => Next::Done(Action::await_change()),
            });
        }
        Step::Write(t) => write(ctx, &fr, status, t, round).await,
        Step::Apply { key, image, targets, after } => {
            let batch =
                Batch { key: &key, image: &image, targets: &targets, revision: status.revision_number() };
            if let Some(at) = round.batch_settled_at.take() {
                ctx.metrics.batch_transition.observe(at.elapsed().as_secs_f64());
            }
            let out = if targets.is_empty() { Outcome::default() } else { F::apply(ctx, &fr, batch).await? };
            info!(key = %key, changed = out.changed, unchanged = out.unchanged, skipped = out.skipped, denied = out.denied.len(), held = out.held.len(), "batch applied");
            failpoint::hit(failpoint::AFTER_APPLY).await;
            let batch = after.status.current_batch.unwrap_or_default();
            let after = rollout::unreached(after, batch, &targets, &out.unreached);
            let denied = rollout::denied(after, batch, out.denied, fr.spec.resume_token.as_deref());
            let after = rollout::held(denied, batch, out.held);
            super::notifications::persist(ctx, &fr, after).await
        }
        Step::Restore { key, targets, refused, waiting } => {
            let out = if targets.is_empty() {
                Outcome::default()
            } else {
                F::restore(ctx, &fr, &key, &targets).await?
            };
            info!(key = %key, changed = out.changed, unchanged = out.unchanged, skipped = out.skipped, waiting = waiting.len() + out.unreached.len(), "rollback applied");
            super::notifications::persist(ctx, &fr, restored(&fr, status, out, refused, waiting, now)).await
        }
    };
    settle(ctx, &fr, written).await
}

/// Persists a status the core decided, and what it tells: a batch settled (for the transition metric),
/// batch durations, and the measurements it records, counted once written (a write that lost a race is
/// measured again).
async fn write(
    ctx: &Context,
    fr: &Arc<FleetRollout>,
    status: &FleetRolloutStatus,
    t: Transition,
    round: &mut Round,
) -> Result<Arc<FleetRollout>> {
    let intent = rollout::is_intent(status, &t.status);
    if t.events.iter().any(|e| e.reason == reason::BATCH_SUCCEEDED) {
        round.batch_settled_at = Some(round.started);
    }
    ctx.observe_batches(status, &t.status);
    let measurements = super::analysis::recorded(status, &t.status);
    let written = super::notifications::persist(ctx, fr, t).await;
    if written.is_ok() {
        super::analysis::observe(ctx, measurements);
        if intent {
            failpoint::hit(failpoint::AFTER_INTENT).await;
        }
    }
    written
}

/// The status after a pass of a rollback: what was restored, what could not be (refused by the scope
/// rules or by the API server), and the member clusters it still waits for (they did not answer, before
/// or during the restore).
fn restored(
    fr: &FleetRollout,
    status: &FleetRolloutStatus,
    out: Outcome,
    refused: Vec<TargetFailure>,
    mut waiting: BTreeMap<String, String>,
    now: Timestamp,
) -> Transition {
    let batch = status.current_batch.unwrap_or_default();
    let mut not_restored = refused;
    let failure = |t: &PlannedTarget, reason: &str, message: String| TargetFailure {
        cluster: t.cluster.clone(),
        namespace: t.namespace.clone(),
        name: t.name.clone(),
        batch,
        reason: reason.into(),
        message,
    };
    not_restored
        .extend(out.denied.iter().map(|(t, message)| failure(t, reason::CHANGE_DENIED, message.clone())));
    not_restored.extend(
        out.held.iter().map(|(t, by)| failure(t, reason::TARGET_HELD, by.refusal(&t.key(), "restored"))),
    );
    waiting.extend(out.unreached);
    let generation = fr.metadata.generation.unwrap_or(0);
    let restored = out.changed + out.unchanged;
    rollout::restored(now, generation, status, restored, out.skipped, not_restored, &waiting)
}

/// A write's result: the rollout as written, or (it changed underneath us) as it is now.
async fn settle(ctx: &Context, fr: &FleetRollout, written: Result<Arc<FleetRollout>>) -> Result<Next> {
    match written {
        Ok(f) => Ok(Next::Again(f)),
        Err(Error::Conflict) => {
            debug!("status changed underneath us; re-reading");
            Ok(Next::Again(ctx.rollouts_io.refetch(fr).await?))
        }
        Err(e) => Err(e),
    }
}

/// Why this installation will not run a spec at all: node rollouts it was not given the rights for, or a
/// health check that may not go where it points.
fn not_served(ctx: &Context, fr: &FleetRollout) -> Option<Blocked> {
    let spec = &fr.spec;
    if spec.targets.kind == TargetKind::Node && !ctx.settings.node_rollouts {
        return Some(Blocked {
            reason: reason::NODE_ROLLOUTS_DISABLED,
            message:
                "node rollouts (targets.kind Node) are disabled in this installation: the operator runs \
                      with --node-rollouts=false (Helm value nodeRollouts.enabled); nothing was changed"
                    .into(),
        });
    }
    if let Some(analysis) = &spec.analysis
        && let Err(blocked) = crate::core::analysis::provider::check(
            &ctx.settings.analysis,
            analysis,
            fr.metadata.namespace.as_deref().unwrap_or_default(),
        )
    {
        return Some(blocked);
    }
    let check = spec.health.http.as_ref()?;
    let message = ctx.prober.policy().check_template(&check.url, spec.targets.kind).err()?;
    Some(Blocked { reason: reason::HTTP_CHECK_REFUSED, message })
}
