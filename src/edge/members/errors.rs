//! What an error from a member means: its credentials refused, the member out of reach, or an answer;
//! and how to say so without printing credentials.

use kube::client::AuthError;

use crate::edge::answers::cut_off;
use crate::edge::egress::chain;

/// Whether the member refused the client's credentials (401): they were rotated or have expired, so the
/// client must be rebuilt from its Secret ([`super::Members::forget`]).
pub fn is_unauthorized(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 401)
}

/// Whether the member could not be reached, as opposed to an answer from it: no connection (refused,
/// timed out, no such host, a failed TLS handshake), no answer in time, a connection lost midway, or a
/// gateway before it saying so (502, 503, 504). A failing exec plugin is not one: that is the
/// credentials, whichever way the member is. Nor is an answer cut off at its bound: that is an answer.
pub fn is_unreachable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => matches!(s.code, 502..=504),
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            auth_error(e).is_none() && cut_off(e).is_none()
        }
        _ => false,
    }
}

/// The credentials error somewhere in `e`'s chain (an exec plugin run when a token is refreshed is
/// reported through the client's service stack).
fn auth_error(e: &kube::Error) -> Option<&AuthError> {
    if let kube::Error::Auth(auth) = e {
        return Some(auth);
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(auth) = cause.downcast_ref::<AuthError>() {
            return Some(auth);
        }
        source = cause.source();
    }
    None
}

/// `e` in words fit for a status, an event or a log. kube's message for a failed exec plugin carries
/// the plugin's environment and output, which may hold credentials: only its exit status is kept.
pub fn describe(e: &kube::Error) -> String {
    if let Some(auth) = auth_error(e) {
        return describe_auth(auth);
    }
    if let Some(cut) = cut_off(e) {
        return cut.to_string();
    }
    match e {
        kube::Error::Api(s) if s.reason == "Failed to parse error data" => {
            // Not the API server's Status: a proxy's or load balancer's page, of any length.
            format!("the member answered {} (not a Kubernetes API answer)", s.code)
        }
        kube::Error::Api(s) => format!("the member answered {} {}: {}", s.code, s.reason, cut(&s.message)),
        other if is_unreachable(other) => format!("the member cannot be reached: {}", cut(&chain(other))),
        other => cut(&chain(other)),
    }
}

/// An exec plugin's or a credential's failure, without the plugin's environment or output.
fn describe_auth(e: &AuthError) -> String {
    match e {
        AuthError::AuthExecRun { out, .. } => format!(
            "the exec plugin failed ({}); its output is not shown, as it may hold credentials",
            out.status
        ),
        AuthError::AuthExecStart(io) => format!("the exec plugin could not be started: {io}"),
        AuthError::AuthExecParse(_) => "the exec plugin's output is not an ExecCredential".into(),
        AuthError::ExecPluginFailed => "the exec plugin's ExecCredential has no status".into(),
        AuthError::InvalidBearerToken(_) => "the token is not valid in an HTTP header".into(),
        AuthError::InvalidBasicAuth(_) => "the user name or password is not valid in an HTTP header".into(),
        AuthError::MalformedTokenExpirationDate(_) => "the exec plugin's token expiry is not a time".into(),
        other => format!("authentication failed: {other}"),
    }
}

/// A member's message, cut to a size fit for a status.
fn cut(message: &str) -> String {
    crate::core::text::cut(message, 300)
}
