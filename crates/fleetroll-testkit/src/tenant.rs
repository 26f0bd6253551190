//! Tenants for attacker tests: a ServiceAccount in a namespace, bound to a ClusterRole (such as the built-in
//! `edit`) or to rules of its own, with a real token from the TokenRequest API, a kubeconfig for
//! `kubectl_as`, and a client acting as it. Also the chart's admission policy and user roles, installed
//! once per test process (`ensure_crd` installs them), so every test runs with the policy active.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::{
    admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
    authentication::v1::{TokenRequest, TokenRequestSpec},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
    core::v1::ServiceAccount,
    rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject},
};
use kube::{
    Api, Client, Config,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::json;
use tokio::sync::OnceCell;

use super::{
    cli::{Ran, helm, kubectl, kubectl_as, repo_path},
    wait_for,
};

/// What a tenant may do: a RoleBinding to a ClusterRole, or a Role of its own rules; in the tenant's own
/// namespace unless `in_namespace` says otherwise.
#[derive(Clone, Debug)]
pub struct Grant {
    namespace: Option<String>,
    role: Granted,
}

#[derive(Clone, Debug)]
enum Granted {
    ClusterRole(String),
    Rules(Vec<PolicyRule>),
}

impl Grant {
    pub fn cluster_role(name: &str) -> Grant {
        Grant { namespace: None, role: Granted::ClusterRole(name.to_string()) }
    }

    pub fn rules(rules: Vec<PolicyRule>) -> Grant {
        Grant { namespace: None, role: Granted::Rules(rules) }
    }

    pub fn in_namespace(mut self, namespace: &str) -> Grant {
        self.namespace = Some(namespace.to_string());
        self
    }
}

/// One RBAC rule: `verbs` on `resources` of API group `group`.
pub fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    }
}

/// A ServiceAccount acting with its own token.
pub struct Tenant {
    pub namespace: String,
    pub name: String,
    /// `system:serviceaccount:<namespace>:<name>`, as the API server and the admission policy see it.
    pub username: String,
    pub kubeconfig: PathBuf,
    pub client: Client,
    /// How many grants it has had: the n-th one's Role and RoleBinding are `<name>-<n>` (from 0).
    granted: std::sync::atomic::AtomicUsize,
}

impl Tenant {
    /// Creates the ServiceAccount `name` in `namespace` with `grants`, and waits until RBAC honours them.
    pub async fn create(admin: &Client, namespace: &str, name: &str, grants: &[Grant]) -> Tenant {
        Tenant::create_on(admin, &super::cluster().kubeconfig, namespace, name, grants).await
    }

    /// [`Tenant::create`] on the cluster whose admin kubeconfig is `admin_kubeconfig` (a fresh cluster's).
    pub async fn create_on(
        admin: &Client,
        admin_kubeconfig: &Path,
        namespace: &str,
        name: &str,
        grants: &[Grant],
    ) -> Tenant {
        let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
        let sa = ServiceAccount {
            metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
            ..Default::default()
        };
        sas.create(&PostParams::default(), &sa).await.expect("create the tenant's ServiceAccount");
        let username = format!("system:serviceaccount:{namespace}:{name}");
        let kubeconfig = serviceaccount_kubeconfig_on(admin, admin_kubeconfig, namespace, name).await;
        let client = client_from(&kubeconfig, None).await;
        let tenant = Tenant {
            namespace: namespace.to_string(),
            name: name.to_string(),
            username,
            kubeconfig,
            client,
            granted: Default::default(),
        };
        for grant in grants {
            tenant.grant(admin, grant).await;
        }
        tenant
    }

    /// Grants the tenant `grant` (a Role of its rules, if it has rules, and a RoleBinding, both named
    /// `<name>-<n>` for its n-th grant), and waits until RBAC honours it.
    pub async fn grant(&self, admin: &Client, grant: &Grant) {
        let ns = grant.namespace.as_deref().unwrap_or(&self.namespace);
        let n = self.granted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let binding = format!("{}-{n}", self.name);
        let role_ref = match &grant.role {
            Granted::ClusterRole(role) => RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "ClusterRole".into(),
                name: role.clone(),
            },
            Granted::Rules(rules) => {
                let role = Role {
                    metadata: ObjectMeta { name: Some(binding.clone()), ..Default::default() },
                    rules: Some(rules.clone()),
                };
                Api::<Role>::namespaced(admin.clone(), ns)
                    .create(&PostParams::default(), &role)
                    .await
                    .expect("create the tenant's Role");
                RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Role".into(),
                    name: binding.clone(),
                }
            }
        };
        let rb = RoleBinding {
            metadata: ObjectMeta { name: Some(binding.clone()), ..Default::default() },
            role_ref,
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: self.name.clone(),
                namespace: Some(self.namespace.clone()),
                ..Default::default()
            }]),
        };
        Api::<RoleBinding>::namespaced(admin.clone(), ns)
            .create(&PostParams::default(), &rb)
            .await
            .expect("create the tenant's RoleBinding");
        honoured(admin, &self.username, ns, grant).await;
    }

    /// kubectl as this tenant (in its own namespace unless `args` name another).
    pub async fn kubectl(&self, args: &[&str]) -> Ran {
        kubectl_as(&self.kubeconfig, args).await
    }
}

/// Waits until RBAC allows `user` the first rule of `grant` (RoleBindings reach the authorizer's cache a
/// moment after they are created).
async fn honoured(admin: &Client, user: &str, ns: &str, grant: &Grant) {
    let rules = match &grant.role {
        Granted::Rules(rules) => rules.clone(),
        Granted::ClusterRole(name) => {
            // An aggregated role may still be empty: wait for a rule to appear.
            let roles: Api<ClusterRole> = Api::all(admin.clone());
            wait_for(&roles, name, "the ClusterRole to have rules", Duration::from_secs(30), |r| {
                r.rules.as_ref().is_some_and(|r| !r.is_empty())
            })
            .await
            .rules
            .unwrap_or_default()
        }
    };
    let Some(rule) = rules.iter().find(|r| {
        r.resource_names.is_none() && r.resources.as_ref().is_some_and(|res| res.iter().any(|x| x != "*"))
    }) else {
        return;
    };
    let attributes = ResourceAttributes {
        namespace: Some(ns.to_string()),
        group: rule.api_groups.as_ref().and_then(|g| g.first().cloned()).filter(|g| g != "*"),
        resource: rule.resources.as_ref().and_then(|r| r.iter().find(|x| *x != "*").cloned()),
        verb: rule.verbs.iter().find(|v| *v != "*").cloned().or(Some("get".into())),
        ..Default::default()
    };
    until_allowed(admin, user, serviceaccount_groups(user_namespace(user)), attributes).await;
}

/// Whether RBAC allows `user` in `groups` what `attributes` describe now, as the API server's authorizer
/// says (a SubjectAccessReview).
pub async fn allowed(admin: &Client, user: &str, groups: &[String], attributes: &ResourceAttributes) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            groups: Some(groups.to_vec()),
            resource_attributes: Some(attributes.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SubjectAccessReview> = Api::all(admin.clone());
    let reviewed = api.create(&PostParams::default(), &review).await.expect("SubjectAccessReview");
    reviewed.status.is_some_and(|s| s.allowed)
}

/// The groups the API server puts a ServiceAccount's token in.
pub fn serviceaccount_groups(namespace: &str) -> Vec<String> {
    vec![
        "system:serviceaccounts".into(),
        format!("system:serviceaccounts:{namespace}"),
        "system:authenticated".into(),
    ]
}

/// Waits until RBAC allows `user` in `groups` what `attributes` describe.
pub async fn until_allowed(admin: &Client, user: &str, groups: Vec<String>, attributes: ResourceAttributes) {
    let what = format!("RBAC to allow {user} {attributes:?}");
    super::poll_until(&what, Duration::from_secs(30), || allowed(admin, user, &groups, &attributes)).await;
}

/// A RoleBinding `name` in `ns` of the ClusterRole `role` to a `User` or `Group` named `subject`.
pub async fn bind(admin: &Client, ns: &str, name: &str, kind: &str, subject: &str, role: &str) {
    let binding: RoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": subject}],
    }))
    .expect("a RoleBinding");
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create the RoleBinding");
}

fn user_namespace(user: &str) -> &str {
    user.split(':').nth(2).unwrap_or_default()
}

/// A token for the ServiceAccount from the TokenRequest API (an hour).
pub async fn token(client: &Client, ns: &str, sa: &str) -> String {
    token_for(client, ns, sa, None).await
}

/// A token for the ServiceAccount for `audience` (e.g. an MCP endpoint's URL; None: the API server).
pub async fn token_for(client: &Client, ns: &str, sa: &str, audience: Option<&str>) -> String {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let spec = TokenRequestSpec {
        audiences: audience.map(|a| vec![a.to_string()]),
        expiration_seconds: Some(3600),
        ..Default::default()
    };
    let request = TokenRequest { spec: Some(spec), ..Default::default() };
    let issued: TokenRequest =
        sas.create_subresource("token", sa, &PostParams::default(), &request).await.expect("TokenRequest");
    issued.status.and_then(|s| s.token).expect("a token")
}

/// A kubeconfig for the ServiceAccount: the test cluster's server and CA, and a token from the TokenRequest
/// API.
pub async fn serviceaccount_kubeconfig(client: &Client, ns: &str, sa: &str) -> PathBuf {
    serviceaccount_kubeconfig_on(client, &super::cluster().kubeconfig, ns, sa).await
}

/// [`serviceaccount_kubeconfig`] with the server and CA of `admin_kubeconfig` (a fresh cluster's).
pub async fn serviceaccount_kubeconfig_on(
    client: &Client,
    admin_kubeconfig: &Path,
    ns: &str,
    sa: &str,
) -> PathBuf {
    let token = token(client, ns, sa).await;
    let admin = Kubeconfig::read_from(admin_kubeconfig).expect("the admin kubeconfig");
    let cluster = admin.clusters[0].cluster.clone().expect("a cluster");
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": cluster.server, "certificate-authority-data": cluster.certificate_authority_data}}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "test", "user": sa, "namespace": ns}}],
        "current-context": "sa",
    });
    let path = PathBuf::from(repo_path("target/test-logs")).join(format!("{ns}-{sa}.kubeconfig"));
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("target/test-logs");
    std::fs::write(&path, kubeconfig.to_string()).expect("write the kubeconfig");
    path
}

/// A client from a kubeconfig file, optionally impersonating `user` (Impersonate-User).
pub async fn client_from(kubeconfig: &Path, impersonate: Option<&str>) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("read the kubeconfig");
    let mut config =
        Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.expect("a config");
    config.auth_info.impersonate = impersonate.map(str::to_string);
    Client::try_from(config).expect("a client")
}

/// The chart's release in the tests: its objects are named `fleetroll-*`, as in manifests/install.yaml.
pub const RELEASE: &str = "fleetroll";
/// The admission policy's name.
pub const POLICY: &str = "fleetroll-creator-rights";
/// The chart's ClusterRole for people who approve batches (the approve verb).
pub const APPROVER_ROLE: &str = "fleetroll-approver";
/// The chart's unbound ClusterRole for fleet administrators (span-namespaces).
pub const FLEET_ADMIN_ROLE: &str = "fleetroll-fleet-admin";

/// Renders chart templates with the defaults and applies them (server-side, field manager fleetroll-tests).
async fn apply_chart_templates(templates: &[&str]) {
    let chart = repo_path("charts/fleetroll");
    let mut args = vec!["template", RELEASE, chart.as_str(), "--namespace", "fleetroll-system"];
    for t in templates {
        args.extend(["--show-only", t]);
    }
    let rendered = helm(&args).await.ok().stdout;
    let file = std::env::temp_dir().join(format!(
        "fleetroll-tests-{}-{}.yaml",
        std::process::id(),
        templates.join("+").replace('/', "_")
    ));
    std::fs::write(&file, rendered).expect("write the rendered templates");
    let file = file.display().to_string();
    kubectl(&["apply", "--server-side", "--force-conflicts", "--field-manager=fleetroll-tests", "-f", &file])
        .await
        .ok();
}

/// Installs (or updates) the chart's admission policy once per test process, and waits until the API server
/// enforces this version of it: a dry-run create by a user who may create FleetRollouts but patch nothing
/// is denied.
pub async fn ensure_admission_policy(client: &Client) {
    static DONE: OnceCell<()> = OnceCell::const_new();
    DONE.get_or_init(|| async {
        let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
        let before =
            policies.get_opt(POLICY).await.expect("read the policy").and_then(|p| p.metadata.generation);
        apply_chart_templates(&["templates/admission-policy.yaml", "templates/guardrails.yaml"]).await;
        let after = policies.get(POLICY).await.expect("the policy").metadata.generation;
        let probe = policy_probe(client).await;
        if before.is_some() && before != after {
            // The admission plugin rebuilds its policies from its informers every second, so a denial right
            // after a change may come from the old version. Take the binding away until the probe passes,
            // then bring it back: the denial that follows comes from a rebuild after the change.
            let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
            bindings.delete(POLICY, &Default::default()).await.expect("delete the policy's binding");
            probe.until(false).await;
            apply_chart_templates(&["templates/admission-policy.yaml", "templates/guardrails.yaml"]).await;
        }
        probe.until(true).await;
        recorded_identities_written(client).await;
    })
    .await;
}

/// Waits until the chart's mutating policy records the creator: a dry-run create returns spec.creator.
async fn recorded_identities_written(client: &Client) {
    let rollouts: Api<fleetroll::api::FleetRollout> = Api::namespaced(client.clone(), "default");
    let probe: fleetroll::api::FleetRollout = serde_json::from_value(json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": "creator-probe"},
        "spec": {"image": "registry.k8s.io/pause:3.10", "targets": {"kind": "Deployment", "selector": {"matchLabels": {"probe": "x"}}}},
    }))
    .expect("a FleetRollout");
    let dry_run = PostParams { dry_run: true, ..Default::default() };
    super::poll_until("the admission policy to record creators", Duration::from_secs(60), || async {
        rollouts.create(&dry_run, &probe).await.is_ok_and(|fr| fr.spec.creator.is_some())
    })
    .await;
}

/// A user who may create FleetRollouts and nothing else, and the rollout it tries to create (dry run).
struct PolicyProbe {
    rollouts: Api<fleetroll::api::FleetRollout>,
    rollout: fleetroll::api::FleetRollout,
}

async fn policy_probe(client: &Client) -> PolicyProbe {
    let probe = "fleetroll-tests:policy-probe";
    let pp = PatchParams::apply("fleetroll-tests").force();
    let role = ClusterRole {
        metadata: ObjectMeta { name: Some("fleetroll-tests-policy-probe".into()), ..Default::default() },
        rules: Some(vec![rule("fleetroll.dev", &["fleetrollouts"], &["create"])]),
        ..Default::default()
    };
    Api::<ClusterRole>::all(client.clone())
        .patch("fleetroll-tests-policy-probe", &pp, &Patch::Apply(&role))
        .await
        .expect("the probe's ClusterRole");
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "fleetroll-tests-policy-probe"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "fleetroll-tests-policy-probe"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": probe}],
    });
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch("fleetroll-tests-policy-probe", &pp, &Patch::Apply(&binding))
        .await
        .expect("the probe's ClusterRoleBinding");
    let as_probe = client_from(&super::cluster().kubeconfig, Some(probe)).await;
    let rollout = serde_json::from_value(json!({
        "apiVersion": "fleetroll.dev/v1alpha1", "kind": "FleetRollout", "metadata": {"name": "policy-probe"},
        "spec": {"image": "registry.k8s.io/pause:3.10", "targets": {"kind": "Deployment", "selector": {"matchLabels": {"probe": "x"}}}},
    }))
    .expect("a FleetRollout");
    PolicyProbe { rollouts: Api::namespaced(as_probe, "default"), rollout }
}

impl PolicyProbe {
    /// Waits until the policy denies the probe (`enforced`), or no longer does.
    async fn until(&self, enforced: bool) {
        let dry_run = PostParams { dry_run: true, ..Default::default() };
        let what = format!("the admission policy to be {}enforced", if enforced { "" } else { "no longer " });
        super::poll_until(&what, Duration::from_secs(60), || async {
            let outcome = self.rollouts.create(&dry_run, &self.rollout).await;
            let denied =
                matches!(&outcome, Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(POLICY));
            denied == enforced
        })
        .await;
    }
}

/// Installs (or updates) the chart's roles for people once per test process, and waits until Kubernetes has
/// aggregated FleetRollouts into the built-in view, edit and admin roles.
pub async fn ensure_aggregated_roles(client: &Client) {
    static DONE: OnceCell<()> = OnceCell::const_new();
    DONE.get_or_init(|| async {
        apply_chart_templates(&["templates/user-roles.yaml"]).await;
        let roles: Api<ClusterRole> = Api::all(client.clone());
        for (role, verb) in [("view", "watch"), ("edit", "create"), ("admin", "delete")] {
            wait_for(&roles, role, "FleetRollouts to be aggregated", Duration::from_secs(60), |r| {
                r.rules.iter().flatten().any(|rule| {
                    rule.resources.iter().flatten().any(|x| x == "fleetrollouts")
                        && rule.verbs.iter().any(|v| v == verb)
                })
            })
            .await;
        }
    })
    .await;
}
