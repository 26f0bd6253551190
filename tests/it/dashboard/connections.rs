//! The session's connections are its own: one the session token was shown on stays open for the next
//! call (and is never closed to make room for a flood's), while one that showed none is answered once and
//! closed, as on every listener.

use std::{io::Write, time::Duration};

use testkit::dashboard::Dashboard;

/// Sends `requests` pipelined on one connection to the dashboard (the last asks to close), and returns
/// all that came back until the server closed it.
async fn pipelined(dash: &Dashboard, requests: Vec<String>) -> String {
    let address = dash.origin.trim_start_matches("http://").to_string();
    tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(&address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        stream.write_all(requests.concat().as_bytes()).unwrap();
        let mut answers = String::new();
        let _ = std::io::Read::read_to_string(&mut stream, &mut answers);
        answers
    })
    .await
    .unwrap()
}

fn request(host: &str, path: &str, token: Option<&str>, last: bool) -> String {
    let authorization = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let close = if last { "Connection: close\r\n" } else { "" };
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{authorization}{close}\r\n")
}

#[tokio::test]
async fn the_sessions_connections_stay_open_and_others_are_answered_once() {
    let dash = Dashboard::start(&testkit::cluster().kubeconfig, &[]).await;
    let host = dash.origin.trim_start_matches("http://").to_string();
    let token = Some(dash.token.as_str());
    let session = pipelined(
        &dash,
        vec![request(&host, "/api/me", token, false), request(&host, "/api/me", token, true)],
    );
    let session = session.await;
    assert_eq!(
        session.matches("HTTP/1.1 200").count(),
        2,
        "both calls answered on one connection: {session}"
    );
    let anonymous =
        pipelined(&dash, vec![request(&host, "/", None, false), request(&host, "/", None, true)]).await;
    assert_eq!(anonymous.matches("HTTP/1.1 ").count(), 1, "answered once, then closed: {anonymous}");
    assert!(anonymous.to_ascii_lowercase().contains("connection: close"), "{anonymous}");
}
