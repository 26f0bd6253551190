//! `kubectl fleetroll dashboard`: a web page of every rollout the user can read, live, served on this
//! machine's loopback and acting with the user's own kubeconfig identity (as Argo Rollouts' dashboard
//! does). Nothing runs in the cluster. The page (TypeScript under `dashboard/`, built into `assets/`) is
//! embedded in the binary; `docs/src/dashboard.md` says what it shows and how it is kept safe.

mod actions;
mod assets;
mod guard;
mod list;
mod rollout;
mod sse;
mod targets;
mod timeline;
mod view;

use std::{net::SocketAddr, process::ExitCode, sync::Arc};

use axum::{
    Json, Router,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use kube::Client;
use serde_json::json;

use super::{Exit, PluginError};
use crate::edge::control::ControlError;

/// What every handler shares.
#[derive(Clone)]
pub(super) struct Dash {
    client: Client,
    /// The kubeconfig's namespace: where the list falls back to when the user may not list every one.
    namespace: String,
    fleet_namespace: String,
    token: Arc<str>,
    /// The Host values requests may carry; None when listening beyond loopback was asked for.
    hosts: Option<Arc<[String]>>,
}

/// The options of the command.
pub(super) struct Options<'a> {
    pub address: std::net::IpAddr,
    pub port: u16,
    pub open: bool,
    pub allow_remote: bool,
    pub fleet_namespace: &'a str,
}

pub(super) async fn dashboard(
    client: &Client,
    ns: &str,
    options: Options<'_>,
) -> Result<ExitCode, PluginError> {
    if !options.address.is_loopback() && !options.allow_remote {
        return Err(PluginError::Usage(format!(
            "{} is not a loopback address: the dashboard acts with your credentials, so it listens on 127.0.0.1 \
             unless --allow-remote says otherwise",
            options.address
        )));
    }
    // The operator's listener: bounded connections and header deadlines, as on every listener of ours.
    let listener =
        crate::runtime::http::listen(SocketAddr::new(options.address, options.port)).map_err(|e| {
            PluginError::Usage(format!("cannot listen on {}:{}: {e}", options.address, options.port))
        })?;
    let listening = listener.local_addr().map_err(|e| PluginError::Failed(e.to_string()))?;
    let token = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    let dash = Dash {
        client: client.clone(),
        namespace: ns.to_string(),
        fleet_namespace: options.fleet_namespace.to_string(),
        token: token.into(),
        // Listening beyond loopback, the page is reached by names only the person knows: any Host, the
        // token and the same-origin check still required.
        hosts: (!options.allow_remote).then(|| guard::allowed_hosts(listening).into()),
    };
    let url = format!("http://{}/#token={}", shown_address(listening), dash.token);
    println!("fleetroll dashboard: {url}");
    let opened = if options.open { open_browser(&url) } else { None };
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            let _ = tokio::signal::ctrl_c().await;
            stop.cancel();
        }
    });
    let served = crate::runtime::http::serve(listener, router(dash), stop).await;
    if let Some(file) = opened {
        let _ = std::fs::remove_file(file);
    }
    served.map_err(|e| PluginError::Failed(format!("serving the dashboard: {e}")))?;
    Ok(Exit::Done.into())
}

fn router(dash: Dash) -> Router {
    Router::new()
        .route("/", get(assets::index))
        .route("/assets/{file}", get(assets::file))
        .route("/api/me", get(actions::me))
        .route("/api/streams/rollouts", get(list::stream))
        .route("/api/streams/rollouts/{namespace}/{name}", get(rollout::stream))
        .route("/api/rollouts/{namespace}/{name}/{action}", post(actions::act))
        .route("/api/plan", post(actions::preview))
        .layer(axum::middleware::from_fn_with_state(dash.clone(), guard::guard))
        .with_state(dash)
}

/// Where to reach an address listened on: a wildcard is reached through loopback.
fn shown_address(listening: SocketAddr) -> SocketAddr {
    match listening.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => SocketAddr::from(([127, 0, 0, 1], listening.port())),
        ip if ip.is_unspecified() => SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, listening.port())),
        _ => listening,
    }
}

/// Opens `url` in the desktop's browser when there is a desktop; the address is printed either way. The
/// browser is handed a file only this user may read that forwards to it, never the address itself: a
/// command line (the opener's, the browser's) is there for every user of the machine to read, token and all.
/// Returns the file, to delete when the dashboard stops.
fn open_browser(url: &str) -> Option<std::path::PathBuf> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let opener = match std::env::consts::OS {
        "macos" => "open",
        "linux" if std::env::var_os("DISPLAY").is_some() || std::env::var_os("WAYLAND_DISPLAY").is_some() => {
            "xdg-open"
        }
        _ => return None,
    };
    let path =
        std::env::temp_dir().join(format!("fleetroll-dashboard-{}.html", uuid::Uuid::new_v4().simple()));
    let page = format!(
        "<!doctype html><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"0;url={url}\">\
         <title>fleetroll dashboard</title><a href=\"{url}\">Open the fleetroll dashboard</a>\n"
    );
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| f.write_all(page.as_bytes()));
    let spawned = written.and_then(|()| {
        std::process::Command::new(opener)
            .arg(&path)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
    });
    match spawned {
        Ok(_) => Some(path),
        Err(e) => {
            eprintln!("could not open a browser ({opener}: {e}); open the address above");
            let _ = std::fs::remove_file(&path);
            None
        }
    }
}

/// An answer that is not a success, as the page reads it: `{"error": {"reason", "message"}}`. The
/// message is the API server's or the policy's own, unchanged.
#[derive(Debug)]
pub(super) struct ApiError {
    status: StatusCode,
    reason: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self { status, reason, message: message.into() }
    }
}

impl From<ControlError> for ApiError {
    fn from(e: ControlError) -> Self {
        let status = match &e {
            ControlError::NotFound { .. } => StatusCode::NOT_FOUND,
            ControlError::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            ControlError::Forbidden { .. } | ControlError::Refused(_) => StatusCode::FORBIDDEN,
            ControlError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ControlError::Changed(_) => StatusCode::CONFLICT,
            ControlError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        };
        let message = match &e {
            // The API server's words (an admission policy's message, RBAC's), verbatim.
            ControlError::Forbidden { reason, .. } | ControlError::Invalid { reason, .. } => reason.clone(),
            other => other.to_string(),
        };
        Self { status, reason: e.reason(), message }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({"error": {"reason": self.reason, "message": self.message}})))
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use kube::core::Status;

    use super::*;

    fn answer(code: u16, message: &str) -> ApiError {
        let status = Status::failure(message, "Reason").with_code(code);
        ControlError::from_kube(kube::Error::Api(Box::new(status)), "FleetRollout a/b").into()
    }

    #[test]
    fn the_api_servers_answers_keep_their_meaning_and_words() {
        let expired = answer(401, "Unauthorized");
        assert_eq!((expired.status, expired.reason), (StatusCode::UNAUTHORIZED, "Unauthorized"));
        assert!(expired.message.contains("credentials were not accepted"), "{}", expired.message);
        let refused = answer(403, "dash-bob may not approve fleetrollouts");
        assert_eq!(
            (refused.status, refused.message.as_str()),
            (StatusCode::FORBIDDEN, "dash-bob may not approve fleetrollouts")
        );
        assert_eq!(answer(503, "busy").status, StatusCode::SERVICE_UNAVAILABLE);
    }
}
