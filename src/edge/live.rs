//! The live health of a batch's targets, read straight from the API server, for those who see a rollout
//! from outside the operator and have none of its caches: the kubectl plugin and MCP. Status counts a
//! batch's healthy targets only once the batch ends; this is how many are healthy now.

use kube::Client;

use crate::{
    api::{FleetRollout, TargetKind},
    core::{count, plan::Plan, rollout::TargetState, workload::Readiness},
    edge::{
        nodes::{At, View},
        workloads,
    },
    error::Result,
};

/// Workload targets are read one GET each: a batch larger than this is counted on its first ones only.
const WORKLOAD_READS: usize = 100;

/// How many targets of batch `batch` of `fr`'s `plan` run the revision's image and are ready now. A
/// workload that is gone, or cannot be read, is not healthy. None across member clusters: the caller's
/// client reaches only this cluster.
pub async fn healthy(client: &Client, fr: &FleetRollout, plan: &Plan, batch: u32) -> Result<Option<u32>> {
    if fr.spec.targets.clusters.is_some() {
        return Ok(None);
    }
    let revision = fr.status.as_ref().and_then(|s| s.revision.as_ref());
    let image = revision.map_or(fr.spec.image.as_str(), |r| r.inputs.image.as_str());
    let container = revision.and_then(|r| r.inputs.container.as_deref());
    let targets = plan.batch(batch);
    let healthy = match fr.spec.targets.kind {
        TargetKind::Node => {
            // One read of the DaemonSet, its pods and the nodes serves every node of the batch.
            let status = fr.status.clone().unwrap_or_default();
            let states = View::read(At::home(client, fr), fr).await?.rollout_states(fr, &status, Some(batch));
            targets.iter().filter(|t| states.get(&t.name).is_some_and(|s| is_healthy(s, image))).count()
        }
        kind => {
            let mut healthy = 0;
            for t in targets.iter().take(WORKLOAD_READS) {
                if let Ok(Some(facts)) = workloads::live_facts(client, kind, t).await
                    && facts.container_image(container).is_ok_and(|(_, i)| i == image)
                    && facts.readiness() == Readiness::Ready
                {
                    healthy += 1;
                }
            }
            healthy
        }
    };
    Ok(Some(count(healthy)))
}

fn is_healthy(state: &TargetState, image: &str) -> bool {
    state.image.as_deref() == Ok(image) && state.readiness == Readiness::Ready
}
