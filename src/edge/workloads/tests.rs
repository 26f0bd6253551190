use std::collections::BTreeMap;

use super::*;
use crate::core::rollout::HeldBy;

fn facts(applied: Option<&str>, image: &str) -> WorkloadFacts {
    WorkloadFacts {
        namespace: "ns".into(),
        name: "web".into(),
        labels: Some(BTreeMap::new()),
        applied: applied.map(String::from),
        containers: vec![("web".into(), Ok(image.into()))],
        containers_cut: 0,
        generation: 1,
        status: Default::default(),
        resource_version: Some("41".into()),
    }
}

#[test]
fn a_target_is_changed_only_as_it_was_judged_and_never_under_another_running_rollout() {
    let holder = |key: &str| {
        let owner = |rollout: &str, running| HeldBy { rollout: rollout.into(), running };
        match key.split('/').next() {
            Some("other-uid") => Some(owner("team/other", true)),
            Some("finished-uid") => Some(owner("team/finished", false)),
            _ => None,
        }
    };
    let change = Change {
        kind: TargetKind::Deployment,
        container: None,
        key: "own-uid/1/0",
        rollout: "team/own",
        between: "",
        holder: &holder,
    };
    // Free (never rolled, or last changed by a finished rollout before this plan): sent against the
    // version judged.
    for applied in [None, Some("finished-uid/3/1"), Some("gone-uid/1/0")] {
        let Judged::Send(body) = judge(&change, &facts(applied, "web:v1"), "web:v2", "web:v1") else {
            panic!("a free target is changed");
        };
        assert_eq!(body["metadata"]["resourceVersion"], "41");
        assert_eq!(body["spec"]["template"]["spec"]["containers"][0]["image"], "web:v2");
    }
    // Another running rollout changed it first: left alone, whatever the plan says.
    let held = judge(&change, &facts(Some("other-uid/1/0"), "web:v9"), "web:v2", "web:v1");
    assert!(matches!(held, Judged::Done(PatchResult::Held(ref o)) if o.rollout == "team/other"));
    // Changed by another rollout after this plan was frozen: that one's, even once it has ended.
    let since = judge(&change, &facts(Some("finished-uid/3/1"), "web:v9"), "web:v2", "web:v1");
    assert!(matches!(since, Judged::Done(PatchResult::Held(ref o)) if o.rollout == "team/finished"));
    // Ours already: a replay changes nothing.
    let replay = judge(&change, &facts(Some("own-uid/1/0"), "web:v2"), "web:v2", "web:v1");
    assert!(matches!(replay, Judged::Done(PatchResult::Unchanged)));
}
