use std::collections::BTreeMap;

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::api::ObjectMeta;

use super::credentials::Auth;
use super::*;
use crate::api::ANALYSIS_SECRET_LABEL;

/// A throwaway self-signed certificate and its key, made for these tests only.
const TEST_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBiDCCAS+gAwIBAgIUallRJVbg28TK4WlTIkVLldCWy2EwCgYIKoZIzj0EAwIw
GTEXMBUGA1UEAwwOZmxlZXRyb2xsLXRlc3QwIBcNMjYxMTMwMTgyMDA4WhgPMjEy
NjExMDYxODIwMDhaMBkxFzAVBgNVBAMMDmZsZWV0cm9sbC10ZXN0MFkwEwYHKoZI
zj0CAQYIKoZIzj0DAQcDQgAEzVvlFdOT8vM6jItKnP3rUzzxvp+lNVgPqdSX4rjt
6w4AybZocIeTCIANvaPue5rM1eOqGejiCEHY0IfNz33sPKNTMFEwHQYDVR0OBBYE
FODFSB3NW32G/NuU0YoqcVgehkWqMB8GA1UdIwQYMBaAFODFSB3NW32G/NuU0Yoq
cVgehkWqMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDRwAwRAIgF86L4z8p
4QXRx4oZx7b8R0YaPrGxcCBA4HHvcjyXPZECIGQgz6x4E3bAdNoXPMyHDibQII3/
2PAOcG6wE5s35jUP
-----END CERTIFICATE-----
";
const TEST_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgu0vBHWlxKGng+1JP
8UJj+Aa7EsR0d/N49yTRfclXWS+hRANCAATNW+UV05Py8zqMi0qc/etTPPG+n6U1
WA+p1JfiuO3rDgDJtmhwh5MIgA29o+57mszV46oZ6OIIQdjQh83Pfew8
-----END PRIVATE KEY-----
";

fn secret(label: Option<&str>, data: &[(&str, &[u8])]) -> Secret {
    let labels = label.map(|v| BTreeMap::from([(ANALYSIS_SECRET_LABEL.to_string(), v.to_string())]));
    Secret {
        metadata: ObjectMeta {
            name: Some("prom".into()),
            namespace: Some("team".into()),
            labels,
            ..Default::default()
        },
        data: Some(data.iter().map(|(k, v)| (k.to_string(), ByteString(v.to_vec()))).collect()),
        ..Default::default()
    }
}

fn labelled(data: &[(&str, &[u8])]) -> Result<Credentials, String> {
    Credentials::from_secret(&secret(Some("true"), data))
}

#[test]
fn only_a_secret_labelled_for_analysis_is_used() {
    for label in [None, Some("false"), Some("True")] {
        let e = Credentials::from_secret(&secret(label, &[("token", b"hunter2")])).unwrap_err();
        assert!(
            e.contains("Secret team/prom") && e.contains("fleetroll.dev/analysis-credentials=true"),
            "{e}"
        );
        assert!(
            e.contains("cannot send the other Secrets of its namespace") && !e.contains("hunter2"),
            "{e}"
        );
    }
}

#[test]
fn credentials_are_a_token_or_a_username_and_password() {
    // Secrets made from files end in a newline, which no header may carry.
    let token = labelled(&[("token", b"hunter2\n")]).unwrap();
    // Auth has no Debug, which would show the secret.
    assert!(token.auth == Some(Auth::Bearer("hunter2".into())));
    let basic = labelled(&[("username", b"alice"), ("password", b"pa ss\r\n")]).unwrap();
    assert!(basic.auth == Some(Auth::Basic { username: "alice".into(), password: "pa ss".into() }));
    let big = vec![b'a'; MAX_VALUE_BYTES + 1];
    for (data, expected) in [
        (vec![("token", &b"hunter2"[..]), ("username", b"alice"), ("password", b"pw")], "keep one"),
        (vec![("token", b"hunter2"), ("password", b"pw")], "keep one"),
        (vec![("username", b"alice")], "no password"),
        (vec![("password", b"hunter2")], "no username"),
        (vec![("token", b"\n")], "token is empty"),
        (vec![("username", b""), ("password", b"hunter2")], "username is empty"),
        (vec![("token", b"hunter2\nX-Injected: 1")], "control characters or line breaks"),
        (vec![("token", b"hunter2\xff")], "not UTF-8"),
        (vec![("token", &big[..])], "larger than 64 KiB"),
        (vec![("unrelated", b"hunter2")], "holds none of the keys"),
    ] {
        let e = labelled(&data).unwrap_err();
        assert!(e.starts_with("Secret team/prom") && e.contains(expected), "{data:?}: {e}");
        assert!(!e.contains("hunter2"), "{e}");
    }
}

#[test]
fn certificates_are_checked_when_read_and_never_shown() {
    let (cert, key) = (TEST_CERT.as_bytes(), TEST_KEY.as_bytes());
    let full =
        labelled(&[("token", b"hunter2"), ("ca.crt", cert), ("tls.crt", cert), ("tls.key", key)]).unwrap();
    assert!(full.ca_pem.is_some() && full.identity_pem.is_some());
    let shown = format!("{full:?}");
    assert_eq!(shown, r#"Credentials { auth: "bearer token", ca: true, client_certificate: true }"#);
    assert!(
        labelled(&[("ca.crt", b"not a certificate")])
            .unwrap_err()
            .contains("ca.crt holds no PEM certificate")
    );
    assert!(labelled(&[("tls.crt", cert)]).unwrap_err().contains("both"));
    assert!(labelled(&[("tls.key", key)]).unwrap_err().contains("both"));
    let e = labelled(&[("tls.crt", cert), ("tls.key", b"hunter2")]).unwrap_err();
    assert!(e.contains("tls.crt and tls.key are not") && !e.contains("hunter2"), "{e}");
}
