//! Platform guardrails (FleetRolloutPolicy) as pure functions: which policies govern a rollout (its
//! recorded creator is one of their subjects), what they require together (each applies, so the strictest
//! wins), and whether a planned rollout breaks one. Admission judges what a spec says; this judges the
//! plan too (percentages, namespaces and clusters a selector reached) and holds a rollout that breaks a
//! policy before its next batch, whenever the policy was written.

use std::collections::BTreeSet;

use crate::{
    api::{
        ApprovalMode, Approvers, ChangeWindow, Creator, FleetRolloutPolicy, FleetRolloutSpec, PolicyApprovers,
    },
    core::plan::Plan,
};

/// What the policies governing one rollout require, each requirement with the policy that sets it (the
/// strictest, when several do).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Guardrails {
    pub approval: Option<(ApprovalMode, String)>,
    pub max_batch_size: Option<(u32, String)>,
    pub max_targets: Option<(u32, String)>,
    pub require_analysis: Option<String>,
    /// Each policy's approvers: an approver must satisfy every one.
    pub approvers: Vec<(String, Approvers)>,
    /// Each policy's namespaces: a target must be in every one of these sets.
    pub namespaces: Vec<(String, BTreeSet<String>)>,
    /// Each policy's member clusters: a target in a member cluster must be in every one of these sets.
    pub clusters: Vec<(String, BTreeSet<String>)>,
    /// Each policy's change windows: every one applies.
    pub windows: Vec<(String, Vec<ChangeWindow>)>,
    /// Each policy's notification subscriptions: every one hears.
    pub notify: Vec<(String, Vec<crate::api::Subscription>)>,
}

/// A policy a rollout breaks: which, by which rule, in words a person can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub policy: String,
    pub rule: &'static str,
    pub message: String,
}

/// Whether `policy` governs the rollouts of `creator`.
pub fn governs(policy: &FleetRolloutPolicy, creator: &Creator) -> bool {
    let s = &policy.spec.subjects;
    s.users.contains(&creator.username)
        || s.groups.iter().any(|g| creator.groups.contains(g))
        || s.service_accounts
            .iter()
            .any(|sa| creator.username == format!("system:serviceaccount:{}:{}", sa.namespace, sa.name))
}

/// What the policies that govern a rollout of `creator` require. A rollout without a recorded creator
/// (created before fleetroll recorded them, or without its admission policy) is governed by none.
pub fn guardrails(policies: &[impl AsRef<FleetRolloutPolicy>], creator: Option<&Creator>) -> Guardrails {
    let mut g = Guardrails::default();
    let Some(creator) = creator else { return g };
    let mut governing: Vec<&FleetRolloutPolicy> =
        policies.iter().map(AsRef::as_ref).filter(|p| governs(p, creator)).collect();
    // In name order, so the policy named for a tie is the same on every replica.
    governing.sort_by_key(|p| p.metadata.name.clone());
    for p in governing {
        let name = p.metadata.name.clone().unwrap_or_default();
        let spec = &p.spec;
        if let Some(mode) = spec.approval
            && g.approval.as_ref().is_none_or(|(m, _)| rank(mode) > rank(*m))
        {
            g.approval = Some((mode, name.clone()));
        }
        stricter(&mut g.max_batch_size, spec.max_batch_size, &name);
        stricter(&mut g.max_targets, spec.max_targets, &name);
        if spec.require_analysis && g.require_analysis.is_none() {
            g.require_analysis = Some(name.clone());
        }
        if let Some(approvers) = &spec.approvers {
            g.approvers.push((name.clone(), approvers.clone()));
        }
        if let Some(ns) = &spec.namespaces {
            g.namespaces.push((name.clone(), ns.iter().cloned().collect()));
        }
        if let Some(clusters) = &spec.clusters {
            g.clusters.push((name.clone(), clusters.iter().cloned().collect()));
        }
        if !spec.windows.is_empty() {
            g.windows.push((name.clone(), spec.windows.clone()));
        }
        if !spec.notify.is_empty() {
            g.notify.push((name.clone(), spec.notify.clone()));
        }
    }
    g
}

fn stricter(current: &mut Option<(u32, String)>, candidate: Option<u32>, policy: &str) {
    if let Some(n) = candidate
        && current.as_ref().is_none_or(|(m, _)| n < *m)
    {
        *current = Some((n, policy.to_string()));
    }
}

/// How strict an approval mode is.
fn rank(mode: ApprovalMode) -> u8 {
    match mode {
        ApprovalMode::None => 0,
        ApprovalMode::FirstBatch => 1,
        ApprovalMode::EveryBatch => 2,
    }
}

/// The approval mode that applies: the spec's, or the policies' when stricter.
pub fn approval_mode(spec: ApprovalMode, g: &Guardrails) -> ApprovalMode {
    match &g.approval {
        Some((mode, _)) if rank(*mode) > rank(spec) => *mode,
        _ => spec,
    }
}

/// How many policies' approvers, and how many users and groups of each, status shows (its size is bounded).
const SHOWN_POLICIES: usize = 8;
const SHOWN_NAMES: usize = 16;

/// Who may approve, as status shows it: the approvers of each governing policy that names them.
pub fn approvers(g: &Guardrails) -> Vec<PolicyApprovers> {
    let shown = |names: &[String]| names.iter().take(SHOWN_NAMES).cloned().collect::<Vec<_>>();
    g.approvers
        .iter()
        .take(SHOWN_POLICIES)
        .map(|(policy, a)| PolicyApprovers {
            policy: policy.clone(),
            users: shown(&a.users),
            groups: shown(&a.groups),
            more: a.users.len() > SHOWN_NAMES || a.groups.len() > SHOWN_NAMES,
        })
        .collect()
}

/// Whether `username`, in `groups`, is one the approvers of every listed policy allow. A list cut short
/// (`more`) allows anyone here: admission judges the approval against the whole policy when it is written.
pub fn allows_approver(approvers: &[PolicyApprovers], username: &str, groups: &[String]) -> bool {
    approvers.iter().all(|a| {
        a.more || a.users.iter().any(|u| u == username) || a.groups.iter().any(|g| groups.contains(g))
    })
}

/// A digest of who may approve (the approvers of each governing policy, sorted): empty when no policy names
/// any.
pub fn approvers_digest(g: &Guardrails) -> String {
    if g.approvers.is_empty() {
        return String::new();
    }
    let sorted = |names: &Vec<String>| names.iter().cloned().collect::<BTreeSet<_>>();
    let named: Vec<_> = g.approvers.iter().map(|(p, a)| (p, sorted(&a.users), sorted(&a.groups))).collect();
    crate::core::plan::short_hash(&named)
}

/// The approvers in words: "a member of group approvers (policy agents-need-people)".
pub fn describe_approvers(approvers: &[PolicyApprovers]) -> String {
    let one = |a: &PolicyApprovers| {
        let mut who: Vec<String> = Vec::new();
        if !a.groups.is_empty() {
            who.push(format!("a member of group {}", a.groups.join(" or ")));
        }
        if !a.users.is_empty() {
            who.push(format!("user {}", a.users.join(" or ")));
        }
        if a.more {
            who.push("another the policy names".into());
        }
        if who.is_empty() {
            who.push("no one".into());
        }
        format!("{} (FleetRolloutPolicy {})", who.join(" or "), a.policy)
    };
    approvers.iter().map(one).collect::<Vec<_>>().join(", and ")
}

/// The first policy the rest of the planned rollout, from batch `next` on, breaks, if any (`maxTargets`
/// counts the whole plan). `namespace` is the rollout's own (a node's target has none: its DaemonSet is in
/// the rollout's namespace).
pub fn violation(
    g: &Guardrails,
    spec: &FleetRolloutSpec,
    namespace: &str,
    plan: &Plan,
    next: u32,
) -> Option<Violation> {
    let broken =
        |policy: &str, rule, message: String| Violation { policy: policy.to_string(), rule, message };
    if let Some(policy) = &g.require_analysis
        && spec.analysis.is_none()
    {
        return Some(broken(
            policy,
            "requireAnalysis",
            "its rollouts need a metric analysis (spec.analysis)".into(),
        ));
    }
    if let Some((max, policy)) = &g.max_targets {
        let total = plan.total_targets();
        if total > *max {
            return Some(broken(
                policy,
                "maxTargets",
                format!("{total} targets planned, at most {max} allowed"),
            ));
        }
    }
    let rest = || plan.batches.iter().enumerate().skip(next as usize);
    if let Some((max, policy)) = &g.max_batch_size
        && let Some((i, batch)) = rest().find(|(_, b)| b.len() > *max as usize)
    {
        let message = format!("batch {} has {} targets, at most {max} allowed", i + 1, batch.len());
        return Some(broken(policy, "maxBatchSize", message));
    }
    let targets = || rest().flat_map(|(_, b)| b);
    for (policy, allowed) in &g.namespaces {
        let outside = targets()
            .map(|t| if t.namespace.is_empty() { namespace } else { t.namespace.as_str() })
            .find(|ns| !allowed.contains(*ns));
        if let Some(ns) = outside {
            return Some(broken(
                policy,
                "namespaces",
                format!("namespace {ns} is not one its rollouts may roll"),
            ));
        }
    }
    for (policy, allowed) in &g.clusters {
        if let Some(t) = targets().find(|t| !t.cluster.is_empty() && !allowed.contains(&t.cluster)) {
            let message = format!("member cluster {} is not one its rollouts may roll", t.cluster);
            return Some(broken(policy, "clusters", message));
        }
    }
    None
}

#[cfg(test)]
mod tests;
