//! The local control plane's audit log (tests/testenv/audit-policy.yaml: changes to workloads and pods, at
//! Metadata level): who changed a target, and as whom.

use std::time::Duration;

use serde_json::Value;

/// One audited change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub verb: String,
    pub resource: String,
    pub name: String,
    /// Who sent the request.
    pub user: String,
    /// Whom it acted as, if it impersonated.
    pub as_user: Option<String>,
    pub code: i64,
}

fn changes_in(namespace: &str) -> Vec<Change> {
    let logs = super::testenv_dir().join("logs");
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(&logs) else { return found };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with("audit") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<Value>(line) else { continue };
            let object = &event["objectRef"];
            if object["namespace"] != namespace || object.get("subresource").is_some() {
                continue;
            }
            let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
            found.push(Change {
                verb: text(&event["verb"]),
                resource: text(&object["resource"]),
                name: text(&object["name"]),
                user: text(&event["user"]["username"]),
                as_user: event["impersonatedUser"]["username"].as_str().map(String::from),
                code: event["responseStatus"]["code"].as_i64().unwrap_or_default(),
            });
        }
    }
    found
}

/// The audited changes in `namespace` once `done` holds of them (the log is written as requests
/// complete); None when the cluster under test is not the local one (no audit log to read).
pub async fn changes(
    namespace: &str,
    deadline: Duration,
    done: impl Fn(&[Change]) -> bool,
) -> Option<Vec<Change>> {
    if !super::cluster().local {
        return None;
    }
    let what = format!("the audit log to show what was expected in {namespace}");
    super::poll_until(&what, deadline, || async { done(&changes_in(namespace)) }).await;
    // The log only grows: what held holds still.
    Some(changes_in(namespace))
}
