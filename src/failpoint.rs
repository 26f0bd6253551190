//! Crash-test hooks. `FLEETROLL_FAILPOINT=<name>:<n>` makes the process stop dead at the n-th time it
//! reaches the named point: it prints `FAILPOINT <name> reached` on stderr and blocks, so the crash test can
//! SIGKILL it at exactly that instant (for example between the intent write and the first patch).
//! `<name>:<n>:panic` panics there instead, to prove a panicking reconcile fails that rollout's step only.
//! Unset (always, outside tests), a hit costs one relaxed atomic load.

use std::sync::{
    OnceLock,
    atomic::{AtomicU64, Ordering},
};

/// After the batch intent (Applying) is persisted, before any target of the batch is changed.
pub const AFTER_INTENT: &str = "after-intent";
/// After one target patch, before the next.
pub const BETWEEN_PATCHES: &str = "between-patches";
/// After every target of a batch is patched, before the Verifying status is persisted.
pub const AFTER_APPLY: &str = "after-apply";
/// After plan shards are created, before the plan is recorded in status.
pub const AFTER_PLAN_SHARDS: &str = "after-plan-shards";
/// After an analysis measurement's queries were answered, before the status recording it is written.
pub const AFTER_MEASURE: &str = "after-measure";
/// Between restoring one target and the next during a rollback.
pub const BETWEEN_RESTORES: &str = "between-restores";

struct Armed {
    name: String,
    at: u64,
    panic: bool,
    hits: AtomicU64,
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let spec = std::env::var("FLEETROLL_FAILPOINT").ok()?;
            let mut parts = spec.split(':');
            let name = parts.next()?.to_string();
            let at = parts.next().unwrap_or("1").parse().ok()?;
            let panic = parts.next() == Some("panic");
            Some(Armed { name, at, panic, hits: AtomicU64::new(0) })
        })
        .as_ref()
}

/// Marks that the process reached `name`. Blocks forever when the armed failpoint fires.
pub(crate) async fn hit(name: &str) {
    let Some(a) = armed() else { return };
    if a.name != name || a.hits.fetch_add(1, Ordering::Relaxed) + 1 != a.at {
        return;
    }
    eprintln!("FAILPOINT {name} reached");
    if a.panic {
        panic!("failpoint {name} panicked on purpose");
    }
    std::future::pending::<()>().await;
}
