//! Who publishes: a ServiceAccount token, checked by the API server (a `TokenReview`) for
//! this component's audience, names the one namespace its holder may publish into. The
//! broker takes no tenant's connection (docs/security.md, door 8), so this is the only way in.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use thiserror::Error;
use tokio::sync::Semaphore;

/// The audience a publisher's token must be made for (`kubectl create token SA --audience
/// wasmless-events`, or a projected token): a token for the API server is not replayed here,
/// and one made for us is worth nothing to the API server.
pub const AUDIENCE: &str = "wasmless-events";

/// How long a reviewed token is trusted without asking again: a deleted ServiceAccount's
/// token publishes for at most this long after.
const REMEMBER_FOR: Duration = Duration::from_secs(60);
/// Tokens remembered at once, and of one namespace: past either, a new token is checked on
/// each publish (and waits for a review), while the tokens remembered stay, so one
/// namespace minting tokens does not make every other namespace's be checked again.
const REMEMBERED: usize = 4096;
const REMEMBERED_PER_NAMESPACE: usize = 256;
/// Reviews asked of the API server at once: a flood of made-up tokens waits here, it does
/// not become a flood of TokenReviews; a publish that waits longer than `REVIEW_WAIT` for
/// one is answered 503.
const REVIEWS_AT_ONCE: usize = 8;
const REVIEW_WAIT: Duration = Duration::from_secs(5);
/// A ServiceAccount token is a JWT of a few hundred bytes to a few KiB.
const MAX_TOKEN_BYTES: usize = 8 << 10;

/// A publisher: the ServiceAccount its token belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub namespace: String,
    pub service_account: String,
}

#[derive(Debug, Error)]
pub enum AuthError {
    #[error(
        "no bearer token: send `Authorization: Bearer <token>` with a token of a ServiceAccount of the namespace, made for the audience {AUDIENCE} (kubectl create token default -n <namespace> --audience {AUDIENCE})"
    )]
    Missing,
    #[error(
        "the token was not accepted: {0}; make one for the audience {AUDIENCE} (kubectl create token default -n <namespace> --audience {AUDIENCE})"
    )]
    Refused(String),
    #[error("the token is {0}'s, not a ServiceAccount's: publish with a token of a ServiceAccount of the namespace")]
    NotServiceAccount(String),
    #[error("the API server could not check the token: {0}")]
    Unavailable(String),
}

/// Tells who holds a token.
pub trait Authenticate: Send + Sync + 'static {
    fn authenticate(&self, token: &str) -> impl Future<Output = Result<Caller, AuthError>> + Send;
}

/// The ServiceAccount a username names: `system:serviceaccount:<namespace>:<name>`.
pub fn service_account(username: &str) -> Result<Caller, AuthError> {
    let not_one = || AuthError::NotServiceAccount(username.to_string());
    let rest = username.strip_prefix("system:serviceaccount:").ok_or_else(not_one)?;
    let (namespace, name) = rest.split_once(':').ok_or_else(not_one)?;
    if namespace.is_empty() || name.is_empty() || name.contains(':') {
        return Err(not_one());
    }
    Ok(Caller {
        namespace: namespace.to_string(),
        service_account: name.to_string(),
    })
}

/// Three dot-separated parts of base64url, at most `MAX_TOKEN_BYTES`: what is not is
/// refused without asking the API server.
fn looks_like_a_jwt(token: &str) -> bool {
    token.len() <= MAX_TOKEN_BYTES
        && token.split('.').count() == 3
        && token.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
        })
}

/// Asks the API server, remembering its answer about a token for a minute.
pub struct TokenReviewer {
    api: kube::Api<k8s_openapi::api::authentication::v1::TokenReview>,
    remembered: Mutex<HashMap<[u8; 32], (Caller, Instant)>>,
    reviews: Semaphore,
}

impl TokenReviewer {
    pub fn new(client: kube::Client) -> Self {
        Self {
            api: kube::Api::all(client),
            remembered: Mutex::new(HashMap::new()),
            reviews: Semaphore::new(REVIEWS_AT_ONCE),
        }
    }

    fn recall(&self, key: &[u8; 32]) -> Option<Caller> {
        let remembered = self.remembered.lock().expect("tokens");
        remembered
            .get(key)
            .filter(|(_, at)| at.elapsed() < REMEMBER_FOR)
            .map(|(caller, _)| caller.clone())
    }

    fn remember(&self, key: [u8; 32], caller: &Caller) {
        let mut remembered = self.remembered.lock().expect("tokens");
        remembered.retain(|_, (_, at)| at.elapsed() < REMEMBER_FOR);
        let of_namespace = remembered
            .values()
            .filter(|(known, _)| known.namespace == caller.namespace)
            .count();
        if remembered.len() < REMEMBERED && of_namespace < REMEMBERED_PER_NAMESPACE {
            remembered.insert(key, (caller.clone(), Instant::now()));
        }
    }

    async fn review(&self, token: &str) -> Result<Caller, AuthError> {
        use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: Some(vec![AUDIENCE.to_string()]),
            },
            ..Default::default()
        };
        let answer = self
            .api
            .create(&kube::api::PostParams::default(), &review)
            .await
            .map_err(|error| AuthError::Unavailable(error.to_string()))?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err(AuthError::Refused(
                status
                    .error
                    .unwrap_or_else(|| "the API server did not authenticate it".to_string()),
            ));
        }
        // An API server that ignores the audiences asked for answers without them.
        if !status
            .audiences
            .unwrap_or_default()
            .iter()
            .any(|audience| audience == AUDIENCE)
        {
            return Err(AuthError::Refused(format!("it is not for the audience {AUDIENCE}")));
        }
        let username = status.user.and_then(|user| user.username).unwrap_or_default();
        service_account(&username)
    }
}

impl Authenticate for TokenReviewer {
    async fn authenticate(&self, token: &str) -> Result<Caller, AuthError> {
        if !looks_like_a_jwt(token) {
            return Err(AuthError::Refused(
                "it is not a ServiceAccount token (a JWT)".to_string(),
            ));
        }
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(caller) = self.recall(&key) {
            return Ok(caller);
        }
        let _review = match tokio::time::timeout(REVIEW_WAIT, self.reviews.acquire()).await {
            Ok(Ok(permit)) => permit,
            _ => {
                return Err(AuthError::Unavailable(
                    "too many tokens are being checked at once; try again".to_string(),
                ));
            }
        };
        // Another request with the same token may have been answered while this one waited.
        if let Some(caller) = self.recall(&key) {
            return Ok(caller);
        }
        let caller = self.review(token).await?;
        self.remember(key, &caller);
        Ok(caller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_shaped_as_a_jwt_is_refused_without_a_review() {
        assert!(looks_like_a_jwt("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln-_x"));
        for token in [
            "",
            "abc",
            "a.b",
            "a.b.c.d",
            "a..c",
            "a.b.c d",
            "a.b.c=",
            "a".repeat(9000).as_str(),
        ] {
            assert!(!looks_like_a_jwt(token), "{token:?}");
        }
    }

    #[test]
    fn only_a_service_accounts_username_names_a_namespace() {
        assert_eq!(
            service_account("system:serviceaccount:shop:orders").unwrap(),
            Caller {
                namespace: "shop".into(),
                service_account: "orders".into()
            }
        );
        for username in [
            "alice",
            "system:node:worker-1",
            "system:serviceaccount:shop",
            "system:serviceaccount::orders",
            "system:serviceaccount:shop:",
            "system:serviceaccount:shop:orders:extra",
            "",
        ] {
            assert!(
                matches!(service_account(username), Err(AuthError::NotServiceAccount(_))),
                "{username:?} named a ServiceAccount"
            );
        }
    }
}
