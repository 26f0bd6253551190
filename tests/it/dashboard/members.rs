//! A rollout across two member clusters in the dashboard, against the hub and the members of the test
//! environment: the grid by wave (canary: member-1, then prod: member-2), each cluster's batches and targets
//! under it, pending before it starts and healthy once it succeeded; then rolled back from the page, every
//! target it changed on either member shown restored.

use serde_json::{Value, json};
use testkit::{
    browser::Browser,
    dashboard::Dashboard,
    fleet::{NEXT_IMAGE, READY_IMAGE, has_plan, phase, with_fleet},
    operator::Operator,
};

use super::{DEADLINE, open_grid, press, wait_cells, wait_phase};
use crate::members::support::{self, OPERATOR_ACCOUNT, register, site, spec, tidy, unique};
use fleetroll::api::Phase;

/// The grid as the page lays it out: each wave, its clusters, and each cluster's batches and targets.
const LAYOUT: &str = r#"
return [...document.querySelectorAll('#grid .wave')].map(w => ({
  wave: w.querySelector('h3 .v')?.textContent,
  clusters: [...w.querySelectorAll('.cluster')].map(c => ({
    cluster: c.querySelector('.gh .v')?.textContent,
    batches: [...c.querySelectorAll('.batch')].map(b => Number(b.dataset.batch)),
    targets: [...c.querySelectorAll('[data-target]')].map(t => t.dataset.target),
  })),
}));
"#;

#[tokio::test]
async fn a_rollout_across_members_is_shown_by_wave_and_cluster_and_rolled_back_from_the_page() {
    if !support::members_up() {
        return;
    }
    let _shared = support::FREEZE.read().await;
    with_fleet("dash-waves", 0, |fleet| async move {
        let team = unique("dash-waves");
        let (one, two) = tokio::join!(
            site("member-1", &team, &team, 3, READY_IMAGE, true),
            site("member-2", &team, &team, 3, READY_IMAGE, true),
        );
        register(&fleet, &[&one, &two], OPERATOR_ACCOUNT).await;
        let _op = Operator::start(&fleet.ns, &[], &[]);
        let mut spec = spec(NEXT_IMAGE, &team, 2);
        spec["paused"] = json!(true);
        fleet.rollout("across", spec).await;
        fleet.wait_rollout("across", "a plan", DEADLINE, has_plan).await;

        let dash = Dashboard::start(&testkit::cluster().kubeconfig, &[]).await;
        let browser = Browser::start().await;
        open_grid(&browser, &dash, &format!("#/r/{}/across", fleet.ns), 6).await;
        let target = |member: &str, i: usize| format!("{member}/{team}/web-{i:02}");
        let names = |member: &str| (0..3).map(|i| Value::from(target(member, i))).collect::<Vec<_>>();
        let expected = json!([
            {"wave": "canary", "clusters": [{"cluster": "member-1", "batches": [0, 1], "targets": names("member-1")}]},
            {"wave": "prod", "clusters": [{"cluster": "member-2", "batches": [2, 3], "targets": names("member-2")}]},
        ]);
        assert_eq!(browser.js(LAYOUT, vec![]).await, expected, "waves, then clusters, then batches");
        let all = |state: &'static str| {
            ["member-1", "member-2"].iter().flat_map(|m| (0..3).map(move |i| (target(m, i), state))).collect::<Vec<_>>()
        };
        wait_cells(&browser, "every cell pending before it starts", &all("pending")).await;

        fleet.patch_spec("across", json!({"paused": false})).await;
        fleet.wait_rollout("across", "the rollout to succeed", DEADLINE, |f| phase(f) == Phase::Succeeded).await;
        wait_cells(&browser, "every cell healthy", &all("healthy")).await;

        let (outcome, said) = press(&browser, "#rollout button[data-action=\"rollback\"]").await;
        assert_eq!(outcome, "ok", "{said}");
        fleet.wait_rollout("across", "the rollback", DEADLINE, |f| phase(f) == Phase::RolledBack).await;
        wait_phase(&browser, "RolledBack").await;
        wait_cells(&browser, "every cell restored", &all("restored")).await;
        for site in [&one, &two] {
            for (name, (image, _)) in site.state().await {
                assert_eq!(image, READY_IMAGE, "{}/{name} restored", site.member.name);
            }
        }
        browser.screenshot(&super::screenshot_path("members")).await;
        tidy(&[&one, &two]).await;
    })
    .await;
}
