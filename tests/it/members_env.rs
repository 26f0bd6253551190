//! The member clusters of the local test environment (tests/testenv/members.sh): they are up and answer;
//! they are clusters of their own (objects, CA, ServiceAccount signing key), so nothing of the hub works on
//! them; and the hub's Secrets for them, in the Argo CD and the Cluster API conventions, give clients that
//! reach the right member with exactly the rights of the token they carry, until it is revoked.

use std::time::Duration;

use k8s_openapi::api::{
    apps::v1::Deployment,
    authentication::v1::{SelfSubjectReview, TokenRequest, TokenRequestSpec},
    core::v1::{Namespace, Node, Secret, ServiceAccount},
    rbac::v1::ClusterRoleBinding,
};
use kube::{
    Api, Client, Config, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::json;
use testkit::members::{self, ARGO_SECRET_TYPE, CAPI_CLUSTER_NAME, MEMBERS_NAMESPACE, Member};
use tokio::sync::RwLock;

const DEADLINE: Duration = Duration::from_secs(60);
/// Every test reads the members; the one that freezes a member's apiserver holds them alone.
static PLANES: RwLock<()> = RwLock::const_new(());

/// Members exist only in the local test environment: on a user's own cluster there is nothing to test.
fn local() -> bool {
    let local = testkit::cluster().local;
    if !local {
        eprintln!("not run: member clusters exist only in the local test environment");
    }
    local
}

/// A client from a server URL, a base64 CA PEM and a bearer token, and nothing else.
async fn token_client(server: &str, ca_data: &str, token: &str) -> Client {
    let kubeconfig: Kubeconfig = serde_json::from_value(json!({
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority-data": ca_data}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }))
    .unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.unwrap();
    Client::try_from(config).unwrap()
}

fn text(secret: &Secret, key: &str) -> String {
    let bytes = &secret.data.as_ref().and_then(|d| d.get(key)).unwrap_or_else(|| panic!("no key {key}")).0;
    String::from_utf8(bytes.clone()).unwrap()
}

/// The client an Argo CD cluster Secret describes: its `server` and its `config`'s bearer token and caData.
async fn argo_client(secret: &Secret) -> Client {
    let config: serde_json::Value = serde_json::from_str(&text(secret, "config")).unwrap();
    let token = config["bearerToken"].as_str().expect("config.bearerToken");
    let ca = config["tlsClientConfig"]["caData"].as_str().expect("config.tlsClientConfig.caData");
    token_client(&text(secret, "server"), ca, token).await
}

/// The client a Cluster API kubeconfig Secret describes: its `value`.
async fn capi_client(secret: &Secret) -> Client {
    let kubeconfig = Kubeconfig::from_yaml(&text(secret, "value")).unwrap();
    let user = kubeconfig.auth_infos[0].auth_info.as_ref().unwrap();
    assert!(user.token.is_some(), "the kubeconfig authenticates with a token");
    assert!(user.client_certificate_data.is_none(), "and not with a client certificate (the admin's)");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.unwrap();
    Client::try_from(config).unwrap()
}

/// The HTTP status of listing namespaces with `client`: 200, or the API's refusal.
async fn list_status(client: &Client) -> u16 {
    match Api::<Namespace>::all(client.clone()).list(&ListParams::default()).await {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("no answer from the API: {e}"),
    }
}

async fn namespace_names(client: &Client) -> Vec<String> {
    let list = Api::<Namespace>::all(client.clone()).list(&ListParams::default()).await.unwrap();
    list.items.iter().map(|n| n.name_any()).collect()
}

async fn delete_namespace(client: &Client, name: &str) {
    if let Err(e) = Api::<Namespace>::all(client.clone()).delete(name, &DeleteParams::background()).await {
        eprintln!("warning: could not delete namespace {name}: {e}");
    }
}

#[tokio::test]
async fn members_are_up_and_answer_on_addresses_of_their_own() {
    if !local() {
        return;
    }
    let _planes = PLANES.read().await;
    let found = members::members();
    let names: Vec<&str> = found.iter().map(|m| m.name.as_str()).collect();
    assert!(names.starts_with(&["member-1", "member-2"]), "members up: {names:?}");
    for (i, m) in found.iter().enumerate() {
        let host = url::Url::parse(&m.server).unwrap().host_str().unwrap().to_string();
        assert_eq!(host, format!("127.0.0.{}", i + 2), "{} listens on its own loopback address", m.name);
        let nodes = Api::<Node>::all(m.admin_client().await).list(&ListParams::default()).await.unwrap();
        let ready = nodes
            .items
            .iter()
            .filter(|n| {
                let conditions = n.status.as_ref().and_then(|s| s.conditions.as_ref());
                conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        assert_eq!(ready, 3, "{} has its 3 kwok nodes Ready", m.name);
    }
}

#[tokio::test]
async fn objects_stay_in_the_cluster_they_were_made_in() {
    if !local() {
        return;
    }
    let _planes = PLANES.read().await;
    let hub = testkit::client().await;
    let (one, two) =
        (members::member("member-1").admin_client().await, members::member("member-2").admin_client().await);
    let on_one = testkit::create_namespace(&one, "member-only", &[]).await;
    let on_hub = testkit::create_namespace(&hub, "hub-only", &[]).await;
    let sees = |client: &Client, name: &str| {
        let api = Api::<Namespace>::all(client.clone());
        let name = name.to_string();
        async move { api.get_opt(&name).await.unwrap().is_some() }
    };
    assert!(sees(&one, &on_one).await && sees(&hub, &on_hub).await, "each sees what it made");
    assert!(!sees(&hub, &on_one).await, "the hub sees member-1's namespace {on_one}");
    assert!(!sees(&two, &on_one).await, "member-2 sees member-1's namespace {on_one}");
    assert!(!sees(&one, &on_hub).await, "member-1 sees the hub's namespace {on_hub}");
    assert!(!sees(&two, &on_hub).await, "member-2 sees the hub's namespace {on_hub}");
    // What `up` installed on the members (member-rbac.yaml) is not on the hub: the binding of the members'
    // ServiceAccount to their ClusterRole. (The ServiceAccount's name, fleetroll-system/fleetroll, is on the
    // hub too, from the chart `up` installs there; the ClusterRole alone too once the bench's smoke run has
    // registered the hub as a member of its own fleet, tests/bench/members.rs.)
    let binding = |client: &Client| Api::<ClusterRoleBinding>::all(client.clone());
    assert!(binding(&one).get_opt("fleetroll-member").await.unwrap().is_some());
    assert!(binding(&hub).get_opt("fleetroll-member").await.unwrap().is_none());
    delete_namespace(&one, &on_one).await;
    delete_namespace(&hub, &on_hub).await;
}

#[tokio::test]
async fn the_hubs_credentials_are_refused_by_a_member() {
    if !local() {
        return;
    }
    let _planes = PLANES.read().await;
    let one = members::member("member-1");
    let hub_kubeconfig = Kubeconfig::read_from(testkit::cluster().kubeconfig).unwrap();
    let aimed_at = |m: &Member, with_member_ca: bool| {
        let mut kubeconfig = hub_kubeconfig.clone();
        let cluster = kubeconfig.clusters[0].cluster.as_mut().unwrap();
        cluster.server = Some(m.server.clone());
        if with_member_ca {
            cluster.certificate_authority_data = Some(m.ca_data());
        }
        kubeconfig
    };
    let client = |kubeconfig: Kubeconfig| async move {
        Client::try_from(
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.unwrap(),
        )
        .unwrap()
    };

    // The member's serving certificate is not from the hub's CA.
    let outcome =
        Api::<Namespace>::all(client(aimed_at(&one, false)).await).list(&ListParams::default()).await;
    assert!(matches!(&outcome, Err(e) if !matches!(e, kube::Error::Api(_))), "TLS must fail: {outcome:?}");
    // The hub's admin certificate, trusting the member's CA: the member does not know the hub's CA.
    assert_eq!(list_status(&client(aimed_at(&one, true)).await).await, 401);

    // A ServiceAccount token of the hub is good on the hub and refused by the member (another signing key).
    let hub = testkit::client().await;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(600), ..Default::default() }),
        ..Default::default()
    };
    let accounts = Api::<ServiceAccount>::namespaced(hub.clone(), "default");
    let issued = accounts.create_token_request("default", &PostParams::default(), &request).await.unwrap();
    let token = issued.status.and_then(|s| s.token).unwrap();
    let hub_server = hub_kubeconfig.clusters[0].cluster.as_ref().unwrap().server.clone().unwrap();
    let hub_ca = std::fs::read(testkit::testenv_dir().join("pki/ca.crt")).unwrap();
    let review = || serde_json::from_value::<SelfSubjectReview>(json!({})).unwrap();
    let on_hub =
        Api::<SelfSubjectReview>::all(token_client(&hub_server, &members::base64(&hub_ca), &token).await);
    let who = on_hub.create(&PostParams::default(), &review()).await.unwrap();
    let user = who.status.and_then(|s| s.user_info).and_then(|u| u.username);
    assert_eq!(user.as_deref(), Some("system:serviceaccount:default:default"));
    let on_member = Api::<SelfSubjectReview>::all(token_client(&one.server, &one.ca_data(), &token).await);
    let refused = on_member.create(&PostParams::default(), &review()).await;
    assert!(matches!(&refused, Err(kube::Error::Api(s)) if s.code == 401), "{refused:?}");
}

#[tokio::test]
async fn the_argo_cd_secret_of_member_1_reaches_member_1_with_the_operators_rights() {
    if !local() {
        return;
    }
    let _planes = PLANES.read().await;
    let hub = testkit::client().await;
    let secret = Api::<Secret>::namespaced(hub, MEMBERS_NAMESPACE).get("cluster-member-1").await.unwrap();
    let labels = secret.labels();
    assert_eq!(labels.get(ARGO_SECRET_TYPE.0).map(String::as_str), Some(ARGO_SECRET_TYPE.1));
    assert_eq!(
        (labels.get("env").unwrap().as_str(), labels.get("region").unwrap().as_str()),
        ("canary", "eu")
    );
    assert_eq!(text(&secret, "name"), "member-1");

    let one = members::member("member-1");
    let admin = one.admin_client().await;
    let only_here = testkit::create_namespace(&admin, "argo-sees", &[]).await;
    let client = argo_client(&secret).await;
    let names = namespace_names(&client).await;
    assert!(names.contains(&only_here), "member-1's namespace {only_here} is not in {names:?}");
    // A ServiceAccount's token, not the admin's: it may list namespaces, not make them.
    let made = Api::<Namespace>::all(client).create(&PostParams::default(), &Namespace::default()).await;
    assert!(matches!(&made, Err(kube::Error::Api(s)) if s.code == 403), "{made:?}");
    delete_namespace(&admin, &only_here).await;
}

fn web(name: &str) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "web", "image": "registry.k8s.io/pause:3.10"}]}
            }
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn the_cluster_api_secret_of_member_2_reaches_member_2_with_the_operators_rights() {
    if !local() {
        return;
    }
    let _planes = PLANES.read().await;
    let hub = testkit::client().await;
    let secret =
        Api::<Secret>::namespaced(hub.clone(), MEMBERS_NAMESPACE).get("member-2-kubeconfig").await.unwrap();
    assert_eq!(secret.type_.as_deref(), Some("cluster.x-k8s.io/secret"));
    assert_eq!(secret.labels().get(CAPI_CLUSTER_NAME).map(String::as_str), Some("member-2"));
    let cluster = members::clusters(&hub, MEMBERS_NAMESPACE).get("member-2").await.unwrap();
    let labels = cluster.labels();
    assert_eq!((labels.get("env").unwrap().as_str(), labels.get("region").unwrap().as_str()), ("prod", "us"));

    let admin = members::member("member-2").admin_client().await;
    let ns = testkit::create_namespace(&admin, "capi-sees", &[]).await;
    Api::<Deployment>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &web("web"))
        .await
        .unwrap();
    let client = capi_client(&secret).await;
    let all = Api::<Deployment>::all(client.clone()).list(&ListParams::default()).await.unwrap();
    assert!(
        all.items.iter().any(|d| d.namespace().as_deref() == Some(ns.as_str()) && d.name_any() == "web"),
        "the Deployment web made on member-2 in {ns} is not listed"
    );
    // May patch Deployments, not create them.
    let made = Api::<Deployment>::namespaced(client, &ns).create(&PostParams::default(), &web("other")).await;
    assert!(matches!(&made, Err(kube::Error::Api(s)) if s.code == 403), "{made:?}");
    delete_namespace(&admin, &ns).await;
}

#[tokio::test]
async fn a_revoked_token_is_refused_and_a_new_one_works() {
    if !local() {
        return;
    }
    let _planes = PLANES.read().await;
    let hub = testkit::client().await;
    let ns = testkit::create_namespace(&hub, "members-rotate", &[]).await;
    let (one, two) = (members::member("member-1"), members::member("member-2"));
    let (admin_one, admin_two) = (one.admin_client().await, two.admin_client().await);

    let old = members::service_account_token(&admin_one, &ns, "rotated").await;
    let secret = members::write_argo_secret(&hub, &ns, &one, &old, &[("env", "canary")]).await;
    assert_eq!(secret.labels().get("env").map(String::as_str), Some("canary"));
    let old_client = argo_client(&secret).await;
    assert_eq!(list_status(&old_client).await, 200);

    members::revoke_tokens(&admin_one, &ns, "rotated").await;
    // The apiserver caches a token's successful authentication for 10 s: nothing to watch, so poll.
    testkit::poll_until("the revoked token to be refused", DEADLINE, || {
        let client = old_client.clone();
        async move { list_status(&client).await == 401 }
    })
    .await;

    let new = members::service_account_token(&admin_one, &ns, "rotated").await;
    let secret = members::write_argo_secret(&hub, &ns, &one, &new, &[("env", "canary")]).await;
    assert_eq!(list_status(&argo_client(&secret).await).await, 200, "the token issued after revocation");
    assert_eq!(list_status(&old_client).await, 401, "the old token stays refused");

    // The same for a Cluster API Secret written by the helper, on member-2.
    let token = members::service_account_token(&admin_two, &ns, "capi").await;
    let secret = members::write_capi_secret(&hub, &ns, &two, &token, &[("env", "prod")]).await;
    let client = capi_client(&secret).await;
    Api::<Deployment>::all(client.clone()).list(&ListParams::default()).await.unwrap();
    let cluster = members::clusters(&hub, &ns).get("member-2").await.unwrap();
    assert_eq!(cluster.labels().get("env").map(String::as_str), Some("prod"));
    for (admin, name) in [(&admin_one, &ns), (&admin_two, &ns), (&hub, &ns)] {
        delete_namespace(admin, name).await;
    }
}

#[tokio::test]
async fn a_frozen_member_hangs_alone_and_answers_once_thawed() {
    if !local() {
        return;
    }
    let _alone = PLANES.write().await;
    let two = members::member("member-2");
    let client = two.admin_client().await;
    assert_eq!(list_status(&client).await, 200);
    let frozen = two.freeze();
    let hung = tokio::time::timeout(Duration::from_secs(3), list_status(&client)).await;
    assert!(hung.is_err(), "a frozen apiserver answered: {hung:?}");
    // Only member-2 is frozen.
    assert_eq!(list_status(&testkit::client().await).await, 200, "the hub");
    assert_eq!(list_status(&members::member("member-1").admin_client().await).await, 200, "member-1");
    frozen.thaw();
    testkit::poll_until("member-2 to answer again", DEADLINE, || {
        let client = client.clone();
        async move { matches!(tokio::time::timeout(Duration::from_secs(5), list_status(&client)).await, Ok(200)) }
    })
    .await;
}
