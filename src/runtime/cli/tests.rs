use clap::Parser;

use super::{Cli, Command, log_filter};

fn operator(args: &[&str]) -> crate::runtime::operator::Options {
    let cli = Cli::try_parse_from(["fleetroll", "operator"].iter().chain(args)).expect("valid arguments");
    match cli.command {
        Command::Operator(args) => args.options().expect("settings that go together"),
        other => panic!("parsed as {other:?}"),
    }
}

#[test]
fn by_default_kube_system_is_protected_node_rollouts_served_and_checks_reach_only_targets() {
    let s = operator(&[]).settings;
    assert_eq!(s.protected_namespaces, ["kube-system"]);
    assert!(s.self_workloads.is_empty());
    assert!(s.node_rollouts);
    assert!(s.http_check.allowed.is_empty());
    assert_eq!(
        s.member_exec,
        crate::edge::members::ExecPolicy::default(),
        "the flags' defaults are the lists'"
    );
    let none = operator(&["--member-exec-commands=", "--member-exec-env="]).settings;
    assert_eq!(none.member_exec.commands().count(), 0, "an empty list runs no exec plugin");
    let bare = operator(&["--member-exec-args=", "--member-exec-env="]).settings.member_exec;
    let env = [("AWS_REGION", Some("eu-west-1"))];
    assert!(bare.refusal("m", "kubelogin", &[], &[]).is_none(), "a plugin given nothing runs");
    assert!(bare.refusal("m", "kubelogin", &["get-token".into()], &[]).is_some(), "no argument allowed");
    assert!(bare.refusal("m", "aws-iam-authenticator", &[], &env).is_some(), "no variable allowed");
}

#[test]
fn exec_plugin_arguments_are_extended_by_entries_and_refused_when_they_contradict() {
    let args = [
        "--member-exec-args=kubelogin get-token=--login,--federated-token-file=/var/run/secrets/azure/token",
        "--member-exec-args=my-plugin=--region={region};my-plugin token=",
        "--member-exec-commands=kubelogin,my-plugin",
    ];
    let policy = operator(&args).settings.member_exec;
    let given = |command: &str, args: &[&str]| {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        policy.refusal("m", command, &args, &[])
    };
    let file = "--federated-token-file=/var/run/secrets/azure/token";
    assert_eq!(given("kubelogin", &["get-token", "--login", "msi", file]), None);
    assert!(given("kubelogin", &["get-token", "--federated-token-file=/var/run/secrets/other"]).is_some());
    assert!(given("kubelogin", &["get-token", "--server-id", "x"]).is_some(), "the defaults are replaced");
    assert_eq!(given("my-plugin", &["--region", "eu-west-1"]), None);
    assert_eq!(given("my-plugin", &["token"]), None);
    for bad in [
        &["--member-exec-args=kubelogin"][..],
        &["--member-exec-args=kubelogin get-token=--login={nope}"],
        &["--member-exec-args=kubelogin get-token=login"],
        &["--member-exec-args=kubelogin get-token=--login=a|{switch}"],
    ] {
        assert!(Cli::try_parse_from(["fleetroll", "operator"].iter().chain(bad)).is_err(), "{bad:?}");
    }
    let cli = Cli::try_parse_from([
        "fleetroll",
        "operator",
        "--member-exec-args=kubelogin get-token=--legacy={switch}",
        "--member-exec-args=kubelogin get-token=--legacy",
    ])
    .unwrap();
    let Command::Operator(args) = cli.command else { panic!("not the operator") };
    let refused = args.options().err().unwrap_or_default();
    assert!(
        refused.contains("kubelogin --legacy is declared both as a {switch} and with values"),
        "{refused}"
    );
}

#[test]
fn exec_plugin_variables_are_given_per_plugin() {
    let file = "/var/run/secrets/azure/tokens/azure-identity-token";
    let flag = format!(
        "--member-exec-env=kubelogin=AZURE_FEDERATED_TOKEN_FILE={file};aws-iam-authenticator=AWS_REGION"
    );
    let policy = operator(&[&flag]).settings.member_exec;
    let set = |command: &str, name: &'static str, value: &str| {
        policy.refusal("m", command, &[], &[(name, Some(value))])
    };
    assert_eq!(set("kubelogin", "AZURE_FEDERATED_TOKEN_FILE", file), None);
    let token = "/var/run/secrets/kubernetes.io/serviceaccount/token";
    assert!(set("kubelogin", "AZURE_FEDERATED_TOKEN_FILE", token).is_some(), "only the file allowed");
    assert!(set("kubelogin", "AZURE_CLIENT_ID", "x").is_some(), "the defaults are replaced");
    assert_eq!(set("aws-iam-authenticator", "AWS_REGION", "eu-west-1"), None);
    for bad in [
        "--member-exec-env=AAD_*",
        "--member-exec-env=kubelogin=AZURE_*",
        "--member-exec-env=kubelogin=LD_PRELOAD",
    ] {
        assert!(Cli::try_parse_from(["fleetroll", "operator", bad]).is_err(), "{bad}");
    }
}

#[test]
fn the_security_flags_parse_strictly() {
    let s = operator(&[
        "--protected-namespaces=",
        "--self-workload=Deployment/fleet/fleetroll",
        "--node-rollouts=false",
        "--http-check-allow=127.0.0.1,10.0.0.0/8",
        "--http-check-allow=checks.example.com",
    ])
    .settings;
    assert!(s.protected_namespaces.is_empty(), "an empty list protects nothing");
    assert_eq!(s.self_workloads.len(), 1);
    assert!(!s.node_rollouts);
    assert_eq!(s.http_check.allowed.len(), 3);
    for bad in
        [&["--self-workload=Pod/x/y"][..], &["--http-check-allow=not a host"], &["--node-rollouts=maybe"]]
    {
        assert!(Cli::try_parse_from(["fleetroll", "operator"].iter().chain(bad)).is_err(), "{bad:?}");
    }
}

#[test]
fn analysis_backends_may_be_bound_to_namespaces() {
    let s = operator(&[
        "--analysis-prometheus-address=http://127.0.0.1:9090,team-a=http://prom-a.monitoring.svc:9090",
        "--analysis-allow=team-*=10.0.5.0/24,*=prom-b.monitoring.svc:9090",
        "--analysis-namespace-header=X-Scope-OrgID",
    ])
    .settings
    .analysis;
    assert_eq!(s.default_for("team-a"), Some("http://prom-a.monitoring.svc:9090"));
    assert_eq!(s.default_for("other"), Some("http://127.0.0.1:9090"));
    assert_eq!(s.allow.len(), 2);
    // Every allowed address and the defaults' hosts may be connected to; who may name them is judged apart.
    assert_eq!(s.policy.allowed.len(), 4, "{:?}", s.policy.allowed);
    assert_eq!(s.namespace_header.as_deref(), Some("X-Scope-OrgID"));
    for bad in [
        "--analysis-namespace-header=Authorization",
        "--analysis-namespace-header=X Bad",
        "--analysis-allow=Team-A=prom",
        "--analysis-allow=prom-b.monitoring.svc:9090",
        "--analysis-prometheus-address=team-a=prom:9090",
    ] {
        assert!(Cli::try_parse_from(["fleetroll", "operator", bad]).is_err(), "{bad}");
    }
}

#[test]
fn metrics_move_to_their_own_listener_only_when_asked() {
    assert!(operator(&[]).listen.metrics.is_none(), "one listener by default");
    let o = operator(&["--listen=127.0.0.1:8080", "--metrics-listen=0.0.0.0:9090"]);
    assert_eq!((o.listen.http.port(), o.listen.metrics.map(|a| a.port())), (8080, Some(9090)));
    let mcp = Cli::try_parse_from(["fleetroll", "mcp", "--metrics-listen=127.0.0.1:9090"]).expect("mcp");
    assert!(matches!(mcp.command, Command::Mcp(a) if a.listen.metrics_listen.is_some()));
}

#[test]
fn durations_are_written_as_in_the_spec() {
    let o = operator(&["--lease-duration=1m30s", "--task-retention=2h"]);
    assert_eq!((o.lease_duration.as_secs(), o.mcp.retention.as_secs()), (90, 7200));
    let bare = Cli::try_parse_from(["fleetroll", "operator", "--lease-duration=90"]).expect_err("no unit");
    assert!(bare.to_string().contains("is not a duration"), "{bare}");
}

#[test]
fn rmcp_and_kube_clients_dumps_are_held_back_unless_the_filter_names_them() {
    let held = ",rmcp=warn,kube_client::client=error";
    assert_eq!(log_filter(None, "info"), format!("info{held}"));
    assert_eq!(log_filter(Some("fleetroll=debug".into()), "info"), format!("fleetroll=debug{held}"));
    assert_eq!(log_filter(Some(" ".into()), "debug"), format!("debug{held}"));
    assert_eq!(
        log_filter(Some("info,rmcp=debug".into()), "info"),
        "info,rmcp=debug,kube_client::client=error"
    );
    assert_eq!(log_filter(Some("info,kube_client=debug".into()), "info"), "info,kube_client=debug,rmcp=warn");
}
