//! What both streams share: a task per page feeding its Server-Sent Events, stopped when the page goes
//! (however quiet the watches are), the events' shape, and how soon a lost watch is tried again.

use std::{convert::Infallible, future::Future, time::Duration};

use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::Serialize;
use serde_json::json;
use tokio::sync::mpsc;

/// Events queued for a page that reads slowly before the watches wait for it.
const QUEUED: usize = 256;
/// A comment line this often keeps idle connections (and proxies between) open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// The first wait before a lost watch is tried again, and the longest.
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
pub const RETRY_MAX: Duration = Duration::from_secs(10);

/// A page that has gone: stop.
pub struct Gone;

/// The page's stream of what `feed` sends; `feed` runs until it ends or the page goes.
pub fn serve<F, Fut>(feed: F) -> Sse<impl Stream<Item = Result<Event, Infallible>>>
where
    F: FnOnce(mpsc::Sender<Event>) -> Fut,
    Fut: Future + Send + 'static,
{
    let (tx, rx) = mpsc::channel(QUEUED);
    let page = tx.clone();
    let fed = feed(tx);
    tokio::spawn(async move {
        // A quiet rollout sends nothing for hours: its watches stop when the page goes, not at the next send.
        tokio::select! {
            _ = fed => {}
            () = page.closed() => {}
        }
    });
    let events = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (Ok(e), rx)) });
    Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

pub async fn send(tx: &mpsc::Sender<Event>, e: Event) -> Result<(), Gone> {
    tx.send(e).await.map_err(|_| Gone)
}

/// An SSE event named `name` carrying `data` as JSON.
pub fn event(name: &str, data: &impl Serialize) -> Event {
    Event::default().event(name).data(serde_json::to_string(data).unwrap_or_else(|_| "null".into()))
}

pub fn connection(live: bool, message: &str) -> Event {
    let state = if live { "live" } else { "reconnecting" };
    event("connection", &json!({"state": state, "message": message}))
}
