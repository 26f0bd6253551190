//! Where frozen plans live: in status while small, in immutable ConfigMaps owned by the rollout when large
//! (so status stays small whatever the fleet size), and in a process cache keyed by plan hash either way.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
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
    error::{Error, Result},
    failpoint,
    plan::Plan,
};

/// Plans whose JSON is larger than this (about 20 targets) go to ConfigMaps. The API server validates and
/// tracks every field of a structured status on every write: a 100-target plan inline made each status
/// write twice as slow (17.6 ms against 10.2 ms), and batch transitions with it; a ConfigMap holds the plan
/// as one string, written once.
pub const INLINE_MAX_BYTES: usize = 2 * 1024;
/// Targets per ConfigMap shard (about 130 bytes each, far below the 1 MiB object limit).
pub const SHARD_TARGETS: usize = 2000;

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
const CACHE_LIMIT: usize = 512;

/// A loaded plan and the set of its targets.
#[derive(Debug)]
pub struct LoadedPlan {
    pub plan: Plan,
    pub members: HashSet<(String, String)>,
}

impl LoadedPlan {
    fn new(plan: Plan) -> Arc<Self> {
        let members = plan.batches.iter().flatten().map(|t| (t.namespace.clone(), t.name.clone())).collect();
        Arc::new(Self { plan, members })
    }
}

#[derive(Debug, Default)]
pub struct PlanStore {
    limits: Limits,
    cache: Mutex<HashMap<String, Arc<LoadedPlan>>>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ShardEntry {
    batch: u32,
    #[serde(flatten)]
    target: PlannedTarget,
}

impl PlanStore {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits: Limits { shard_targets: limits.shard_targets.max(1), ..limits },
            cache: Mutex::default(),
        }
    }

    /// Persists a plan (shards first, if it needs them) and returns the reference to put in status.
    pub async fn store(&self, client: &Client, fr: &FleetRollout, plan: &Plan) -> Result<PlanRef> {
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
            plan_ref.shards = self.write_shards(client, fr, plan).await?;
            failpoint::hit(failpoint::AFTER_PLAN_SHARDS).await;
        }
        self.remember(plan.clone());
        Ok(plan_ref)
    }

    async fn write_shards(&self, client: &Client, fr: &FleetRollout, plan: &Plan) -> Result<Vec<String>> {
        let ns = fr.namespace().unwrap_or_default();
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        let owner = fr.controller_owner_ref(&());
        let entries: Vec<ShardEntry> = plan
            .batches
            .iter()
            .enumerate()
            .flat_map(|(b, ts)| ts.iter().map(move |t| ShardEntry { batch: b as u32, target: t.clone() }))
            .collect();
        let mut names = Vec::new();
        for (i, chunk) in entries.chunks(self.limits.shard_targets).enumerate() {
            // The name carries the plan hash, so a re-plan never collides with an older shard.
            let name = format!("{}-plan-{}-{i}", truncate_name(&fr.name_any(), 200), plan.hash);
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
                data: Some(BTreeMap::from([(
                    DATA_KEY.to_string(),
                    serde_json::to_string(chunk).map_err(Error::Json)?,
                )])),
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
                // Written before a crash: same name, same hash, same content.
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(Error::Kube(e)),
            }
            names.push(name);
        }
        Ok(names)
    }

    /// The plan a status refers to.
    pub async fn load(
        &self,
        client: &Client,
        fr: &FleetRollout,
        plan_ref: &PlanRef,
    ) -> Result<Arc<LoadedPlan>> {
        if let Some(p) = self.cache.lock().ok().and_then(|c| c.get(&plan_ref.hash).cloned()) {
            return Ok(p);
        }
        let unreadable = |reason: String| Error::PlanUnreadable { rollout: fr.name_any(), reason };
        let plan = match plan_ref.storage {
            PlanStorage::Status => Plan { hash: plan_ref.hash.clone(), batches: plan_ref.batches.clone() },
            PlanStorage::ConfigMaps => {
                let api: Api<ConfigMap> =
                    Api::namespaced(client.clone(), &fr.namespace().unwrap_or_default());
                let mut batches: Vec<Vec<PlannedTarget>> = vec![Vec::new(); plan_ref.total_batches as usize];
                for name in &plan_ref.shards {
                    let cm = api.get(name).await.map_err(|e| unreadable(format!("ConfigMap {name}: {e}")))?;
                    let data = cm
                        .data
                        .as_ref()
                        .and_then(|d| d.get(DATA_KEY))
                        .ok_or_else(|| unreadable(format!("ConfigMap {name} has no {DATA_KEY}")))?;
                    let entries: Vec<ShardEntry> = serde_json::from_str(data)
                        .map_err(|e| unreadable(format!("ConfigMap {name}: {e}")))?;
                    for e in entries {
                        let slot = batches.get_mut(e.batch as usize).ok_or_else(|| {
                            unreadable(format!(
                                "ConfigMap {name} names batch {} of {}",
                                e.batch, plan_ref.total_batches
                            ))
                        })?;
                        slot.push(e.target);
                    }
                }
                Plan { hash: plan_ref.hash.clone(), batches }
            }
        };
        if plan.total_targets() != plan_ref.total_targets {
            return Err(unreadable(format!(
                "{} targets found, {} recorded",
                plan.total_targets(),
                plan_ref.total_targets
            )));
        }
        Ok(self.remember(plan))
    }

    fn remember(&self, plan: Plan) -> Arc<LoadedPlan> {
        let loaded = LoadedPlan::new(plan);
        if let Ok(mut c) = self.cache.lock() {
            if c.len() >= CACHE_LIMIT {
                c.clear();
            }
            c.insert(loaded.plan.hash.clone(), loaded.clone());
        }
        loaded
    }
}

fn truncate_name(name: &str, max: usize) -> &str {
    if name.len() <= max { name } else { name[..max].trim_end_matches('-') }
}
