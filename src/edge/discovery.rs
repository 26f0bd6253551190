//! Finding the fleet: which namespaces a rollout may touch, and which workloads in them match. Run once
//! per revision, against the API server (not the cache), right before the plan is frozen.

use std::collections::HashSet;

use k8s_openapi::{api::core::v1::Namespace, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::{
    Client, Resource, ResourceExt,
    api::ListParams,
    core::{Selector, SelectorExt},
};
use serde::de::DeserializeOwned;

use crate::{
    api::{ClustersStatus, FleetRollout, OPT_IN_LABEL, OPT_IN_VALUE, TargetKind, Unplanned},
    core::{
        Blocked,
        plan::{self, Candidate, Discovered},
        reason,
        workload::{self, ContainerError, WorkloadFacts},
    },
    error::Result,
};

use super::{lists, workloads::Stores};

fn blocked(reason: &'static str, message: String) -> Blocked {
    Blocked { reason, message }
}

/// The namespaces a rollout may touch, or why it may touch none. Pure over the namespaces listed.
pub(crate) fn allowed_namespaces(
    fr: &FleetRollout,
    fleet_namespace: &str,
    listed: Option<&[Namespace]>,
) -> Result<Vec<String>, Blocked> {
    let own = fr.namespace().unwrap_or_default();
    let Some(selector) = &fr.spec.targets.namespace_selector else {
        return Ok(vec![own]);
    };
    if fleet_namespace.is_empty() {
        return Err(blocked(
            reason::CROSS_NAMESPACE_NOT_ALLOWED,
            "targets.namespaceSelector: this installation has no fleet namespace (--fleet-namespace), so no \
             rollout may span namespaces (no target was changed)"
                .into(),
        ));
    }
    if own != fleet_namespace {
        return Err(blocked(
            reason::CROSS_NAMESPACE_NOT_ALLOWED,
            format!(
                "targets.namespaceSelector is honoured only for FleetRollouts in the fleet namespace {fleet_namespace:?}; \
                 this one is in {own:?} (no target was changed)"
            ),
        ));
    }
    let selector = Selector::try_from(selector.clone())
        .map_err(|e| blocked(reason::INVALID_SELECTOR, format!("targets.namespaceSelector: {e}")))?;
    // Only the namespaces that opted in are the fleet's: the others are not looked at, so that what a
    // selector matches among them (whether one exists, its labels) is never told to whoever reads the
    // rollout, who may not list namespaces. A namespace left out is one its owner did not offer.
    let opted_in = |n: &&Namespace| n.labels().get(OPT_IN_LABEL).map(String::as_str) == Some(OPT_IN_VALUE);
    let matching: Vec<&Namespace> =
        listed.unwrap_or_default().iter().filter(opted_in).filter(|n| selector.matches(n.labels())).collect();
    if matching.is_empty() {
        return Err(blocked(
            reason::NO_NAMESPACES,
            format!(
                "no namespace labelled {OPT_IN_LABEL}={OPT_IN_VALUE} matches targets.namespaceSelector ({selector}); \
                 a namespace takes part only once its owner labels it (no target was changed)"
            ),
        ));
    }
    let mut names: Vec<String> = matching.iter().map(|n| n.name_any()).collect();
    names.sort();
    Ok(names)
}

/// Turns the matching workloads into plan candidates, or says why they cannot be planned. Pure.
pub(crate) fn candidates(
    fr: &FleetRollout,
    found: Vec<(String, WorkloadFacts)>,
    namespaces: &[String],
) -> Result<Vec<Candidate>, Blocked> {
    let container = fr.spec.container.as_deref();
    let mut out = Vec::with_capacity(found.len());
    let mut errors: Vec<ContainerError> = Vec::new();
    for (cluster, f) in &found {
        match f.container_image(container) {
            Ok((_, image)) => out.push(Candidate {
                cluster: cluster.clone(),
                namespace: f.namespace.clone(),
                name: f.name.clone(),
                current_image: image.to_string(),
            }),
            Err(e) => errors.push(e),
        }
    }
    if let Some(first) = errors.first() {
        let reason = first.reason();
        let more = if errors.len() > 1 {
            format!(" (and {} more targets)", errors.len() - 1)
        } else {
            String::new()
        };
        return Err(blocked(reason, format!("{first}{more}; no target was changed")));
    }
    if out.is_empty() {
        let kind = workload::kind_name(fr.spec.targets.kind);
        let selector =
            Selector::try_from(fr.spec.targets.selector.clone()).map(|s| s.to_string()).unwrap_or_default();
        return Err(blocked(
            reason::NO_TARGETS,
            format!("no {kind} matches selector {selector:?} in namespace(s) {}", sample(namespaces)),
        ));
    }
    Ok(out)
}

/// Lists the fleet from the API server. The outer error is an API failure; the inner one is a spec the
/// operator cannot act on.
pub(crate) async fn discover(
    client: &Client,
    fleet_namespace: &str,
    fr: &FleetRollout,
) -> Result<Result<Discovered, Blocked>> {
    if fr.spec.targets.kind == TargetKind::Node {
        let at = super::nodes::At::home(client, fr);
        return Ok(super::nodes::discover(at, fr).await?.map(Discovered::local));
    }
    Ok(match list_fleet(client, fleet_namespace, fr).await? {
        Ok((found, namespaces)) => {
            let found = found.into_iter().map(|f| (String::new(), f)).collect();
            candidates(fr, found, &namespaces).map(Discovered::local)
        }
        Err(b) => Err(b),
    })
}

/// The workloads of a rollout in one cluster (its own, or a member's through that member's client), and
/// the namespaces they were looked for in.
pub(crate) async fn list_fleet(
    client: &Client,
    fleet_namespace: &str,
    fr: &FleetRollout,
) -> Result<Result<(Vec<WorkloadFacts>, Vec<String>), Blocked>> {
    let selector = match Selector::try_from(fr.spec.targets.selector.clone()) {
        Ok(s) => s,
        Err(e) => {
            return Ok(Err(blocked(reason::INVALID_SELECTOR, format!("targets.selector: {e}"))));
        }
    };
    let listed = match &fr.spec.targets.namespace_selector {
        Some(_) => Some(namespaces(client).await?),
        None => None,
    };
    let namespaces = match allowed_namespaces(fr, fleet_namespace, listed.as_deref()) {
        Ok(n) => n,
        Err(b) => return Ok(Err(b)),
    };
    let selector = selector.to_string();
    let (mut found, mut weight) = (Vec::new(), 0);
    for ns in &namespaces {
        list_workloads(client, fr.spec.targets.kind, ns, &selector, (&mut found, &mut weight)).await?;
    }
    Ok(Ok((found, namespaces)))
}

/// Facts found so far, and what they weigh in all ([`WorkloadFacts::weight`]).
pub(crate) type Found<'a> = (&'a mut Vec<WorkloadFacts>, &'a mut usize);

/// Every namespace, with its name and labels only (all a rollout's scope reads of them).
pub(crate) async fn namespaces(client: &Client) -> Result<Vec<Namespace>> {
    let keep = |n: Namespace| Namespace {
        metadata: ObjectMeta { name: n.metadata.name, labels: n.metadata.labels, ..ObjectMeta::default() },
        ..Namespace::default()
    };
    let weight = |n: &Namespace| {
        let labels = n.labels().iter().map(|(k, v)| 96 + k.len() + v.len()).sum::<usize>();
        std::mem::size_of::<Namespace>() + n.name_any().len() + labels
    };
    lists::kept(client, None, &ListParams::default(), keep, weight).await
}

/// The workloads of `kind` in `namespace` matching `selector` (a label selector string), as facts added
/// to `found`, with what they weigh in all.
pub(crate) async fn list_workloads(
    client: &Client,
    kind: TargetKind,
    namespace: &str,
    selector: &str,
    found: Found<'_>,
) -> Result<()> {
    match kind {
        TargetKind::Deployment => {
            list_facts(client, namespace, selector, workload::deployment_facts, found).await
        }
        TargetKind::StatefulSet => {
            list_facts(client, namespace, selector, workload::statefulset_facts, found).await
        }
        TargetKind::DaemonSet => {
            list_facts(client, namespace, selector, workload::daemonset_facts, found).await
        }
        TargetKind::Node => Ok(()),
    }
}

/// Lists page by page and item by item, keeping only the facts of each workload: a fleet of 10,000 never
/// sits in memory as full objects. The pages are one consistent snapshot. Err once the facts found in all
/// weigh more than [`lists::MAX_FACTS_BYTES`].
async fn list_facts<K>(
    client: &Client,
    namespace: &str,
    selector: &str,
    facts: fn(&K) -> WorkloadFacts,
    (found, weight): Found<'_>,
) -> Result<()>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let lp = ListParams::default().labels(selector);
    lists::each(client, Some(namespace), &lp, |k: K| {
        let f = facts(&k);
        *weight += f.weight();
        if *weight > lists::MAX_FACTS_BYTES {
            return Err(lists::too_heavy("in one fleet"));
        }
        found.push(f);
        Ok(())
    })
    .await
    .map(drop)
}

/// A rollout as it would be planned now.
pub struct Preview {
    pub plan: plan::Plan,
    /// Across member clusters: the waves with their batches, and the targets per cluster.
    pub clusters: Option<ClustersStatus>,
    /// Member Secrets or clusters left out, and why.
    pub notes: Vec<String>,
}

/// The plan a rollout would get if it were planned now: discovery, then planning, exactly as the
/// operator does it. Everything is read with `client`'s rights, the member Secrets included (the plugin's
/// `plan` reads as the person running it); member Secrets' exec plugins run only as `exec` allows (on a
/// person's machine, with their environment: the plugin runs none unless asked). The outer error is an
/// API failure; the inner one says why it could not be planned.
pub async fn preview(
    client: &Client,
    fleet_namespace: &str,
    fr: &FleetRollout,
    exec: super::members::ExecPolicy,
) -> Result<Result<Preview, Blocked>> {
    if fr.spec.targets.clusters.is_some() {
        let members =
            super::members::Members::new(client.clone(), fleet_namespace.to_string()).with_exec(exec);
        return preview_members(&members, fleet_namespace, fr).await;
    }
    Ok(discover(client, fleet_namespace, fr).await?.and_then(|d| planned(fr, d)))
}

/// [`preview`] across member clusters, through `members` (whose hub client reads the member Secrets). A
/// rollout outside the fleet namespace is refused before any Secret is read.
pub(crate) async fn preview_members(
    members: &super::members::Members,
    fleet_namespace: &str,
    fr: &FleetRollout,
) -> Result<Result<Preview, Blocked>> {
    let discovered = super::members::workloads::discover(members, fleet_namespace, fr).await?;
    Ok(discovered.and_then(|d| planned(fr, d)))
}

fn planned(fr: &FleetRollout, d: Discovered) -> Result<Preview, Blocked> {
    let planned =
        plan::plan_revision(&fr.spec, d.candidates, &Default::default(), &d.waves, Default::default())?;
    let clusters =
        (!d.waves.is_empty()).then(|| crate::core::clusters::planned_status(&d.waves, &planned.plan.batches));
    Ok(Preview { plan: planned.plan, clusters, notes: d.refused })
}

/// Matching workloads in the cache that the plan does not contain (reported, never added).
pub(crate) fn unplanned(
    fr: &FleetRollout,
    fleet_namespace: &str,
    stores: &Stores,
    members: &HashSet<(String, String)>,
) -> Option<Unplanned> {
    let selector = Selector::try_from(fr.spec.targets.selector.clone()).ok()?;
    let namespaces: Vec<Namespace> = match &fr.spec.targets.namespace_selector {
        Some(_) => stores.namespaces.state().iter().map(|n| (**n).clone()).collect(),
        None => Vec::new(),
    };
    let allowed: HashSet<String> =
        allowed_namespaces(fr, fleet_namespace, Some(&namespaces)).ok()?.into_iter().collect();
    let extra = stores.keys_where(fr.spec.targets.kind, |f| {
        allowed.contains(&f.namespace)
            && f.labels.as_ref().is_some_and(|labels| selector.matches(labels))
            && !members.contains(&(f.namespace.clone(), f.name.clone()))
    });
    Some(plan::unplanned(extra))
}

fn sample(names: &[String]) -> String {
    let mut s = names.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > 5 {
        s.push_str(&format!(" and {} more", names.len() - 5));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{FleetRolloutSpec, Targets};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    use std::collections::BTreeMap;

    fn rollout(ns: &str, ns_selector: Option<&str>) -> FleetRollout {
        let sel = |k: &str| LabelSelector {
            match_labels: Some(BTreeMap::from([(k.to_string(), "yes".to_string())])),
            ..Default::default()
        };
        let mut fr = FleetRollout::new(
            "r",
            FleetRolloutSpec {
                image: "web:v2".into(),
                targets: Targets {
                    selector: sel("app"),
                    namespace_selector: ns_selector.map(sel),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        fr.metadata.namespace = Some(ns.into());
        fr
    }

    fn namespace(name: &str, labels: &[(&str, &str)]) -> Namespace {
        Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn without_a_namespace_selector_only_the_own_namespace_is_used() {
        assert_eq!(
            allowed_namespaces(&rollout("team-a", None), "fleetroll-system", None),
            Ok(vec!["team-a".into()])
        );
    }

    #[test]
    fn cross_namespace_rollouts_are_honoured_only_in_the_fleet_namespace() {
        let err =
            allowed_namespaces(&rollout("team-a", Some("tier")), "fleetroll-system", Some(&[])).unwrap_err();
        assert_eq!(err.reason, reason::CROSS_NAMESPACE_NOT_ALLOWED);
    }

    #[test]
    fn only_namespaces_that_opted_in_are_matched_and_the_others_are_never_told() {
        let listed = [
            namespace("t1", &[("tier", "yes"), (OPT_IN_LABEL, OPT_IN_VALUE)]),
            namespace("t2", &[("tier", "yes"), ("team", "yes")]),
            namespace("other", &[(OPT_IN_LABEL, OPT_IN_VALUE)]),
        ];
        let plan = |label: &str| {
            allowed_namespaces(&rollout("fleetroll-system", Some(label)), "fleetroll-system", Some(&listed))
        };
        assert_eq!(plan("tier"), Ok(vec!["t1".into()]), "t2 never opted in: left out");
        // A selector matching only a namespace that never opted in reads as one matching none at all.
        let (hidden, none) = (plan("team").unwrap_err(), plan("nobody").unwrap_err());
        assert_eq!(hidden.reason, reason::NO_NAMESPACES);
        assert_eq!(hidden.message.replace("team", "nobody"), none.message);
        assert!(!hidden.message.contains("t2"), "{}", hidden.message);
    }

    #[test]
    fn a_wrong_container_name_blocks_the_whole_plan() {
        let f = WorkloadFacts {
            namespace: "ns".into(),
            name: "web".into(),
            labels: Some(BTreeMap::new()),
            applied: None,
            containers: vec![("web".into(), Ok("web:v1".into()))],
            containers_cut: 0,
            generation: 1,
            status: Default::default(),
            resource_version: None,
        };
        let mut fr = rollout("ns", None);
        fr.spec.container = Some("api".into());
        let err = candidates(&fr, vec![(String::new(), f.clone())], &["ns".into()]).unwrap_err();
        assert_eq!(err.reason, reason::CONTAINER_NOT_FOUND);
        fr.spec.container = None;
        assert_eq!(candidates(&fr, vec![(String::new(), f)], &["ns".into()]).unwrap().len(), 1);
        assert_eq!(candidates(&fr, vec![], &["ns".into()]).unwrap_err().reason, reason::NO_TARGETS);
    }
}
