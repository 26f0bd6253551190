//! Handing a node rollout's DaemonSet back when the rollout ends or is deleted, as its creator: what is
//! final (no creator to act as, a refusal) and what is tried again.

use kube::{Client, ResourceExt};
use tracing::{info, warn};

use super::{At, daemonset, daemonset_name, post_params};
use crate::{
    api::{FleetRollout, Phase},
    core::nodes,
    error::{Error, Result, denial},
};

/// A node rollout being deleted: hands its DaemonSet back if it still holds it, then lets it go. After
/// success or a rollback only the update strategy goes back (the template is the one the rollout ended
/// on); otherwise the template from before the rollout goes back too, so deleting an unfinished rollout
/// undoes it instead of letting the DaemonSet controller finish it on every node at once. One the creator
/// may no longer change is left held (by a rollout gone, which no other honours) rather than kept.
pub async fn finalize(
    client: &Client,
    writer: std::result::Result<Client, String>,
    fr: &FleetRollout,
) -> Result<()> {
    if !crate::edge::rollouts::holds_daemonset(fr) {
        return Ok(());
    }
    let finished =
        fr.status.as_ref().is_some_and(|s| matches!(s.phase, Phase::Succeeded | Phase::RolledBack));
    if !daemonset_name(fr).is_empty()
        && let HandBack::Left(why) = hand_back(client, &writer, fr, finished).await?
    {
        warn!(daemonset = %daemonset_name(fr), %why, "could not hand the DaemonSet back; the rollout goes \
              all the same (set its updateStrategy back by hand)");
    }
    crate::edge::rollouts::set_finalizer(client, fr, crate::edge::rollouts::FINALIZER, false).await?;
    info!("handed the DaemonSet back; the rollout may go");
    Ok(())
}

/// What became of a DaemonSet's hand-back.
#[derive(Debug)]
pub enum HandBack {
    Done,
    /// It can never be done (no creator to act as, or the API server refused the creator); why.
    Left(String),
}

/// Hands the DaemonSet back as `writer` (the creator). Err is what is worth trying again (a conflict, the
/// API server away).
pub async fn hand_back(
    client: &Client,
    writer: &std::result::Result<Client, String>,
    fr: &FleetRollout,
    finished: bool,
) -> Result<HandBack> {
    let writer = match writer {
        Ok(writer) => writer,
        Err(why) => return Ok(HandBack::Left(why.clone())),
    };
    match release(At::home_as(client, writer, fr), fr, finished).await {
        Ok(()) => Ok(HandBack::Done),
        Err(Error::Kube(e)) => denial(&e).map(HandBack::Left).ok_or(Error::Kube(e)),
        Err(e) => Err(e),
    }
}

/// Hands the DaemonSet back, if this rollout holds it: a rollout that `finished` (succeeded or was rolled
/// back) its update strategy only ([`nodes::release`]); any other one as it was before the rollout,
/// template too ([`nodes::hand_back`]). Idempotent.
pub async fn release(at: At<'_>, fr: &FleetRollout, finished: bool) -> Result<()> {
    let Some((api, ds)) = daemonset(at, fr).await? else { return Ok(()) };
    let own = format!("{}/{}", fr.namespace().unwrap_or_default(), fr.name_any());
    if !nodes::held_by(ds.annotations(), &own) {
        return Ok(());
    }
    let next = if finished { nodes::release(&ds) } else { nodes::hand_back(&ds) };
    if let Some(next) = next {
        api.replace(&ds.name_any(), &post_params(), &next).await?;
        info!(daemonset = %ds.name_any(), template_restored = !finished, "handed the DaemonSet back");
    }
    Ok(())
}
