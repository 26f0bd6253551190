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
}

/// The identity a TokenReview vouched for, if it did so for `audience`.
fn vouched(status: TokenReviewStatus, audience: &str) -> Option<Identity> {
    let for_us = status.audiences.as_ref().is_some_and(|a| a.iter().any(|x| x == audience));
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
        }
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
        let review = TokenReview {
            spec: TokenReviewSpec { token: token.into(), audiences: Some(vec![audience.into()]) },
            ..Default::default()
        };
        let reviewed =
            Api::<TokenReview>::all(self.client.clone()).create(&PostParams::default(), &review).await?;
        Ok(match reviewed.status.and_then(|s| vouched(s, audience)) {
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
