//! The Helm chart, rendered as release `fr` in namespace `ns`.

use serde_json::Value;

use super::cli::{Ran, helm, repo_path};

/// `helm template` of the chart with `--set` values (or flags of helm's own, such as `--set-json=...`).
pub async fn template(sets: &[&str]) -> Ran {
    let chart = repo_path("charts/fleetroll");
    let mut args = vec!["template", "fr", chart.as_str(), "--namespace", "ns"];
    for set in sets {
        match set.starts_with("--") {
            true => args.push(set),
            false => args.extend(["--set", set]),
        }
    }
    helm(&args).await
}

/// The chart rendered with `--set` values, one JSON value per object.
pub async fn render(sets: &[&str]) -> Vec<Value> {
    let yaml = template(sets).await.ok().stdout;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&yaml).expect("the rendered chart is YAML");
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

pub fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects.iter().find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}
