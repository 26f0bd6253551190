//! Argo CD and Flux re-applying a Deployment's Git manifest the way they do, with the same field managers,
//! force flags and pre-apply normalisation, so the tests see what the API server does with fleetroll's image.
//!
//! - **Argo CD** syncs with `kubectl apply` (client-side, its default) or, with `ServerSideApply=true`, a
//!   server-side apply that always forces conflicts; both as field manager `argocd-controller`
//!   (argo-cd `gitops-engine/pkg/utils/kube/resource_ops.go` `newApplyOptions`: `FieldManager = manager`,
//!   `ForceConflicts = serverSideApply`; `controller/sync.go` passes `common.ArgoCDSSAManager`). With
//!   `RespectIgnoreDifferences=true` it first rewrites the manifest ([`respect_ignore_differences`]).
//! - **Flux**'s kustomize-controller dry-runs a forced server-side apply as `kustomize-controller`, applies
//!   only if that shows drift, and honours the Kustomization's `.spec.ignore` rules in both steps
//!   ([`flux_apply`], after fluxcd/pkg `ssa/manager_apply.go` `Apply`). Its metadata clean-up, which takes
//!   over the fields of `kubectl`, `before-first-apply` and `--override-manager` managers, never names
//!   `fleetroll` (kustomize-controller `internal/controller/kustomization_controller.go` `apply`), so it is
//!   left out here.

use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::{Map, Value, json};

use testkit::cli;

pub const ARGOCD: &str = "argocd-controller";
pub const FLUX: &str = "kustomize-controller";

/// The Flux `.spec.ignore` path docs/src/gitops-managed-targets.md recommends for a Deployment whose rolled
/// container is the first.
pub const FLUX_IMAGE_PATH: &str = "/spec/template/spec/containers/0/image";

/// A Deployment as Git has it at `revision`, which shows in a label and an environment variable, so that
/// a sync's other changes can be seen to apply.
pub fn manifest(ns: &str, name: &str, image: &str, revision: u32) -> Value {
    let revision = revision.to_string();
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns,
                     "labels": {"app": name, "fleet": "web", "git-revision": revision}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "web", "image": image,
                                         "env": [{"name": "GIT_REVISION", "value": revision}]}]}
            }
        }
    })
}

#[derive(Clone, Copy, Debug)]
pub enum ArgoApply {
    /// `kubectl apply` with its last-applied annotation: Argo CD's default.
    ClientSide,
    /// The `ServerSideApply=true` sync option.
    ServerSide,
}

/// Argo CD syncing one resource of an Application. `trusted`: the `ignoreDifferences` entry's
/// `managedFieldsManagers`, honoured at sync because of `RespectIgnoreDifferences=true` (empty: neither).
pub async fn argocd_sync(client: &Client, manifest: &Value, apply: ArgoApply, trusted: &[&str]) {
    let (ns, name) = ns_name(manifest);
    let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let mut target = manifest.clone();
    // "RespectIgnoreDifferences is only effective when the resource is already created" (sync-options.md).
    if let Some(live) = api.get_opt(&name).await.expect("read the live object") {
        respect_ignore_differences(&serde_json::to_value(live).expect("json"), &mut target, trusted);
    }
    match apply {
        ArgoApply::ServerSide => {
            api.patch(&name, &PatchParams::apply(ARGOCD).force(), &Patch::Apply(&target))
                .await
                .expect("Argo CD's server-side apply");
        }
        ArgoApply::ClientSide => {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-tmp");
            std::fs::create_dir_all(&dir).expect("target/test-tmp");
            let file = dir.join(format!("{ns}-{name}.json"));
            std::fs::write(&file, target.to_string()).expect("write the manifest");
            let path = file.display().to_string();
            cli::kubectl(&["apply", "--field-manager", ARGOCD, "-f", &path]).await.ok();
            let _ = std::fs::remove_file(file);
        }
    }
}

/// Argo CD's `RespectIgnoreDifferences=true` with `ignoreDifferences[].managedFieldsManagers`: every field a
/// trusted manager owns on the live object and whose value Git would change takes its live value in the
/// manifest applied. This is argo-cd `util/argo/managedfields/managed_fields.go` `Normalize` (remove, from
/// both sides, the fields of a trusted manager's managedFields entry that are in the comparison's `Modified`
/// set) followed by `controller/sync.go` `normalizeTargetResources` (patch the removed fields' live values
/// into the target). Fields only one side has are not `Modified` and stay as they are.
pub fn respect_ignore_differences(live: &Value, target: &mut Value, trusted: &[&str]) {
    let entries = live.pointer("/metadata/managedFields").and_then(Value::as_array).into_iter().flatten();
    for entry in entries.filter(|e| trusted.iter().any(|m| e["manager"] == *m)) {
        let mut leaves = Vec::new();
        leaves_of(&entry["fieldsV1"], &mut Vec::new(), &mut leaves);
        for path in leaves {
            let Some(live_value) = resolve(live, &path) else { continue };
            if let Some(value) = resolve_mut(target, &path) {
                *value = live_value.clone();
            }
        }
    }
}

/// The owned leaves of a fieldsV1 set, as paths of `f:` and `k:` segments.
fn leaves_of(node: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    for (segment, child) in node.as_object().into_iter().flatten() {
        if segment == "." {
            continue; // the node itself (a list item's existence), not a value
        }
        path.push(segment.clone());
        match child.as_object() {
            Some(children) if !children.is_empty() => leaves_of(child, path, out),
            _ => out.push(path.clone()),
        }
        path.pop();
    }
}

/// The list item a `k:{...}` segment names: the one whose key fields all have these values.
fn key_of(segment: &str) -> Option<Map<String, Value>> {
    serde_json::from_str(segment.strip_prefix("k:")?).ok()
}

fn matches(item: &Value, key: &Map<String, Value>) -> bool {
    key.iter().all(|(k, v)| item.get(k) == Some(v))
}

// `v:` (set members) and `i:` (positions) segments never lead to a Deployment's image: not followed.
fn resolve<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, segment| match segment.strip_prefix("f:") {
        Some(field) => v.get(field),
        None => v.as_array()?.iter().find(|item| key_of(segment).is_some_and(|k| matches(item, &k))),
    })
}

fn resolve_mut<'a>(value: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(value, |v, segment| match segment.strip_prefix("f:") {
        Some(field) => v.get_mut(field),
        None => {
            let key = key_of(segment)?;
            v.as_array_mut()?.iter_mut().find(|item| matches(item, &key))
        }
    })
}

/// What kustomize-controller did with an object.
#[derive(Debug, PartialEq, Eq)]
pub enum FluxAction {
    Created,
    Configured,
    Unchanged,
}

/// kustomize-controller applying one object of a Kustomization whose `.spec.ignore` names `ignore`
/// (JSON pointers) for it. A drifted ignored field is taken out of the apply when another manager holds it
/// through server-side apply, or else set to its live value (fluxcd/pkg `ssa/manager_apply.go`
/// `computeDriftedPaths`, `applyDriftResult`).
pub async fn flux_apply(client: &Client, manifest: &Value, ignore: &[&str]) -> FluxAction {
    let (ns, name) = ns_name(manifest);
    let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let force = PatchParams::apply(FLUX).force();
    let existing = api.get_opt(&name).await.expect("read the live object");
    let Some(existing) = existing.map(|d| serde_json::to_value(d).expect("json")) else {
        api.patch(&name, &force, &Patch::Apply(manifest)).await.expect("Flux's apply");
        return FluxAction::Created;
    };
    let dry_run = api.patch(&name, &force.clone().dry_run(), &Patch::Apply(manifest)).await;
    let dry_run = serde_json::to_value(dry_run.expect("Flux's dry run")).expect("json");
    if !drifted(&existing, &dry_run, ignore) {
        return FluxAction::Unchanged;
    }
    let mut payload = manifest.clone();
    for path in ignore.iter().filter(|p| existing.pointer(p) != dry_run.pointer(p)) {
        if owned_by_another_applier(&existing, path) {
            remove(&mut payload, path);
        } else if let (Some(live), Some(value)) = (existing.pointer(path), payload.pointer_mut(path)) {
            *value = live.clone();
        }
    }
    api.patch(&name, &force, &Patch::Apply(&payload)).await.expect("Flux's apply");
    FluxAction::Configured
}

/// fluxcd/pkg `ssa` `hasDriftedWithIgnore`: labels, annotations and everything outside metadata and status,
/// ignored paths removed from both sides.
fn drifted(existing: &Value, dry_run: &Value, ignore: &[&str]) -> bool {
    let comparable = |v: &Value| {
        let mut v = v.clone();
        for path in ignore {
            remove(&mut v, path);
        }
        let meta = v["metadata"].take();
        if let Some(o) = v.as_object_mut() {
            o.remove("status");
        }
        (meta["labels"].clone(), meta["annotations"].clone(), v)
    };
    comparable(existing) != comparable(dry_run)
}

fn remove(value: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else { return };
    let last = last.replace("~1", "/").replace("~0", "~");
    match value.pointer_mut(parent) {
        Some(Value::Object(o)) => {
            o.remove(&last);
        }
        Some(Value::Array(a)) => {
            if let Ok(i) = last.parse::<usize>()
                && i < a.len()
            {
                a.remove(i);
            }
        }
        _ => {}
    }
}

/// fluxcd/pkg `ssa` `isFieldOwnedByOtherApplyManager`: whether a server-side-apply entry of a manager other
/// than Flux (no subresource) holds the field. An array index is turned into the `k:{...}` key of the item
/// at that index, from the keys the entries hold at that level; a path that cannot be resolved counts as
/// Flux's alone.
fn owned_by_another_applier(existing: &Value, pointer: &str) -> bool {
    let entries: Vec<&Value> = existing
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|e| e["operation"] == "Apply" && e.get("subresource").is_none_or(Value::is_null))
        .collect();
    let mut segments: Vec<String> = Vec::new();
    let mut at = existing;
    for token in pointer.trim_start_matches('/').split('/') {
        let token = token.replace("~1", "/").replace("~0", "~");
        let Ok(index) = token.parse::<usize>() else {
            segments.push(format!("f:{token}"));
            at = &at[token.as_str()];
            continue;
        };
        let item = &at[index];
        let key = entries
            .iter()
            .filter_map(|e| walk(&e["fieldsV1"], &segments))
            .flat_map(|node| node.as_object().into_iter().flatten().map(|(k, _)| k.clone()))
            .find(|k| key_of(k).is_some_and(|kv| matches(item, &kv)));
        let Some(key) = key else { return false };
        segments.push(key);
        at = item;
    }
    entries.iter().any(|e| e["manager"] != FLUX && walk(&e["fieldsV1"], &segments).is_some())
}

fn walk<'a>(fields: &'a Value, segments: &[String]) -> Option<&'a Value> {
    segments.iter().try_fold(fields, |node, s| node.get(s.as_str()))
}

fn ns_name(manifest: &Value) -> (String, String) {
    let field =
        |f: &str| manifest["metadata"][f].as_str().expect("the manifest names its object").to_string();
    (field("namespace"), field("name"))
}
