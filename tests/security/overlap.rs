//! Rollouts that overlap without anyone meaning harm: two FleetRollouts applied in one request burst (a
//! GitOps sync of two manifests) over the same Deployments. Whatever the interleaving of their plans,
//! each target is changed by one rollout only, the other reports it, and both settle within their own
//! timeouts.

use std::collections::HashMap;

use fleetroll::api::{APPLIED_ANNOTATION, Phase};
use k8s_openapi::api::apps::v1::Deployment;
use testkit::fleet::{NEXT_IMAGE, UNREADY_IMAGE, deployment, image_of, phase};

use super::*;

/// Pairs raced at once, each over six Deployments of its own, and rounds of that.
const PAIRS: usize = 4;
const ROUNDS: usize = 2;
const TARGETS: usize = 6;
/// Long enough for every batch of the slower rollout to time out, and far shorter than what a rollout
/// left "in progress" for ever would show.
const SETTLED: Duration = Duration::from_secs(90);

pub(super) async fn two_rollouts_applied_together_race(env: &'static Env) -> Row {
    let ns = env.scratch_namespace("sec-race", &[]).await;
    let fleet = Fleet { client: env.admin.clone(), ns: ns.clone(), tenants: vec![] };
    let mut op = Operator::start(&ns, &[], &[]);
    let mut problems = Vec::new();
    let (mut changed, mut refused) = (0, 0);
    for round in 0..ROUNDS {
        let deployments = Api::<Deployment>::namespaced(env.admin.clone(), &ns);
        let pairs: Vec<String> = (0..PAIRS).map(|p| format!("r{round}p{p}")).collect();
        for pair in &pairs {
            for i in 0..TARGETS {
                let d = deployment(&format!("{pair}-{i}"), READY_IMAGE, &[("pair", pair)]);
                deployments.create(&PostParams::default(), &d).await.unwrap();
            }
        }
        let before = generations(&deployments).await;
        // Every rollout of the round in one burst: the requests go out together, not one after another.
        let creates = pairs.iter().flat_map(|pair| {
            let targets = json!({"kind": "Deployment", "selector": {"matchLabels": {"pair": pair}}});
            [
                (
                    format!("{pair}-ready"),
                    json!({"image": NEXT_IMAGE, "targets": targets,
                    "strategy": {"batchSize": 3}}),
                ),
                (
                    format!("{pair}-unready"),
                    json!({"image": UNREADY_IMAGE, "targets": targets,
                    "strategy": {"batchSize": 2}, "health": {"timeout": "15s"}}),
                ),
            ]
        });
        let created = futures::future::join_all(creates.map(|(name, spec)| {
            let fleet = &fleet;
            async move { fleet.rollout(&name, spec).await }
        }))
        .await;
        let uids: HashMap<String, String> =
            created.iter().map(|fr| (fr.uid().unwrap(), fr.name_any())).collect();
        for fr in &created {
            let last = fleet.wait_rollout(&fr.name_any(), "a settled state", SETTLED, settled).await;
            if !settled(&last) {
                problems.push(format!("{} did not settle: {}", fr.name_any(), state(&last)));
            }
        }
        let round_of = |d: &Deployment| pairs.iter().any(|p| d.name_any().starts_with(&format!("{p}-")));
        let after: Vec<Deployment> =
            deployments.list(&Default::default()).await.unwrap().items.into_iter().filter(round_of).collect();
        for d in &after {
            let name = d.name_any();
            let grew = d.metadata.generation.unwrap_or(0) - before.get(&name).copied().unwrap_or(0);
            let owner = applied_owner(d).and_then(|uid| uids.get(&uid)).cloned();
            let expected_image = match owner.as_deref() {
                Some(o) if o.ends_with("-ready") => NEXT_IMAGE,
                Some(_) => UNREADY_IMAGE,
                None => READY_IMAGE,
            };
            if grew > 1 || (owner.is_none() && grew != 0) || image_of(d) != expected_image {
                problems.push(format!("{name}: generation +{grew}, image {}, key of {owner:?}", image_of(d)));
            }
            changed += usize::from(owner.is_some());
        }
        // Each rollout reports every target of its started batches that the other took.
        for fr in &created {
            let fr = fleet.rollouts().get(&fr.name_any()).await.unwrap();
            refused += refusals(&fr, "TargetHeldByAnotherRollout");
            if let Some(gap) = unaccounted(&fr, &after, &uids) {
                problems.push(gap);
            }
        }
    }
    let alive = serving(&mut op).await;
    Row {
        attack: format!(
            "two rollouts over the same {TARGETS} Deployments applied in one burst ({PAIRS} pairs at once, {ROUNDS} rounds)"
        ),
        who: "a GitOps sync of two manifests (no attacker)".into(),
        expected:
            "each target changed by one rollout only, the other reports it; both settle within their timeouts"
                .into(),
        outcome: if problems.is_empty() {
            format!("{changed} targets changed once each, {refused} refusals reported, every rollout settled")
        } else {
            problems.join("; ")
        },
        contained: problems.is_empty() && alive && changed > 0 && refused > 0,
    }
}

async fn generations(api: &Api<Deployment>) -> HashMap<String, i64> {
    let list = api.list(&Default::default()).await.unwrap();
    list.items.iter().map(|d| (d.name_any(), d.metadata.generation.unwrap_or(0))).collect()
}

/// The uid in a Deployment's `fleetroll.dev/applied` key: the rollout that changed it.
fn applied_owner(d: &Deployment) -> Option<String> {
    d.annotations().get(APPLIED_ANNOTATION).and_then(|k| k.split('/').next()).map(String::from)
}

/// Finished, or held for a person to act on; never "in progress" with targets no one will judge.
fn settled(fr: &FleetRollout) -> bool {
    phase(fr).is_terminal() || phase(fr) == Phase::Paused
}

/// What a rollout's counts leave unexplained: every target of its started batches is either one it
/// changed (it carries its key) or one it reports as refused.
fn unaccounted(fr: &FleetRollout, all: &[Deployment], uids: &HashMap<String, String>) -> Option<String> {
    let s = fr.status.clone().unwrap_or_default();
    let own = all.iter().filter(|d| applied_owner(d).and_then(|u| uids.get(&u)) == Some(&fr.name_any()));
    let ours = u32::try_from(own.count()).unwrap_or(u32::MAX);
    let started: u32 = s.batches.iter().map(|b| b.size).sum();
    (s.counts.updated != ours || ours + s.counts.refused != started).then(|| {
        let failures: Vec<String> = s.failures.iter().map(|f| format!("{} {}", f.name, f.reason)).collect();
        let batches: Vec<String> = s.batches.iter().map(|b| format!("{}:{:?}", b.size, b.state)).collect();
        format!(
            "{}: changed {ours}, counts say updated {} and refused {} of {started} in its started batches \
             ({}; {batches:?}; {failures:?})",
            fr.name_any(),
            s.counts.updated,
            s.counts.refused,
            state(fr),
        )
    })
}
