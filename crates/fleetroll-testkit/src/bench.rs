//! What the benchmark and the chaos harness share: bulk fleets, a watch-driven view of the fleet, the API
//! server's own request counters, process accounting, and the results file.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{StreamExt, stream};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Namespace};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use tokio::sync::watch;

pub const V1: &str = "registry.k8s.io/pause:3.10";

pub async fn cleanup(client: &Client, namespaces: &[String]) {
    for ns in namespaces {
        let _ = crate::delete_namespace(client, ns).await;
    }
}

/// Deletes the namespaces and waits until each is gone (at most 10 minutes each), so that nothing they held
/// is in a cache or a controller's queue of the scenario that comes next.
pub async fn cleanup_and_wait(client: &Client, namespaces: &mut Vec<String>) {
    use kube::runtime::wait::{await_condition, conditions::is_deleted};
    let api: Api<Namespace> = Api::all(client.clone());
    for ns in namespaces.drain(..) {
        let Ok(Some(found)) = api.get_opt(&ns).await else { continue };
        let _ = crate::delete_namespace(client, &ns).await;
        let uid = found.uid().unwrap_or_default();
        let gone = await_condition(api.clone(), &ns, is_deleted(&uid));
        tokio::time::timeout(Duration::from_secs(600), gone)
            .await
            .unwrap_or_else(|_| panic!("namespace {ns} not deleted within 10 minutes"))
            .unwrap();
    }
}

/// Creates `n` Deployments `t-00000..` in `ns` with `replicas` each and extra labels, 32 at a time.
pub async fn fleet(client: &Client, ns: &str, n: usize, replicas: i32, group_size: usize) {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = format!("t-{i:05}");
                let d: Deployment = serde_json::from_value(json!({
                    "apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": name, "labels": {"fleet": "bench", "group": format!("g{}", i / group_size.max(1))}},
                    "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                             "template": {"metadata": {"labels": {"app": name}},
                                          "spec": {"containers": [{"name": "app", "image": V1}]}}}
                }))
                .unwrap();
                for attempt in 0..5 {
                    match api.create(&PostParams::default(), &d).await {
                        Ok(_) => return,
                        Err(kube::Error::Api(s)) if s.code == 409 => return,
                        Err(e) if attempt == 4 => panic!("creating {name}: {e}"),
                        // A retry's backoff (the apiserver was busy), not a wait for a condition.
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                }
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
}

/// A target as the watch last showed it.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    pub image: String,
    pub generation: i64,
    pub rolled_out: bool,
    /// When the watch first showed it on each image, and when it first showed it rolled out on it.
    pub changed_at: HashMap<String, Instant>,
    pub rolled_at: HashMap<String, Instant>,
}

/// A watch-driven view of the Deployments of some namespaces.
#[derive(Clone)]
pub struct Observer {
    pub state: Arc<Mutex<HashMap<String, Seen>>>,
    changed: watch::Receiver<u64>,
    task: Arc<tokio::task::JoinHandle<()>>,
    pub max_in_flight: Arc<Mutex<HashMap<String, usize>>>,
}

pub fn rolled_out(d: &Deployment) -> bool {
    let want = d.spec.replicas.unwrap_or(1);
    d.status.as_ref().is_some_and(|s| {
        s.observed_generation == d.metadata.generation
            && s.updated_replicas.unwrap_or(0) == want
            && s.ready_replicas.unwrap_or(0) == want
            && s.available_replicas.unwrap_or(0) == want
            && s.replicas.unwrap_or(0) == want
    })
}

pub fn image(d: &Deployment) -> String {
    d.spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

impl Observer {
    /// Watches the Deployments labelled `fleet=bench` in `namespaces` (all of them when empty).
    pub fn start(client: &Client, namespaces: Vec<String>) -> Observer {
        let state: Arc<Mutex<HashMap<String, Seen>>> = Arc::default();
        let max_in_flight: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let (tx, changed) = watch::channel(0u64);
        let api: Api<Deployment> = Api::all(client.clone());
        let (st, mf) = (state.clone(), max_in_flight.clone());
        let task = tokio::spawn(async move {
            // Backoff and skip errors: the chaos runs restart the apiserver under this watch.
            let mut events = watcher(api, watcher::Config::default().labels("fleet=bench"))
                .default_backoff()
                .applied_objects()
                .filter_map(|event| async move { event.ok() })
                .boxed();
            let mut version = 0u64;
            while let Some(d) = events.next().await {
                let ns = d.namespace().unwrap_or_default();
                if !namespaces.is_empty() && !namespaces.contains(&ns) {
                    continue;
                }
                let key = format!("{ns}/{}", d.name_any());
                let now = Instant::now();
                {
                    let mut s = st.lock().unwrap();
                    let seen = s.entry(key).or_default();
                    seen.image = image(&d);
                    seen.generation = d.metadata.generation.unwrap_or(0);
                    seen.rolled_out = rolled_out(&d);
                    seen.changed_at.entry(seen.image.clone()).or_insert(now);
                    if seen.rolled_out {
                        seen.rolled_at.entry(seen.image.clone()).or_insert(now);
                    }
                    // Targets on an image other than v1 and not rolled out on it: in flight.
                    let mut in_flight: HashMap<String, usize> = HashMap::new();
                    for v in s.values().filter(|v| !v.rolled_out) {
                        *in_flight.entry(v.image.clone()).or_default() += 1;
                    }
                    let mut m = mf.lock().unwrap();
                    for (img, n) in in_flight {
                        let e = m.entry(img).or_default();
                        *e = (*e).max(n);
                    }
                }
                version += 1;
                let _ = tx.send(version);
            }
        });
        Observer { state, changed, task: Arc::new(task), max_in_flight }
    }

    /// Waits until `cond` holds over the view, or panics after `timeout`.
    pub async fn wait(&self, what: &str, timeout: Duration, cond: impl Fn(&HashMap<String, Seen>) -> bool) {
        let mut rx = self.changed.clone();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if cond(&self.state.lock().unwrap()) {
                return;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => panic!("the Deployment watch ended while waiting for {what}"),
                Err(_) => panic!("timed out after {timeout:?} waiting for {what}"),
            }
        }
    }
}

/// Whether every one of `keys` is rolled out on `image`, in a view passed to [`Observer::wait`].
pub fn all_on(state: &HashMap<String, Seen>, keys: &[String], image: &str) -> bool {
    keys.iter().all(|k| state.get(k).is_some_and(|v| v.image == image && v.rolled_out))
}

impl Drop for Observer {
    fn drop(&mut self) {
        if Arc::strong_count(&self.task) == 1 {
            self.task.abort();
        }
    }
}

/// The API server's own request counter, `apiserver_request_total`, summed by (verb, resource, subresource).
pub async fn apiserver_requests(client: &Client) -> HashMap<(String, String, String), f64> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
        .await
        .unwrap_or_default();
    let mut out: HashMap<(String, String, String), f64> = HashMap::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let (labels, value) = line.rsplit_once(' ').unwrap_or((line, "0"));
        let get = |k: &str| {
            labels
                .split(&format!("{k}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_string()
        };
        *out.entry((get("verb"), get("resource"), get("subresource"))).or_default() +=
            value.parse::<f64>().unwrap_or(0.0);
    }
    out
}

pub fn delta(
    before: &HashMap<(String, String, String), f64>,
    after: &HashMap<(String, String, String), f64>,
    verb: &str,
    resource: &str,
    subresource: &str,
) -> f64 {
    let k = (verb.to_string(), resource.to_string(), subresource.to_string());
    after.get(&k).copied().unwrap_or(0.0) - before.get(&k).copied().unwrap_or(0.0)
}

/// Sets every target of `keys` (namespace/name) to `image` with server-side apply, `concurrency` at a time.
pub async fn patch_images(client: &Client, keys: &[String], image: &str, concurrency: usize) {
    stream::iter(keys.iter().cloned())
        .map(|key| {
            let client = client.clone();
            let image = image.to_string();
            async move {
                let (ns, name) = key.split_once('/').unwrap();
                let api: Api<Deployment> = Api::namespaced(client, ns);
                let body = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
                    "spec": {"template": {"spec": {"containers": [{"name": "app", "image": image}]}}}});
                api.patch(name, &PatchParams::apply("bench-bare").force(), &Patch::Apply(&body))
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await;
}

/// Percentile of sorted samples (nearest rank).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// "p50 ms / p99 ms" of sorted latencies in seconds, as the tables print them.
pub fn p50_p99_ms(sorted: &[f64]) -> String {
    format!("{:.1} ms / {:.1} ms", percentile(sorted, 50.0) * 1e3, percentile(sorted, 99.0) * 1e3)
}

/// The `q` quantile (0–1) of the Prometheus histogram `name` (its series carrying the label `label`, such as
/// `write="intent"`, or "" for a histogram without labels) in a metrics text, interpolated linearly inside
/// its bucket as PromQL's `histogram_quantile` does; with the number of observations. None when it has none.
pub fn histogram_quantile(text: &str, name: &str, label: &str, q: f64) -> Option<(f64, f64)> {
    let mut buckets: Vec<(f64, f64)> = samples(text, &format!("{name}_bucket"), label)
        .filter_map(|(labels, count)| {
            let le = labels.split(',').find_map(|l| l.strip_prefix("le=\""))?.trim_end_matches('"');
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, count))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for (le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some((lower, total));
            }
            let share = if count > below { (rank - below) / (count - below) } else { 1.0 };
            return Some((lower + (le - lower) * share, total));
        }
        (lower, below) = (le, count);
    }
    None
}

/// The mean of the Prometheus histogram `name` (its series carrying `label`, or "" for one without labels),
/// from its `_sum` and `_count`: exact, where a quantile read from buckets is only as fine as the buckets.
/// None when it has no observations.
pub fn histogram_mean(text: &str, name: &str, label: &str) -> Option<f64> {
    let value = |series: String| samples(text, &series, label).next().map(|(_, v)| v);
    let (sum, count) = (value(format!("{name}_sum"))?, value(format!("{name}_count"))?);
    (count > 0.0).then(|| sum / count)
}

/// The samples of `series` in a metrics text that carry the label `label` (any of theirs, in any order:
/// prometheus-client writes `le` first; "" for all): each one's labels as written, and its value.
fn samples<'a>(text: &'a str, series: &'a str, label: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    text.lines().filter_map(move |l| {
        let rest = l.strip_prefix(series)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(labelled) => labelled.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        // No value here holds a comma.
        if !label.is_empty() && !labels.split(',').any(|l| l == label) {
            return None;
        }
        Some((labels, value.split_whitespace().next()?.parse().ok()?))
    })
}

/// Facts about this machine and this code, for the results file.
pub fn machine_facts() -> Vec<(String, String)> {
    let sh = |cmd: &str| {
        std::process::Command::new("sh")
            .args(["-c", cmd])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    vec![
        ("date".into(), sh("date -u +%Y-%m-%dT%H:%M:%SZ")),
        ("commit".into(), sh(&format!("git -C {} rev-parse --short HEAD", crate::repo_root().display()))),
        ("cpu".into(), sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2")),
        ("cores".into(), sh("nproc")),
        ("memory".into(), sh("free -g | awk '/Mem:/ {print $2 \" GiB\"}'")),
        ("kernel".into(), sh("uname -r")),
        ("rustc".into(), sh("rustc --version")),
        (
            "kubernetes".into(),
            sh(&format!(
                "grep K8S_VERSION= {}/tests/testenv/versions.sh | cut -d= -f2",
                crate::repo_root().display()
            )),
        ),
        ("build".into(), if cfg!(debug_assertions) { "debug".into() } else { "release".into() }),
    ]
}

/// One row of a results table.
pub struct Row {
    pub metric: String,
    pub value: String,
    pub goal: String,
    /// None: no goal to meet.
    pub met: Option<bool>,
}

pub fn row(
    metric: impl Into<String>,
    value: impl Into<String>,
    goal: impl Into<String>,
    met: Option<bool>,
) -> Row {
    Row { metric: metric.into(), value: value.into(), goal: goal.into(), met }
}

/// Where a run writes its results: bench/results for a whole full run, target/bench-smoke for a smoke or
/// partial run.
pub fn results_dir(full: bool) -> std::path::PathBuf {
    let root = crate::repo_root().to_path_buf();
    let out = if full { root.join("bench/results") } else { root.join("target/bench-smoke") };
    std::fs::create_dir_all(&out).unwrap();
    out
}

/// How fast the machine was during a run. Machines of one kind here have been seen running the same
/// code 3-4× slower than usual, which every absolute latency shows and no ratio does: these facts tell
/// such a run apart, beside the bare client's own times. SHA-256 alone does not (the CPU does it in
/// hardware at full speed on such a machine), so the calibration is the work an API server does most,
/// JSON, and etcd's, fsync.
pub struct MachineSpeed {
    /// The best of three timings of a fixed single-core JSON workload of `rounds`, at the start of the run.
    calibration: Duration,
    /// Rounds timed, and how many times.
    rounds: (usize, usize),
    /// fsync latency, p50 and p99, at the start.
    fsync_at_start: (Duration, Duration),
    at_start: Option<Vec<u64>>,
}

/// The work timed as the calibration: a Deployment-sized JSON document encoded and decoded this often.
const CALIBRATION_ROUNDS: usize = 20_000;

impl MachineSpeed {
    /// Times the calibration and fsync, and notes the CPU counters; call at the start of a run.
    pub fn measure() -> MachineSpeed {
        let doc = json!({"metadata": {"name": "web", "labels": {"app": "web", "tier": "front"},
            "annotations": {"fleetroll.dev/applied": "uid/1/0"}},
            "spec": {"replicas": 3, "template": {"spec": {"containers": (0..8).map(|i| json!({
                "name": format!("c{i}"), "image": "registry.example/app:1.2.3",
                "env": (0..8).map(|e| json!({"name": format!("E{e}"), "value": "x".repeat(20)})).collect::<Vec<_>>()
            })).collect::<Vec<_>>()}}},
            "status": {"replicas": 3, "readyReplicas": 3, "conditions": [{"type": "Available", "status": "True"}]}});
        // A debug build's figure means nothing to compare, and costs seconds of every `make test`.
        let (rounds, tries) =
            if cfg!(debug_assertions) { (CALIBRATION_ROUNDS / 20, 1) } else { (CALIBRATION_ROUNDS, 3) };
        let calibration = (0..tries)
            .map(|_| {
                let started = Instant::now();
                for _ in 0..rounds {
                    let text = serde_json::to_string(&doc).unwrap();
                    std::hint::black_box(serde_json::from_str::<serde_json::Value>(&text).unwrap());
                }
                started.elapsed()
            })
            .min()
            .unwrap_or_default();
        MachineSpeed {
            calibration,
            rounds: (rounds, tries),
            fsync_at_start: fsync_latency(),
            at_start: cpu_counters(),
        }
    }

    /// The calibration, fsync at the start and the end, and the share of CPU time the hypervisor took for
    /// others since the start.
    fn facts(&self) -> Vec<(String, String)> {
        let stolen = match (&self.at_start, cpu_counters()) {
            (Some(start), Some(now)) => {
                let delta: Vec<u64> = now.iter().zip(start).map(|(n, s)| n.saturating_sub(*s)).collect();
                let total: u64 = delta.iter().sum();
                // /proc/stat's cpu line: user nice system idle iowait irq softirq steal ...
                let steal = delta.get(7).copied().unwrap_or(0);
                if total == 0 {
                    "unknown".into()
                } else {
                    format!("{:.1}%", 100.0 * steal as f64 / total as f64)
                }
            }
            _ => "unknown".into(),
        };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let fsync = |(p50, p99): (Duration, Duration)| format!("{:.2} ms / {:.2} ms", ms(p50), ms(p99));
        vec![
            (
                format!(
                    "calibration: {} JSON encodes and decodes of a Deployment on one core (best of {})",
                    self.rounds.0, self.rounds.1
                ),
                format!("{:.0} ms", ms(self.calibration)),
            ),
            (
                "fsync of 4 KiB, p50 / p99: at the start, at the end".into(),
                format!("{}, {}", fsync(self.fsync_at_start), fsync(fsync_latency())),
            ),
            ("CPU time stolen by the hypervisor during the run".into(), stolen),
        ]
    }
}

/// fsync latency of 4 KiB writes in target/ (p50, p99 of 50), as etcd pays it on every write.
fn fsync_latency() -> (Duration, Duration) {
    use std::io::Write;
    let path = crate::repo_root().join("target/fsync-probe");
    let Ok(mut file) = std::fs::File::create(&path) else { return Default::default() };
    let mut times: Vec<Duration> = (0..50)
        .filter_map(|_| {
            file.write_all(&[0x5a; 4096]).ok()?;
            let started = Instant::now();
            file.sync_data().ok()?;
            Some(started.elapsed())
        })
        .collect();
    let _ = std::fs::remove_file(&path);
    times.sort();
    let at = |q: usize| times.get((times.len().saturating_sub(1)) * q / 100).copied().unwrap_or_default();
    (at(50), at(99))
}

/// The counters of /proc/stat's first line (all CPUs), in clock ticks.
fn cpu_counters() -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    line.split_whitespace().map(|v| v.parse().ok()).collect()
}

/// The machine facts, and how fast the machine was during the run, as a two-column markdown table.
pub fn machine_table(speed: &MachineSpeed) -> String {
    let facts = machine_facts().into_iter().chain(speed.facts());
    let rows: String = facts.map(|(k, v)| format!("| {k} | {v} |\n")).collect();
    format!("| | |\n|---|---|\n{rows}")
}

pub fn table(rows: &[Row]) -> String {
    let mut out = String::from("| metric | value | goal | met |\n|---|---|---|---|\n");
    for r in rows {
        let met = match r.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "",
        };
        out.push_str(&format!("| {} | {} | {} | {met} |\n", r.metric, r.value, r.goal));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As prometheus-client writes a labelled histogram: `le` first, then the histogram's own labels.
    const TEXT: &str = "\
# TYPE w histogram
w_sum{write=\"intent\"} 0.06
w_count{write=\"intent\"} 4
w_bucket{le=\"0.01\",write=\"intent\"} 1
w_bucket{le=\"0.02\",write=\"intent\"} 4
w_bucket{le=\"+Inf\",write=\"intent\"} 4
w_sum{write=\"other\"} 9
w_count{write=\"other\"} 1
w_bucket{le=\"0.01\",write=\"other\"} 0
w_bucket{le=\"0.02\",write=\"other\"} 0
w_bucket{le=\"+Inf\",write=\"other\"} 1
t_sum 0.5
t_count 2
";

    #[test]
    fn a_histograms_mean_comes_from_its_sum_and_count_for_the_label_asked() {
        assert_eq!(histogram_mean(TEXT, "w", "write=\"intent\""), Some(0.015));
        assert_eq!(histogram_mean(TEXT, "w", "write=\"other\""), Some(9.0));
        assert_eq!(histogram_mean(TEXT, "t", ""), Some(0.25));
        assert_eq!(histogram_mean(TEXT, "missing", ""), None);
    }

    #[test]
    fn a_quantile_is_interpolated_inside_its_bucket_whatever_the_label_order() {
        let (p50, n) = histogram_quantile(TEXT, "w", "write=\"intent\"", 0.5).expect("observations");
        assert_eq!(n, 4.0);
        // Rank 2 of 4: one observation below 0.01, three in (0.01, 0.02]: a third of the way in.
        assert!((p50 - (0.01 + 0.01 / 3.0)).abs() < 1e-12, "{p50}");
    }
}
