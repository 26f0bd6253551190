//! One rollout's stream: the rollout itself, the grid of its targets, and its events, each from a watch
//! made as the user. The grid's states come from the rollout's checkpoints and, for targets in this
//! cluster the user may read, from a watch of the targets themselves; changes are sent as the cells that
//! changed, at most every [`TICK`], so a page keeps up with thousands of targets changing.

use std::{convert::Infallible, sync::Arc, time::Duration};

use axum::{
    extract::{Path, State},
    response::sse::{Event, Sse},
};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Event as KubeEvent;
use kube::{
    Api, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use tokio::sync::mpsc;

use super::{
    Dash,
    sse::{self, Gone, RETRY_FIRST, RETRY_MAX, connection, event},
    targets::{self, Targets},
    timeline::Timeline,
    view::{self, Cell},
};
use crate::{
    api::FleetRollout,
    core::plan::Plan,
    edge::{control, plans::PlanStore},
};

/// How often changed cells and events are sent at most.
const TICK: Duration = Duration::from_millis(100);

pub async fn stream(
    State(dash): State<Dash>,
    Path((ns, name)): Path<(String, String)>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    sse::serve(|tx| Watching::new(dash, ns, name, tx).run())
}

/// What one rollout's stream has seen, and what it last sent.
struct Watching {
    dash: Dash,
    ns: String,
    name: String,
    tx: mpsc::Sender<Event>,
    rollout: Option<FleetRollout>,
    plan: Option<Arc<Plan>>,
    plans: PlanStore,
    targets: Targets,
    sent: Vec<Cell>,
    events: Timeline,
    /// The last dry run of the approval the rollout waits for: what it was asked of, and its answer.
    may_approve: Option<(String, bool)>,
    targets_dirty: bool,
    events_dirty: bool,
}

/// How a session of watches ended.
enum Ended {
    Deleted,
    Lost {
        message: String,
        was_live: bool,
    },
    /// The rollout was planned anew: its targets are others, so everything is watched and sent again.
    Replanned,
}

enum Change {
    Rollout(Box<Result<watcher::Event<FleetRollout>, watcher::Error>>),
    Target(targets::Change),
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
            targets: Targets::default(),
            sent: Vec::new(),
            events: Timeline::default(),
            may_approve: None,
            targets_dirty: false,
            events_dirty: false,
        }
    }

    async fn send(&self, e: Event) -> Result<(), Gone> {
        sse::send(&self.tx, e).await
    }

    /// Watches until the page goes or the rollout is deleted; a lost watch of the rollout is said at once,
    /// and a new session (a full list, the rollout and grid sent again) starts after a backoff.
    async fn run(mut self) -> Result<(), Gone> {
        self.send(connection(false, "connecting")).await?;
        let mut pause = RETRY_FIRST;
        loop {
            match self.session().await? {
                Ended::Deleted => return Ok(()),
                Ended::Replanned => {}
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
        let by_name = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let rollouts = watcher(Api::<FleetRollout>::namespaced(self.dash.client.clone(), &self.ns), by_name)
            .map(|r| Change::Rollout(Box::new(r)));
        let ticks = futures::stream::unfold(tokio::time::interval(TICK), |mut i| async move {
            i.tick().await;
            Some((Change::Tick, i))
        });
        let mut changes = futures::stream::select_all([rollouts.boxed(), ticks.boxed()]);
        // A new session sends everything again: the page replaces what it had, and a rollout deleted
        // meanwhile is found gone.
        self.rollout = None;
        self.plan = None;
        self.sent.clear();
        self.targets = Targets::default();
        self.events.clear();
        let (mut events_watched, mut targets_watched) = (false, false);
        let mut live = false;
        while let Some(change) = changes.next().await {
            match change {
                Change::Rollout(r) => match *r {
                    Ok(watcher::Event::Apply(fr) | watcher::Event::InitApply(fr)) => {
                        if self.rollout_changed(fr).await? == Planned::Anew {
                            return Ok(Ended::Replanned);
                        }
                        // The events once the rollout (its uid) is known; its targets once its plan (which
                        // of them to keep) is.
                        if !events_watched && let Some(fr) = &self.rollout {
                            events_watched = true;
                            changes.push(
                                events_of(&self.dash.client, fr).map(|e| Change::Event(Box::new(e))).boxed(),
                            );
                        }
                        if !targets_watched && let (Some(fr), Some(_)) = (&self.rollout, &self.plan) {
                            targets_watched = true;
                            if let Some(watch) = targets::watch(&self.dash.client, fr) {
                                changes.push(watch.map(Change::Target).boxed());
                            }
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
                Change::Target(t) => self.targets_dirty |= self.targets.apply(t),
                Change::Event(e) => self.event_changed(*e),
                Change::Tick => self.flush().await?,
            }
        }
        Ok(Ended::Lost { message: "the watch ended".into(), was_live: live })
    }

    fn event_changed(&mut self, change: Result<watcher::Event<KubeEvent>, watcher::Error>) {
        match change {
            Ok(watcher::Event::Apply(e) | watcher::Event::InitApply(e)) => {
                self.events.apply(&e);
                self.events_dirty = true;
            }
            Ok(watcher::Event::Delete(e)) => {
                self.events.remove(&e);
                self.events_dirty = true;
            }
            // Events are an extra too.
            Ok(watcher::Event::Init | watcher::Event::InitDone) | Err(_) => {}
        }
    }

    /// Sends the rollout, and the whole grid when its plan is new; says whether it was planned anew
    /// (another plan than the one this session loaded).
    async fn rollout_changed(&mut self, fr: FleetRollout) -> Result<Planned, Gone> {
        let may_approve = self.may_approve(&fr).await;
        let mut object = serde_json::to_value(&fr).unwrap_or_default();
        if let Some(meta) = object.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            meta.remove("managedFields");
        }
        let summary = view::summary(&fr);
        self.send(event(
            "rollout",
            &json!({"summary": summary, "object": object, "mayApprove": may_approve}),
        ))
        .await?;
        let plan_ref = fr.status.as_ref().and_then(|s| s.plan.clone());
        self.rollout = Some(fr);
        let (Some(plan_ref), Some(fr)) = (plan_ref, self.rollout.as_ref()) else { return Ok(Planned::Same) };
        match &self.plan {
            Some(known) if known.hash == plan_ref.hash => {
                self.targets_dirty = true;
                return Ok(Planned::Same);
            }
            Some(_) => return Ok(Planned::Anew),
            None => {}
        }
        let grid = match self.plans.load(&self.dash.client, fr, &plan_ref).await {
            Ok(Ok(loaded)) => {
                self.targets = Targets::of(&loaded.plan);
                self.plan = Some(Arc::new(loaded.plan.clone()));
                self.grid()
            }
            // A plan the user may not read (its ConfigMaps), or one that is not what was frozen: the grid
            // says why, and the rest of the rollout is shown.
            Ok(Err(blocked)) => view::Grid::unread(&format!("the plan cannot be shown: {}", blocked.message)),
            Err(e) => view::Grid::unread(&format!("the plan could not be read: {e}")),
        };
        self.sent = grid.states.clone();
        self.send(event("grid", &grid)).await?;
        Ok(Planned::Same)
    }

    /// Whether the user may give the approval the rollout waits for: the API server's dry run, asked again
    /// only when what is awaited (batch, plan, gates) or the spec changes.
    async fn may_approve(&mut self, fr: &FleetRollout) -> bool {
        let Some(pending) = crate::core::task::awaited_approval(fr) else { return false };
        let asked = format!(
            "{}/{}/{}/{:?}",
            pending.batch, pending.plan_hash, pending.gates_hash, fr.metadata.generation
        );
        if let Some((known, answer)) = &self.may_approve
            && *known == asked
        {
            return *answer;
        }
        match control::may_approve(&self.dash.client, fr).await {
            Ok(answer) => {
                self.may_approve = Some((asked, answer));
                answer
            }
            // Not known now: not cached, asked again at the next change.
            Err(_) => false,
        }
    }

    fn grid(&self) -> view::Grid {
        match (&self.rollout, &self.plan) {
            (Some(fr), Some(plan)) => view::grid(fr, plan, &|t| self.targets.sight(t)),
            _ => view::Grid::unread(""),
        }
    }

    async fn flush(&mut self) -> Result<(), Gone> {
        if std::mem::take(&mut self.targets_dirty)
            && let (Some(fr), Some(plan)) = (&self.rollout, &self.plan)
        {
            let states = view::states(fr, plan, &|t| self.targets.sight(t));
            let changes = view::changes(&self.sent, &states);
            if !changes.is_empty() {
                self.send(event("cells", &json!({"changes": changes}))).await?;
            }
            self.sent = states;
        }
        if std::mem::take(&mut self.events_dirty) {
            self.send(event("events", &json!({"events": self.events.newest()}))).await?;
        }
        Ok(())
    }
}

/// Whether a rollout's plan is still the one a session loaded.
#[derive(PartialEq)]
enum Planned {
    Same,
    Anew,
}

/// A watch of the rollout's own Events (by its uid: others' Events that name it are not its own).
fn events_of(
    client: &kube::Client,
    fr: &FleetRollout,
) -> impl Stream<Item = Result<watcher::Event<KubeEvent>, watcher::Error>> + Send + 'static {
    let about = format!("involvedObject.uid={}", fr.uid().unwrap_or_default());
    let api = Api::<KubeEvent>::namespaced(client.clone(), &fr.namespace().unwrap_or_default());
    watcher(api, watcher::Config::default().fields(&about)).default_backoff()
}
