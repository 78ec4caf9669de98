//! One trigger's messages delivered to its Function: `deliver_all` reads the trigger's
//! consumer and runs up to its in-flight limit of `deliver` at once; each sends the
//! message's request (`send`), asks `retry::decide` what the answer means, and settles the
//! message with the broker: acknowledged only after a 2xx, handed out again after a
//! growing delay, or, after the last try, parked on the dead-letter subject with its last
//! error (published, durably, before the broker is told to stop handing it out).

use crate::broker::{Broker, BrokerError, ConsumerSpec, Delivery, Message, Publish};
use crate::cloudevent::{self, Kind};
use crate::endpoints::Addresses;
use crate::journal::Journal;
use crate::metrics::{EventMetrics, Outcome};
use crate::names::TriggerRef;
use crate::retry::{self, Answer, Decision, DeliveryPolicy};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Headers of a dead letter, beside the message's own: why and after how many tries.
pub const LAST_ERROR_HEADER: &str = "Wasmless-Last-Error";
pub const ATTEMPTS_HEADER: &str = "Wasmless-Attempts";
/// The subject the message was published on, and its id (`ce-id`).
pub const SUBJECT_HEADER: &str = "Wasmless-Subject";
pub const EVENT_ID_HEADER: &str = "ce-id";

/// A response body read, at most, to say what went wrong: the rest is not read (and its
/// connection not reused).
const ERROR_BODY: usize = 512;
/// A 2xx's body is read to reuse the connection, up to this.
const DRAINED_BODY: usize = 64 * 1024;
/// How long a try that finds no ready Pod waits for the Pods read again before it counts as
/// "no answer": a trigger starts before its Function serves, and a pool pod is replaced.
const LOOK_FOR_PODS: Duration = Duration::from_secs(3);

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn http_client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(Duration::from_secs(5)));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// Where one trigger's events go, and how patiently.
pub struct Target {
    pub trigger: TriggerRef,
    pub kind: Kind,
    /// The Function's ready Pods (`endpoints.rs`), taken in turn.
    pub addresses: Arc<Addresses>,
    /// The trigger's path.
    pub path: String,
    pub policy: DeliveryPolicy,
    /// Where failed tries, dead letters and recoveries are noted for people.
    pub journal: Journal,
}

/// Delivers the consumer's messages until its stream ends; the caller starts it again. A
/// message that cannot be settled (the broker away for a moment) is logged and left to
/// the broker, which hands it out again after the consumer's `ack_wait`. Each delivery
/// holds one of the process's `in_flight` permits, shared by every trigger: one
/// namespace's triggers cannot hold more of the process's sockets and memory than that.
pub async fn deliver_all<B: Broker>(
    broker: Arc<B>,
    consumer: ConsumerSpec,
    target: Arc<Target>,
    client: HttpClient,
    metrics: EventMetrics,
    in_flight: Arc<Semaphore>,
) -> Result<(), BrokerError> {
    let deliveries = broker.consume(&consumer).await?;
    let limit = usize::try_from(consumer.max_in_flight.max(1)).unwrap_or(1);
    let ack_wait = consumer.ack_wait;
    deliveries
        .for_each_concurrent(limit, |next| {
            let (broker, target, client, metrics) = (broker.clone(), target.clone(), client.clone(), metrics.clone());
            let in_flight = in_flight.clone();
            async move {
                let delivered = match next {
                    Ok(delivery) => match wait_for_permit(&in_flight, &delivery, ack_wait).await {
                        Some(_permit) => deliver(broker.as_ref(), &target, &client, &metrics, delivery).await,
                        None => return,
                    },
                    Err(error) => Err(error),
                };
                if let Err(error) = delivered {
                    tracing::warn!(trigger = ?target.trigger, %error, "an event's delivery was interrupted; the broker hands it out again");
                }
            }
        })
        .await;
    Ok(())
}

/// One of the process's permits for `delivery`. While it waits (every trigger's deliveries
/// share them), the broker is told the message is in progress every half `ack_wait`, and
/// once more when the permit comes, so the try has a whole `ack_wait`: else the broker
/// would hand the message out again, and count a try it never had.
async fn wait_for_permit<D: Delivery>(
    in_flight: &Arc<Semaphore>,
    delivery: &D,
    ack_wait: Duration,
) -> Option<OwnedSemaphorePermit> {
    if let Ok(permit) = in_flight.clone().try_acquire_owned() {
        return Some(permit);
    }
    let acquire = in_flight.clone().acquire_owned();
    tokio::pin!(acquire);
    loop {
        tokio::select! {
            permit = &mut acquire => {
                mark_in_progress(delivery).await;
                return permit.ok();
            }
            () = tokio::time::sleep(ack_wait / 2) => mark_in_progress(delivery).await,
        }
    }
}

async fn mark_in_progress<D: Delivery>(delivery: &D) {
    if let Err(error) = delivery.in_progress().await {
        tracing::debug!(%error, "an event waiting for a slot not marked in progress");
    }
}

/// One try of one message, and what the broker is told after it.
pub async fn deliver<B: Broker>(
    broker: &B,
    target: &Target,
    client: &HttpClient,
    metrics: &EventMetrics,
    delivery: B::Delivery,
) -> Result<(), BrokerError> {
    let message = delivery.message().clone();
    let tried = match target.addresses.pick_or_wait(LOOK_FOR_PODS).await {
        None => no_answer("the Function has no ready pod (its own, or its namespace's pool) to take it".into()),
        Some(address) => match request_to(target, address, &message) {
            Ok(request) => send(client, request, target.policy.timeout).await,
            // Never a request on any try: given up on at once.
            Err(error) => Tried {
                answer: Answer::Status {
                    status: 400,
                    retry_after: None,
                },
                error,
            },
        },
    };
    let jitter = rand::random_range(-retry::JITTER..=retry::JITTER);
    match retry::decide(&target.policy, message.attempt, &tried.answer, jitter) {
        Decision::Done => {
            delivery.ack().await?;
            metrics.delivered(&target.trigger, Outcome::Ok);
            if message.attempt > 1 {
                target
                    .journal
                    .handled_after_retries(&target.trigger, &message.id, message.attempt);
            }
            let waited = SystemTime::now().duration_since(message.published).unwrap_or_default();
            metrics.delivered_after(&target.trigger, waited.as_secs_f64());
        }
        Decision::RetryIn(delay) => {
            tracing::info!(trigger = ?target.trigger, id = %message.id, attempt = message.attempt, error = %tried.error, ?delay, "event failed; tried again later");
            delivery.retry_in(delay).await?;
            metrics.delivered(&target.trigger, Outcome::Retry);
            target
                .journal
                .retrying(&target.trigger, &message.id, message.attempt, &tried.error, delay);
        }
        Decision::GiveUp if target.policy.dead_letter => {
            tracing::warn!(trigger = ?target.trigger, id = %message.id, attempt = message.attempt, error = %tried.error, "event failed for the last time; parked as a dead letter");
            broker
                .publish(dead_letter(&target.trigger, &message, &tried.error))
                .await?;
            delivery.give_up().await?;
            metrics.delivered(&target.trigger, Outcome::DeadLetter);
            target
                .journal
                .dead_lettered(&target.trigger, &message.id, message.attempt, &tried.error);
        }
        Decision::GiveUp => {
            tracing::warn!(trigger = ?target.trigger, id = %message.id, attempt = message.attempt, error = %tried.error, "event failed for the last time; dropped (dead letters are off)");
            delivery.give_up().await?;
            metrics.delivered(&target.trigger, Outcome::Dropped);
            target
                .journal
                .dropped(&target.trigger, &message.id, message.attempt, &tried.error);
        }
    }
    Ok(())
}

fn request_to(target: &Target, address: SocketAddr, message: &Message) -> Result<http::Request<Bytes>, String> {
    let url: http::Uri = format!("http://{address}{}", target.path)
        .parse()
        .map_err(|error| format!("path {:?}: {error}", target.path))?;
    cloudevent::request(&target.trigger, target.kind, &url, message).map_err(|error| error.to_string())
}

/// What one try came to, and in words for a dead letter.
#[derive(Debug)]
pub struct Tried {
    pub answer: Answer,
    pub error: String,
}

/// Sends the request and reads enough of the answer to decide (and, for a 2xx, to reuse
/// the connection), all within `timeout`.
pub async fn send(client: &HttpClient, request: http::Request<Bytes>, timeout: Duration) -> Tried {
    let request = request.map(Full::new);
    let tried = async {
        let response = match client.request(request).await {
            Ok(response) => response,
            Err(error) => return no_answer(format!("no answer: {}", error_chain(&error))),
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(retry::retry_after);
        let limit = if status.is_success() { DRAINED_BODY } else { ERROR_BODY };
        let body = Limited::new(response.into_body(), limit)
            .collect()
            .await
            .map(|body| body.to_bytes())
            .unwrap_or_default();
        Tried {
            answer: Answer::Status {
                status: status.as_u16(),
                retry_after,
            },
            error: format!("status {}: {}", status.as_u16(), String::from_utf8_lossy(&body).trim()),
        }
    };
    tokio::time::timeout(timeout, tried)
        .await
        .unwrap_or_else(|_| no_answer(format!("no answer within {timeout:?} (spec.delivery.timeout)")))
}

fn no_answer(error: String) -> Tried {
    Tried {
        answer: Answer::NoAnswer,
        error,
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut words = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        words.push_str(": ");
        words.push_str(&cause.to_string());
        source = cause.source();
    }
    words
}

/// The message parked: its payload and headers, why it failed and after how many tries.
/// Its id is derived from the message's, so a reader that died between parking it and
/// telling the broker parks it again as the same message, which the broker keeps once.
pub fn dead_letter(trigger: &TriggerRef, message: &Message, error: &str) -> Publish {
    // The publisher's own headers, but not those the broker acts on (`Nats-Expected-…` would
    // refuse the dead letter) nor any it could use to forge what the dead letter says.
    let ours = |name: &str| {
        let name = name.to_ascii_lowercase();
        name.starts_with("nats-") || name.starts_with("wasmless-") || name.starts_with("ce-")
    };
    let mut headers: Vec<(String, String)> = message
        .headers
        .iter()
        .filter(|(name, _)| !ours(name))
        .cloned()
        .collect();
    headers.push((LAST_ERROR_HEADER.into(), header_safe(error)));
    headers.push((ATTEMPTS_HEADER.into(), message.attempt.to_string()));
    headers.push((SUBJECT_HEADER.into(), message.subject.clone()));
    headers.push((EVENT_ID_HEADER.into(), message.id.clone()));
    Publish {
        subject: trigger.dead_letter_subject(),
        // Per trigger: two triggers giving up on one message park one dead letter each.
        id: Some(format!("{}.dead.{}", message.id, trigger.durable())),
        headers,
        payload: message.payload.clone(),
    }
}

/// A handler's words as one header line: control characters become spaces, and a long
/// answer is cut.
fn header_safe(words: &str) -> String {
    words
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(ERROR_BODY)
        .collect()
}
