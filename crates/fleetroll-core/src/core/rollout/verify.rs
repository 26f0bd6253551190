//! The batch in flight: each target's verdict (healthy, failed, gone, refused or not yet), the soak that
//! follows, and the batch settled once every target is judged.

use std::time::Duration;

use super::{
    Event, Facts, Step,
    analysis::{self, Gate},
    failure,
    failure::apply_failure_policy,
    gates::next_batch,
    later, total_batches, trim_front, until, write_if_changed,
};
use crate::{
    api::{BatchState, BatchStatus, FAILURE_DETAILS, FleetRolloutStatus, PlannedTarget, TargetFailure, time},
    core::{clusters, count, duration, reason, workload::Readiness},
};

use super::TargetState;

const HTTP_NOT_RUN: &str = "the HTTP check has not run yet";

/// What the targets of a batch look like now.
#[derive(Default)]
struct Tally {
    healthy: u32,
    /// Failed targets, and gone ones (`skipped` of them), as failure records.
    failures: Vec<TargetFailure>,
    skipped: u32,
    refused: Vec<TargetFailure>,
    /// The first target not settled yet, and why.
    waiting: Option<String>,
}

pub(super) fn verify(f: &Facts<'_>, mut s: FleetRolloutStatus, b: BatchStatus) -> Step {
    let timeout = duration::parse(&f.spec.health.timeout).unwrap_or(Duration::from_secs(600));
    let applied_at = b.applied_at.as_ref().map_or(f.now, |t| t.0);
    let deadline = later(applied_at, timeout);
    if let Some(c) = s.clusters.as_mut() {
        c.trouble = clusters::trouble(&c.trouble, f.unreachable, f.now);
    }
    // Past the health timeout a member that answers again is not changed any more: its targets fail.
    if f.now < deadline
        && let Some(again) = reach_again(f, &s, &b)
    {
        return again;
    }
    let tally = tally(f, &b, f.now >= deadline);

    if let Some(why) = tally.waiting {
        // A target waiting only for its first probe is probed at the next step: take it soon.
        let soon = why.ends_with(HTTP_NOT_RUN).then_some(Duration::from_millis(200));
        // Not settled yet. A soak clock that was running stops: not everything is healthy any more.
        let mut events = Vec::new();
        if s.batch_mut(b.index).is_some_and(|entry| entry.healthy_since.take().is_some()) {
            let message = format!("batch {}: soak restarted, {why}", b.index + 1);
            events.push(Event::warning(reason::SOAKING, Some(b.index), message));
        }
        // A pause the analysis made (AnalysisError) is kept while the targets settle again.
        if s.phase == crate::api::Phase::Progressing {
            s.reason = Some(reason::BATCH_APPLIED.into());
        }
        let wait = until(f.now, deadline).max(Duration::from_millis(100));
        return write_if_changed(f, s, events, Some(soon.map_or(wait, |soon| soon.min(wait))));
    }
    let failed = count(tally.failures.len()) - tally.skipped;
    // Failures past the budget settle the batch at once: nothing left to measure or soak.
    if s.counts.failed.saturating_add(failed) > failure::budget(f) {
        return settle(f, s, &b, tally, failed, Vec::new(), None);
    }
    let mut events = Vec::new();
    let wait = match analysis::gate(f, &mut s, b.index, &mut events) {
        Gate::Failed(why) => return settle(f, s, &b, tally, failed, events, Some(why)),
        Gate::Held => return write_if_changed(f, s, events, None),
        Gate::Wait(after) => Some(after),
        Gate::Passed => None,
    };
    let soaking = if failed == 0 { soak(f, &mut s, b.index, &mut events) } else { None };
    match (wait, soaking) {
        (None, None) => settle(f, s, &b, tally, failed, events, None),
        (analysing, soaking) => {
            let after = [analysing.flatten(), soaking].into_iter().flatten().min();
            write_if_changed(f, s, events, after)
        }
    }
}

/// Changes, with the batch's own key, the targets of member clusters the batch could not reach before and
/// that answer now. None when there are none.
fn reach_again(f: &Facts<'_>, s: &FleetRolloutStatus, b: &BatchStatus) -> Option<Step> {
    let back: Vec<&String> = b.unreached.iter().filter(|c| !f.unreachable.contains_key(*c)).collect();
    if back.is_empty() {
        return None;
    }
    let targets: Vec<PlannedTarget> =
        f.plan.batch(b.index).iter().filter(|t| back.contains(&&t.cluster)).cloned().collect();
    let (targets, _refused) = failure::in_scope(f, targets, b.index);
    let mut after = s.clone();
    if let Some(entry) = after.batch_mut(b.index) {
        entry.unreached.retain(|c| !back.contains(&c));
    }
    after.counts.updated = after.counts.updated.saturating_add(count(targets.len()));
    if let Some(c) = after.clusters.as_mut() {
        clusters::tally(c, b.index, targets.iter().map(|t| t.cluster.as_str()), clusters::Count::Updated, 1);
    }
    super::finish(&mut after, f.generation, f.now);
    let names: Vec<&str> = back.iter().map(|c| c.as_str()).collect();
    let message = format!(
        "batch {}: cluster(s) {} answer again; changing their {} target(s)",
        b.index + 1,
        names.join(", "),
        targets.len()
    );
    Some(Step::Apply {
        key: b.idempotency_key.clone(),
        image: super::image(f),
        targets,
        after: super::Transition {
            status: after,
            events: vec![Event::normal(reason::CLUSTER_REACHABLE, Some(b.index), message)],
        },
    })
}

/// Judges every target of the batch.
fn tally(f: &Facts<'_>, b: &BatchStatus, timed_out: bool) -> Tally {
    let want_image = super::image(f);
    let http_required = f.spec.health.http.is_some();
    let mut t = Tally::default();
    for target in f.plan.batch(b.index) {
        let state = (f.target)(target);
        // A target the batch did not change because the scope rules refused it (its namespace opted out,
        // it is protected, another rollout holds it) is reported as refused, not awaited.
        if b.denied.contains(&target.key())
            && state.as_ref().is_none_or(|s| s.applied.as_deref() != Some(b.idempotency_key.as_str()))
        {
            // Failed when its change was refused; counted then.
            continue;
        }
        // A member cluster that does not answer shows nothing: its targets wait for it (or fail at the
        // timeout), whatever else is true of them.
        let not_reached = || b.unreached.contains(&target.cluster).then_some("its change never reached it");
        let down = f.unreachable.get(&target.cluster).map(String::as_str).or_else(not_reached);
        if let Some(why) = down.filter(|_| !target.cluster.is_empty()) {
            match unreachable(target, why, timed_out) {
                Verdict::Failed(reason, message) => {
                    t.failures.push(super::failure(target, b.index, reason, message))
                }
                _ => {
                    let why = format!("cluster {} does not answer: {why}", target.cluster);
                    t.waiting.get_or_insert_with(|| format!("{}: {why}", target.key()));
                }
            }
            continue;
        }
        let ours = state.as_ref().is_some_and(|s| s.applied.as_deref() == Some(b.idempotency_key.as_str()));
        if !ours && (b.denied.contains(&target.key()) || b.refused.contains(&target.key())) {
            // Failed when its change was refused, or refused when the batch started or came to change it;
            // counted then.
            continue;
        }
        if !ours && let Err(r) = (f.scope)(target) {
            t.refused.push(super::failure(target, b.index, r.reason, r.message));
            continue;
        }
        match verdict(target, state, &b.idempotency_key, &want_image, http_required, timed_out) {
            Verdict::Healthy => t.healthy += 1,
            Verdict::Missing => {
                t.skipped += 1;
                let message = "the target was deleted during the rollout (skipped, not counted as a failure)";
                t.failures.push(super::failure(target, b.index, reason::TARGET_MISSING, message.into()));
            }
            Verdict::Failed(reason, message) => {
                t.failures.push(super::failure(target, b.index, reason, message))
            }
            Verdict::Waiting(why) => {
                t.waiting.get_or_insert_with(|| format!("{}: {why}", target.key()));
            }
        }
    }
    t
}

/// Holds a healthy batch for `health.soak` before it counts: how long it has left, or None once it has
/// soaked (or needs no soak).
fn soak(f: &Facts<'_>, s: &mut FleetRolloutStatus, index: u32, events: &mut Vec<Event>) -> Option<Duration> {
    let soak = duration::parse(&f.spec.health.soak).unwrap_or(Duration::ZERO);
    if soak.is_zero() {
        return None;
    }
    let since = match s.batch(index).and_then(|x| x.healthy_since.clone()) {
        Some(since) => since.0,
        None => {
            if let Some(entry) = s.batch_mut(index) {
                entry.healthy_since = Some(time(f.now));
            }
            let message =
                format!("batch {}: all targets healthy, soaking for {}", index + 1, f.spec.health.soak);
            events.push(Event::normal(reason::SOAKING, Some(index), message));
            f.now
        }
    };
    let end = later(since, soak);
    if f.now >= end {
        return None;
    }
    // Only a rollout going on is Soaking: one the analysis paused says so, and AnalysisRunning says more.
    if s.phase == crate::api::Phase::Progressing && s.reason.as_deref() != Some(reason::ANALYSIS_RUNNING) {
        s.reason = Some(reason::SOAKING.into());
    }
    Some(until(f.now, end))
}

/// The batch is settled: count it, then either go on or apply the failure policy.
fn settle(
    f: &Facts<'_>,
    mut s: FleetRolloutStatus,
    b: &BatchStatus,
    t: Tally,
    failed: u32,
    mut events: Vec<Event>,
    analysis_failed: Option<String>,
) -> Step {
    let changed = changed_by_others(b.index, &t.failures);
    s.counts.healthy += t.healthy;
    s.counts.failed += failed;
    s.counts.skipped += t.skipped;
    s.counts.refused += count(t.refused.len());
    if let Some(c) = s.clusters.as_mut() {
        let failed = t.failures.iter().filter(|x| x.reason != reason::TARGET_MISSING);
        clusters::tally(c, b.index, failed.map(|x| x.cluster.as_str()), clusters::Count::Failed, 1);
    }
    s.failures.extend(t.failures);
    s.failures.extend(t.refused.iter().cloned());
    trim_front(&mut s.failures, FAILURE_DETAILS);
    let over_budget = failure::over_budget(f, &s);
    if let Some(entry) = s.batch_mut(b.index) {
        let batch_failed = over_budget || analysis_failed.is_some();
        entry.state = if batch_failed { BatchState::Failed } else { BatchState::Succeeded };
        entry.failed = entry.failed.saturating_add(failed);
        entry.finished_at = Some(time(f.now));
    }
    let total = total_batches(f);
    if over_budget {
        let message = format!(
            "batch {}/{total}: {} of {} targets failed; {} failed in total, budget {}",
            b.index + 1,
            failed.saturating_add(count(b.denied.len())),
            b.size,
            s.counts.failed,
            failure::budget(f)
        );
        events.push(Event::warning(reason::BATCH_FAILED, Some(b.index), message));
        events.extend(changed);
        return apply_failure_policy(f, s, b, events);
    }
    if let Some(why) = analysis_failed {
        events.extend(changed);
        return analysis::fail(f, s, b, events, &why);
    }
    events.extend(
        t.refused
            .iter()
            .map(|r| Event::warning(reason::refusal(&r.reason), Some(b.index), r.message.clone())),
    );
    events.extend(changed);
    let message = format!(
        "batch {}/{total}: {} healthy, {failed} failed, {} skipped, {} refused",
        b.index + 1,
        t.healthy,
        t.skipped,
        t.refused.len()
    );
    events.push(Event::normal(reason::BATCH_SUCCEEDED, Some(b.index), message));
    next_batch(f, s, events)
}

/// One Warning event per batch for its targets whose image someone else changed after fleetroll set it: a
/// person or a GitOps tool is undoing the rollout, which the batch's own event does not say.
fn changed_by_others(index: u32, failures: &[TargetFailure]) -> Option<Event> {
    let mut changed = failures.iter().filter(|x| x.reason == reason::IMAGE_CHANGED);
    let first = changed.next()?;
    let message = match changed.count() {
        0 => first.message.clone(),
        more => format!("{} (and {more} more targets of this batch)", first.message),
    };
    Some(Event::warning(reason::IMAGE_CHANGED, Some(index), message))
}

enum Verdict {
    Healthy,
    Missing,
    Failed(&'static str, String),
    Waiting(String),
}

/// A target of a member cluster that does not answer: waited for until the health timeout, then failed.
fn unreachable(t: &PlannedTarget, why: &str, timed_out: bool) -> Verdict {
    if timed_out {
        let message = format!("cluster {} did not answer within the health timeout: {why}", t.cluster);
        Verdict::Failed(reason::CLUSTER_UNREACHABLE, message)
    } else {
        Verdict::Waiting(format!("cluster {} does not answer: {why}", t.cluster))
    }
}

fn verdict(
    t: &PlannedTarget,
    state: Option<TargetState>,
    key: &str,
    image: &str,
    http_required: bool,
    timed_out: bool,
) -> Verdict {
    let Some(state) = state else {
        return Verdict::Missing;
    };
    let current = match &state.image {
        Ok(i) => i,
        Err(e) => return Verdict::Failed(reason::INVALID_SPEC, e.clone()),
    };
    if current != image {
        if state.applied.as_deref() == Some(key) {
            return Verdict::Failed(
                reason::IMAGE_CHANGED,
                format!("{} was changed to {current} by someone else after fleetroll set {image}", t.key()),
            );
        }
        // Our change is not in the cache yet; past the health timeout it never will be: someone changed the
        // target again before it was seen, and it is judged, never awaited for ever.
        if timed_out {
            let message = format!(
                "{} does not show this batch's change ({image}) within the health timeout: it runs {current}",
                t.key()
            );
            return Verdict::Failed(reason::IMAGE_CHANGED, message);
        }
        return Verdict::Waiting("the change is not visible yet".into());
    }
    let (why, failure_reason) = match state.readiness {
        Readiness::Failed { reason, message } => return Verdict::Failed(reason, message),
        Readiness::NotReady(why) => (why, reason::TIMEOUT),
        Readiness::Ready => match state.http {
            Some(Ok(())) => return Verdict::Healthy,
            None if !http_required => return Verdict::Healthy,
            // Ready only since the probes of this step ran: probed at the next step, never passed unprobed.
            None => (HTTP_NOT_RUN.to_string(), reason::HTTP_CHECK_FAILED),
            Some(Err(e)) => (format!("HTTP check: {e}"), reason::HTTP_CHECK_FAILED),
        },
    };
    if timed_out {
        Verdict::Failed(failure_reason, format!("not healthy within the health timeout: {why}"))
    } else {
        Verdict::Waiting(why)
    }
}
