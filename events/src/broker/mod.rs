//! The broker behind triggers, as four verbs: publish, consume a durable consumer, settle a
//! delivery (ack, retry after a delay, give up), and read a consumer's progress. NATS JetStream
//! is the implementation (`jetstream.rs`); Kafka would be a second: durable → consumer
//! group, a retry after a delay → a retry topic with the delay in a header (Kafka has no
//! per-message redelivery), the message id → an idempotent producer's key.

pub mod jetstream;

use crate::names::TriggerRef;
use bytes::Bytes;
use futures::stream::BoxStream;
use std::future::Future;
use std::time::{Duration, SystemTime};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum BrokerError {
    #[error("cannot reach the broker at {url}: {source}; is it running, and does --nats-url name it?")]
    Connect {
        url: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// No stream takes the subject: no Function of its namespace has a trigger yet.
    #[error("no stream takes {subject}: no Function of its namespace has a queue trigger")]
    NoStream { subject: String },
    #[error("the broker refused to {what}: {source}")]
    Refused {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl BrokerError {
    pub(crate) fn refused(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Refused {
            what: what.into(),
            source: source.into(),
        }
    }
}

/// One trigger's durable consumer: where it reads, and the broker's own limits on it.
#[derive(Clone, Debug, PartialEq)]
pub struct ConsumerSpec {
    pub trigger: TriggerRef,
    /// The full subject it reads (`names::subject`).
    pub subject: String,
    /// Messages handed out and not yet settled, across every reader of this consumer.
    pub max_in_flight: u32,
    /// An unsettled message is handed out again after this (a reader that died with it).
    pub ack_wait: Duration,
    /// Deliveries after which the broker stops handing a message out. One more than the
    /// policy's tries: the last is the one on which a reader that died mid-way decides again.
    pub max_deliver: u32,
}

/// A message to publish.
#[derive(Clone, Debug, Default)]
pub struct Publish {
    pub subject: String,
    /// Deduplicated by the broker: the same id published twice within its window is kept once.
    pub id: Option<String>,
    pub headers: Vec<(String, String)>,
    pub payload: Bytes,
}

/// A message as a consumer hands it out.
#[derive(Clone, Debug)]
pub struct Message {
    /// The same on every redelivery: the publisher's id, else the stream and its sequence.
    pub id: String,
    pub subject: String,
    /// 1 on the first delivery.
    pub attempt: u32,
    pub headers: Vec<(String, String)>,
    pub payload: Bytes,
    pub published: SystemTime,
}

impl Message {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

pub trait Delivery: Send + Sync + 'static {
    fn message(&self) -> &Message;
    /// Still being worked on: not handed out again for another `ack_wait`.
    fn in_progress(&self) -> impl Future<Output = Result<(), BrokerError>> + Send;
    /// Done: never handed out again.
    fn ack(self) -> impl Future<Output = Result<(), BrokerError>> + Send;
    /// Handed out again after `delay`.
    fn retry_in(self, delay: Duration) -> impl Future<Output = Result<(), BrokerError>> + Send;
    /// Never handed out again, and not done (its dead letter, if any, is published first).
    fn give_up(self) -> impl Future<Output = Result<(), BrokerError>> + Send;
}

pub trait Broker: Send + Sync + 'static {
    type Delivery: Delivery;

    /// The namespace's stream exists (made if missing).
    fn ensure_namespace(&self, namespace: &str) -> impl Future<Output = Result<(), BrokerError>> + Send;
    /// The consumer exists with this spec (made, or changed to it).
    fn ensure_consumer(&self, consumer: &ConsumerSpec) -> impl Future<Output = Result<(), BrokerError>> + Send;
    /// Returns once the broker has the message durably.
    fn publish(&self, message: Publish) -> impl Future<Output = Result<(), BrokerError>> + Send;
    fn consume(
        &self,
        consumer: &ConsumerSpec,
    ) -> impl Future<Output = Result<BoxStream<'static, Result<Self::Delivery, BrokerError>>, BrokerError>> + Send;
    /// The consumer gone (its trigger or Function removed); gone already is fine.
    fn remove_consumer(&self, consumer: &ConsumerSpec) -> impl Future<Output = Result<(), BrokerError>> + Send;
    /// The id of the last message stored on `subject` of the namespace's stream (none when
    /// there is none, or no stream yet).
    fn last_id(
        &self,
        namespace: &str,
        subject: &str,
    ) -> impl Future<Output = Result<Option<String>, BrokerError>> + Send;
    /// Only the last `keep` messages on `subject` of the namespace's stream stay.
    fn trim(&self, namespace: &str, subject: &str, keep: u64) -> impl Future<Output = Result<(), BrokerError>> + Send;
    /// What the trigger's consumer has done so far.
    fn progress(&self, consumer: &ConsumerSpec) -> impl Future<Output = Result<Progress, BrokerError>> + Send;
}

/// A trigger's progress as the broker says it: its lag, last delivery and dead letters
/// (`wasmless_events_lag` and `status.triggers`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Messages of the consumer not yet handed out, and handed out but not settled.
    pub lag: u64,
    /// When a message was last handed out.
    pub last_delivered: Option<SystemTime>,
    /// Messages on the trigger's dead-letter subject.
    pub dead_letters: u64,
}
