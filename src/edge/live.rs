//! The live health of a batch's targets, read straight from the API server, for those who see a rollout
//! from outside the operator and have none of its caches: the kubectl plugin and MCP. Status counts a
//! batch's healthy targets only once the batch ends; this is how many are healthy now.

use std::collections::HashMap;

use kube::{Client, ResourceExt};

use crate::{
    api::{FleetRollout, TargetKind},
    core::{count, nodes, plan::Plan, rollout::TargetState, workload::Readiness},
    edge::{daemonset_pods::View, targets},
    error::Result,
};

/// Workload targets are read one GET each: a batch larger than this is counted on its first ones only.
const WORKLOAD_READS: usize = 100;

/// How many targets of batch `batch` of `fr`'s `plan` run the revision's image and are ready now. A
/// workload that is gone, or cannot be read, is not healthy.
pub async fn healthy(client: &Client, fr: &FleetRollout, plan: &Plan, batch: u32) -> Result<u32> {
    let revision = fr.status.as_ref().and_then(|s| s.revision.as_ref());
    let image = revision.map_or(fr.spec.image.as_str(), |r| r.inputs.image.as_str());
    let container = revision.and_then(|r| r.inputs.container.as_deref());
    let targets = plan.batch(batch);
    let healthy = match fr.spec.targets.kind {
        TargetKind::Node => {
            // One read of the DaemonSet, its pods and the nodes serves every node of the batch.
            let states = node_states(&View::read(client, fr).await?, fr, batch, image, container);
            targets.iter().filter(|t| states.get(&t.name).is_some_and(|s| is_healthy(s, image))).count()
        }
        kind => {
            let mut healthy = 0;
            for t in targets.iter().take(WORKLOAD_READS) {
                if let Ok(Some(facts)) = targets::live_facts(client, kind, t).await
                    && facts.container_image(container).is_ok_and(|(_, i)| i == image)
                    && facts.readiness() == Readiness::Ready
                {
                    healthy += 1;
                }
            }
            healthy
        }
    };
    Ok(count(healthy))
}

/// Every node as the controller's state machine sees it (the controller's `node_states`, for batch
/// `batch` rather than the current one).
fn node_states(
    view: &View,
    fr: &FleetRollout,
    batch: u32,
    image: &str,
    container: Option<&str>,
) -> HashMap<String, TargetState> {
    let status = fr.status.as_ref();
    let number = status.and_then(|s| s.revision.as_ref()).map_or(0, |r| r.number);
    let revision = nodes::revision_key(&fr.uid().unwrap_or_default(), number);
    let batch_key = status
        .and_then(|s| s.batches.iter().find(|b| b.index == batch))
        .map_or("", |b| b.idempotency_key.as_str());
    view.states(&revision, batch_key, image, container)
}

fn is_healthy(state: &TargetState, image: &str) -> bool {
    state.image.as_deref() == Ok(image) && state.readiness == Readiness::Ready
}
