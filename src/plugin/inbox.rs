//! `kubectl fleetroll inbox`: the rollouts waiting for an approval the user may give, across the
//! namespaces they can read. "May give" is the API server's answer to a dry run of that very approval, so
//! RBAC's `approve`, separation of duties and a platform policy's approvers all count.

use std::process::ExitCode;

use k8s_openapi::{api::core::v1::Namespace, jiff::Timestamp};
use kube::{Api, Client, ResourceExt, api::ListParams};
use serde::Serialize;

use super::{Exit, Output, PluginError, print};
use crate::{
    api::FleetRollout,
    core::task::awaited_approval,
    edge::control::{self, ControlError},
};

/// One rollout waiting for the user.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(super) struct Waiting {
    namespace: String,
    name: String,
    /// 1-based, as `status` shows batches.
    batch: u32,
    batches: u32,
    plan_hash: String,
    gates_hash: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    creator: Option<String>,
    since: Timestamp,
}

pub(super) async fn inbox(
    client: &Client,
    ns: &str,
    all: bool,
    output: Option<Output>,
) -> Result<ExitCode, PluginError> {
    let rollouts = readable(client, ns, all).await?;
    let mut waiting = Vec::new();
    for fr in rollouts.iter().filter(|fr| awaited_approval(fr).is_some()) {
        match control::may_approve(client, fr).await {
            Ok(true) => waiting.extend(entry(fr)),
            Ok(false) => {}
            // One the API server cannot judge now is said, and the rest still listed.
            Err(e) => eprintln!("warning: {e}"),
        }
    }
    waiting.sort_by(|a, b| {
        a.since.cmp(&b.since).then_with(|| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)))
    });
    match output {
        Some(o) => print(&waiting, o)?,
        None => print!("{}", table(&waiting, Timestamp::now())),
    }
    Ok(Exit::Done.into())
}

pub(super) fn entry(fr: &FleetRollout) -> Option<Waiting> {
    let pending = awaited_approval(fr)?;
    let s = fr.status.as_ref()?;
    Some(Waiting {
        namespace: fr.namespace().unwrap_or_default(),
        name: fr.name_any(),
        batch: pending.batch + 1,
        batches: s.plan.as_ref().map_or(0, |p| p.total_batches),
        plan_hash: pending.plan_hash.clone(),
        gates_hash: pending.gates_hash.clone(),
        creator: fr.spec.creator.as_ref().map(|c| c.username.clone()),
        since: pending.since.0,
    })
}

/// The FleetRollouts the user can read: of every namespace with `all` (listed across the cluster, else
/// namespace by namespace as far as they may list namespaces), else of `ns`.
async fn readable(client: &Client, ns: &str, all: bool) -> Result<Vec<FleetRollout>, ControlError> {
    let in_ns = |ns: &str| Api::<FleetRollout>::namespaced(client.clone(), ns);
    let list =
        |api: Api<FleetRollout>| async move { api.list(&ListParams::default()).await.map(|l| l.items) };
    if !all {
        return list(in_ns(ns))
            .await
            .map_err(|e| ControlError::from_kube(e, format!("listing FleetRollouts in {ns}")));
    }
    match list(Api::all(client.clone())).await {
        Ok(items) => return Ok(items),
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        Err(e) => return Err(ControlError::from_kube(e, "listing FleetRollouts")),
    }
    let namespaces =
        Api::<Namespace>::all(client.clone()).list(&ListParams::default()).await.map_err(|e| {
            ControlError::from_kube(
                e,
                "listing FleetRollouts across namespaces (nor may you list namespaces; use -n)",
            )
        })?;
    let mut items = Vec::new();
    for n in namespaces.items {
        match list(in_ns(&n.name_any())).await {
            Ok(found) => items.extend(found),
            Err(kube::Error::Api(s)) if s.code == 403 => {}
            Err(e) => {
                let what = format!("listing FleetRollouts in {}", n.name_any());
                return Err(ControlError::from_kube(e, what));
            }
        }
    }
    Ok(items)
}

fn table(waiting: &[Waiting], now: Timestamp) -> String {
    if waiting.is_empty() {
        return "No FleetRollout waits for an approval you may give.\n".into();
    }
    let mut rows = vec![["NAMESPACE", "NAME", "BATCH", "PLAN", "CREATOR", "WAITING"].map(String::from)];
    for w in waiting {
        let waited = now.duration_since(w.since).as_secs().max(0);
        rows.push([
            w.namespace.clone(),
            w.name.clone(),
            format!("{}/{}", w.batch, w.batches),
            w.plan_hash.clone(),
            w.creator.clone().unwrap_or_else(|| "-".into()),
            age(waited),
        ]);
    }
    let widths: Vec<usize> =
        (0..6).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in &rows {
        let cells: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out.push_str("Approve with: kubectl fleetroll approve NAME -n NAMESPACE\n");
    out
}

/// kubectl's age: 45s, 3m, 2h, 4d.
fn age(seconds: i64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inbox_names_each_rollout_its_batch_creator_and_how_long_it_waited() {
        let now: Timestamp = "2026-12-03T12:00:00Z".parse().unwrap();
        let waiting = [Waiting {
            namespace: "team".into(),
            name: "agents".into(),
            batch: 1,
            batches: 4,
            plan_hash: "5b15b4a7de2be0af".into(),
            gates_hash: "g".into(),
            creator: Some("system:serviceaccount:team:agent".into()),
            since: "2026-12-03T11:57:00Z".parse().unwrap(),
        }];
        let shown = table(&waiting, now);
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["NAMESPACE", "NAME", "BATCH", "PLAN", "CREATOR", "WAITING"]
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["team", "agents", "1/4", "5b15b4a7de2be0af", "system:serviceaccount:team:agent", "3m"]
        );
        assert!(lines[2].starts_with("Approve with: kubectl fleetroll approve"));
        assert_eq!(table(&[], now), "No FleetRollout waits for an approval you may give.\n");
        assert_eq!([age(5), age(300), age(7200 * 3), age(86400 * 3)], ["5s", "5m", "6h", "3d"]);
    }
}
