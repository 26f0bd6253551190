//! Bearer tokens and permissions, reviewed by the API server: a TokenReview for the MCP audience says who a
//! token stands for, a SubjectAccessReview whether RBAC allows them an operation. Answers are cached
//! within bounds; reviews of tokens never seen before are rationed, and SubjectAccessReviews are charged to
//! the caller that asks (see `limits`).

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{Api, Client, api::PostParams};
use sha2::{Digest, Sha256};

use super::{Access, Identity, Mode, Origins};
use crate::mcp::limits::{
    ACCESS_REVIEWS_PER_CALLER, ACCESS_REVIEWS_PER_TENANT, Cached, Caller, CallerBudgets, DECISION_TTL,
    DECISIONS_CACHED, IDENTITIES_CACHED, IDENTITY_TTL, ReviewBudget, TtlLru,
};

/// What a token turned out to be.
pub enum Reviewed {
    Valid(Identity),
    Invalid,
    /// Not reviewed: unknown tokens arrive faster than the budget allows; come back after this long.
    Limited(Duration),
}

/// Whether RBAC allows a caller an operation.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    Denied,
    /// Not reviewed: the caller (or its tenant) asks for new reviews faster than its budget allows; come
    /// back after this long.
    Limited(Duration),
}

/// Checks tokens and permissions against the API server, with bounded caches and a budget for reviews.
#[derive(Clone)]
pub struct Authenticator {
    client: Client,
    pub mode: Mode,
    /// Where the Protected Resource Metadata document is served.
    pub metadata_url: String,
    pub origins: Arc<Origins>,
    /// Only tokens the API server vouched for: invalid ones can neither grow nor evict it.
    tokens: Arc<TtlLru<[u8; 32], Identity>>,
    decisions: Arc<TtlLru<(Identity, Access), bool>>,
    budget: Arc<ReviewBudget>,
    /// SubjectAccessReviews, per caller and tenant.
    access_budgets: Arc<CallerBudgets>,
    /// The `aud` values of people's ID tokens accepted besides the MCP audience (see [`people_audiences`]).
    people_audiences: Arc<Vec<String>>,
}

/// The largest token whose claims are looked at (ID tokens with hundreds of groups stay well below).
const CLAIMS_READ_MAX: usize = 64 * 1024;

/// The audiences a JWT's unverified claims name (`aud`, a string or a list); empty for anything else.
/// Read only to choose which review to ask for: the API server verifies the token, these claims included.
fn people_audiences(token: &str) -> Vec<String> {
    use base64::Engine;
    let mut parts = token.split('.');
    let (Some(_), Some(claims), Some(_), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Vec::new();
    };
    if claims.len() > CLAIMS_READ_MAX {
        return Vec::new();
    }
    let Ok(bytes) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(claims) else {
        return Vec::new();
    };
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Audience {
        One(String),
        Many(Vec<String>),
    }
    #[derive(serde::Deserialize)]
    struct Claims {
        aud: Option<Audience>,
    }
    match serde_json::from_slice::<Claims>(&bytes).ok().and_then(|c| c.aud) {
        Some(Audience::One(a)) => vec![a],
        Some(Audience::Many(all)) => all,
        None => Vec::new(),
    }
}

/// The identity a TokenReview vouched for, if it did so for `audience` (None: for the API server's own).
fn vouched(status: TokenReviewStatus, audience: Option<&str>) -> Option<Identity> {
    let audiences = status.audiences.unwrap_or_default();
    let for_us = match audience {
        Some(audience) => audiences.iter().any(|x| x == audience),
        None => !audiences.is_empty(),
    };
    if status.authenticated != Some(true) || !for_us {
        return None;
    }
    let user = status.user?;
    Some(Identity {
        username: user.username?,
        uid: user.uid,
        groups: user.groups.unwrap_or_default(),
        extra: user.extra.unwrap_or_default(),
    })
}

impl Authenticator {
    pub fn new(client: Client, mode: Mode, metadata_url: String, origins: Origins) -> Self {
        Self {
            client,
            mode,
            metadata_url,
            origins: Arc::new(origins),
            tokens: Arc::new(TtlLru::new(IDENTITIES_CACHED, IDENTITY_TTL)),
            decisions: Arc::new(TtlLru::new(DECISIONS_CACHED, DECISION_TTL)),
            budget: Arc::new(ReviewBudget::default()),
            access_budgets: Arc::new(CallerBudgets::new(
                ACCESS_REVIEWS_PER_CALLER,
                ACCESS_REVIEWS_PER_TENANT,
                2 * IDENTITIES_CACHED,
            )),
            people_audiences: Arc::new(Vec::new()),
        }
    }

    /// Also accepts people's ID tokens issued for one of `audiences` (the client IDs of an OpenID Connect
    /// issuer the API server trusts): such an authenticator vouches for a token only for the API server's
    /// own audiences, so a token for the MCP audience can never come from it.
    pub fn accepting_people(mut self, audiences: Vec<String>) -> Self {
        self.people_audiences = Arc::new(audiences);
        self
    }

    /// One TokenReview: for `audience`, or with none (the API server's own audiences).
    async fn review(
        &self,
        token: &str,
        audience: Option<&str>,
    ) -> Result<Option<TokenReviewStatus>, kube::Error> {
        let review = TokenReview {
            spec: TokenReviewSpec { token: token.into(), audiences: audience.map(|a| vec![a.into()]) },
            ..Default::default()
        };
        let reviewed =
            Api::<TokenReview>::all(self.client.clone()).create(&PostParams::default(), &review).await?;
        Ok(reviewed.status)
    }

    /// Who a token stands for: a token for `audience`, or a person's ID token for one of the accepted people
    /// audiences, which the API server vouches for only as for a request to itself (one review each: the
    /// token's own unverified `aud` says which to ask for). Never a ServiceAccount on that second path: a
    /// ServiceAccount can always get a token for the MCP audience, so one without it was not meant for us.
    async fn identify(&self, token: &str, audience: &str) -> Result<Option<Identity>, kube::Error> {
        let named = people_audiences(token);
        let a_persons =
            !named.iter().any(|a| a == audience) && named.iter().any(|a| self.people_audiences.contains(a));
        if !a_persons {
            return Ok(self.review(token, Some(audience)).await?.and_then(|s| vouched(s, Some(audience))));
        }
        let person = self.review(token, None).await?.and_then(|s| vouched(s, None));
        Ok(person.filter(|p| !p.username.starts_with("system:serviceaccount:")))
    }

    /// The identity a token stands for. A token never vouched for costs a TokenReview from the budget; one
    /// vouched for before is looked at again when its answer is stale, outside the budget (only valid
    /// tokens get there, and the cache bounds how many), so a flood of bad tokens cannot lock out callers
    /// the server already knows.
    pub async fn authenticate(&self, token: &str, audience: &str) -> Result<Reviewed, kube::Error> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let _permit = match self.tokens.get(&digest) {
            Some(Cached::Fresh(identity)) => return Ok(Reviewed::Valid(identity)),
            Some(Cached::Stale(_)) => None,
            None => match self.budget.admit().await {
                Ok(permit) => Some(permit),
                Err(wait) => return Ok(Reviewed::Limited(wait)),
            },
        };
        Ok(match self.identify(token, audience).await? {
            Some(identity) => {
                self.tokens.insert(digest, identity.clone());
                Reviewed::Valid(identity)
            }
            None => {
                self.tokens.remove(&digest);
                Reviewed::Invalid
            }
        })
    }

    /// Whether RBAC allows `who` the `access`. An answer not in the cache costs a SubjectAccessReview from
    /// the caller's own budget.
    pub async fn authorize(&self, who: &Identity, access: &Access) -> Result<Decision, kube::Error> {
        let key = (who.clone(), access.clone());
        if let Some(Cached::Fresh(allowed)) = self.decisions.get(&key) {
            return Ok(if allowed { Decision::Allowed } else { Decision::Denied });
        }
        if let Err(wait) = self.access_budgets.take(&Caller::of(&who.username)) {
            return Ok(Decision::Limited(wait));
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(who.username.clone()),
                uid: who.uid.clone(),
                groups: Some(who.groups.clone()),
                extra: (!who.extra.is_empty()).then(|| who.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some("fleetroll.dev".into()),
                    resource: Some("fleetrollouts".into()),
                    verb: Some(access.verb.as_str().into()),
                    namespace: access.namespace.clone(),
                    name: access.name.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let reviewed = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let allowed = reviewed.status.is_some_and(|s| s.allowed);
        self.decisions.insert(key, allowed);
        Ok(if allowed { Decision::Allowed } else { Decision::Denied })
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine;

    use super::*;

    fn jwt(claims: serde_json::Value) -> String {
        let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        format!("{}.{}.{}", b64(br#"{"alg":"RS256"}"#), b64(claims.to_string().as_bytes()), b64(b"sig"))
    }

    #[test]
    fn the_audiences_a_token_names_are_read_from_its_claims_and_nothing_else_is() {
        assert_eq!(people_audiences(&jwt(serde_json::json!({"aud": "kubectl"}))), ["kubectl"]);
        assert_eq!(people_audiences(&jwt(serde_json::json!({"aud": ["a", "b"]}))), ["a", "b"]);
        assert!(people_audiences(&jwt(serde_json::json!({"sub": "alice"}))).is_empty());
        assert!(people_audiences(&jwt(serde_json::json!({"aud": 7}))).is_empty());
        for hostile in
            ["", "opaque-token", "a.b", "a.!!!.c", "a.b.c.d", &format!("a.{}.c", "A".repeat(100_000))]
        {
            assert!(people_audiences(hostile).is_empty(), "{hostile:.40}");
        }
    }

    #[test]
    fn a_review_vouches_for_the_audience_asked_or_for_the_api_servers_own() {
        let status = |audiences: &[&str]| TokenReviewStatus {
            authenticated: Some(true),
            audiences: Some(audiences.iter().map(|a| a.to_string()).collect()),
            user: Some(k8s_openapi::api::authentication::v1::UserInfo {
                username: Some("oidc:alice".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(vouched(status(&["https://x/mcp"]), Some("https://x/mcp")).is_some());
        assert!(vouched(status(&["https://kubernetes.default.svc"]), Some("https://x/mcp")).is_none());
        assert!(vouched(status(&["https://kubernetes.default.svc"]), None).is_some());
        assert!(vouched(status(&[]), None).is_none());
        let refused = TokenReviewStatus { authenticated: Some(false), ..status(&["https://x/mcp"]) };
        assert!(vouched(refused, Some("https://x/mcp")).is_none());
    }
}
