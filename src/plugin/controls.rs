//! The controls: pause, resume, abort, rollback (spec switches) and approvals.

use std::process::ExitCode;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::{Api, Client, api::PostParams};

use super::{Exit, PluginError, args::Output, print};
use crate::{api::FleetRollout, edge::control};

const FIELD_MANAGER: &str = "kubectl-fleetroll";

/// Sets spec switches (`{"paused": true}`, …) and says `done`.
pub(super) async fn set(
    client: &Client,
    ns: &str,
    name: &str,
    spec: serde_json::Value,
    done: &str,
    output: Option<Output>,
) -> Result<ExitCode, PluginError> {
    let fr = control::set(client, ns, name, spec, FIELD_MANAGER).await?;
    match output {
        Some(o) => print(&fr, o)?,
        None => println!("fleetrollout.fleetroll.dev/{name} {done}"),
    }
    Ok(Exit::Done.into())
}

/// Makes the caller the creator of a rollout that has none: admission records whoever writes the field
/// (whatever is sent), and refuses it unless they may change the rollout's targets.
pub(super) async fn adopt(
    client: &Client,
    ns: &str,
    name: &str,
    output: Option<Output>,
) -> Result<ExitCode, PluginError> {
    let found = control::get(client, ns, name).await?;
    if let Some(c) = &found.spec.creator {
        return Err(PluginError::Refused(format!(
            "FleetRollout {ns}/{name} was created by {}, recorded when it was created; only a rollout \
             without a recorded creator can be adopted",
            c.username
        )));
    }
    let claim = serde_json::json!({"creator": {"username": "recorded by admission"}});
    let fr = control::set(client, ns, name, claim, FIELD_MANAGER).await?;
    match output {
        Some(o) => print(&fr, o)?,
        None => {
            let who = fr.spec.creator.as_ref().map_or("(not recorded)", |c| c.username.as_str());
            println!("fleetrollout.fleetroll.dev/{name} adopted: its changes are made as {who} from now on");
        }
    }
    Ok(Exit::Done.into())
}

/// Approves `batch` (1-based, as `status` shows them; the waiting one when absent) of `plan_hash` under
/// `gates_hash` (each the current one when absent).
pub(super) async fn approve(
    client: &Client,
    ns: &str,
    name: &str,
    what: control::Approving<'_>,
    output: Option<Output>,
) -> Result<ExitCode, PluginError> {
    let who = whoami(client).await;
    let batch = match what.batch {
        Some(0) => return Err(PluginError::Usage("batches are numbered from 1".into())),
        b => b.map(|b| b - 1),
    };
    let what = control::Approving { batch, ..what };
    let fr = control::approve(client, ns, name, what, who.as_deref(), FIELD_MANAGER).await?;
    match output {
        Some(o) => print(&fr, o)?,
        None => println!("{}", approved(name, &fr, who.as_deref())),
    }
    Ok(Exit::Done.into())
}

/// What an approval says: the latest batch approved, of which plan, and by whom when known.
fn approved(name: &str, fr: &FleetRollout, who: Option<&str>) -> String {
    let latest = fr.spec.approvals.iter().max_by_key(|a| a.batch);
    let what = latest
        .map(|a| format!("batch {} of plan {} with gates {}", a.batch + 1, a.plan_hash, a.gates_hash))
        .unwrap_or_default();
    let as_who = who.map(|w| format!(" as {w}")).unwrap_or_default();
    format!("fleetrollout.fleetroll.dev/{name} approved {what}{as_who}")
}

/// Who the API server says the kubeconfig's user is (SelfSubjectReview), for the approval record; None
/// when it will not say, and the approval then names no one.
async fn whoami(client: &Client) -> Option<String> {
    user_info(client).await?.username
}

/// The user and groups the API server says the kubeconfig's user is (SelfSubjectReview); None when it will
/// not say.
pub(super) async fn user_info(client: &Client) -> Option<k8s_openapi::api::authentication::v1::UserInfo> {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    let reviewed = api.create(&PostParams::default(), &SelfSubjectReview::default()).await.ok()?;
    reviewed.status?.user_info
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_approval_names_the_latest_batch_approved_one_based_and_who_approved_it() {
        let fr: FleetRollout = serde_json::from_value(json!({
            "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"image": "web:v2", "targets": {"kind": "Deployment", "selector": {}},
                     "approvals": [{"batch": 1, "planHash": "abc", "gatesHash": "def"},
                                   {"batch": 0, "planHash": "abc", "gatesHash": "def"}]}
        }))
        .unwrap();
        assert_eq!(
            approved("web", &fr, Some("alice")),
            "fleetrollout.fleetroll.dev/web approved batch 2 of plan abc with gates def as alice"
        );
        assert_eq!(
            approved("web", &fr, None),
            "fleetrollout.fleetroll.dev/web approved batch 2 of plan abc with gates def"
        );
    }
}
