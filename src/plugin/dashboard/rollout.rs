//! One rollout's stream: the rollout itself, the grid of its targets, and its events, each from a watch
//! made as the user. The grid's states come from the rollout's checkpoints and, for targets in this
//! cluster the user may read, from a watch of the targets themselves; changes are sent as the cells that
//! changed, at most every [`TICK`], so a page keeps up with thousands of targets changing.

use std::{collections::HashMap, convert::Infallible, sync::Arc, time::Duration};

use axum::{
    extract::{Path, State},
    response::sse::{Event, KeepAlive, Sse},
};
use futures::{Stream, StreamExt, TryStreamExt, stream::BoxStream};
use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment, StatefulSet},
    core::v1::Event as KubeEvent,
};
use kube::{
    Api, Resource, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::mpsc;

use super::{
    Dash,
    list::{KEEP_ALIVE, connection, event, received},
    view::{self, Cell, Seen},
};
use crate::{
    api::{FleetRollout, TargetKind},
    core::{
        plan::Plan,
        workload::{self, WorkloadFacts},
    },
    edge::{control, plans::PlanStore},
};

/// How often changed cells and events are sent at most.
const TICK: Duration = Duration::from_millis(100);
/// The first wait before a lost watch is tried again, and the longest.
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
pub const RETRY_MAX: Duration = Duration::from_secs(10);
/// The most events the timeline shows (the newest).
const EVENTS_SHOWN: usize = 200;

pub async fn stream(
    State(dash): State<Dash>,
    Path((ns, name)): Path<(String, String)>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move {
        let _ = Watching::new(dash, ns, name, tx).run().await;
    });
    Sse::new(received(rx)).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

/// A page that has gone: stop.
struct Gone;

/// What one rollout's stream has seen, and what it last sent.
struct Watching {
    dash: Dash,
    ns: String,
    name: String,
    tx: mpsc::Sender<Event>,
    rollout: Option<FleetRollout>,
    plan: Option<Arc<Plan>>,
    plans: PlanStore,
    seen: HashMap<String, Seen>,
    sent: Vec<Cell>,
    events: HashMap<String, serde_json::Value>,
    targets_dirty: bool,
    events_dirty: bool,
}

/// How a session of watches ended.
enum Ended {
    Deleted,
    Lost { message: String, was_live: bool },
}

/// Targets as the grid sees them: (`namespace/name`, what was seen).
type SeenEvents = BoxStream<'static, Result<watcher::Event<(String, Seen)>, watcher::Error>>;

enum Change {
    Rollout(Box<Result<watcher::Event<FleetRollout>, watcher::Error>>),
    Target(Result<watcher::Event<(String, Seen)>, watcher::Error>),
    Event(Box<Result<watcher::Event<KubeEvent>, watcher::Error>>),
    Tick,
}

impl Watching {
    fn new(dash: Dash, ns: String, name: String, tx: mpsc::Sender<Event>) -> Self {
        Self {
            dash,
            ns,
            name,
            tx,
            rollout: None,
            plan: None,
            plans: PlanStore::default(),
            seen: HashMap::new(),
            sent: Vec::new(),
            events: HashMap::new(),
            targets_dirty: false,
            events_dirty: false,
        }
    }

    async fn send(&self, e: Event) -> Result<(), Gone> {
        self.tx.send(e).await.map_err(|_| Gone)
    }

    /// Watches until the page goes or the rollout is deleted; a lost watch of the rollout is said at once,
    /// and a new session (a full list, the rollout and grid sent again) starts after a backoff.
    async fn run(mut self) -> Result<(), Gone> {
        self.send(connection(false, "connecting")).await?;
        let mut pause = RETRY_FIRST;
        loop {
            match self.session().await? {
                Ended::Deleted => return Ok(()),
                Ended::Lost { message, was_live } => {
                    if was_live {
                        pause = RETRY_FIRST;
                    }
                    self.send(connection(
                        false,
                        &format!("the watch of the rollout was lost ({message}); reconnecting"),
                    ))
                    .await?;
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
            }
        }
    }

    async fn session(&mut self) -> Result<Ended, Gone> {
        let client = self.dash.client.clone();
        let by_name = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let rollouts = watcher(Api::<FleetRollout>::namespaced(client.clone(), &self.ns), by_name)
            .map(|r| Change::Rollout(Box::new(r)));
        let about = format!("involvedObject.kind=FleetRollout,involvedObject.name={}", self.name);
        let events = watcher(
            Api::<KubeEvent>::namespaced(client.clone(), &self.ns),
            watcher::Config::default().fields(&about),
        )
        .default_backoff()
        .map(|e| Change::Event(Box::new(e)));
        let ticks = futures::stream::unfold(tokio::time::interval(TICK), |mut i| async move {
            i.tick().await;
            Some((Change::Tick, i))
        });
        let mut changes = futures::stream::select_all([rollouts.boxed(), events.boxed(), ticks.boxed()]);
        // A new session sends everything again: the page replaces what it had.
        self.plan = None;
        self.seen.clear();
        self.events.clear();
        let mut targets_watched = false;
        let mut live = false;
        while let Some(change) = changes.next().await {
            match change {
                Change::Rollout(r) => match *r {
                    Ok(watcher::Event::Apply(fr) | watcher::Event::InitApply(fr)) => {
                        self.rollout_changed(fr).await?;
                        if !targets_watched && let Some(targets) = self.targets() {
                            changes.push(targets.map(Change::Target).boxed());
                            targets_watched = true;
                        }
                    }
                    Ok(watcher::Event::Delete(_)) => {
                        self.send(event("gone", &json!({}))).await?;
                        return Ok(Ended::Deleted);
                    }
                    Ok(watcher::Event::InitDone) => {
                        live = true;
                        self.send(connection(true, "")).await?;
                        if self.rollout.is_none() {
                            // None such (yet): said, and still watched, so one created later shows.
                            self.send(event("gone", &json!({}))).await?;
                        }
                    }
                    Ok(watcher::Event::Init) => {}
                    Err(e) => return Ok(Ended::Lost { message: e.to_string(), was_live: live }),
                },
                Change::Target(t) => self.target_changed(t),
                Change::Event(e) => self.event_changed(*e),
                Change::Tick => self.flush().await?,
            }
        }
        Ok(Ended::Lost { message: "the watch ended".into(), was_live: live })
    }

    fn target_changed(&mut self, change: Result<watcher::Event<(String, Seen)>, watcher::Error>) {
        match change {
            Ok(watcher::Event::Apply((k, s)) | watcher::Event::InitApply((k, s))) => {
                self.seen.insert(k, s);
                self.targets_dirty = true;
            }
            Ok(watcher::Event::Delete((k, _))) => {
                self.seen.remove(&k);
                self.targets_dirty = true;
            }
            // The targets are an extra: a user who may not read them still sees the rollout.
            Ok(watcher::Event::Init | watcher::Event::InitDone) | Err(_) => {}
        }
    }

    fn event_changed(&mut self, change: Result<watcher::Event<KubeEvent>, watcher::Error>) {
        match change {
            Ok(watcher::Event::Apply(e) | watcher::Event::InitApply(e)) => {
                self.events.insert(e.uid().unwrap_or_default(), timeline_event(&e));
                self.events_dirty = true;
            }
            Ok(watcher::Event::Delete(e)) => {
                self.events.remove(&e.uid().unwrap_or_default());
                self.events_dirty = true;
            }
            // Events are an extra too.
            Ok(watcher::Event::Init | watcher::Event::InitDone) | Err(_) => {}
        }
    }

    /// Sends the rollout, and the whole grid when its plan is new.
    async fn rollout_changed(&mut self, fr: FleetRollout) -> Result<(), Gone> {
        let may_approve = control::may_approve(&self.dash.client, &fr).await.unwrap_or(false);
        let mut object = serde_json::to_value(&fr).unwrap_or_default();
        if let Some(meta) = object.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            meta.remove("managedFields");
        }
        self.send(event(
            "rollout",
            &json!({"summary": view::summary(&fr), "object": object, "mayApprove": may_approve}),
        ))
        .await?;
        let plan_ref = fr.status.as_ref().and_then(|s| s.plan.clone());
        let new_plan =
            plan_ref.as_ref().is_some_and(|p| self.plan.as_ref().is_none_or(|known| known.hash != p.hash));
        self.rollout = Some(fr);
        if new_plan && let (Some(plan_ref), Some(fr)) = (plan_ref, self.rollout.as_ref()) {
            // A plan the user may not read (its ConfigMaps) leaves the grid empty, and the rest shown.
            if let Ok(Ok(loaded)) = self.plans.load(&self.dash.client, fr, &plan_ref).await {
                self.plan = Some(Arc::new(loaded.plan.clone()));
                let grid = self.grid();
                self.sent = grid.states.clone();
                self.send(event("grid", &grid)).await?;
            }
        } else {
            self.targets_dirty = true;
        }
        Ok(())
    }

    fn grid(&self) -> view::Grid {
        let (Some(fr), Some(plan)) = (&self.rollout, &self.plan) else {
            return view::Grid {
                plan_hash: String::new(),
                groups: vec![],
                targets: vec![],
                previous_images: vec![],
                states: vec![],
            };
        };
        view::grid(fr, plan, &|t| if t.cluster.is_empty() { self.seen.get(&t.key()).cloned() } else { None })
    }

    async fn flush(&mut self) -> Result<(), Gone> {
        if std::mem::take(&mut self.targets_dirty) && self.plan.is_some() {
            let states = self.grid().states;
            let changes = view::changes(&self.sent, &states);
            if !changes.is_empty() {
                self.send(event("cells", &json!({"changes": changes}))).await?;
            }
            self.sent = states;
        }
        if std::mem::take(&mut self.events_dirty) {
            let mut events: Vec<_> = self.events.values().cloned().collect();
            events.sort_by(|a, b| a["time"].as_str().cmp(&b["time"].as_str()));
            let newest = events.split_off(events.len().saturating_sub(EVENTS_SHOWN));
            self.send(event("events", &json!({"events": newest}))).await?;
        }
        Ok(())
    }

    /// A watch of the rollout's targets in this cluster, as the user, in its namespace or across the
    /// cluster when its selector reaches others; None for nodes and for targets in member clusters only.
    fn targets(&self) -> Option<SeenEvents> {
        let fr = self.rollout.as_ref()?;
        let across = fr.spec.targets.namespace_selector.is_some();
        let client = self.dash.client.clone();
        let ns = self.ns.clone();
        Some(match fr.spec.targets.kind {
            TargetKind::Deployment => seen::<Deployment>(client, across, &ns, workload::deployment_facts),
            TargetKind::StatefulSet => seen::<StatefulSet>(client, across, &ns, workload::statefulset_facts),
            TargetKind::DaemonSet => seen::<DaemonSet>(client, across, &ns, workload::daemonset_facts),
            TargetKind::Node => return None,
        })
    }
}

fn seen<K>(client: kube::Client, across: bool, ns: &str, facts: fn(&K) -> WorkloadFacts) -> SeenEvents
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let api = if across { Api::<K>::all(client) } else { Api::<K>::namespaced(client, ns) };
    watcher(api, watcher::Config::default())
        .default_backoff()
        .map_ok(move |e| {
            let seen = |o: &K| {
                let f = facts(o);
                (f.key(), Seen { applied: f.applied.clone(), readiness: f.readiness() })
            };
            match e {
                watcher::Event::Apply(o) => watcher::Event::Apply(seen(&o)),
                watcher::Event::InitApply(o) => watcher::Event::InitApply(seen(&o)),
                watcher::Event::Delete(o) => watcher::Event::Delete(seen(&o)),
                watcher::Event::Init => watcher::Event::Init,
                watcher::Event::InitDone => watcher::Event::InitDone,
            }
        })
        .boxed()
}

/// An event as the timeline shows it.
fn timeline_event(e: &KubeEvent) -> serde_json::Value {
    let time = e
        .last_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()));
    json!({
        "time": time, "type": e.type_, "reason": e.reason, "message": e.message,
        "count": e.count.unwrap_or(1),
    })
}
