//! Publishing over HTTP: `POST /publish/<namespace>/<subject>` with a ServiceAccount token of
//! that namespace puts the body on the namespace's subject, for its Functions' queue
//! triggers. The broker itself takes connections from this component alone (its password
//! lives in `wasmless-system`), so a namespace reaches only its own subjects, and never
//! Wasmless's own (`_…`): docs/security.md, door 8.
//!
//! A request passes through named steps: [`publish`] reads it, [`authenticate`] says who
//! sent it, [`authorize`] checks that is the URL's namespace, [`message`] makes the
//! broker's message, and the broker stores it before the `202`.

use crate::broker::jetstream::MAX_MESSAGE_BYTES;
use crate::broker::{Broker, BrokerError, Publish};
use crate::identity::{AuthError, Authenticate, Caller};
use crate::metrics::IngressMetrics;
use crate::names::{self, NameError};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, StatusCode, header};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::sync::Semaphore;

/// The longest `ce-id` kept as the message's id (the broker's deduplication key).
const MAX_ID_BYTES: usize = 256;
/// Bodies being read at once, after their sender was authenticated: what publishes hold of
/// this process's memory is at most this many of the largest message.
const BODIES_AT_ONCE: usize = 64;
/// How long a publish waits for one of them, and how long its body may take to arrive.
const BODY_WAIT: Duration = Duration::from_secs(5);
const BODY_READ: Duration = Duration::from_secs(30);

#[derive(Debug, Error)]
pub enum IngressError {
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error(
        "the token is ServiceAccount {}/{}'s, which publishes into namespace {} only, not {namespace}",
        .caller.namespace, .caller.service_account, .caller.namespace
    )]
    OtherNamespace { caller: Caller, namespace: String },
    #[error(transparent)]
    Subject(#[from] NameError),
    #[error("the ce-id header is more than {MAX_ID_BYTES} bytes or not text; send a shorter one")]
    Id,
    #[error(
        "the body is more than {} bytes, the largest message; send a smaller one",
        MAX_MESSAGE_BYTES
    )]
    TooLarge,
    #[error("the body could not be read: {0}")]
    Body(String),
    #[error("the body did not arrive within {} s", BODY_READ.as_secs())]
    BodyTimeout,
    #[error("too many publishes are being read at once; try again")]
    Busy,
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

impl IntoResponse for IngressError {
    fn into_response(self) -> Response {
        let status = match &self {
            IngressError::Auth(AuthError::Missing | AuthError::Refused(_)) => StatusCode::UNAUTHORIZED,
            IngressError::Auth(AuthError::NotServiceAccount(_)) | IngressError::OtherNamespace { .. } => {
                StatusCode::FORBIDDEN
            }
            IngressError::Auth(AuthError::Unavailable(_)) => StatusCode::SERVICE_UNAVAILABLE,
            IngressError::Subject(_) | IngressError::Id | IngressError::Body(_) => StatusCode::BAD_REQUEST,
            IngressError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            IngressError::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            IngressError::Busy => StatusCode::SERVICE_UNAVAILABLE,
            IngressError::Broker(BrokerError::NoStream { .. }) => StatusCode::NOT_FOUND,
            IngressError::Broker(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        if status == StatusCode::SERVICE_UNAVAILABLE {
            tracing::warn!(error = %self, "a publish failed");
        }
        (
            status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("{self}\n"),
        )
            .into_response()
    }
}

pub struct Ingress<B, A> {
    broker: Arc<B>,
    authenticator: Arc<A>,
    metrics: IngressMetrics,
    bodies: Semaphore,
}

/// The ingress's routes: `POST /publish/{namespace}/{subject}`.
pub fn router<B: Broker, A: Authenticate>(
    broker: Arc<B>,
    authenticator: Arc<A>,
    metrics: IngressMetrics,
) -> axum::Router {
    let ingress = Arc::new(Ingress {
        broker,
        authenticator,
        metrics,
        bodies: Semaphore::new(BODIES_AT_ONCE),
    });
    axum::Router::new()
        .route("/publish/{namespace}/{subject}", axum::routing::post(publish::<B, A>))
        .with_state(ingress)
}

async fn publish<B: Broker, A: Authenticate>(
    State(ingress): State<Arc<Ingress<B, A>>>,
    Path((namespace, subject)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, IngressError> {
    let caller = authenticate(ingress.authenticator.as_ref(), &headers).await?;
    authorize(&caller, &namespace)?;
    let payload = read_body(&ingress.bodies, body).await?;
    let message = message(&namespace, &subject, &headers, payload)?;
    let id = message.id.clone();
    let published = ingress.broker.publish(message).await;
    ingress.metrics.published(&caller.namespace, published.is_ok());
    published?;
    tracing::debug!(%namespace, %subject, publisher = %caller.service_account, "published");
    let accepted = serde_json::json!({"namespace": namespace, "subject": subject, "id": id});
    Ok((StatusCode::ACCEPTED, axum::Json(accepted)).into_response())
}

/// The body, at most the largest message, read while holding one of `bodies`.
async fn read_body(bodies: &Semaphore, body: Body) -> Result<Bytes, IngressError> {
    let _reading = match tokio::time::timeout(BODY_WAIT, bodies.acquire()).await {
        Ok(Ok(permit)) => permit,
        _ => return Err(IngressError::Busy),
    };
    let read = tokio::time::timeout(BODY_READ, axum::body::to_bytes(body, MAX_MESSAGE_BYTES as usize))
        .await
        .map_err(|_| IngressError::BodyTimeout)?;
    read.map_err(|error| {
        if std::error::Error::source(&error).is_some_and(|source| source.is::<http_body_util::LengthLimitError>()) {
            IngressError::TooLarge
        } else {
            IngressError::Body(error.to_string())
        }
    })
}

/// Who sent the request: the holder of its bearer token.
pub async fn authenticate(authenticator: &impl Authenticate, headers: &HeaderMap) -> Result<Caller, AuthError> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|token| !token.is_empty())
        .ok_or(AuthError::Missing)?;
    authenticator.authenticate(token).await
}

/// A ServiceAccount publishes into its own namespace only.
pub fn authorize(caller: &Caller, namespace: &str) -> Result<(), IngressError> {
    if caller.namespace == namespace {
        Ok(())
    } else {
        Err(IngressError::OtherNamespace {
            caller: caller.clone(),
            namespace: namespace.to_string(),
        })
    }
}

/// The broker's message: on the namespace's subject, its id the request's `ce-id` (so a
/// publisher that sends one event twice has it delivered once), its `Content-Type` kept.
pub fn message(namespace: &str, subject: &str, headers: &HeaderMap, payload: Bytes) -> Result<Publish, IngressError> {
    let subject = names::publish_subject(namespace, subject)?;
    let id = match headers.get("ce-id") {
        None => None,
        Some(value) => {
            let id = value.to_str().map_err(|_| IngressError::Id)?;
            if id.is_empty() || id.len() > MAX_ID_BYTES {
                return Err(IngressError::Id);
            }
            Some(id.to_string())
        }
    };
    let headers = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(|content_type| vec![("Content-Type".to_string(), content_type.to_string())])
        .unwrap_or_default();
    Ok(Publish {
        subject,
        id,
        headers,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(namespace: &str) -> Caller {
        Caller {
            namespace: namespace.into(),
            service_account: "default".into(),
        }
    }

    #[test]
    fn a_service_account_publishes_into_its_own_namespace_only() {
        assert!(authorize(&caller("shop"), "shop").is_ok());
        let error = authorize(&caller("shop"), "billing").unwrap_err();
        assert_eq!(
            error.to_string(),
            "the token is ServiceAccount shop/default's, which publishes into namespace shop only, not billing"
        );
        assert_eq!(error.into_response().status(), StatusCode::FORBIDDEN);
    }

    #[test]
    fn the_message_keeps_the_events_id_and_content_type_and_nothing_else() {
        let mut headers = HeaderMap::new();
        headers.insert("ce-id", "order-7".parse().unwrap());
        headers.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        headers.insert("nats-expected-stream", "WASMLESS_billing".parse().unwrap());
        headers.insert("wasmless-last-error", "forged".parse().unwrap());
        let message = message("shop", "orders.created", &headers, Bytes::from_static(b"{}")).unwrap();
        assert_eq!(message.subject, "wasmless.shop.orders.created");
        assert_eq!(message.id.as_deref(), Some("order-7"));
        assert_eq!(
            message.headers,
            vec![("Content-Type".to_string(), "application/json".to_string())]
        );
    }

    #[test]
    fn a_wildcard_an_own_subject_or_a_long_id_is_a_bad_request() {
        let headers = HeaderMap::new();
        for subject in ["orders.*", ">", "_deadletter.f.t"] {
            let error = message("shop", subject, &headers, Bytes::new()).unwrap_err();
            assert_eq!(error.into_response().status(), StatusCode::BAD_REQUEST, "{subject}");
        }
        let mut headers = HeaderMap::new();
        headers.insert("ce-id", "x".repeat(MAX_ID_BYTES + 1).parse().unwrap());
        let error = message("shop", "orders", &headers, Bytes::new()).unwrap_err();
        assert_eq!(error.into_response().status(), StatusCode::BAD_REQUEST);
    }
}
