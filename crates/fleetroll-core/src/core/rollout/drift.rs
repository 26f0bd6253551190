//! After success: the targets a rollout changed whose image someone else has changed since (a GitOps tool
//! re-applying Git, a person with kubectl). Recounted from what the targets carry now, so the status says
//! how things are rather than what once happened; a Warning event says so whenever more are affected.
//!
//! A target counts when it still carries a key of this revision (a later rollout replaces the key) and
//! its image is not the revision's. Only targets the rollout may touch count: anyone may copy a key onto
//! a workload of their own, and that must not make someone else's rollout read as failed. A target whose
//! rolled container can no longer be told apart (no `container` and a second one added since) does not
//! count: its image cannot be judged.

use super::{Event, Facts};
use crate::{
    api::{ChangedByOthers, FleetRolloutStatus, Phase, PlannedTarget, target_key},
    core::{count, reason},
};

/// Names of changed targets listed in status.
const SAMPLE: usize = 10;

/// Recounts the targets of a succeeded rollout that no longer carry its image; a Warning event when the
/// count grows.
pub(super) fn recount(f: &Facts<'_>, s: &mut FleetRolloutStatus) -> Vec<Event> {
    let revision = match (&s.revision, s.phase) {
        (Some(r), Phase::Succeeded) => r,
        _ => {
            s.changed_by_others = None;
            return Vec::new();
        }
    };
    let image = revision.inputs.image.clone();
    let prefix = format!("{}/{}/", f.uid, revision.number);
    let in_scope = |namespace: &str, name: &str| {
        let t = PlannedTarget { namespace: namespace.into(), name: name.into(), ..Default::default() };
        (f.scope)(&t).is_ok()
    };
    // The image first: it is a comparison, the scope check builds a target (this runs at every change of
    // a carrying target, a thousand of them when a whole fleet is re-applied).
    let mut changed: Vec<String> = (f.carrying)(&prefix)
        .into_iter()
        .filter(|c| c.image.as_ref().is_ok_and(|now| *now != image))
        .filter(|c| in_scope(&c.namespace, &c.name))
        .filter_map(|c| Some(format!("{}: {}", target_key(&c.namespace, &c.name), c.image.ok()?)))
        .collect();
    if changed.is_empty() {
        s.changed_by_others = None;
        return Vec::new();
    }
    changed.sort();
    let total = count(changed.len());
    changed.truncate(SAMPLE);
    let before = f.status.changed_by_others.as_ref().map_or(0, |c| c.count);
    let message = message(total, &image, &changed);
    s.changed_by_others = Some(ChangedByOthers { count: total, sample: changed });
    if total > before { vec![Event::warning(reason::IMAGE_CHANGED, None, message)] } else { Vec::new() }
}

/// One line on the targets that no longer carry `image`.
pub(super) fn message(total: u32, image: &str, sample: &[String]) -> String {
    let more = total.saturating_sub(count(sample.len()));
    let tail = if more > 0 { format!(" (and {more} more)") } else { String::new() };
    format!(
        "{total} targets no longer carry {image}: someone else changed them since fleetroll set it: {}{tail}",
        sample.join(", ")
    )
}
