//! The FleetRollout API (group `fleetroll.dev`, version `v1alpha1`), generated into `crds/` by
//! `fleetroll crd`.

mod analysis;
mod approvals;
mod clusters;
mod notify;
mod policy;
mod revision;
mod spec;
mod status;
mod windows;

pub use analysis::*;
pub use approvals::*;
pub use clusters::*;
pub use notify::*;
pub use policy::*;
pub use revision::*;
pub use spec::*;
pub use status::*;
pub use windows::*;

use k8s_openapi::{
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::util::intstr::IntOrString,
};
use kube_core::CustomResourceExt;
use schemars::JsonSchema;
use serde_json::Value;

/// Annotation stamped on every target fleetroll changes: `<rollout-uid>/<revision>/<batch>`.
pub const APPLIED_ANNOTATION: &str = "fleetroll.dev/applied";
/// Annotation naming the rollout (`<namespace>/<name>`) that last changed a target.
pub const ROLLOUT_ANNOTATION: &str = "fleetroll.dev/rollout";
/// Namespace label that opts a namespace in to cross-namespace rollouts.
pub const OPT_IN_LABEL: &str = "fleetroll.dev/rollouts";
/// Annotation holding a hash of an MCP task's secret part: a rollout that carries it was started over MCP.
pub const TASK_TOKEN_HASH_ANNOTATION: &str = "fleetroll.dev/task-token-sha256";
pub const OPT_IN_VALUE: &str = "enabled";
/// Field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "fleetroll";

/// The operator's finalizer on a node rollout holding a DaemonSet: the DaemonSet's update strategy is
/// given back before the rollout goes.
pub const RELEASE_DAEMONSET_FINALIZER: &str = "fleetroll.dev/release-daemonset";

/// The operator's finalizer on a rollout a FleetRolloutPolicy subscribes notifications of: deleting it
/// (by hand, before what the platform is owed was delivered) tells the platform, and waits for that.
pub const PLATFORM_NOTIFICATIONS_FINALIZER: &str = "fleetroll.dev/platform-notifications";

/// The operator's own finalizers: the only ones a cache keeps.
pub const FINALIZERS: [&str; 2] = [RELEASE_DAEMONSET_FINALIZER, PLATFORM_NOTIFICATIONS_FINALIZER];

/// The longest annotation value a cache keeps of a FleetRollout (hashes and user names are far shorter).
const CACHED_ANNOTATION_MAX: usize = 512;

/// A FleetRollout as a cache keeps it: its spec, status, the operator's own finalizer and identity, and of
/// its annotations only those in `keep` (each at most [`CACHED_ANNOTATION_MAX`] bytes). Labels, other
/// annotations (a `kubectl apply` copy of the whole object among them), other finalizers and managed fields
/// are whatever its writers made them, and no reader of a cache needs them.
pub fn kept_for_cache(fr: &mut FleetRollout, keep: &[&str]) {
    let meta = &mut fr.metadata;
    meta.managed_fields = None;
    meta.labels = None;
    meta.owner_references = None;
    // Anyone who may update a rollout may add finalizers, as many as fill the object.
    if let Some(finalizers) = meta.finalizers.as_mut() {
        finalizers.retain(|f| FINALIZERS.contains(&f.as_str()));
    }
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, v| keep.contains(&k.as_str()) && v.len() <= CACHED_ANNOTATION_MAX);
    }
}

/// The FleetRollout CRD, with the generated schema adjusted for the API server (see [`adjust_schema`]).
pub fn crd() -> CustomResourceDefinition {
    adjusted(FleetRollout::crd(), default_status)
}

/// The FleetRolloutPolicy CRD (cluster-scoped).
pub fn policy_crd() -> CustomResourceDefinition {
    adjusted(FleetRolloutPolicy::crd(), |_| {})
}

fn adjusted(mut crd: CustomResourceDefinition, also: fn(&mut Value)) -> CustomResourceDefinition {
    let generic = generic_int_or_string_description();
    for version in &mut crd.spec.versions {
        if let Some(schema) = version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()) {
            let mut value = serde_json::to_value(&*schema).unwrap_or(Value::Null);
            adjust_schema(&mut value, generic.as_deref());
            also(&mut value);
            if let Ok(adjusted) = serde_json::from_value(value) {
                *schema = adjusted;
            }
        }
    }
    crd
}

/// The FleetRollout CRD as YAML, exactly as committed under `crds/`.
pub fn crd_yaml() -> Result<String, serde_saphyr::ser::Error> {
    serde_saphyr::to_string(&crd())
}

/// The FleetRolloutPolicy CRD as YAML, exactly as committed under `crds/`.
pub fn policy_crd_yaml() -> Result<String, serde_saphyr::ser::Error> {
    serde_saphyr::to_string(&policy_crd())
}

/// The CRDs as the Helm chart installs them (`charts/fleetroll/templates/crds.yaml`): only when
/// `crds.install` is set, with the chart's labels, and kept on `helm uninstall` when `crds.keep` is set,
/// since deleting one would delete every rollout or policy.
pub fn crd_helm_template() -> Result<String, serde_saphyr::ser::Error> {
    let templates = [crd(), policy_crd()].iter().map(crd_template).collect::<Result<Vec<_>, _>>()?;
    Ok(format!(
        "{{{{- if .Values.crds.install }}}}\n# Generated by `fleetroll crd --helm` (make generate); do not edit.\n{}{{{{- end }}}}\n",
        templates.join("---\n")
    ))
}

fn crd_template(crd: &CustomResourceDefinition) -> Result<String, serde_saphyr::ser::Error> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    // Query placeholders ({{targets}}) in descriptions and rules are text to Helm, not actions.
    let yaml = serde_saphyr::to_string(crd)?
        .replace("{{", "\u{0}OPEN")
        .replace("}}", "\u{0}CLOSE")
        .replace("\u{0}OPEN", r#"{{ "{{" }}"#)
        .replace("\u{0}CLOSE", r#"{{ "}}" }}"#);
    // The labels and the annotation are template text, which no serializer writes: they go in by hand,
    // under the metadata, which holds the name alone.
    let plain = format!("\nmetadata:\n  name: {name}\n");
    if !yaml.contains(&plain) {
        return Err(serde::ser::Error::custom(format!("the CRD's metadata is not its name alone: {yaml}")));
    }
    let templated = [
        "\nmetadata:",
        &format!("  name: {name}"),
        "  labels:",
        r#"    {{- include "fleetroll.labels" . | nindent 4 }}"#,
        "  {{- if .Values.crds.keep }}",
        "  annotations:",
        "    helm.sh/resource-policy: keep",
        "  {{- end }}\n",
    ]
    .join("\n");
    Ok(yaml.replacen(&plain, &templated, 1))
}

/// Gives a rollout the operator has not seen yet `status.observedGeneration: 0`. The API server drops the
/// status of a create and applies schema defaults whenever it reads the object, so a just-created rollout
/// reads as generation 1 observed as 0: InProgress to kstatus (Flux, kpt) and Progressing to Argo CD,
/// never Current before the operator has looked at it.
fn default_status(schema: &mut Value) {
    if let Some(status) = schema.pointer_mut("/properties/status").and_then(Value::as_object_mut) {
        status.insert("default".into(), serde_json::json!({ "observedGeneration": 0 }));
    }
}

/// The description k8s-openapi gives every int-or-string value ("IntOrString is a type that can hold an
/// int32 or a string..."): it says nothing about what the field means, so a field's doc comment replaces it.
fn generic_int_or_string_description() -> Option<String> {
    let schema = IntOrString::json_schema(&mut schemars::SchemaGenerator::default());
    schema.get("description").and_then(Value::as_str).map(String::from)
}

/// Makes the schemars output what the API server wants:
/// - descriptions, which schemars takes from doc comments line by line, are unwrapped into paragraphs,
///   since `kubectl explain` wraps them itself and would break lines at the comments' breaks too;
/// - unsigned integer formats (`uint32`), which it warns about, become `int64`;
/// - int-or-string values (always a count or a percentage here) get `maxLength: 4`, without which the
///   CEL cost estimate of the rules over them exceeds the budget. They keep their field's description
///   (which costs nothing in CEL) but lose the long `generic` one, which the items of `steps` would carry;
/// - label selectors get the bounds of [`bound_label_selector`].
fn adjust_schema(node: &mut Value, generic: Option<&str>) {
    match node {
        Value::Object(map) => {
            bound_label_selector(map);
            if let Some(Value::String(description)) = map.get_mut("description") {
                *description = unwrap_lines(description);
            }
            if let Some(Value::String(format)) = map.get("format")
                && format.starts_with("uint")
            {
                map.insert("format".into(), Value::String("int64".into()));
            }
            if map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
                map.insert("maxLength".into(), Value::from(4));
                if generic.is_some() && map.get("description").and_then(Value::as_str) == generic {
                    map.remove("description");
                }
            }
            map.values_mut().for_each(|v| adjust_schema(v, generic));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| adjust_schema(v, generic)),
        _ => {}
    }
}

/// Label selectors in a rollout: at most this many `matchLabels`, ...
pub const SELECTOR_LABELS_MAX: usize = 16;
/// ... this many `matchExpressions`, ...
pub const SELECTOR_EXPRESSIONS_MAX: usize = 8;
/// ... and this many values in each.
pub const SELECTOR_VALUES_MAX: usize = 16;

/// Bounds a label selector's schema (Kubernetes bounds none of it: a `LabelSelector` may fill a whole
/// object): label keys at most 317 characters (a 253-character prefix, '/', a 63-character name), values at
/// most 63, and the counts above. With them every list and string of a spec is bounded, since every cache
/// keeps specs whole: about 17 KiB a selector at most, 1.2 MiB for a spec with every list full (two thirds
/// of it 1,000 approvals), typically 1–3 KiB. Selectors are told apart from other
/// objects by their two properties.
fn bound_label_selector(map: &mut serde_json::Map<String, Value>) {
    let Some(Value::Object(properties)) = map.get_mut("properties") else { return };
    if !(properties.contains_key("matchLabels") && properties.contains_key("matchExpressions")) {
        return;
    }
    if let Some(Value::Object(labels)) = properties.get_mut("matchLabels") {
        labels.insert("maxProperties".into(), Value::from(SELECTOR_LABELS_MAX));
        if let Some(Value::Object(value)) = labels.get_mut("additionalProperties") {
            value.insert("maxLength".into(), Value::from(LABEL_VALUE_MAX));
        }
        labels.insert(
            "x-kubernetes-validations".into(),
            serde_json::json!([{
                "rule": format!("self.all(k, size(k) <= {LABEL_KEY_MAX})"),
                "message": format!("a label key has at most {LABEL_KEY_MAX} characters"),
            }]),
        );
    }
    let Some(Value::Object(expressions)) = properties.get_mut("matchExpressions") else { return };
    expressions.insert("maxItems".into(), Value::from(SELECTOR_EXPRESSIONS_MAX));
    let Some(Value::Object(fields)) = expressions.get_mut("items").and_then(|i| i.get_mut("properties"))
    else {
        return;
    };
    if let Some(Value::Object(key)) = fields.get_mut("key") {
        key.insert("maxLength".into(), Value::from(LABEL_KEY_MAX));
    }
    if let Some(Value::Object(operator)) = fields.get_mut("operator") {
        operator.insert("enum".into(), serde_json::json!(["In", "NotIn", "Exists", "DoesNotExist"]));
    }
    if let Some(Value::Object(values)) = fields.get_mut("values") {
        values.insert("maxItems".into(), Value::from(SELECTOR_VALUES_MAX));
        if let Some(Value::Object(value)) = values.get_mut("items") {
            value.insert("maxLength".into(), Value::from(LABEL_VALUE_MAX));
        }
    }
}

/// The longest label key Kubernetes takes: a 253-character DNS prefix, '/', a 63-character name.
const LABEL_KEY_MAX: usize = 317;
/// The longest label value Kubernetes takes.
const LABEL_VALUE_MAX: usize = 63;

/// Joins the lines of each paragraph with spaces; paragraphs stay apart.
fn unwrap_lines(text: &str) -> String {
    text.split("\n\n")
        .map(|p| p.split('\n').map(str::trim).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n\n")
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use schemars::{JsonSchema, SchemaGenerator};
    use serde_json::Value;

    /// Collects the JSON path of every property at or under `property` (named `path`) whose description is
    /// empty or only one of the `generic` ones its type carries (the Time type's says how Go marshals it).
    /// The items of an array need none of their own (`kubectl explain` shows the array's), but their
    /// properties do.
    fn undescribed(property: &Value, path: &str, generic: &[String], missing: &mut Vec<String>) {
        let description = property.get("description").and_then(Value::as_str).unwrap_or_default();
        if description.trim().is_empty() || generic.iter().any(|g| g == description) {
            missing.push(path.to_string());
        }
        properties_undescribed(property, path, generic, missing);
    }

    fn properties_undescribed(node: &Value, path: &str, generic: &[String], missing: &mut Vec<String>) {
        for (name, property) in node.get("properties").and_then(Value::as_object).into_iter().flatten() {
            undescribed(property, &format!("{path}.{name}"), generic, missing);
        }
        if let Some(items) = node.get("items") {
            properties_undescribed(items, &format!("{path}[]"), generic, missing);
        }
        if let Some(values) = node.get("additionalProperties").filter(|v| v.is_object()) {
            properties_undescribed(values, &format!("{path}{{}}"), generic, missing);
        }
    }

    #[test]
    fn descriptions_are_unwrapped_into_paragraphs() {
        assert_eq!(
            super::unwrap_lines("a count\nor a percentage.\n\nDefault 0."),
            "a count or a percentage.\n\nDefault 0."
        );
    }

    #[test]
    fn every_spec_and_status_field_is_described() {
        let crd = serde_json::to_value(super::crd()).expect("the CRD serializes");
        let time = Time::json_schema(&mut SchemaGenerator::default());
        let time = time.get("description").and_then(Value::as_str).map(String::from);
        let generic: Vec<String> =
            [time, super::generic_int_or_string_description()].into_iter().flatten().collect();
        assert_eq!(generic.len(), 2, "the generic descriptions of Time and IntOrString");
        let mut missing = Vec::new();
        for version in crd["spec"]["versions"].as_array().expect("the CRD has versions") {
            let root = &version["schema"]["openAPIV3Schema"];
            for part in ["spec", "status"] {
                assert!(root["properties"][part].is_object(), "the schema has no {part}");
                undescribed(&root["properties"][part], part, &generic, &mut missing);
            }
        }
        assert!(
            missing.is_empty(),
            "{} CRD properties have no description (`kubectl explain` shows nothing for them): give each \
             field a doc comment\n{}",
            missing.len(),
            missing.join("\n")
        );
    }

    #[test]
    fn the_chart_installs_the_same_crd() {
        let committed = include_str!("../../../../charts/fleetroll/templates/crds.yaml");
        let generated = super::crd_helm_template().expect("the CRD renders");
        assert!(
            committed == generated,
            "charts/fleetroll/templates/crds.yaml is out of date: run `make generate` and commit the result"
        );
    }

    #[test]
    fn the_status_an_unseen_rollout_reads_with_is_a_valid_pending_status() {
        let crd = serde_json::to_value(super::crd()).expect("the CRD serializes");
        let default = crd
            .pointer("/spec/versions/0/schema/openAPIV3Schema/properties/status/default")
            .expect("status has a default")
            .clone();
        let status: super::FleetRolloutStatus = serde_json::from_value(default).expect("the default parses");
        assert_eq!(status.observed_generation, Some(0));
        assert_eq!(status.phase, super::Phase::Pending);
    }

    #[test]
    fn the_committed_crds_are_the_generated_ones() {
        let committed = include_str!("../../../../crds/fleetroll.dev_fleetrollouts.yaml");
        let generated = super::crd_yaml().expect("the CRD renders");
        assert!(
            committed == generated,
            "crds/fleetroll.dev_fleetrollouts.yaml is out of date: run `make generate` and commit the result"
        );
        let committed = include_str!("../../../../crds/fleetroll.dev_fleetrolloutpolicies.yaml");
        let generated = super::policy_crd_yaml().expect("the CRD renders");
        assert!(
            committed == generated,
            "crds/fleetroll.dev_fleetrolloutpolicies.yaml is out of date: run `make generate` and commit the result"
        );
    }

    /// The most bytes of JSON `node` may take as the schema bounds it, or the path of what it leaves
    /// unbounded. Numbers and booleans count 20 bytes; a map key, the longest label key.
    fn weight_bound(node: &Value, path: &str) -> Result<usize, String> {
        if let Some(choices) = node.get("enum").and_then(Value::as_array) {
            return Ok(choices.iter().map(|c| c.to_string().len()).max().unwrap_or(0));
        }
        let max = |key: &str| node.get(key).and_then(Value::as_u64).map(|n| n as usize);
        if node.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
            return max("maxLength").map(|n| n + 2).ok_or(path.to_string());
        }
        match node.get("type").and_then(Value::as_str) {
            Some("string") if node.get("format").is_some() => Ok(64),
            Some("string") => max("maxLength").map(|n| n + 2).ok_or(path.to_string()),
            Some("integer" | "number" | "boolean") => Ok(20),
            Some("array") => {
                let items = weight_bound(&node["items"], &format!("{path}[]"))?;
                max("maxItems").map(|n| n * (items + 1)).ok_or(path.to_string())
            }
            _ if node.get("additionalProperties").is_some_and(Value::is_object) => {
                let values = weight_bound(&node["additionalProperties"], &format!("{path}{{}}"))?;
                max("maxProperties").map(|n| n * (super::LABEL_KEY_MAX + 3 + values)).ok_or(path.to_string())
            }
            _ => node.get("properties").and_then(Value::as_object).into_iter().flatten().try_fold(
                2,
                |sum, (name, property)| {
                    Ok(sum + name.len() + 4 + weight_bound(property, &format!("{path}.{name}"))?)
                },
            ),
        }
    }

    /// A rollout's spec is kept whole by every cache, so its schema bounds every string, list and map in
    /// it, and all together, below what the API server takes (1.5 MiB).
    #[test]
    fn a_spec_at_every_bound_weighs_at_most_1_25_mib() {
        let crd = serde_json::to_value(super::crd()).expect("the CRD serializes");
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let bound = weight_bound(spec, "spec").unwrap_or_else(|path| panic!("{path} has no bound"));
        assert!(bound <= 1_280 * 1024, "a spec may weigh {bound} bytes");
        assert!(bound >= 700 * 1000, "the bound ({bound} bytes) counts the 1,000 approvals");
    }

    #[test]
    fn a_cached_rollout_keeps_only_the_operators_finalizers() {
        let mut fr = super::FleetRollout::new(
            "r",
            serde_json::from_value(serde_json::json!({
                "image": "example/app:v2",
                "targets": {"kind": "Deployment", "selector": {"matchLabels": {"app": "web"}}},
            }))
            .expect("a valid spec"),
        );
        let others = (0..10_000).map(|i| format!("example.com/hold-{i}"));
        fr.metadata.finalizers = Some(others.chain(super::FINALIZERS.map(String::from)).collect());
        super::kept_for_cache(&mut fr, &[]);
        assert_eq!(fr.metadata.finalizers, Some(super::FINALIZERS.map(String::from).to_vec()));
    }
}

#[cfg(test)]
mod admission_tests {
    /// The chart's admission policy judges a write by the spec fields it changes: one it does not name would
    /// pass without the rights over the targets.
    #[test]
    fn the_admission_policy_compares_every_spec_field_but_approvals_and_creator() {
        let policy = include_str!("../../../../charts/fleetroll/templates/admission-policy.yaml");
        let crd = serde_json::to_value(super::crd()).expect("the CRD as JSON");
        let spec =
            &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        let fields: Vec<&String> = spec.as_object().expect("spec properties").keys().collect();
        assert!(fields.len() > 10, "{fields:?}");
        for field in fields {
            let compared = format!("object.spec.?{field} != oldObject.spec.?{field}");
            match field.as_str() {
                "approvals" | "creator" => {
                    assert!(!policy.contains(&compared), "{field} is judged on its own")
                }
                _ => assert!(policy.contains(&compared), "specWritten does not compare spec.{field}"),
            }
        }
    }
}
