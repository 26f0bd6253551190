//! `preview_rollout` across member clusters with authentication on: callers with real ServiceAccount
//! tokens and no right on Secrets. The member Secrets are read with the server's own identity, and only
//! for a caller the API server lets create that FleetRollout (a dry run as the caller); anyone else is
//! refused before any member is contacted, which a decoy member (a listener counting connections) shows.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::{Value, json};

use super::support::{self, OPERATOR_ACCOUNT, register, site, spec, tidy, unique};
use testkit::{
    fleet::{NEXT_IMAGE, READY_IMAGE, with_fleet},
    mcp::drive,
    members::{Member, write_argo_secret},
    operator::Operator,
    tenant::{FLEET_ADMIN_ROLE, Grant, Tenant, rule, token_for},
};

/// A member cluster that is not one: a TCP listener that counts the connections made to it and closes
/// each at once (the TLS handshake then fails, and the member reads as unreachable). A connection is
/// counted before it is closed, so once a preview has answered, every attempt it made is counted.
struct Decoy {
    port: u16,
    contacts: Arc<AtomicUsize>,
}

impl Decoy {
    async fn start() -> Decoy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let contacts = Arc::new(AtomicUsize::new(0));
        let counted = contacts.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        Decoy { port, contacts }
    }

    fn contacts(&self) -> usize {
        self.contacts.load(Ordering::SeqCst)
    }
}

/// A caller of the MCP endpoint at `url`: a ServiceAccount of the fleet namespace with `grants` (none on
/// Secrets), and a token for the endpoint.
async fn caller(admin: &kube::Client, ns: &str, name: &str, grants: &[Grant], url: &str) -> String {
    let tenant = Tenant::create(admin, ns, name, grants).await;
    let secrets: Api<Secret> = Api::namespaced(tenant.client.clone(), ns);
    let listed = secrets.list(&Default::default()).await;
    assert!(
        matches!(&listed, Err(kube::Error::Api(s)) if s.code == 403),
        "{name} may read Secrets: {listed:?}"
    );
    token_for(admin, ns, name, Some(url)).await
}

fn text(result: &Value) -> String {
    result["content"][0]["text"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn with_authentication_only_callers_who_may_create_the_rollout_preview_it_across_members() {
    if !support::members_up() {
        return;
    }
    let _shared = support::FREEZE.read().await;
    with_fleet("members-preview", 1, |fleet| async move {
        let team = unique("preview");
        let one = site("member-1", &team, &team, 2, READY_IMAGE, true).await;
        let two = site("member-2", &team, &team, 2, READY_IMAGE, true).await;
        register(&fleet, &[&one, &two], OPERATOR_ACCOUNT).await;
        // A third member in the prod wave, whose server is the decoy.
        let decoy = Decoy::start().await;
        let stand_in = Member {
            name: "decoy".into(),
            server: format!("https://127.0.0.1:{}", decoy.port),
            ..one.member.clone()
        };
        write_argo_secret(&fleet.client, &fleet.ns, &stand_in, "not-a-token", &[("env", "prod")]).await;

        let op = Operator::start_mcp(
            &fleet.ns,
            &["--auth", "serviceaccount", "--mcp-audience", "http://127.0.0.1:{port}/mcp"],
            &[],
        );
        op.ready().await;
        let url = op.mcp_url();
        let (admin, ns) = (&fleet.client, fleet.ns.as_str());
        let patch = || Grant::rules(vec![rule("apps", &["deployments"], &["patch"])]);
        // A fleet administrator (the chart's role), who may create rollouts across namespaces here.
        let planner =
            caller(admin, ns, "planner", &[Grant::cluster_role(FLEET_ADMIN_ROLE), patch()], &url).await;
        // May create FleetRollouts here and in the tenant namespace, but not span namespaces: the admission
        // policy refuses a rollout across members from them.
        let fr_rights = || Grant::rules(vec![rule("fleetroll.dev", &["fleetrollouts"], &["get", "create"])]);
        let tenant = fleet.tenants[0].as_str();
        let grants = [fr_rights(), patch(), fr_rights().in_namespace(tenant), patch().in_namespace(tenant)];
        let editor = caller(admin, ns, "editor", &grants, &url).await;
        // May only read FleetRollouts.
        let viewer = caller(admin, ns, "viewer", &[Grant::cluster_role("view")], &url).await;

        let mut args = spec(NEXT_IMAGE, &team, 1);
        args["namespace"] = json!(ns);
        let preview = |args: Value, token: String| {
            let url = url.clone();
            async move {
                drive(&["call", &url, "preview_rollout", &args.to_string(), "--no-tasks", "--token", &token])
                    .await
            }
        };

        // The fleet administrator gets the plan, members and waves, read with the server's identity.
        let shown = preview(args.clone(), planner).await;
        assert_eq!(shown["isError"], false, "{shown}");
        let said = text(&shown);
        let waves =
            "waves: canary: member-1 (2 targets, batches 1-2); prod: member-2 (2 targets, batches 3-4)";
        assert!(said.contains(waves), "{said}");
        assert!(said.contains("member cluster decoy could not be reached"), "{said}");
        assert_eq!(shown["structuredContent"]["batches"][2]["targets"][0]["cluster"], "member-2", "{shown}");
        let waves = &shown["structuredContent"]["waves"];
        assert_eq!((waves[0]["name"].as_str(), waves[1]["name"].as_str()), (Some("canary"), Some("prod")));
        assert!(!said.contains("not-a-token"), "{said}");
        // The decoy counts the members a preview contacts.
        let contacts = decoy.contacts();
        assert!(contacts > 0, "the decoy was not contacted");

        // Without the right to create FleetRollouts: refused before the tool runs.
        let params = json!({"name": "preview_rollout", "arguments": args}).to_string();
        let refused = drive(&["raw", &url, "tools/call", &params, "--token", &viewer]).await;
        assert_eq!(refused["status"], 403, "{refused}");

        // Allowed to create FleetRollouts, but admission refuses this one: a tool error saying why.
        let refused = preview(args.clone(), editor.clone()).await;
        assert_eq!(refused["isError"], true, "{refused}");
        let said = text(&refused);
        assert!(said.contains("may not span-namespaces"), "{said}");
        assert!(said.contains("no member cluster was contacted"), "{said}");

        // Outside the fleet namespace: refused as before, whoever asks.
        let mut elsewhere = args;
        elsewhere["namespace"] = json!(tenant);
        let refused = preview(elsewhere, editor).await;
        assert_eq!(refused["isError"], true, "{refused}");
        assert!(text(&refused).contains("CrossNamespaceNotAllowed"), "{refused}");
        assert!(text(&refused).contains("no member cluster was contacted"), "{refused}");
        assert_eq!(decoy.contacts(), contacts, "a member was contacted for a refused preview");

        tidy(&[&one, &two]).await;
    })
    .await;
}
