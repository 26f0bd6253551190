//! People: users the API server knows by an x509 client certificate or an OpenID Connect ID token (not
//! ServiceAccounts), with groups, the way a cluster's humans log in. The certificate is issued through the
//! CertificateSigningRequest API (signer kubernetes.io/kube-apiserver-client), so the test cluster's own CA
//! signs it; the token by the test control plane's own issuer (tests/testenv/oidc-issuer.py).

use std::{path::PathBuf, process::Command, time::Duration};

use k8s_openapi::{
    ByteString,
    api::authorization::v1::ResourceAttributes,
    api::certificates::v1::{
        CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestSpec,
        CertificateSigningRequestStatus,
    },
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
    config::Kubeconfig,
};
use serde_json::json;

use super::{
    cli::repo_path,
    tenant::{client_from, until_allowed},
};

pub struct Person {
    /// The certificate's CN (or the token's subject, prefixed `oidc:`), as the API server names the user.
    pub username: String,
    /// The certificate's O values (or the token's groups, prefixed `oidc:`).
    pub groups: Vec<String>,
    pub kubeconfig: PathBuf,
    pub client: Client,
    /// A person of the test OpenID Connect issuer: the bearer token (an ID token signed by the issuer).
    pub token: Option<String>,
}

/// Base64url without padding, as JWTs are written.
fn b64url(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

impl Person {
    /// `name` in `groups`, with a certificate valid for an hour.
    pub async fn x509(admin: &Client, name: &str, groups: &[&str]) -> Person {
        let dir = PathBuf::from(repo_path("target/test-logs/people"));
        std::fs::create_dir_all(&dir).expect("target/test-logs/people");
        let unique = format!("{name}-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
        let key = dir.join(format!("{unique}.key"));
        let subject: String =
            std::iter::once(format!("/CN={name}")).chain(groups.iter().map(|g| format!("/O={g}"))).collect();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl").args(args).output().expect("run openssl");
            assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            out.stdout
        };
        let key_path = key.display().to_string();
        openssl(&["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", &key_path]);
        let csr = openssl(&["req", "-new", "-key", &key_path, "-subj", &subject]);

        let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
        let request = CertificateSigningRequest {
            metadata: ObjectMeta { name: Some(unique.clone()), ..Default::default() },
            spec: CertificateSigningRequestSpec {
                request: ByteString(csr),
                signer_name: "kubernetes.io/kube-apiserver-client".into(),
                usages: Some(vec!["client auth".into()]),
                expiration_seconds: Some(3600),
                ..Default::default()
            },
            status: None,
        };
        let mut created = csrs.create(&PostParams::default(), &request).await.expect("create the CSR");
        created.status = Some(CertificateSigningRequestStatus {
            conditions: Some(vec![CertificateSigningRequestCondition {
                type_: "Approved".into(),
                status: "True".into(),
                reason: Some("FleetrollTests".into()),
                message: Some("a person for the tests".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        csrs.replace_subresource("approval", &unique, &PostParams::default(), &created)
            .await
            .expect("approve the CSR");
        let signed =
            super::wait_for(&csrs, &unique, "the certificate to be issued", Duration::from_secs(60), |c| {
                c.status.as_ref().and_then(|s| s.certificate.as_ref()).is_some()
            })
            .await;
        let certificate = signed.status.and_then(|s| s.certificate).expect("a certificate").0;

        let admin_config = Kubeconfig::read_from(super::cluster().kubeconfig).expect("the test kubeconfig");
        let cluster = admin_config.clusters[0].cluster.clone().expect("a cluster");
        let cert = dir.join(format!("{unique}.crt"));
        std::fs::write(&cert, &certificate).expect("write the certificate");
        let kubeconfig = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": cluster.server, "certificate-authority-data": cluster.certificate_authority_data}}],
            "users": [{"name": name, "user": {"client-certificate": cert, "client-key": key}}],
            "contexts": [{"name": name, "context": {"cluster": "test", "user": name}}],
            "current-context": name,
        });
        let path = dir.join(format!("{unique}.kubeconfig"));
        std::fs::write(&path, kubeconfig.to_string()).expect("write the kubeconfig");
        let client = client_from(&path, None).await;
        Person {
            username: name.to_string(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            kubeconfig: path,
            client,
            token: None,
        }
    }

    /// `name` in `groups` of the test control plane's OpenID Connect issuer (tests/testenv/oidc-issuer.py):
    /// an ID token for an hour, signed with the issuer's key, which the API server's JWT authenticator
    /// accepts as user `oidc:<name>` in groups `oidc:<group>`.
    pub async fn oidc(name: &str, groups: &[&str]) -> Person {
        let env = super::testenv_dir();
        let issuer = std::fs::read_to_string(env.join("oidc-issuer-url")).expect("the test issuer's URL");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let header = json!({"alg": "RS256", "typ": "JWT", "kid": "testenv"});
        let claims = json!({"iss": issuer.trim(), "sub": name, "aud": "fleetroll-testenv", "groups": groups,
                            "iat": now, "nbf": now - 60, "exp": now + 3600});
        let signed =
            format!("{}.{}", b64url(header.to_string().as_bytes()), b64url(claims.to_string().as_bytes()));
        let key = env.join("pki/oidc-signing.key");
        let mut child = Command::new("openssl")
            .args(["dgst", "-sha256", "-sign", &key.display().to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run openssl");
        use std::io::Write;
        child.stdin.take().unwrap().write_all(signed.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "openssl dgst -sign failed");
        let token = format!("{signed}.{}", b64url(&out.stdout));

        let dir = PathBuf::from(repo_path("target/test-logs/people"));
        std::fs::create_dir_all(&dir).expect("target/test-logs/people");
        let admin_config = Kubeconfig::read_from(super::cluster().kubeconfig).expect("the test kubeconfig");
        let cluster = admin_config.clusters[0].cluster.clone().expect("a cluster");
        let kubeconfig = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": cluster.server, "certificate-authority-data": cluster.certificate_authority_data}}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": "test", "user": name}}],
            "current-context": name,
        });
        let path =
            dir.join(format!("oidc-{name}-{}.kubeconfig", &uuid::Uuid::new_v4().simple().to_string()[..10]));
        std::fs::write(&path, kubeconfig.to_string()).expect("write the kubeconfig");
        let client = client_from(&path, None).await;
        Person {
            username: format!("oidc:{name}"),
            groups: groups.iter().map(|g| format!("oidc:{g}")).collect(),
            kubeconfig: path,
            client,
            token: Some(token),
        }
    }

    /// Waits until RBAC lets this person `verb` `resource` (of API group `group`) in `ns`.
    pub async fn wait_allowed(&self, admin: &Client, ns: &str, group: &str, resource: &str, verb: &str) {
        let groups = self.groups.iter().cloned().chain(["system:authenticated".to_string()]).collect();
        let attributes = ResourceAttributes {
            namespace: Some(ns.into()),
            group: Some(group.into()),
            resource: Some(resource.into()),
            verb: Some(verb.into()),
            ..Default::default()
        };
        until_allowed(admin, &self.username, groups, attributes).await;
    }

    /// kubectl as this person.
    pub async fn kubectl(&self, args: &[&str]) -> super::cli::Ran {
        super::cli::kubectl_as(&self.kubeconfig, args).await
    }
}
