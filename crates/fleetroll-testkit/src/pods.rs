//! Pods on a real node (tests/testenv/node.sh): waits until a workload's pods run, and fails at once, naming
//! the cause, when they cannot (an image that cannot be pulled, a registry that is down, a crash loop),
//! instead of timing out the way `helm --wait` and `kubectl rollout status` do.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ContainerStatus, Event, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::ListParams,
    runtime::{WatchStreamExt, reflector, watcher},
};

/// Waiting reasons of a container that will not start without someone changing something.
const STUCK: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "CrashLoopBackOff",
];

/// Where a set of pods stands.
#[derive(Debug, PartialEq)]
pub enum Readiness {
    /// Exactly the wanted number, all Ready.
    Ready,
    /// One of them cannot start: pod, reason and message.
    Blocked {
        pod: String,
        reason: String,
        message: String,
    },
    Waiting,
}

/// Judges `pods` (those of the revision waited for; terminating ones left out): Ready when there are
/// `count` and all are Ready, Blocked as soon as one has a container stuck for a reason in [`STUCK`].
pub fn readiness(pods: &[&Pod], count: usize) -> Readiness {
    let live: Vec<&Pod> = pods.iter().copied().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
    for pod in &live {
        if let Some((reason, message)) = stuck(pod) {
            return Readiness::Blocked { pod: pod.name_any(), reason, message };
        }
    }
    if live.len() == count && live.iter().all(|p| is_ready(p)) {
        Readiness::Ready
    } else {
        Readiness::Waiting
    }
}

fn statuses(pod: &Pod) -> impl Iterator<Item = &ContainerStatus> {
    let status = pod.status.as_ref();
    let init = status.and_then(|s| s.init_container_statuses.as_deref()).unwrap_or_default();
    let main = status.and_then(|s| s.container_statuses.as_deref()).unwrap_or_default();
    init.iter().chain(main)
}

fn stuck(pod: &Pod) -> Option<(String, String)> {
    statuses(pod).find_map(|c| {
        let waiting = c.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.clone()?;
        STUCK.contains(&reason.as_str()).then(|| (reason, waiting.message.clone().unwrap_or_default()))
    })
}

pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until the pods of `selector` that are `wanted` (those of one revision: its image, say) number
/// `count` and are all Ready, and returns them (not the terminating ones). Errs at once with the cause when one cannot start (for a
/// back-off, whose message says only that it backs off, with the kubelet's last `Failed` event, which says
/// why), or with the pods as they were after `timeout`.
pub async fn wait_ready(
    client: &Client,
    ns: &str,
    selector: &str,
    count: usize,
    timeout: Duration,
    wanted: impl Fn(&Pod) -> bool,
) -> Result<Vec<Pod>, String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let (store, writer) = reflector::store();
    // Judged after every event, the end of the initial listing included (pods that are Ready already).
    let events =
        reflector(writer, watcher(api, watcher::Config::default().labels(selector))).default_backoff();
    futures::pin_mut!(events);
    let judge = |store: &reflector::Store<Pod>| {
        let all = store.state();
        let pods: Vec<&Pod> = all.iter().map(|p| p.as_ref()).filter(|p| wanted(p)).collect();
        // What was judged Ready: the live pods (a deleted pod may linger, terminating, beside them).
        let live = pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).map(|p| (*p).clone());
        (readiness(&pods, count), live.collect::<Vec<Pod>>())
    };
    let waited = tokio::time::timeout(timeout, async {
        while let Some(event) = events.next().await {
            if event.is_err() {
                continue;
            }
            match judge(&store) {
                (Readiness::Waiting, _) => {}
                (other, pods) => return (other, pods),
            }
        }
        (Readiness::Waiting, Vec::new())
    })
    .await;
    match waited {
        Ok((Readiness::Ready, pods)) => Ok(pods),
        Ok((Readiness::Blocked { pod, reason, mut message }, _)) => {
            if reason == "ImagePullBackOff" || reason == "CrashLoopBackOff" {
                message = format!("{message}; last failure: {}", last_failure(client, ns, &pod).await);
            }
            Err(format!("pod {pod} cannot start: {reason}: {message}"))
        }
        Ok((Readiness::Waiting, _)) => Err("the watch of the pods ended".into()),
        Err(_) => {
            let (_, pods) = judge(&store);
            let seen: Vec<String> = pods.iter().map(describe).collect();
            Err(format!("after {timeout:?}, {} of {count} wanted pods, not all Ready: {seen:?}", pods.len()))
        }
    }
}

/// The message of the kubelet's last `Failed` (or `BackOff`) event of `pod`.
async fn last_failure(client: &Client, ns: &str, pod: &str) -> String {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().fields(&format!("involvedObject.name={pod}"));
    let mut list = events.list(&lp).await.map(|l| l.items).unwrap_or_default();
    list.sort_by_key(|e| e.last_timestamp.clone().map(|t| t.0));
    list.iter()
        .rev()
        .find(|e| e.reason.as_deref() == Some("Failed"))
        .and_then(|e| e.message.clone())
        .unwrap_or_default()
}

fn describe(pod: &Pod) -> String {
    let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
    let waiting: Vec<String> =
        statuses(pod).filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone()).collect();
    format!("{} {phase} ready={} waiting={waiting:?}", pod.name_any(), is_ready(pod))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, ready: bool, waiting: Option<(&str, &str)>, terminating: bool) -> Pod {
        let state =
            waiting.map_or(json!({"running": {}}), |(r, m)| json!({"waiting": {"reason": r, "message": m}}));
        serde_json::from_value(json!({
            "metadata": {"name": name, "deletionTimestamp": terminating.then_some("2026-12-06T00:00:00Z")},
            "status": {
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                "containerStatuses": [{"name": "c", "image": "i", "imageID": "", "ready": ready,
                                       "restartCount": 0, "state": state}]
            }
        }))
        .unwrap()
    }

    #[test]
    fn ready_only_with_the_count_and_blocked_as_soon_as_one_is_stuck() {
        let a = pod("a", true, None, false);
        let b = pod("b", true, None, false);
        let starting = pod("c", false, Some(("ContainerCreating", "")), false);
        let pulling =
            pod("d", false, Some(("ErrImagePull", "dial tcp 127.0.0.1:5000: connection refused")), false);
        let leaving = pod("e", false, Some(("CrashLoopBackOff", "back-off")), true);
        assert_eq!(readiness(&[&a, &b], 2), Readiness::Ready);
        assert_eq!(readiness(&[&a], 2), Readiness::Waiting);
        assert_eq!(readiness(&[&a, &starting], 2), Readiness::Waiting, "creating is not stuck");
        assert_eq!(readiness(&[&a, &b, &leaving], 2), Readiness::Ready, "terminating pods do not count");
        assert_eq!(
            readiness(&[&a, &pulling], 2),
            Readiness::Blocked {
                pod: "d".into(),
                reason: "ErrImagePull".into(),
                message: "dial tcp 127.0.0.1:5000: connection refused".into()
            }
        );
    }
}
