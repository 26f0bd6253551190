//! A hub fleet namespace holding the Secrets of two member clusters (member-1 as an Argo CD cluster Secret,
//! labelled env=canary; member-2 as a Cluster API kubeconfig Secret whose Cluster is labelled env=prod),
//! and in each member a tenant namespace, opted in there, with Deployments to roll. Everything is deleted
//! afterwards.

use std::{collections::HashMap, time::Duration};

use k8s_openapi::api::{apps::v1::Deployment, core::v1::Namespace};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

use fleetroll::api::{OPT_IN_LABEL, OPT_IN_VALUE};
use testkit::{
    fleet::{Fleet, deployment},
    members::{Member, member, service_account_token, write_argo_secret, write_capi_secret},
    wait_for,
};

pub const DEADLINE: Duration = Duration::from_secs(180);
/// The ServiceAccount on each member whose tokens the hub's Secrets carry (the test environment's own).
pub const OPERATOR_ACCOUNT: (&str, &str) = ("fleetroll-system", "fleetroll");

/// One member cluster as a test uses it: its admin client and the tenant namespace made for the test.
pub struct Site {
    pub member: Member,
    pub admin: Client,
    pub ns: String,
}

impl Site {
    pub fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    /// Each Deployment's image and generation.
    pub async fn state(&self) -> HashMap<String, (String, i64)> {
        let list = self.deployments().list(&ListParams::default().labels("fleet=web")).await.unwrap();
        list.items
            .iter()
            .map(|d| (d.name_any(), (testkit::fleet::image_of(d), d.metadata.generation.unwrap_or(0))))
            .collect()
    }
}

/// A tenant namespace on `member`, labelled `team=<team>` and opted in when `opted_in`, with `n` Available
/// Deployments `web-00..` (label `fleet=web`).
pub async fn site(member_name: &str, ns: &str, team: &str, n: usize, image: &str, opted_in: bool) -> Site {
    let member = member(member_name);
    let admin = member.admin_client().await;
    let mut labels = json!({"team": team});
    if opted_in {
        labels[OPT_IN_LABEL] = json!(OPT_IN_VALUE);
    }
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}});
    namespaces.patch(ns, &PatchParams::apply("fleetroll-tests").force(), &Patch::Apply(&body)).await.unwrap();
    let api: Api<Deployment> = Api::namespaced(admin.clone(), ns);
    for i in 0..n {
        let d = deployment(&format!("web-{i:02}"), image, &[("fleet", "web")]);
        api.create(&PostParams::default(), &d).await.unwrap();
    }
    for i in 0..n {
        wait_for(&api, &format!("web-{i:02}"), "the Deployment to be available", DEADLINE, |d| {
            d.status.as_ref().and_then(|s| s.available_replicas) == Some(1)
        })
        .await;
    }
    Site { member, admin, ns: ns.to_string() }
}

/// The storefront of the example manifests on `member_name`: namespace `ns` labelled tier=tenant and opted
/// in, with `n` Available Deployments labelled app.kubernetes.io/part-of=storefront.
pub async fn storefront(member_name: &str, ns: &str, n: usize) -> Site {
    let member = member(member_name);
    let admin = member.admin_client().await;
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let body = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns, "labels": {"tier": "tenant", OPT_IN_LABEL: OPT_IN_VALUE}}});
    namespaces.patch(ns, &PatchParams::apply("fleetroll-tests").force(), &Patch::Apply(&body)).await.unwrap();
    let api: Api<Deployment> = Api::namespaced(admin.clone(), ns);
    for i in 0..n {
        let d = deployment(
            &format!("shop-{i:02}"),
            testkit::fleet::READY_IMAGE,
            &[("fleet", "web"), ("app.kubernetes.io/part-of", "storefront")],
        );
        api.create(&PostParams::default(), &d).await.unwrap();
        wait_for(&api, &format!("shop-{i:02}"), "the Deployment to be available", DEADLINE, |d| {
            d.status.as_ref().and_then(|s| s.available_replicas) == Some(1)
        })
        .await;
    }
    Site { member, admin, ns: ns.to_string() }
}

/// Deletes the tenant namespaces the test made on the members.
pub async fn tidy(sites: &[&Site]) {
    for s in sites {
        let namespaces: Api<Namespace> = Api::all(s.admin.clone());
        if let Err(e) = namespaces.delete(&s.ns, &DeleteParams::background()).await {
            eprintln!("warning: could not delete {} on {}: {e}", s.ns, s.member.name);
        }
    }
}

/// Writes the two members' Secrets into the fleet namespace, each with a token of `account` on it.
pub async fn register(fleet: &Fleet, sites: &[&Site], account: (&str, &str)) {
    for s in sites {
        let token = service_account_token(&s.admin, account.0, account.1).await;
        match s.member.name.as_str() {
            "member-1" => {
                write_argo_secret(&fleet.client, &fleet.ns, &s.member, &token, &[("env", "canary")]).await;
            }
            _ => {
                write_capi_secret(&fleet.client, &fleet.ns, &s.member, &token, &[("env", "prod")]).await;
            }
        }
    }
}

/// A rollout of `image` over the `fleet=web` Deployments of the namespaces labelled `team=<team>` in the
/// member clusters labelled env (any), in two waves: canary (member-1), then prod (member-2).
pub fn spec(image: &str, team: &str, batch: i32) -> Value {
    json!({
        "image": image,
        "targets": {
            "kind": "Deployment",
            "selector": {"matchLabels": {"fleet": "web"}},
            "namespaceSelector": {"matchLabels": {"team": team}},
            "clusters": {"selector": {"matchExpressions": [{"key": "env", "operator": "Exists"}]}},
        },
        "strategy": {
            "batchSize": batch,
            "waves": [
                {"name": "canary", "clusterSelector": {"matchLabels": {"env": "canary"}}},
                {"name": "prod", "clusterSelector": {"matchLabels": {"env": "prod"}}, "maxConcurrency": 1},
            ],
        },
    })
}

/// A name unique to this run, for namespaces on the members (the hub's are made unique by `with_fleet`).
pub fn unique(prefix: &str) -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{prefix}-{:x}", nanos ^ std::process::id())
}

/// Tests of this file share the members: one that freezes a member holds this alone (`write`), the
/// others together (`read`), so that no other test runs into a frozen member.
pub static FREEZE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Whether the test environment has the two members these tests need (it has none on a user's cluster).
pub fn members_up() -> bool {
    let up = testkit::members::members().len() >= 2;
    if !up {
        eprintln!("not run: the test environment has no member clusters (make cluster MEMBERS=2)");
    }
    up
}

/// Whether `token` is refused (401) by `member` now.
pub async fn refused(member: &Member, token: &str) -> bool {
    let kubeconfig = testkit::members::token_kubeconfig(member, token);
    let config = kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default()).await.unwrap();
    let client = Client::try_from(config).unwrap();
    let namespaces: Api<Namespace> = Api::all(client);
    matches!(namespaces.list(&ListParams::default().limit(1)).await, Err(kube::Error::Api(s)) if s.code == 401)
}
