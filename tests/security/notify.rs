//! Attacks on the platform's notifications: what a FleetRolloutPolicy subscribes to hear about a tenant's
//! rollouts reaches it, whatever the tenant's own subscriptions do.

use std::time::Instant;

use fleetroll::api::NOTIFY_SECRET_LABEL;
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Secret};
use testkit::receiver::{Mode, Receiver, Request};

use super::*;

const ROLLOUTS: usize = 6;
const SUBSCRIPTIONS: usize = fleetroll::api::SUBSCRIPTIONS_MAX;
/// How long the operator waits for a sink's answer (its `SEND_TIMEOUT`): a hung sink holds a lane so long.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

fn sink_secret(name: &str, url: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "labels": {NOTIFY_SECRET_LABEL: "true"}}, "stringData": {"url": url}})
}

/// When the platform's receiver first heard of rollout `name`, if it has.
fn first_heard(requests: &[Request], name: &str) -> Option<Instant> {
    let about = |r: &&Request| r.json.as_ref().is_some_and(|j| j["rollout"]["name"] == name);
    requests.iter().find(about).map(|r| r.at)
}

/// A fleet namespace holding the platform's `audit` sink Secret (at `platform`), and a namespace `prefix-…`
/// whose agent (edit) is governed by a policy subscribing that sink: (fleet namespace, namespace, agent,
/// policy).
async fn audited(env: &'static Env, prefix: &str, platform: &Receiver) -> (String, String, Tenant, String) {
    let fleet_ns = env.scratch_namespace(&format!("{prefix}-fleet"), &[]).await;
    let secret: Secret = serde_json::from_value(sink_secret("audit", &platform.url("audit"))).unwrap();
    Api::<Secret>::namespaced(env.admin.clone(), &fleet_ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let audit = json!({"maxBatchSize": 100, "notify": [{"name": "audit", "sink": "Webhook", "secretRef": {"name": "audit"}}]});
    let (ns, agent, policy) = guardrails::governed(env, prefix, audit).await;
    (fleet_ns, ns, agent, policy)
}

pub(super) async fn tenant_hangs_its_sinks_to_silence_the_platforms_audit(env: &'static Env) -> Row {
    let (hung, platform) = (Receiver::start(), Receiver::start());
    hung.set_mode(Mode::Hang);
    let (fleet_ns, ns, agent, _policy) = audited(env, "sec-audit", &platform).await;
    let allow = "--notify-allow=*=127.0.0.0/8";
    let _op = Operator::start(&ns, &[allow, "--fleet-namespace", &fleet_ns], &[]);
    // The tenant's own sinks, all of which hang, made with its own rights.
    let secrets: Vec<Value> =
        (0..SUBSCRIPTIONS).map(|s| sink_secret(&format!("hang-{s}"), &hung.url(&format!("s{s}")))).collect();
    let list = file(&format!("{ns}-sinks"), &json!({"apiVersion": "v1", "kind": "List", "items": secrets}));
    let made = agent.kubectl(&["create", "-n", &ns, "-f", &list]).await;
    let deployments: Api<Deployment> = Api::namespaced(env.admin.clone(), &ns);
    let subscriptions: Vec<Value> = (0..SUBSCRIPTIONS)
        .map(|s| json!({"name": format!("s{s}"), "sink": "Webhook", "secretRef": {"name": format!("hang-{s}")}}))
        .collect();
    let mut created = Vec::new();
    for r in 0..ROLLOUTS {
        let fleet = format!("r{r}");
        let d = testkit::fleet::deployment(&format!("web-{r}"), READY_IMAGE, &[("fleet", &fleet)]);
        deployments.create(&PostParams::default(), &d).await.unwrap();
        let spec = json!({"image": testkit::fleet::NEXT_IMAGE, "notify": subscriptions,
            "targets": {"kind": "Deployment", "selector": {"matchLabels": {"fleet": fleet}}}});
        let at = Instant::now();
        if create_as(&agent, &ns, &fleet, spec).await.code == 0 {
            created.push((fleet, at));
        }
    }
    // Wait (with a deadline far past the bound) until the platform has heard of each rollout.
    let heard_of_all =
        |requests: &[Request]| created.iter().all(|(name, _)| first_heard(requests, name).is_some());
    let requests = platform.wait_until(Duration::from_secs(120), heard_of_all).await.unwrap_or_else(|r| r);
    let waits: Vec<Option<f64>> = created
        .iter()
        .map(|(name, at)| first_heard(&requests, name).map(|h| h.duration_since(*at).as_secs_f64()))
        .collect();
    let slowest = waits.iter().map(|w| w.unwrap_or(f64::INFINITY)).fold(0.0, f64::max);
    let tried = hung.attempts();
    hung.set_mode(Mode::Ok);
    let shown: Vec<String> =
        waits.iter().map(|w| w.map_or_else(|| "never".into(), |s| format!("{s:.1} s"))).collect();
    Row {
        attack: format!(
            "{ROLLOUTS} rollouts × {SUBSCRIPTIONS} subscriptions to a sink that never answers, beside the \
             platform's FleetRolloutPolicy subscription to the same rollouts"
        ),
        who: who(&agent, "edit; governed by a policy that subscribes the platform's audit sink"),
        expected: format!(
            "the platform hears of each rollout within one send timeout ({} s) of its creation",
            SEND_TIMEOUT.as_secs()
        ),
        outcome: format!(
            "sinks made: {}; {} rollouts, the platform heard of them after [{}]; the hung sink was tried {tried} times",
            made.code == 0,
            created.len(),
            shown.join(", ")
        ),
        contained: made.code == 0
            && created.len() == ROLLOUTS
            && tried >= SUBSCRIPTIONS
            && slowest <= SEND_TIMEOUT.as_secs_f64(),
    }
}

/// Revisions the tenant makes while the platform's sink is down: more than the outbox holds.
const REVISIONS: u32 = 40;

pub(super) async fn tenant_outruns_the_platforms_sink_to_drop_its_audit(env: &'static Env) -> Row {
    let platform = Receiver::start();
    platform.set_mode(Mode::Fail(503));
    let (fleet_ns, ns, agent, policy) = audited(env, "sec-gap", &platform).await;
    let _op = Operator::start(&ns, &["--notify-allow=*=127.0.0.0/8", "--fleet-namespace", &fleet_ns], &[]);
    let fleet = Fleet { client: env.admin.clone(), ns: ns.clone(), tenants: vec![] };
    fleet.deployments(&ns, 1, READY_IMAGE).await;
    let mut spec = deployments_spec();
    spec["image"] = json!(format!("{READY_IMAGE}-0"));
    create_as(&agent, &ns, "churn", spec).await.ok();
    // Each new image is a revision, and each revision a Started notification owed to the platform; the
    // first is planned before the next image is asked for (else the two are one revision).
    let first = |f: &FleetRollout| f.status.as_ref().is_some_and(|s| s.revision_number() >= 1);
    fleet.wait_rollout("churn", "the first revision to be planned", Duration::from_secs(60), first).await;
    for r in 1..REVISIONS {
        let image = json!({"spec": {"image": format!("{READY_IMAGE}-{r}")}}).to_string();
        agent
            .kubectl(&["patch", "fleetrollout", "churn", "-n", &ns, "--type=merge", "-p", &image])
            .await
            .ok();
        let planned = |f: &FleetRollout| f.status.as_ref().is_some_and(|s| s.revision_number() > r);
        fleet.wait_rollout("churn", "the revision to be planned", Duration::from_secs(60), planned).await;
    }
    let fr = fleet.wait_rollout("churn", "the outbox", Duration::from_secs(5), |_| true).await;
    let outbox = fr.status.and_then(|s| s.notifications).unwrap_or_default();
    platform.set_mode(Mode::Ok);
    let noticed = |requests: &[Request]| {
        requests.iter().any(|r| r.json.as_ref().is_some_and(|j| j["reason"] == "NotificationsDropped"))
    };
    let requests = platform.wait_until(Duration::from_secs(120), noticed).await.unwrap_or_else(|r| r);
    let notice = requests
        .iter()
        .filter_map(|r| r.json.as_ref())
        .find(|j| j["reason"] == "NotificationsDropped")
        .map(|j| j["message"].as_str().unwrap_or_default().to_string());
    // The tenant reads its rollout's Events: that the platform's sink failed, never which or how.
    let events = fleet.wait_events("churn", &["NotificationFailed"], Duration::from_secs(30)).await;
    let told = |(reason, note): &&(String, String)| {
        reason == "NotificationFailed"
            && (note.contains(&policy) || note.contains(&fleet_ns) || note.contains("503"))
    };
    let leaked = events.iter().filter(told).count();
    Row {
        attack: format!(
            "makes {REVISIONS} revisions of one rollout while the platform's audit sink is down, past the 32 the \
             outbox holds"
        ),
        who: who(&agent, "edit; governed by a policy that subscribes the platform's audit sink"),
        expected: "the platform is told which of its notifications were dropped, once its sink is back; \
                   the tenant's Events say only that a platform subscription failed"
            .into(),
        outcome: format!(
            "outbox: {} pending, {} dropped; the platform heard {} notifications, the notice: {}; the \
             tenant's Events naming the platform's policy, Secret or sink's answer: {leaked}",
            outbox.pending.len(),
            outbox.dropped,
            requests.len(),
            notice.as_deref().unwrap_or("none")
        ),
        contained: outbox.dropped > 0
            && notice.is_some_and(|m| m.contains("dropped undelivered"))
            && leaked == 0,
    }
}

/// The platform opens loopback for its own receiver only (`--notify-allow=<fleet namespace>=127.0.0.0/8`);
/// a tenant points its sinks at that receiver, as written and spelled six other ways.
pub(super) async fn tenant_sends_to_an_address_the_platform_opened_for_its_own_sink(
    env: &'static Env,
) -> Row {
    let platform = Receiver::start();
    let (fleet_ns, ns, agent, _policy) = audited(env, "sec-bound", &platform).await;
    let allow = format!("--notify-allow={fleet_ns}=127.0.0.0/8");
    let _op = Operator::start(&ns, &[&allow, "--fleet-namespace", &fleet_ns], &[]);
    let port = platform.addr().port();
    let spellings = [
        platform.url("t0"),
        format!("http://127.1:{port}/t1"),
        format!("http://2130706433:{port}/t2"),
        format!("http://0x7f000001:{port}/t3"),
        format!("http://[::ffff:127.0.0.1]:{port}/t4"),
        format!("http://localhost:{port}/t5"),
        format!("http://localhost.:{port}/t6"),
    ];
    let secrets: Vec<Value> =
        spellings.iter().enumerate().map(|(i, url)| sink_secret(&format!("t{i}"), url)).collect();
    let list = file(&format!("{ns}-sinks"), &json!({"apiVersion": "v1", "kind": "List", "items": secrets}));
    let made = agent.kubectl(&["create", "-n", &ns, "-f", &list]).await;
    let fleet = Fleet { client: env.admin.clone(), ns: ns.clone(), tenants: vec![] };
    fleet.deployments(&ns, 1, READY_IMAGE).await;
    let mut spec = deployments_spec();
    spec["notify"] = (0..spellings.len())
        .map(|i| json!({"name": format!("t{i}"), "sink": "Webhook", "secretRef": {"name": format!("t{i}")}}))
        .collect();
    let created = create_as(&agent, &ns, "aim", spec).await;
    // Each subscription's first failure is one NotificationFailed Event naming it.
    let failed = |seen: &[(String, String)], i: usize| {
        let to = format!("to rollout/t{i}:");
        seen.iter().any(|(reason, note)| reason == "NotificationFailed" && note.contains(&to))
    };
    let all_failed = |seen: &[(String, String)]| (0..spellings.len()).all(|i| failed(seen, i));
    let events = match created.code {
        0 => fleet.wait_events_until("aim", all_failed, Duration::from_secs(90)).await,
        _ => Vec::new(),
    };
    let heard = platform.wait_until(Duration::from_secs(60), |r| first_heard(r, "aim").is_some()).await;
    let heard = heard.unwrap_or_else(|r| r);
    let reached: Vec<String> =
        platform.requests().into_iter().map(|r| r.path).filter(|p| p.starts_with("/t")).collect();
    let refused = (0..spellings.len()).filter(|i| failed(&events, *i)).count();
    Row {
        attack: format!(
            "points {} notification sinks at the platform's loopback receiver, which --notify-allow opens for \
             the fleet namespace's Secrets only: as written, short, decimal, hex, IPv4-mapped, localhost, \
             localhost.",
            spellings.len()
        ),
        who: who(&agent, "edit; governed by a policy that subscribes the platform's audit sink there"),
        expected: "every tenant sink refused (NotificationFailed), the receiver never asked by them; the \
                   platform's own sink there is heard"
            .into(),
        outcome: format!(
            "sinks made: {}; rollout created: {}; {refused}/{} refused; requests the tenant's sinks made: \
             {reached:?}; the platform heard of the rollout: {}",
            made.code == 0,
            created.code == 0,
            spellings.len(),
            first_heard(&heard, "aim").is_some()
        ),
        contained: made.code == 0
            && created.code == 0
            && refused == spellings.len()
            && reached.is_empty()
            && first_heard(&heard, "aim").is_some(),
    }
}

/// The rollout's (kind) notifications the platform's receiver heard of rollout `name`.
fn kinds_heard(requests: &[Request], name: &str) -> Vec<String> {
    let about = |j: &&Value| j["rollout"]["name"] == name;
    let kind = |j: &Value| j["kind"].as_str().unwrap_or_default().to_string();
    requests.iter().filter_map(|r| r.json.as_ref()).filter(about).map(kind).collect()
}

/// The tenant strips the platform's finalizer off rollout `name` every way it may write (merge patch, JSON
/// patch, replace): how many of the three the admission policy refused, saying why.
async fn strips_refused(agent: &Tenant, fleet: &Fleet, name: &str) -> usize {
    let ns = fleet.ns.as_str();
    let null = r#"{"metadata":{"finalizers":null}}"#;
    let merge = agent.kubectl(&["patch", "fleetrollout", name, "-n", ns, "--type=merge", "-p", null]).await;
    let remove = r#"[{"op":"remove","path":"/metadata/finalizers"}]"#;
    let json_patch =
        agent.kubectl(&["patch", "fleetrollout", name, "-n", ns, "--type=json", "-p", remove]).await;
    let live = fleet.wait_rollout(name, "the rollout", Duration::from_secs(5), |_| true).await;
    let mut live = serde_json::to_value(live).unwrap();
    live["metadata"]["finalizers"] = json!([]);
    let replace = agent.kubectl(&["replace", "-f", &file(&format!("{ns}-{name}"), &live)]).await;
    let why = "may not remove the finalizer fleetroll.dev/platform-notifications";
    [merge, json_patch, replace].iter().filter(|r| r.code != 0 && r.stderr.contains(why)).count()
}

pub(super) async fn tenant_deletes_its_rollout_before_the_platform_heard_of_it(env: &'static Env) -> Row {
    use fleetroll::api::PLATFORM_NOTIFICATIONS_FINALIZER as PLATFORM;
    let platform = Receiver::start();
    platform.set_mode(Mode::Fail(503));
    let (fleet_ns, ns, agent, _policy) = audited(env, "sec-gone", &platform).await;
    let _op = Operator::start(&ns, &["--notify-allow=*=127.0.0.0/8", "--fleet-namespace", &fleet_ns], &[]);
    let fleet = Fleet { client: env.admin.clone(), ns: ns.clone(), tenants: vec![] };
    fleet.deployments(&ns, 1, READY_IMAGE).await;
    let mut spec = deployments_spec();
    spec["strategy"] = json!({"approval": "FirstBatch"});
    let created = create_as(&agent, &ns, "gone", spec).await;
    let held = |f: &FleetRollout| {
        f.finalizers().iter().any(|f| f == PLATFORM)
            && f.status.as_ref().is_some_and(|s| s.revision_number() >= 1)
    };
    let fr = fleet
        .wait_rollout(
            "gone",
            "the platform's finalizer and the first revision",
            Duration::from_secs(60),
            held,
        )
        .await;
    let deleted = agent.kubectl(&["delete", "fleetrollout", "gone", "-n", &ns, "--wait=false"]).await;
    let refused = strips_refused(&agent, &fleet, "gone").await;
    let told = |f: &FleetRollout| {
        f.status.as_ref().and_then(|s| s.notifications.as_ref()).is_some_and(|o| o.deletion_told)
    };
    let waiting = fleet.wait_rollout("gone", "its deletion told", Duration::from_secs(60), told).await;
    platform.set_mode(Mode::Ok);
    let both = |r: &[Request]| {
        let k = kinds_heard(r, "gone");
        k.iter().any(|k| k == "Started") && k.iter().any(|k| k == "Deleted")
    };
    let heard =
        kinds_heard(&platform.wait_until(Duration::from_secs(120), both).await.unwrap_or_else(|r| r), "gone");
    let api = Api::<FleetRollout>::namespaced(env.admin.clone(), &ns);
    let uid = fr.uid().unwrap_or_default();
    let condition = kube::runtime::wait::conditions::is_deleted(&uid);
    let gone = tokio::time::timeout(
        Duration::from_secs(60),
        kube::runtime::wait::await_condition(api, "gone", condition),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    Row {
        attack: "deletes its running rollout while the platform's audit sink is down, then strips the \
                 platform's finalizer (merge patch, JSON patch, replace) so that it goes unheard"
            .into(),
        who: who(&agent, "edit; governed by a policy that subscribes the platform's audit sink"),
        expected: "the deletion is allowed, every strip refused; the rollout waits, Terminating, until the \
                   platform heard Started and Deleted, then goes"
            .into(),
        outcome: format!(
            "created: {}; deleted: {}; strips refused: {refused}/3; Terminating while the sink was down: {}; \
             the platform heard {heard:?}; gone within 60 s of that: {gone}",
            created.code == 0,
            deleted.code == 0,
            waiting.metadata.deletion_timestamp.is_some(),
        ),
        contained: created.code == 0
            && deleted.code == 0
            && refused == 3
            && waiting.metadata.deletion_timestamp.is_some()
            && heard.iter().any(|k| k == "Started")
            && heard.iter().any(|k| k == "Deleted")
            && gone,
    }
}
