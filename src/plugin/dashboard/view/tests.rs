use serde_json::json;

use super::*;
use crate::core::plan::Plan;

fn target(ns: &str, name: &str) -> PlannedTarget {
    PlannedTarget {
        cluster: String::new(),
        namespace: ns.into(),
        name: name.into(),
        previous_image: "old".into(),
    }
}

fn plan() -> Plan {
    Plan {
        hash: "h1".into(),
        batches: vec![
            vec![target("shop", "a"), target("shop", "b")],
            vec![target("shop", "c"), target("shop", "d")],
            vec![target("shop", "e")],
        ],
    }
}

fn rollout(status: serde_json::Value) -> FleetRollout {
    serde_json::from_value(json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
        "metadata": {"name": "web", "namespace": "shop", "uid": "u1"},
        "spec": {"image": "web:2", "targets": {"kind": "Deployment", "selector": {}},
                 "creator": {"username": "alice"}},
        "status": status,
    }))
    .expect("a rollout")
}

fn seen(applied: &str, readiness: Readiness) -> Sight {
    Sight::Seen(Seen { applied: Some(applied.into()), readiness })
}

#[test]
fn each_cell_follows_its_batch_and_what_was_seen_of_its_target() {
    let fr = rollout(json!({
        "phase": "Progressing", "currentBatch": 1,
        "plan": {"hash": "h1", "totalTargets": 5, "totalBatches": 3, "storage": "Status"},
        "batches": [
            {"index": 0, "size": 2, "state": "Succeeded", "idempotencyKey": "u1/1/0"},
            {"index": 1, "size": 2, "state": "Verifying", "idempotencyKey": "u1/1/1"}],
        "failures": [{"cluster": "", "namespace": "shop", "name": "b", "batch": 0, "reason": "TargetProtected",
                      "message": "protected"}],
    }));
    let grid = grid(&fr, &plan(), &|t| match t.name.as_str() {
        "c" => seen("u1/1/1", Readiness::Ready),
        "d" => seen("u1/1/1", Readiness::NotReady("rolling".into())),
        _ => Sight::Unread,
    });
    assert_eq!(grid.targets, ["shop/a", "shop/b", "shop/c", "shop/d", "shop/e"]);
    assert_eq!(grid.states, [Cell::Healthy, Cell::Refused, Cell::Soaking, Cell::Changing, Cell::Pending]);
    assert_eq!(
        grid.groups.iter().map(|g| (g.batch, g.start, g.count)).collect::<Vec<_>>(),
        [(0, 0, 2), (1, 2, 2), (2, 4, 1)]
    );
}

#[test]
fn a_target_not_changed_yet_while_its_batch_applies_is_still_pending() {
    let fr = rollout(json!({
        "phase": "Progressing", "currentBatch": 0,
        "batches": [{"index": 0, "size": 2, "state": "Applying", "idempotencyKey": "u1/1/0"}],
    }));
    let grid = grid(&fr, &plan(), &|t| match t.name.as_str() {
        "a" => seen("u1/1/0", Readiness::NotReady("rolling".into())),
        "b" => Sight::Seen(Seen { applied: None, readiness: Readiness::Ready }),
        _ => Sight::Unread,
    });
    assert_eq!(&grid.states[..2], [Cell::Changing, Cell::Pending]);
}

#[test]
fn batches_status_no_longer_holds_are_done_once_the_rollout_is_past_them() {
    let fr = rollout(json!({"phase": "Progressing", "currentBatch": 2, "batches": [
        {"index": 2, "size": 1, "state": "Applying", "idempotencyKey": "u1/1/2"}]}));
    let grid = grid(&fr, &plan(), &|_| Sight::Unread);
    assert_eq!(grid.states, [Cell::Healthy, Cell::Healthy, Cell::Healthy, Cell::Healthy, Cell::Changing]);
    let done = rollout(json!({"phase": "Succeeded", "currentBatch": 2}));
    assert!(grid_states(&done).iter().all(|c| *c == Cell::Healthy));
}

fn grid_states(fr: &FleetRollout) -> Vec<Cell> {
    grid(fr, &plan(), &|_| Sight::Unread).states
}

#[test]
fn a_target_deleted_after_planning_is_skipped_whether_seen_gone_or_recorded() {
    let fr = rollout(json!({
        "phase": "Progressing", "currentBatch": 1,
        "batches": [
            {"index": 0, "size": 2, "state": "Succeeded", "idempotencyKey": "u1/1/0"},
            {"index": 1, "size": 2, "state": "Verifying", "idempotencyKey": "u1/1/1"}],
        "failures": [{"namespace": "shop", "name": "b", "batch": 0, "reason": "TargetMissing",
                      "message": "the target was deleted during the rollout"},
                     {"namespace": "shop", "name": "a", "batch": 0, "reason": "Timeout", "message": "slow"}],
    }));
    // b: recorded by the operator, unread here; e: gone from a complete list before its batch; a: failed,
    // as the operator recorded it, and deleted since.
    let grid = grid(&fr, &plan(), &|t| match t.name.as_str() {
        "a" | "e" => Sight::Gone,
        _ => Sight::Unread,
    });
    assert_eq!(grid.states, [Cell::Failed, Cell::Skipped, Cell::Changing, Cell::Changing, Cell::Skipped]);
}

fn rolled_back(state: &str) -> FleetRollout {
    rollout(json!({
        "phase": if state == "Done" { "RolledBack" } else { "RollingBack" }, "currentBatch": 1,
        "batches": [
            {"index": 0, "size": 2, "state": "Succeeded", "idempotencyKey": "u1/1/0"},
            {"index": 1, "size": 2, "state": "Verifying", "idempotencyKey": "u1/1/1", "denied": ["shop/d"]}],
        "failures": [{"namespace": "shop", "name": "b", "batch": 0, "reason": "TargetMissing", "message": "gone"},
                     {"namespace": "shop", "name": "d", "batch": 1, "reason": "ChangeDenied", "message": "no"}],
        "rollback": {"state": state, "idempotencyKey": "u1/1/rollback", "reason": "RollbackRequested",
                     "startedAt": "2026-12-05T10:00:00Z", "restored": 2, "skipped": 1},
    }))
}

#[test]
fn a_rollback_restores_the_cells_it_put_back() {
    // While restoring: a target that carries the rollback's key is restored; the others are as they were.
    let restoring = grid(&rolled_back("Restoring"), &plan(), &|t| match t.name.as_str() {
        "a" => seen("u1/1/rollback", Readiness::Ready),
        "c" => seen("u1/1/1", Readiness::Ready),
        _ => Sight::Unread,
    });
    assert_eq!(restoring.states, [Cell::Restored, Cell::Skipped, Cell::Soaking, Cell::Failed, Cell::Pending]);
    // Done, nothing read: what it owed is restored (not d, whose change was denied; not e, never reached).
    let done = grid(&rolled_back("Done"), &plan(), &|_| Sight::Unread);
    assert_eq!(done.states, [Cell::Restored, Cell::Skipped, Cell::Restored, Cell::Failed, Cell::Pending]);
    // Done, read: the targets say it themselves. c still carries the rollout's key (someone else changed it
    // since, so the rollback left it): not restored, and not soaking in a rollout that has ended.
    let read = grid(&rolled_back("Done"), &plan(), &|t| match t.name.as_str() {
        "a" => seen("u1/1/rollback", Readiness::Ready),
        "c" => seen("u1/1/1", Readiness::Ready),
        _ => Sight::Unread,
    });
    assert_eq!(&read.states[..3], [Cell::Restored, Cell::Skipped, Cell::Healthy]);
}

fn rolled_back_across(restored: u32) -> FleetRollout {
    rollout(json!({
        "phase": "RolledBack", "currentBatch": 2,
        "batches": [
            {"index": 0, "size": 2, "state": "Succeeded", "idempotencyKey": "u1/1/0"},
            {"index": 1, "size": 2, "state": "Succeeded", "idempotencyKey": "u1/1/1"},
            {"index": 2, "size": 1, "state": "Verifying", "idempotencyKey": "u1/1/2"}],
        // a failed its health checks at its batch; c, of batch 1, was changed by someone else since, which
        // the rollback files under the batch in flight.
        // c too timed out first; the newest record says most.
        "failures": [{"namespace": "shop", "name": "a", "batch": 0, "reason": "Timeout", "message": "slow"},
                     {"namespace": "shop", "name": "c", "batch": 1, "reason": "Timeout", "message": "slow"},
                     {"namespace": "shop", "name": "c", "batch": 2, "reason": "ImageChangedByOthers",
                      "message": "left as it is"}],
        "rollback": {"state": "Done", "idempotencyKey": "u1/1/rollback", "reason": "RollbackRequested",
                     "startedAt": "2026-12-05T10:00:00Z", "restored": restored, "skipped": 1},
    }))
}

#[test]
fn a_rollback_done_restores_what_it_owed_but_what_it_said_it_could_not() {
    let done = grid(&rolled_back_across(4), &plan(), &|_| Sight::Unread);
    assert_eq!(done.states, [Cell::Restored, Cell::Restored, Cell::Failed, Cell::Restored, Cell::Restored]);
    // Read: c carries the rollback's key, but was changed by someone else since it was put back (the
    // newer record); e was deleted before the rollback came to it.
    let read = grid(&rolled_back_across(4), &plan(), &|t| match t.name.as_str() {
        "c" => seen("u1/1/rollback", Readiness::Ready),
        "e" => Sight::Gone,
        _ => Sight::Unread,
    });
    assert_eq!(read.states, [Cell::Restored, Cell::Restored, Cell::Failed, Cell::Restored, Cell::Skipped]);
}

#[test]
fn a_rollback_waiting_for_a_member_shows_the_others_restored() {
    let member =
        |cluster: &str, name: &str| PlannedTarget { cluster: cluster.into(), ..target("shop", name) };
    let plan = Plan {
        hash: "h1".into(),
        batches: vec![vec![member("member-1", "a"), member("member-1", "b")], vec![member("member-2", "c")]],
    };
    let fr = rollout(json!({
        "phase": "RollingBack", "currentBatch": 1,
        "batches": [
            {"index": 0, "size": 2, "state": "Succeeded", "idempotencyKey": "u1/1/0"},
            {"index": 1, "size": 1, "state": "Succeeded", "idempotencyKey": "u1/1/1"}],
        "rollback": {"state": "Restoring", "idempotencyKey": "u1/1/rollback", "reason": "RollbackRequested",
                     "startedAt": "2026-12-05T10:00:00Z", "restored": 2, "unreached": ["member-2"]},
    }));
    let states = grid(&fr, &plan, &|_| Sight::Unread).states;
    assert_eq!(states, [Cell::Restored, Cell::Restored, Cell::Healthy], "member-2 still runs the new image");
}

#[test]
fn a_target_deleted_once_its_batch_settled_is_not_skipped() {
    let fr = rollout(json!({"phase": "Progressing", "currentBatch": 1, "batches": [
        {"index": 0, "size": 2, "state": "Succeeded", "idempotencyKey": "u1/1/0"},
        {"index": 1, "size": 2, "state": "Applying", "idempotencyKey": "u1/1/1"}]}));
    let states =
        grid(&fr, &plan(), &|t| if t.name == "a" || t.name == "c" { Sight::Gone } else { Sight::Unread })
            .states;
    assert_eq!(&states[..3], [Cell::Healthy, Cell::Healthy, Cell::Skipped]);
}

#[test]
fn only_changed_cells_are_sent() {
    let before = [Cell::Pending, Cell::Changing, Cell::Healthy];
    let after = [Cell::Pending, Cell::Soaking, Cell::Healthy];
    assert_eq!(changes(&before, &after), [(1, Cell::Soaking)]);
    assert_eq!(serde_json::to_value(changes(&before, &after)).expect("json"), json!([[1, "soaking"]]));
}

#[test]
fn a_rollout_says_what_it_waits_for_first() {
    let waiting = rollout(json!({"phase": "WaitingForApproval", "message": "batch 2 waits for an approval"}));
    assert_eq!(
        waiting_for(&waiting),
        WaitingFor { kind: Waiting::Approval, message: "batch 2 waits for an approval".into() }
    );
    let budget =
        rollout(json!({"phase": "Paused", "reason": "FailureBudgetExceeded", "message": "2 failed"}));
    assert_eq!(waiting_for(&budget).kind, Waiting::Budget);
    let window =
        rollout(json!({"phase": "Progressing", "windowHold": {"owner": "namespace shop", "window": "nights",
        "kind": "Allow", "hash": "x", "since": "2026-12-05T00:00:00Z", "opensAt": "2026-12-05T22:00:00Z"}}));
    let said = waiting_for(&window);
    assert_eq!(said.kind, Waiting::Window);
    assert!(said.message.contains("nights") && said.message.contains("namespace shop"), "{}", said.message);
    let done = rollout(json!({"phase": "Succeeded"}));
    assert_eq!(waiting_for(&done).kind, Waiting::None);
}

#[test]
fn a_summary_counts_batches_from_one_and_names_its_creator() {
    let fr = rollout(json!({"phase": "Progressing", "currentBatch": 1,
        "plan": {"hash": "h1", "totalTargets": 5, "totalBatches": 3, "storage": "Status"}}));
    let s = summary(&fr);
    assert_eq!((s.batch, s.total_batches, s.total_targets), (Some(2), 3, 5));
    assert_eq!(s.creator.as_deref(), Some("alice"));
    assert_eq!(s.image, "web:2");
}
