//! What the page asks of the cluster besides watching: who the user is, the controls (each made as the
//! user, with the same code as the plugin's commands), and the plan a pasted manifest would get.

use axum::{
    Json,
    body::Bytes,
    extract::{Path, Query, State},
    http::StatusCode,
};
use kube::ResourceExt;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, Dash};
use crate::{
    api::{FleetRollout, PlannedTarget},
    edge::{control, discovery},
};

const FIELD_MANAGER: &str = "fleetroll-dashboard";
/// The largest manifest a preview reads.
const MANIFEST_MAX: usize = 256 * 1024;

pub async fn me(State(dash): State<Dash>) -> Json<Value> {
    let (user, groups) = whoami(&dash.client).await.unwrap_or_default();
    Json(json!({"user": user, "groups": groups}))
}

/// Who the API server says the kubeconfig's user is: None when it will not say.
async fn whoami(client: &kube::Client) -> Option<(String, Vec<String>)> {
    let info = super::super::controls::user_info(client).await?;
    Some((info.username.unwrap_or_default(), info.groups.unwrap_or_default()))
}

/// An approval as the page sends it: of the batch, plan and gates it showed (0-based batch).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApproveBody {
    batch: Option<u32>,
    plan_hash: Option<String>,
    gates_hash: Option<String>,
}

pub async fn act(
    State(dash): State<Dash>,
    Path((ns, name, action)): Path<(String, String, String)>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let client = &dash.client;
    let switch = |spec: Value| control::set(client, &ns, &name, spec, FIELD_MANAGER);
    let message = match action.as_str() {
        "approve" => {
            let body: ApproveBody = match body.is_empty() {
                true => ApproveBody::default(),
                false => serde_json::from_slice(&body).map_err(|e| {
                    ApiError::new(StatusCode::BAD_REQUEST, "Invalid", format!("the approval: {e}"))
                })?,
            };
            let who = whoami(client).await.map(|(user, _)| user).filter(|u| !u.is_empty());
            let approving = control::Approving {
                batch: body.batch,
                plan_hash: body.plan_hash.as_deref(),
                gates_hash: body.gates_hash.as_deref(),
                override_windows: false,
            };
            let fr = control::approve(client, &ns, &name, approving, who.as_deref(), FIELD_MANAGER).await?;
            // The batch asked for, else the one the rollout waited for (status has not moved on yet).
            let waited = fr.status.as_ref().and_then(|s| s.pending_approval.as_ref()).map(|p| p.batch);
            let batch = body.batch.or(waited).map_or(0, |b| b + 1);
            let as_who = who.map(|w| format!(" as {w}")).unwrap_or_default();
            format!("approved batch {batch} of {ns}/{name}{as_who}")
        }
        "pause" => switch(json!({"paused": true})).await.map(|_| format!("paused {ns}/{name}"))?,
        "resume" => {
            let token = k8s_openapi::jiff::Timestamp::now().to_string();
            switch(json!({"paused": false, "resumeToken": token}))
                .await
                .map(|_| format!("resumed {ns}/{name}"))?
        }
        "abort" => switch(json!({"abort": true})).await.map(|_| format!("abort of {ns}/{name} requested"))?,
        "rollback" => {
            switch(json!({"rollback": true})).await.map(|_| format!("rollback of {ns}/{name} requested"))?
        }
        other => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("no action called {other}"),
            ));
        }
    };
    Ok(Json(json!({"message": message})))
}

#[derive(Deserialize)]
pub struct PreviewQuery {
    namespace: Option<String>,
}

/// The plan a pasted manifest would get, through the same discovery and planning as the operator and
/// `kubectl fleetroll plan -f`. Member Secrets' exec plugins are never run from a web page.
pub async fn preview(
    State(dash): State<Dash>,
    Query(query): Query<PreviewQuery>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let invalid = |m: String| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", m);
    if body.len() > MANIFEST_MAX {
        return Err(invalid(format!("the manifest is larger than {} KiB", MANIFEST_MAX / 1024)));
    }
    let text = std::str::from_utf8(&body).map_err(|_| invalid("the manifest is not UTF-8 text".into()))?;
    let mut fr: FleetRollout =
        serde_saphyr::from_str(text).map_err(|e| invalid(format!("this is not a FleetRollout: {e}")))?;
    if fr.metadata.namespace.is_none() {
        fr.metadata.namespace = Some(query.namespace.unwrap_or_else(|| dash.namespace.clone()));
    }
    let exec = super::super::plan::exec_policy(false);
    let previewed = discovery::preview(&dash.client, &dash.fleet_namespace, &fr, exec)
        .await
        .map_err(|e| control::ControlError::from_operator(e, "discovering the fleet"))?;
    let preview = previewed.map_err(|blocked| {
        invalid(format!("this rollout could not be planned ({}): {}", blocked.reason, blocked.message))
    })?;
    let waves = preview.clusters.as_ref().map(|c| c.waves.clone()).unwrap_or_default();
    let batches: Vec<Value> = preview
        .plan
        .batches
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let index = i as u32;
            let wave = waves.iter().find(|w| (w.first_batch..=w.last_batch).contains(&index)).map(|w| &w.name);
            json!({"index": index, "wave": wave, "targets": b.iter().map(PlannedTarget::key).collect::<Vec<_>>()})
        })
        .collect();
    Ok(Json(json!({
        "namespace": fr.namespace(),
        "planHash": preview.plan.hash,
        "totalTargets": preview.plan.total_targets(),
        "batches": batches,
        "notes": preview.notes,
    })))
}
