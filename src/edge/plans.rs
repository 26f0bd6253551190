//! Where frozen plans live: in status while small, in immutable ConfigMaps owned by the rollout when large
//! (so status stays small whatever the fleet size), and in a process cache keyed by rollout and plan hash
//! either way.
//!
//! A plan read back is input like any other: the ConfigMaps sit in the rollout's namespace, where anyone who
//! may edit ConfigMaps there can replace them. So every plan read from the cluster is checked against the
//! hash recorded in status when it was frozen, and one that does not match is refused (`PlanTampered`):
//! nothing is changed on its word.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Arc, Mutex},
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ObjectMeta, PostParams},
};
use serde::{Deserialize, Serialize};

use crate::{
    api::{FleetRollout, PlanRef, PlanStorage, PlannedTarget},
    core::Blocked,
    core::plan::Plan,
    error::{Error, Result, is_not_found},
    failpoint,
};

/// Plans whose JSON is larger than this (about 20 targets) go to ConfigMaps. The API server validates and
/// tracks every field of a structured status on every write, so a large plan inline would slow down every
/// status write, and batch transitions with it; a ConfigMap holds the plan as one string, written once.
pub(crate) const INLINE_MAX_BYTES: usize = 2 * 1024;
/// Targets per ConfigMap shard (about 130 bytes each, far below the 1 MiB object limit).
pub(crate) const SHARD_TARGETS: usize = 2000;
/// The most plan JSON one shard holds, whatever its targets' names and images weigh: half the 1 MiB an
/// object may be.
const SHARD_MAX_BYTES: usize = 512 * 1024;

/// Where the line between inline and sharded plans lies.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub inline_max_bytes: usize,
    pub shard_targets: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { inline_max_bytes: INLINE_MAX_BYTES, shard_targets: SHARD_TARGETS }
    }
}
const DATA_KEY: &str = "plan.json";
/// Plans kept in memory, the least recently used dropped first (a tenant with many sharded rollouts must
/// not flush everyone's).
const CACHE_LIMIT: std::num::NonZeroUsize = match std::num::NonZeroUsize::new(512) {
    Some(n) => n,
    None => std::num::NonZeroUsize::MIN,
};

/// A loaded plan and the set of its targets.
#[derive(Debug)]
pub struct LoadedPlan {
    pub plan: Plan,
    pub members: HashSet<(String, String)>,
}

impl LoadedPlan {
    /// No plan: for a finished rollout, which needs none to stay finished.
    pub(crate) fn none() -> Arc<Self> {
        Self::new(Plan { hash: String::new(), batches: Vec::new() })
    }

    fn new(plan: Plan) -> Arc<Self> {
        let members = plan.batches.iter().flatten().map(|t| (t.namespace.clone(), t.name.clone())).collect();
        Arc::new(Self { plan, members })
    }
}

/// Cached plans by (rollout uid, plan hash): a status naming another rollout's plan hash must not borrow
/// that rollout's plan.
type CacheKey = (String, String);

#[derive(Debug)]
pub struct PlanStore {
    limits: Limits,
    cache: Mutex<lru::LruCache<CacheKey, Arc<LoadedPlan>>>,
}

impl Default for PlanStore {
    fn default() -> Self {
        Self::new(Limits::default())
    }
}

fn tampered(fr: &FleetRollout, what: String) -> Blocked {
    Blocked {
        reason: crate::core::reason::PLAN_TAMPERED,
        message: format!(
            "the frozen plan of {}: {what}; nothing was changed on its word. Abort, or change the spec \
             (image, targets, batch sizes) to plan anew",
            fr.name_any()
        ),
    }
}

fn cache_key(fr: &FleetRollout, hash: &str) -> CacheKey {
    (fr.uid().unwrap_or_default(), hash.to_string())
}

/// Entries (each a JSON value) in JSON arrays of at most `max_entries` entries and, unless one entry alone
/// weighs more, `max_bytes`, in order.
fn shards(entries: &[String], max_entries: usize, max_bytes: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut count = 0;
    for entry in entries {
        match out.last_mut() {
            Some(shard) if count < max_entries && shard.len() + entry.len() < max_bytes => {
                shard.pop();
                shard.push(',');
                shard.push_str(entry);
                shard.push(']');
                count += 1;
            }
            _ => {
                out.push(format!("[{entry}]"));
                count = 1;
            }
        }
    }
    out
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ShardEntry {
    batch: u32,
    #[serde(flatten)]
    target: PlannedTarget,
}

impl PlanStore {
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            limits: Limits { shard_targets: limits.shard_targets.max(1), ..limits },
            cache: Mutex::new(lru::LruCache::new(CACHE_LIMIT)),
        }
    }

    /// Persists a plan (shards first, if it needs them) and returns the reference to put in status. The inner
    /// error: a shard of that name already exists with other content (planted before we planned).
    pub async fn store(
        &self,
        client: &Client,
        fr: &FleetRollout,
        plan: &Plan,
    ) -> Result<Result<PlanRef, Blocked>> {
        let encoded = serde_json::to_vec(&plan.batches).map_err(Error::Json)?;
        let mut plan_ref = PlanRef {
            hash: plan.hash.clone(),
            total_targets: plan.total_targets(),
            total_batches: plan.total_batches(),
            storage: PlanStorage::Status,
            batches: Vec::new(),
            shards: Vec::new(),
        };
        if encoded.len() <= self.limits.inline_max_bytes {
            plan_ref.batches = plan.batches.clone();
        } else {
            plan_ref.storage = PlanStorage::ConfigMaps;
            plan_ref.shards = match self.write_shards(client, fr, plan).await? {
                Ok(names) => names,
                Err(b) => return Ok(Err(b)),
            };
            failpoint::hit(failpoint::AFTER_PLAN_SHARDS).await;
        }
        self.remember(fr, plan.clone());
        Ok(Ok(plan_ref))
    }

    async fn write_shards(
        &self,
        client: &Client,
        fr: &FleetRollout,
        plan: &Plan,
    ) -> Result<Result<Vec<String>, Blocked>> {
        let ns = fr.namespace().unwrap_or_default();
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        let owner = fr.controller_owner_ref(&());
        let entries: Vec<String> = plan
            .batches
            .iter()
            .enumerate()
            .flat_map(|(b, ts)| ts.iter().map(move |t| ShardEntry { batch: b as u32, target: t.clone() }))
            .map(|e| serde_json::to_string(&e).map_err(Error::Json))
            .collect::<Result<_>>()?;
        let mut names = Vec::new();
        for (i, data) in shards(&entries, self.limits.shard_targets, SHARD_MAX_BYTES).into_iter().enumerate()
        {
            // The name carries the plan hash, so a re-plan never collides with an older shard.
            let name = format!(
                "{}-plan-{}-{i}",
                crate::core::text::clip(&fr.name_any(), 200).trim_end_matches('-'),
                plan.hash
            );
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(ns.clone()),
                    owner_references: owner.clone().map(|o| vec![o]),
                    labels: Some(BTreeMap::from([
                        ("app.kubernetes.io/managed-by".to_string(), "fleetroll".to_string()),
                        ("fleetroll.dev/plan".to_string(), plan.hash.clone()),
                    ])),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([(DATA_KEY.to_string(), data.clone())])),
                immutable: Some(true),
                ..Default::default()
            };
            match api
                .create(
                    &PostParams {
                        field_manager: Some(crate::api::FIELD_MANAGER.into()),
                        ..Default::default()
                    },
                    &cm,
                )
                .await
            {
                Ok(_) => {}
                // Written before a crash (same name, same hash, same content), or planted by someone who
                // predicted the name: read it back and compare.
                Err(e) if crate::error::is_conflict(&e) => {
                    let existing = api.get(&name).await?;
                    if existing.data.as_ref().and_then(|d| d.get(DATA_KEY)) != Some(&data) {
                        return Ok(Err(tampered(
                            fr,
                            format!("ConfigMap {ns}/{name} already exists and holds another plan"),
                        )));
                    }
                }
                Err(e) => return Err(Error::Kube(e)),
            }
            names.push(name);
        }
        Ok(Ok(names))
    }

    /// The plan a status refers to, if it is the plan the operator froze. The outer error is an API
    /// failure (retried); the inner one a plan that is gone or not the one recorded (`PlanTampered`).
    pub async fn load(
        &self,
        client: &Client,
        fr: &FleetRollout,
        plan_ref: &PlanRef,
    ) -> Result<Result<Arc<LoadedPlan>, Blocked>> {
        if let Some(p) =
            self.cache.lock().ok().and_then(|mut c| c.get(&cache_key(fr, &plan_ref.hash)).cloned())
        {
            return Ok(Ok(p));
        }
        let plan = match plan_ref.storage {
            PlanStorage::Status => Plan { hash: plan_ref.hash.clone(), batches: plan_ref.batches.clone() },
            PlanStorage::ConfigMaps => match read_shards(client, fr, plan_ref).await? {
                Ok(batches) => Plan { hash: plan_ref.hash.clone(), batches },
                Err(blocked) => return Ok(Err(blocked)),
            },
        };
        let spec_hash = fr.status.as_ref().and_then(|s| s.revision.as_ref()).map(|r| r.spec_hash.as_str());
        if plan.total_targets() != plan_ref.total_targets
            || plan.total_batches() != plan_ref.total_batches
            || !spec_hash.is_some_and(|h| plan.is_authentic(h))
        {
            return Ok(Err(tampered(
                fr,
                format!("its content does not match the hash {} recorded when it was frozen", plan_ref.hash),
            )));
        }
        Ok(Ok(self.remember(fr, plan)))
    }

    fn remember(&self, fr: &FleetRollout, plan: Plan) -> Arc<LoadedPlan> {
        let loaded = LoadedPlan::new(plan);
        if let Ok(mut c) = self.cache.lock() {
            c.put(cache_key(fr, &loaded.plan.hash), loaded.clone());
        }
        loaded
    }
}

/// The batches stored in a plan's ConfigMaps, or why they are not the plan frozen (`PlanTampered`).
async fn read_shards(
    client: &Client,
    fr: &FleetRollout,
    plan_ref: &PlanRef,
) -> Result<Result<Vec<Vec<PlannedTarget>>, Blocked>> {
    let ns = fr.namespace().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    // Bounded by what status recorded, so a forged total cannot make us allocate without limit.
    let total_batches = plan_ref.total_batches.min(plan_ref.total_targets) as usize;
    let mut batches: Vec<Vec<PlannedTarget>> = vec![Vec::new(); total_batches];
    for name in &plan_ref.shards {
        let cm = match api.get(name).await {
            Ok(cm) => cm,
            Err(e) if is_not_found(&e) => {
                return Ok(Err(tampered(fr, format!("ConfigMap {ns}/{name} is gone"))));
            }
            Err(e) => return Err(Error::Kube(e)),
        };
        let Some(data) = cm.data.as_ref().and_then(|d| d.get(DATA_KEY)) else {
            return Ok(Err(tampered(fr, format!("ConfigMap {ns}/{name} has no {DATA_KEY}"))));
        };
        let entries: Vec<ShardEntry> = match serde_json::from_str(data) {
            Ok(e) => e,
            Err(e) => {
                return Ok(Err(tampered(fr, format!("ConfigMap {ns}/{name} does not hold a plan: {e}"))));
            }
        };
        for e in entries {
            let Some(slot) = batches.get_mut(e.batch as usize) else {
                let why = format!("ConfigMap {ns}/{name} names batch {} of {total_batches}", e.batch);
                return Ok(Err(tampered(fr, why)));
            };
            slot.push(e.target);
        }
    }
    Ok(Ok(batches))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_bounded_by_targets_and_by_bytes_and_keep_the_order() {
        let entries: Vec<String> = (0..7).map(|i| format!("{{\"n\":{i}}}")).collect();
        let by_count = shards(&entries, 3, SHARD_MAX_BYTES);
        assert_eq!(
            by_count,
            ["[{\"n\":0},{\"n\":1},{\"n\":2}]", "[{\"n\":3},{\"n\":4},{\"n\":5}]", "[{\"n\":6}]"]
        );
        // Long names and images: 2,000 targets of 1 KiB each would pass the 1 MiB an object may be.
        let heavy: Vec<String> = (0..2000)
            .map(|i| serde_json::to_string(&ShardEntry { batch: i, target: heavy_target(i) }).unwrap())
            .collect();
        let by_bytes = shards(&heavy, SHARD_TARGETS, SHARD_MAX_BYTES);
        assert!(by_bytes.len() > 1 && by_bytes.iter().all(|s| s.len() <= SHARD_MAX_BYTES));
        let back: Vec<ShardEntry> =
            by_bytes.iter().flat_map(|s| serde_json::from_str::<Vec<ShardEntry>>(s).unwrap()).collect();
        assert_eq!(back.iter().map(|e| e.batch).collect::<Vec<_>>(), (0..2000).collect::<Vec<_>>());
        // One entry heavier than a shard may be still gets a shard of its own.
        let one = vec!["x".repeat(100)];
        assert_eq!(shards(&one, 10, 50), [format!("[{}]", one[0])]);
    }

    fn heavy_target(i: u32) -> PlannedTarget {
        PlannedTarget {
            cluster: format!("arn:aws:eks:eu-west-1:123456789012:cluster/{}", "c".repeat(200)),
            namespace: "n".repeat(63),
            name: format!("{i}-{}", "w".repeat(240)),
            previous_image: format!("registry.example.com/{}:v1", "i".repeat(400)),
        }
    }
}
