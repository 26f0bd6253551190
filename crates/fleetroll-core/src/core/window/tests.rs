use super::*;

fn at(text: &str) -> Timestamp {
    text.parse().unwrap()
}

fn window(kind: WindowKind, schedule: &str, duration: &str, zone: Option<&str>) -> ChangeWindow {
    ChangeWindow {
        name: None,
        kind,
        schedule: schedule.into(),
        duration: duration.into(),
        time_zone: zone.map(Into::into),
    }
}

fn allow(schedule: &str, duration: &str, zone: &str) -> ChangeWindow {
    window(WindowKind::Allow, schedule, duration, Some(zone))
}

fn owner(owner: Owner, windows: &[ChangeWindow]) -> OwnerWindows {
    OwnerWindows::compile(owner, windows).unwrap()
}

/// When the windows next open, judged at `now`: None when they are open now.
fn opens(owners: &[&OwnerWindows], now: &str) -> Option<Option<Timestamp>> {
    match judge(owners, at(now)) {
        Verdict::Open => None,
        Verdict::Closed { opens, .. } => Some(opens),
    }
}

fn is_open(owners: &[&OwnerWindows], now: &str) -> bool {
    judge(owners, at(now)) == Verdict::Open
}

// Europe/Berlin, 2026-03-29: at 02:00 CET the clocks go to 03:00 CEST (01:00 UTC).
#[test]
fn berlin_spring_forward_an_opening_the_clocks_skip_happens_right_after_the_gap() {
    let nightly = owner(Owner::Rollout, &[allow("30 2 * * *", "1h", "Europe/Berlin")]);
    // An ordinary night: 02:30 CET is 01:30 UTC.
    assert_eq!(opens(&[&nightly], "2026-03-27T12:00:00Z"), Some(Some(at("2026-03-28T01:30:00Z"))));
    // 02:30 does not exist on the 29th: the window opens at 03:00 CEST, the first minute after the gap.
    assert_eq!(opens(&[&nightly], "2026-03-28T12:00:00Z"), Some(Some(at("2026-03-29T01:00:00Z"))));
    assert!(is_open(&[&nightly], "2026-03-29T01:00:00Z"));
    assert!(is_open(&[&nightly], "2026-03-29T01:59:00Z"));
    // An hour of elapsed time later it closes; the next night is summer time: 02:30 CEST is 00:30 UTC.
    assert_eq!(opens(&[&nightly], "2026-03-29T02:00:00Z"), Some(Some(at("2026-03-30T00:30:00Z"))));
}

// Europe/Berlin, 2026-10-25: at 03:00 CEST the clocks go back to 02:00 CET (01:00 UTC); 02:30 happens twice.
#[test]
fn berlin_fall_back_an_opening_the_clocks_repeat_happens_once_the_first_time() {
    let nightly = owner(Owner::Rollout, &[allow("30 2 * * *", "1h", "Europe/Berlin")]);
    assert_eq!(opens(&[&nightly], "2026-10-24T12:00:00Z"), Some(Some(at("2026-10-25T00:30:00Z"))));
    assert!(is_open(&[&nightly], "2026-10-25T00:30:00Z"));
    assert!(is_open(&[&nightly], "2026-10-25T01:29:00Z"));
    // 02:45 CET, the second time round: the window opened once and closed at 02:30 CET.
    assert_eq!(opens(&[&nightly], "2026-10-25T01:45:00Z"), Some(Some(at("2026-10-26T01:30:00Z"))));
}

// A window's duration is elapsed time, across a clock change too: 01:00 CET plus 3h is 05:00 CEST.
#[test]
fn a_duration_is_elapsed_time_across_a_clock_change() {
    let night = owner(Owner::Rollout, &[allow("0 1 * * *", "3h", "Europe/Berlin")]);
    assert!(is_open(&[&night], "2026-03-29T02:59:00Z"));
    assert!(!is_open(&[&night], "2026-03-29T03:00:00Z"));
}

// America/New_York, 2026-03-08: at 02:00 EST the clocks go to 03:00 EDT (07:00 UTC).
#[test]
fn new_york_spring_forward_an_opening_the_clocks_skip_happens_right_after_the_gap() {
    let nightly = owner(Owner::Rollout, &[allow("30 2 * * *", "1h", "America/New_York")]);
    assert_eq!(opens(&[&nightly], "2026-03-07T12:00:00Z"), Some(Some(at("2026-03-08T07:00:00Z"))));
    assert!(is_open(&[&nightly], "2026-03-08T07:59:00Z"));
    assert_eq!(opens(&[&nightly], "2026-03-08T08:00:00Z"), Some(Some(at("2026-03-09T06:30:00Z"))));
}

// America/New_York, 2026-11-01: at 02:00 EDT the clocks go back to 01:00 EST (06:00 UTC).
#[test]
fn new_york_fall_back_a_window_lasts_its_elapsed_time_through_the_repeated_hour() {
    let night = owner(Owner::Rollout, &[allow("0 1 * * *", "2h", "America/New_York")]);
    // Opens at 01:00 EDT (05:00 UTC), once; two hours later is 02:00 EST (07:00 UTC).
    assert_eq!(opens(&[&night], "2026-10-31T12:00:00Z"), Some(Some(at("2026-11-01T05:00:00Z"))));
    assert!(is_open(&[&night], "2026-11-01T06:30:00Z"), "01:30 EST, the second time round, is inside");
    assert_eq!(opens(&[&night], "2026-11-01T07:00:00Z"), Some(Some(at("2026-11-02T06:00:00Z"))));
}

#[test]
fn new_york_fall_back_an_hourly_schedule_opens_in_both_passes_of_the_repeated_hour() {
    let hourly = owner(Owner::Rollout, &[allow("0 * * * *", "30m", "America/New_York")]);
    assert!(is_open(&[&hourly], "2026-11-01T05:10:00Z"), "01:10 EDT");
    assert!(is_open(&[&hourly], "2026-11-01T06:10:00Z"), "01:10 EST");
    assert_eq!(opens(&[&hourly], "2026-11-01T06:40:00Z"), Some(Some(at("2026-11-01T07:00:00Z"))));
}

#[test]
fn a_window_spanning_midnight_is_open_on_the_next_day_until_it_ends() {
    let friday_nights = owner(Owner::Rollout, &[allow("0 22 * * Fri", "4h", "UTC")]);
    // 2026-12-04 is a Friday.
    assert_eq!(opens(&[&friday_nights], "2026-12-04T12:00:00Z"), Some(Some(at("2026-12-04T22:00:00Z"))));
    assert!(is_open(&[&friday_nights], "2026-12-04T23:59:00Z"));
    assert!(is_open(&[&friday_nights], "2026-12-05T01:59:00Z"), "Saturday, 01:59");
    assert_eq!(opens(&[&friday_nights], "2026-12-05T02:00:00Z"), Some(Some(at("2026-12-11T22:00:00Z"))));
}

#[test]
fn a_leap_day_window_opens_on_the_next_leap_day() {
    let leap = owner(Owner::Rollout, &[allow("0 0 29 2 *", "24h", "UTC")]);
    assert_eq!(opens(&[&leap], "2026-03-01T00:00:00Z"), Some(Some(at("2028-02-29T00:00:00Z"))));
    assert!(is_open(&[&leap], "2028-02-29T23:59:00Z"));
    assert_eq!(opens(&[&leap], "2028-03-01T00:00:00Z"), Some(Some(at("2032-02-29T00:00:00Z"))));
}

#[test]
fn a_deny_window_holds_inside_an_open_allow_window_and_says_which() {
    let always = owner(Owner::Rollout, &[allow("0 * * * *", "60m", "UTC")]);
    let mut freeze = window(WindowKind::Deny, "0 9 24 12 *", "48h", Some("UTC"));
    freeze.name = Some("holidays".into());
    let platform = owner(Owner::Policy("platform".into()), &[freeze]);
    assert!(is_open(&[&always, &platform], "2026-12-23T10:00:00Z"));
    assert_eq!(
        judge(&[&always, &platform], at("2026-12-24T10:00:00Z")),
        Verdict::Closed {
            hold: Hold {
                owner: Owner::Policy("platform".into()),
                kind: WindowKind::Deny,
                window: "holidays".into()
            },
            others: vec![],
            opens: Some(at("2026-12-26T09:00:00Z")),
        }
    );
}

#[test]
fn every_owner_must_allow_the_moment_and_the_opening_is_when_all_do() {
    let rollout = owner(Owner::Rollout, &[allow("0 22 * * *", "4h", "UTC")]);
    let tenant = owner(Owner::Namespace("tenant-a".into()), &[allow("0 1 * * *", "4h", "UTC")]);
    let both = [&rollout, &tenant];
    match judge(&both, at("2026-12-04T23:00:00Z")) {
        Verdict::Closed { hold, others, opens } => {
            assert_eq!(hold.owner, Owner::Namespace("tenant-a".into()));
            assert_eq!(others, [], "the rollout's own window is open at 23:00");
            assert_eq!(opens, Some(at("2026-12-05T01:00:00Z")));
        }
        Verdict::Open => panic!("the tenant's window is closed at 23:00"),
    }
    assert!(is_open(&both, "2026-12-05T01:30:00Z"));
    assert_eq!(opens(&both, "2026-12-05T02:00:00Z"), Some(Some(at("2026-12-06T01:00:00Z"))));
}

#[test]
fn an_owner_allows_while_any_of_its_windows_is_open() {
    let tenant = owner(
        Owner::Namespace("tenant-a".into()),
        &[allow("0 6 * * *", "1h", "UTC"), allow("0 18 * * *", "1h", "UTC")],
    );
    assert!(is_open(&[&tenant], "2026-12-04T06:30:00Z"));
    assert!(is_open(&[&tenant], "2026-12-04T18:30:00Z"));
    assert_eq!(opens(&[&tenant], "2026-12-04T07:00:00Z"), Some(Some(at("2026-12-04T18:00:00Z"))));
}

#[test]
fn windows_that_never_meet_have_no_opening() {
    let mondays = owner(Owner::Namespace("a".into()), &[allow("0 0 * * Mon", "24h", "UTC")]);
    let tuesdays = owner(Owner::Namespace("b".into()), &[allow("0 0 * * Tue", "24h", "UTC")]);
    assert_eq!(opens(&[&mondays, &tuesdays], "2026-12-04T12:00:00Z"), Some(None));
}

#[test]
fn a_freeze_without_end_has_no_opening_and_costs_a_bounded_search() {
    let forever =
        owner(Owner::Policy("incident".into()), &[window(WindowKind::Deny, "* * * * *", "1h", None)]);
    assert_eq!(opens(&[&forever], "2026-12-04T12:00:00Z"), Some(None));
}

#[test]
fn owners_without_windows_allow_everything() {
    let none = owner(Owner::Rollout, &[]);
    assert!(none.is_empty());
    assert!(is_open(&[&none], "2026-12-04T12:00:00Z"));
    assert!(is_open(&[], "2026-12-04T12:00:00Z"));
}

#[test]
fn windows_people_cannot_use_are_refused_with_why() {
    let compile = |w: ChangeWindow| Window::compile(&w).map(|_| ()).unwrap_err();
    assert!(matches!(compile(allow("61 * * * *", "1h", "UTC")), WindowError::Schedule { .. }));
    assert!(matches!(compile(allow("0 0 * *", "1h", "UTC")), WindowError::Schedule { .. }));
    assert!(
        matches!(compile(allow("0 0 0 * * * 2027", "1h", "UTC")), WindowError::Schedule { .. }),
        "no year field"
    );
    // Six fields: seconds first (a window can open at a second, as tests need).
    assert!(Window::compile(&allow("30 0 22 * * *", "1h", "UTC")).is_ok());
    assert_eq!(compile(allow("0 0 30 2 *", "1h", "UTC")), WindowError::Never("0 0 30 2 *".into()));
    assert_eq!(compile(allow("0 0 * * *", "30s", "UTC")), WindowError::TooShort("30s".into()));
    assert_eq!(compile(allow("0 0 * * *", "1h500ms", "UTC")), WindowError::Fraction("1h500ms".into()));
    assert!(matches!(compile(allow("0 0 * * *", "1d", "UTC")), WindowError::Duration(_)));
    assert_eq!(
        compile(allow("0 0 * * *", "1h", "Mars/Olympus")),
        WindowError::TimeZone("Mars/Olympus".into())
    );
    let many = vec![allow("0 0 * * *", "1h", "UTC"); WINDOWS_MAX + 1];
    assert_eq!(
        OwnerWindows::compile(Owner::Rollout, &many).unwrap_err(),
        WindowError::TooMany(WINDOWS_MAX + 1)
    );
    let message = compile(allow("0 0 * * *", "1h", "Mars/Olympus")).to_string();
    assert!(message.contains("IANA"), "{message}");
}

#[test]
fn an_annotation_is_a_bounded_json_list() {
    let ns = || Owner::Namespace("tenant-a".into());
    let read = OwnerWindows::from_annotation(
        ns(),
        r#"[{"schedule": "0 22 * * Mon-Fri", "duration": "4h", "timeZone": "Europe/Berlin"}]"#,
    )
    .unwrap();
    assert!(!read.is_empty());
    assert!(matches!(OwnerWindows::from_annotation(ns(), "weeknights"), Err(WindowError::Annotation(_))));
    let long = format!("[{}]", vec![r#"{"schedule":"@daily","duration":"1h"}"#; 300].join(","));
    assert!(matches!(OwnerWindows::from_annotation(ns(), &long), Err(WindowError::Annotation(_))));
    assert!(matches!(
        OwnerWindows::from_annotation(ns(), ANNOTATION_TOO_LONG),
        Err(WindowError::Annotation(_))
    ));
    assert!(matches!(
        OwnerWindows::from_annotation(
            ns(),
            r#"[{"schedule": "@daily", "duration": "1h", "timeZone": "Nowhere"}]"#
        ),
        Err(WindowError::TimeZone(_))
    ));
    // A misspelt field is an error, not a default (an Allow window in UTC).
    for misspelt in [
        r#"[{"schedule": "@daily", "duration": "1h", "type": "Deny"}]"#,
        r#"[{"schedule": "@daily", "duration": "1h", "timezone": "Europe/Berlin"}]"#,
    ] {
        let read = OwnerWindows::from_annotation(ns(), misspelt);
        assert!(matches!(read, Err(WindowError::Annotation(_))), "{misspelt}");
    }
}

#[test]
fn names_and_descriptions_are_for_people() {
    let mut w = allow("0 22 * * Mon-Fri", "4h", "Europe/Berlin");
    assert_eq!(Window::compile(&w).unwrap().label(), "0 22 * * Mon-Fri");
    w.name = Some("weeknights".into());
    let compiled = Window::compile(&w).unwrap();
    assert_eq!(compiled.label(), "weeknights");
    assert!(compiled.describe().contains("22:00"), "{}", compiled.describe());
}

#[test]
fn planning_ranks_the_namespaces_that_declare_windows_by_their_opening() {
    let declared = |owner: &Owner| match owner {
        Owner::Namespace(ns) if ns == "night" => {
            Some(r#"[{"schedule": "0 22 * * *", "duration": "2h"}]"#.to_string())
        }
        Owner::Namespace(ns) if ns == "broken" => Some("weeknights".to_string()),
        _ => None,
    };
    let targets = [("", "night"), ("", "night"), ("", "broken"), ("", "plain"), ("member", "night")];
    let opens = openings(targets, &declared, at("2026-12-04T12:00:00Z"));
    assert_eq!(
        opens,
        HashMap::from([
            ((String::new(), "night".to_string()), at("2026-12-04T22:00:00Z")),
            ((String::new(), "broken".to_string()), Timestamp::MAX),
        ]),
        "namespaces without windows, and members' (not read yet), are not ranked"
    );
    assert_eq!(
        openings(targets, &declared, at("2026-12-04T23:00:00Z"))[&(String::new(), "night".to_string())],
        at("2026-12-04T23:00:00Z")
    );
}

#[test]
fn windows_differing_only_by_name_are_compiled_once_and_keep_their_names() {
    let named =
        |name: Option<&str>| ChangeWindow { name: name.map(Into::into), ..allow("0 22 * * *", "1h", "UTC") };
    let labels: Vec<String> = [Some("nightly"), Some("late"), None]
        .into_iter()
        .map(|n| Window::compile(&named(n)).unwrap().label().to_string())
        .collect();
    assert_eq!(labels, ["nightly", "late", "0 22 * * *"]);
    let unnamed = ChangeWindow { name: None, ..named(Some("nightly")) };
    assert!(COMPILED.lock().unwrap().contains_key(&unnamed), "remembered without its name");
    assert!(!COMPILED.lock().unwrap().contains_key(&named(Some("late"))));
}

#[test]
fn the_search_for_an_opening_moves_on_fewer_times_the_more_windows_it_judges() {
    // Allowed 09:00-09:20, frozen 09:00-09:10: from 08:00 the search moves twice (to 09:00, then 09:10).
    let specs = [allow("0 9 * * *", "20m", "UTC"), window(WindowKind::Deny, "0 9 * * *", "10m", Some("UTC"))];
    let each = |n: usize| -> Vec<OwnerWindows> {
        (0..n).map(|i| owner(Owner::Namespace(format!("ns-{i}")), &specs)).collect()
    };
    let (few, many) = (each(10), each(3000));
    let few: Vec<&OwnerWindows> = few.iter().collect();
    assert_eq!(opens(&few, "2026-12-04T08:00:00Z"), Some(Some(at("2026-12-04T09:10:00Z"))));
    // 6,000 windows: one move only, so the opening is not found yet; the hold is judged all the same.
    let many: Vec<&OwnerWindows> = many.iter().collect();
    match judge(&many, at("2026-12-04T08:00:00Z")) {
        Verdict::Closed { hold, others, opens } => {
            assert_eq!((hold.kind, opens), (WindowKind::Allow, None));
            assert_eq!(others.len(), 2999, "every owner's hold is named");
        }
        Verdict::Open => panic!("closed at 08:00"),
    }
}
