//! The list's stream: every rollout the user can read, from one watch (across the cluster when they may
//! list it, else in their namespace), and the inbox of those waiting for an approval they may give. A lost
//! watch is said at once ("reconnecting") and resumed with backoff; the next full list replaces the page's.

use std::{
    collections::{BTreeMap, HashMap},
    convert::Infallible,
};

use axum::{
    extract::State,
    response::sse::{Event, Sse},
};
use futures::{Stream, StreamExt};
use kube::{Api, ResourceExt, api::ListParams, runtime::watcher};
use serde_json::json;
use tokio::sync::mpsc;

use super::super::inbox::{Waiting, entry};
use super::{
    Dash,
    sse::{self, Gone, RETRY_FIRST, RETRY_MAX, connection, event, send},
    view,
};
use crate::{api::FleetRollout, core::task::awaited_approval, edge::control};

pub async fn stream(State(dash): State<Dash>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    sse::serve(|tx| watch(dash, tx))
}

/// Watches until the page goes. A lost watch is said at once; a new one (a full list: the page replaces
/// its own) starts after a backoff, since a watch kube resumes by itself would list nothing again.
async fn watch(dash: Dash, tx: mpsc::Sender<Event>) -> Result<(), Gone> {
    send(&tx, connection(false, "connecting")).await?;
    let mut inbox = Inbox::default();
    let mut pause = RETRY_FIRST;
    loop {
        let (message, was_live) = session(&dash, &tx, &mut inbox).await?;
        if was_live {
            pause = RETRY_FIRST;
        }
        send(&tx, connection(false, &format!("the watch of rollouts was lost ({message}); reconnecting")))
            .await?;
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RETRY_MAX);
    }
}

/// One watch of the rollouts the user can read, until it is lost: why, and whether it was live.
async fn session(dash: &Dash, tx: &mpsc::Sender<Event>, inbox: &mut Inbox) -> Result<(String, bool), Gone> {
    let all = Api::<FleetRollout>::all(dash.client.clone());
    let (api, scope) = match all.list(&ListParams::default().limit(1)).await {
        Err(kube::Error::Api(s)) if s.code == 403 => (
            Api::namespaced(dash.client.clone(), &dash.namespace),
            format!("namespace {} (you may not list rollouts across namespaces)", dash.namespace),
        ),
        Err(e) => return Ok((e.to_string(), false)),
        Ok(_) => (all, "all namespaces".to_string()),
    };
    let mut events = watcher(api, watcher::Config::default()).boxed();
    let mut known: BTreeMap<(String, String), FleetRollout> = BTreeMap::new();
    let mut listing: Option<BTreeMap<(String, String), FleetRollout>> = None;
    let mut live = false;
    while let Some(next) = events.next().await {
        match next {
            Ok(watcher::Event::Init) => listing = Some(BTreeMap::new()),
            Ok(watcher::Event::InitApply(fr)) => {
                if let Some(l) = listing.as_mut() {
                    l.insert(key(&fr), fr);
                }
            }
            Ok(watcher::Event::InitDone) => {
                known = listing.take().unwrap_or_default();
                let rollouts: Vec<_> = known.values().map(view::summary).collect();
                send(tx, event("snapshot", &json!({"scope": scope, "rollouts": rollouts}))).await?;
                send(tx, connection(true, "")).await?;
                live = true;
            }
            Ok(watcher::Event::Apply(fr)) => {
                send(tx, event("upsert", &view::summary(&fr))).await?;
                known.insert(key(&fr), fr);
            }
            Ok(watcher::Event::Delete(fr)) => {
                known.remove(&key(&fr));
                send(tx, event("remove", &json!({"namespace": fr.namespace(), "name": fr.name_any()})))
                    .await?;
            }
            Err(e) => return Ok((e.to_string(), live)),
        }
        if listing.is_none()
            && let Some(waiting) = inbox.update(&dash.client, &known).await
        {
            send(tx, event("inbox", &json!({"waiting": waiting}))).await?;
        }
    }
    Ok(("the watch ended".into(), live))
}

fn key(fr: &FleetRollout) -> (String, String) {
    (fr.namespace().unwrap_or_default(), fr.name_any())
}

/// The rollouts waiting for an approval this user may give: the API server's answer to a dry run of each
/// approval, asked once per version of a waiting rollout.
#[derive(Default)]
struct Inbox {
    judged: HashMap<(String, String), (String, bool)>,
    last: Option<Vec<Waiting>>,
}

impl Inbox {
    /// The inbox, if it changed since it was last said.
    async fn update(
        &mut self,
        client: &kube::Client,
        known: &BTreeMap<(String, String), FleetRollout>,
    ) -> Option<Vec<Waiting>> {
        self.judged.retain(|k, _| known.contains_key(k));
        let mut waiting = Vec::new();
        for (k, fr) in known {
            if awaited_approval(fr).is_none() {
                self.judged.remove(k);
                continue;
            }
            let version = fr.resource_version().unwrap_or_default();
            let may = match self.judged.get(k) {
                Some((v, may)) if *v == version => *may,
                _ => match control::may_approve(client, fr).await {
                    Ok(may) => {
                        self.judged.insert(k.clone(), (version, may));
                        may
                    }
                    // Unknown now (the API server did not answer): counts as not, and is asked again at the
                    // next change of any rollout.
                    Err(_) => false,
                },
            };
            if may {
                waiting.extend(entry(fr));
            }
        }
        (self.last.as_ref() != Some(&waiting)).then(|| {
            self.last = Some(waiting.clone());
            waiting
        })
    }
}
