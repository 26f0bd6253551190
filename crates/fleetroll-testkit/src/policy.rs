//! Platform guardrails in the tests: a FleetRolloutPolicy that lives as long as the test's namespace.

use std::time::Duration;

use fleetroll::api::{FleetRollout, FleetRolloutPolicy};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};

use super::{cluster, poll_until, tenant::client_from};

/// Creates FleetRolloutPolicy `name` with `spec`, owned by namespace `ns` (the garbage collector removes it
/// with the namespace, even when the test fails half-way), and waits until admission enforces it: a dry-run
/// create of a FleetRollout with `probe` as its spec, by `governed` (impersonated), is refused naming it.
pub async fn govern(admin: &Client, ns: &str, name: &str, spec: Value, governed: &str, probe: Value) {
    let _: FleetRolloutPolicy = super::create_owned(admin, ns, json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRolloutPolicy", "metadata": {"name": name}, "spec": spec,
    }))
    .await;
    let as_governed = client_from(&cluster().kubeconfig, Some(governed)).await;
    let rollouts: Api<FleetRollout> = Api::namespaced(as_governed, ns);
    let probe = json!({"apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
                       "metadata": {"name": "policy-probe"}, "spec": probe});
    let dry =
        PatchParams { dry_run: true, field_manager: Some("fleetroll-tests".into()), ..Default::default() };
    let needle = format!("FleetRolloutPolicy {name}");
    // An informer of the API server learns of the new parameter: until then the probe is admitted.
    poll_until("the FleetRolloutPolicy to be enforced", Duration::from_secs(60), || async {
        let refused = rollouts.patch("policy-probe", &dry, &Patch::Apply(&probe)).await;
        matches!(refused, Err(kube::Error::Api(e)) if e.message.contains(&needle))
    })
    .await;
}
