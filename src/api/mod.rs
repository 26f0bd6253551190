//! The FleetRollout API (group `fleetroll.dev`, version `v1alpha1`), generated into `crds/` by
//! `fleetroll crd`.

mod spec;
mod status;

pub use spec::*;
pub use status::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::Value;

/// Annotation stamped on every target fleetroll changes: `<rollout-uid>/<revision>/<batch>`.
pub const APPLIED_ANNOTATION: &str = "fleetroll.dev/applied";
/// Annotation naming the rollout (`<namespace>/<name>`) that last changed a target.
pub const ROLLOUT_ANNOTATION: &str = "fleetroll.dev/rollout";
/// Namespace label that opts a namespace in to cross-namespace rollouts.
pub const OPT_IN_LABEL: &str = "fleetroll.dev/rollouts";
pub const OPT_IN_VALUE: &str = "enabled";
/// Field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "fleetroll";

/// The CRD, with the generated schema adjusted for the API server (see [`adjust_schema`]).
pub fn crd() -> CustomResourceDefinition {
    let mut crd = FleetRollout::crd();
    for version in &mut crd.spec.versions {
        if let Some(schema) = version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()) {
            let mut value = serde_json::to_value(&*schema).unwrap_or(Value::Null);
            adjust_schema(&mut value);
            if let Ok(adjusted) = serde_json::from_value(value) {
                *schema = adjusted;
            }
        }
    }
    crd
}

/// The CRD as YAML, exactly as committed under `crds/`.
pub fn crd_yaml() -> Result<String, serde_saphyr::ser::Error> {
    serde_saphyr::to_string(&crd())
}

/// Makes the schemars output what the API server wants:
/// - unsigned integer formats (`uint32`), which it warns about, become `int64`;
/// - int-or-string values (always a count or a percentage here) get `maxLength: 4`, without which the
///   CEL cost estimate of the rules over them exceeds the budget, and lose the long generic description.
fn adjust_schema(node: &mut Value) {
    match node {
        Value::Object(map) => {
            if let Some(Value::String(format)) = map.get("format")
                && format.starts_with("uint")
            {
                map.insert("format".into(), Value::String("int64".into()));
            }
            if map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
                map.insert("maxLength".into(), Value::from(4));
                map.remove("description");
            }
            map.values_mut().for_each(adjust_schema);
        }
        Value::Array(items) => items.iter_mut().for_each(adjust_schema),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_committed_crd_is_the_generated_one() {
        let committed = include_str!("../../crds/fleetroll.dev_fleetrollouts.yaml");
        let generated = super::crd_yaml().expect("the CRD renders");
        assert!(
            committed == generated,
            "crds/fleetroll.dev_fleetrollouts.yaml is out of date: run `make generate` and commit the result"
        );
    }
}
