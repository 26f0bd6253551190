//! Whether, and how, a user can be acted as through Kubernetes constrained impersonation (KEP-5284): the
//! MCP server writes rollouts as its caller, the operator changes targets as a rollout's recorded creator.
//! The API server's own rules, checked here first so that a refusal comes with a reason a person can act on
//! and nothing is sent:
//!
//! - a ServiceAccount (`system:serviceaccount:NS:NAME`) in `serviceaccount` mode: the username only (the API
//!   server adds the ServiceAccount's groups; that mode forbids uid, groups and extra);
//! - any other user in `user-info` mode: username, uid, groups and extra. That mode refuses
//!   `system:masters`, node identities, and extra keys that are not lowercase domain-prefixed paths.

use std::collections::BTreeMap;

use crate::api::Creator;

/// The `Impersonate-*` fields for one user.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Impersonation {
    pub user: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

const SERVICEACCOUNT_PREFIX: &str = "system:serviceaccount:";
const NODE_PREFIX: &str = "system:node:";

/// A user as an authenticator (a TokenReview, or admission's userInfo) described them.
#[derive(Clone, Copy, Debug)]
pub struct User<'a> {
    pub username: &'a str,
    pub uid: Option<&'a str>,
    pub groups: &'a [String],
    pub extra: &'a BTreeMap<String, Vec<String>>,
}

impl Impersonation {
    /// How `who` is impersonated, or why it cannot be (a sentence naming the user).
    pub fn of(who: User<'_>) -> Result<Impersonation, String> {
        let refuse = |why: &str| Err(format!("cannot act as {:?}: {why}", who.username));
        let user = who.username.to_string();
        if user.is_empty() {
            return refuse("the identity has no username");
        }
        if let Some(rest) = user.strip_prefix(SERVICEACCOUNT_PREFIX) {
            // Only a ServiceAccount's own token says so; another authenticator's user who merely bears
            // such a name must not be impersonated as that ServiceAccount.
            if !who.groups.iter().any(|g| g == "system:serviceaccounts") {
                return refuse("a ServiceAccount username without the system:serviceaccounts group");
            }
            let mut parts = rest.split(':');
            let well_formed = matches!((parts.next(), parts.next(), parts.next()), (Some(ns), Some(name), None) if !ns.is_empty() && !name.is_empty());
            if !well_formed {
                return refuse("not a well-formed ServiceAccount username");
            }
            return Ok(Impersonation { user, uid: None, groups: Vec::new(), extra: BTreeMap::new() });
        }
        if user.starts_with(NODE_PREFIX) {
            return refuse("node identities are not impersonated");
        }
        if who.groups.iter().any(|g| g == "system:masters") {
            return refuse("members of system:masters cannot be impersonated");
        }
        if who.groups.iter().any(String::is_empty) {
            return refuse("an empty group name cannot be impersonated");
        }
        let mut extra = BTreeMap::new();
        for (key, values) in who.extra {
            // A key without values says nothing; the API server refuses one, so leave it out.
            if values.is_empty() {
                continue;
            }
            if let Err(why) = valid_extra_key(key) {
                return refuse(&format!("its extra key {key:?} {why}"));
            }
            if values.iter().any(String::is_empty) {
                return refuse(&format!("its extra {key:?} has an empty value"));
            }
            extra.insert(key.clone(), values.clone());
        }
        let uid = who.uid.filter(|u| !u.is_empty()).map(String::from);
        let imp = Impersonation { user, uid, groups: who.groups.to_vec(), extra };
        // Header values must be visible ASCII: say so here rather than as an HTTP error later.
        let values = std::iter::once(&imp.user)
            .chain(imp.uid.iter())
            .chain(imp.groups.iter())
            .chain(imp.extra.values().flatten());
        if let Some(v) = values.into_iter().find(|v| !v.bytes().all(|b| (0x20..0x7f).contains(&b))) {
            return refuse(&format!(
                "{v:?} is not printable ASCII, which impersonation headers cannot carry"
            ));
        }
        Ok(imp)
    }

    /// How a rollout's recorded creator is impersonated (admission records no extra), or why not.
    pub fn of_creator(creator: Option<&Creator>) -> Result<Impersonation, String> {
        let Some(c) = creator else {
            return Err("the rollout has no recorded creator (it was created before fleetroll recorded \
                        creators, or with its admission policies turned off); `kubectl fleetroll adopt` \
                        records whoever runs it as the creator"
                .into());
        };
        let no_extra = BTreeMap::new();
        Impersonation::of(User {
            username: &c.username,
            uid: Some(c.uid.as_str()),
            groups: &c.groups,
            extra: &no_extra,
        })
    }
}

/// The API server's rule for impersonated extra keys: a lowercase domain-prefixed path (`acme.io/foo`).
/// Header names are case-insensitive, so an uppercase key would silently become another key.
fn valid_extra_key(key: &str) -> Result<(), &'static str> {
    if key != key.to_lowercase() {
        return Err("is not lowercase");
    }
    let Some((domain, path)) = key.split_once('/') else {
        return Err("is not a domain-prefixed path such as acme.io/foo");
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if domain.is_empty() || domain.len() > 253 || !domain.split('.').all(label_ok) {
        return Err("does not start with a DNS subdomain");
    }
    let path_ok = |b: u8| b.is_ascii_alphanumeric() || b"/-._~%!$&'()*+,;=:".contains(&b);
    if path.is_empty() || !path.bytes().all(path_ok) {
        return Err("has an invalid path after the domain");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(username: &str, groups: &[&str], extra: &[(&str, &[&str])]) -> Result<Impersonation, String> {
        let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        let extra: BTreeMap<String, Vec<String>> =
            extra.iter().map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect())).collect();
        Impersonation::of(User { username, uid: Some("uid-1"), groups: &groups, extra: &extra })
    }

    #[test]
    fn a_serviceaccount_is_impersonated_by_its_username_only() {
        let imp = of(
            "system:serviceaccount:team:agent",
            &["system:serviceaccounts", "system:serviceaccounts:team", "system:authenticated"],
            &[("authentication.kubernetes.io/credential-id", &["JTI=abc"])],
        );
        let expected = Impersonation {
            user: "system:serviceaccount:team:agent".into(),
            uid: None,
            groups: vec![],
            extra: BTreeMap::new(),
        };
        assert_eq!(imp, Ok(expected));
    }

    #[test]
    fn any_other_user_keeps_uid_groups_and_extra() {
        let imp = of(
            "alice@example.com",
            &["devs", "system:authenticated"],
            &[("example.com/team", &["a", "b"]), ("example.com/empty", &[])],
        )
        .unwrap();
        assert_eq!(imp.uid.as_deref(), Some("uid-1"));
        assert_eq!(imp.groups, ["devs", "system:authenticated"]);
        assert_eq!(imp.extra.len(), 1, "a key without values is left out: {imp:?}");
    }

    #[test]
    fn identities_the_api_server_would_refuse_are_refused_here_with_a_reason() {
        let refused = |r: Result<Impersonation, String>, why: &str| {
            let e = r.unwrap_err();
            assert!(e.contains(why) && e.starts_with("cannot act as"), "{e}");
        };
        refused(of("root", &["system:masters"], &[]), "system:masters");
        refused(of("system:node:n1", &["system:nodes"], &[]), "node");
        refused(of("bob", &["devs", ""], &[]), "empty group");
        refused(of("bob", &[], &[("Example.com/Team", &["a"])]), "not lowercase");
        refused(of("bob", &[], &[("team", &["a"])]), "domain-prefixed");
        refused(of("bob", &[], &[("-x.com/team", &["a"])]), "DNS subdomain");
        refused(of("bob", &[], &[("x.com/team", &[""])]), "empty value");
        refused(of("bob", &[], &[("x.com/te am", &["a"])]), "invalid path");
        refused(of("bøb", &[], &[]), "printable ASCII");
        refused(of("system:serviceaccount:team", &["system:serviceaccounts"], &[]), "well-formed");
        // Named like a ServiceAccount by another authenticator: not the ServiceAccount.
        refused(of("system:serviceaccount:team:agent", &["oidc:devs"], &[]), "system:serviceaccounts group");
        refused(of("", &[], &[]), "no username");
    }

    #[test]
    fn a_recorded_creator_is_acted_as_with_what_admission_recorded() {
        let agent = Creator {
            username: "system:serviceaccount:team:agent".into(),
            uid: "u-1".into(),
            groups: vec!["system:serviceaccounts".into(), "system:authenticated".into()],
        };
        let imp = Impersonation::of_creator(Some(&agent)).unwrap();
        assert_eq!((imp.user.as_str(), imp.uid, imp.groups.len()), (agent.username.as_str(), None, 0));
        let alice =
            Creator { username: "alice".into(), uid: String::new(), groups: vec!["approvers".into()] };
        let imp = Impersonation::of_creator(Some(&alice)).unwrap();
        assert_eq!((imp.uid, imp.groups), (None, vec!["approvers".to_string()]), "no uid: none sent");
        let root = Creator { groups: vec!["system:masters".into()], ..alice };
        assert!(Impersonation::of_creator(Some(&root)).unwrap_err().contains("system:masters"));
        assert!(Impersonation::of_creator(None).unwrap_err().contains("fleetroll adopt"));
    }
}
