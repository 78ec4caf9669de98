//! The broker as NATS JetStream: a stream per namespace, a durable pull consumer per
//! (Function, trigger), naks with a delay for retries, terms for giving up, the
//! `Nats-Msg-Id` header for deduplication within the stream's window.

use super::{Broker, BrokerError, ConsumerSpec, Delivery, Message, Progress, Publish};
use async_nats::jetstream::{self, AckKind, consumer, stream};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use std::time::{Duration, SystemTime};

/// What a namespace's stream holds by default (`--namespace-max-bytes`): past it, a publish
/// is refused (the publisher sees it), not the namespace's oldest messages dropped, and no
/// namespace fills the broker's disk for the others. The broker reserves it whole for each
/// stream when the stream is made, so its store holds this many namespaces' streams and no
/// more: 9 GB holds 72 of them.
pub const NAMESPACE_BYTES: i64 = 128 << 20;
/// The largest message body, and so the largest event.
pub const MAX_MESSAGE_BYTES: i32 = 1 << 20;
/// Room for a message's headers beside its body, in the stream's limit on a message: a
/// dead letter of the largest body carries its last error (up to 512 bytes) and the
/// publisher's headers too.
const HEADER_ROOM: i32 = 64 << 10;

/// How long a namespace's stream keeps a message no consumer has settled.
pub const KEEP_FOR: Duration = Duration::from_secs(7 * 24 * 3600);
/// The broker keeps a message published twice with one id once, within this: the longest a
/// publisher that did not see its first publish acknowledged takes to send it again.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

pub struct JetStream {
    context: jetstream::Context,
    namespace_bytes: i64,
}

impl JetStream {
    /// `credentials`: the user and password the broker knows this component by, when it
    /// asks for one (the installed broker does: no one else may connect).
    pub async fn connect(url: &str, credentials: Option<(String, String)>) -> Result<Self, BrokerError> {
        let mut options = async_nats::ConnectOptions::new()
            .name("wasmless-events")
            .connection_timeout(Duration::from_secs(5));
        if let Some((user, password)) = credentials {
            options = options.user_and_password(user, password);
        }
        let client = options.connect(url).await.map_err(|source| BrokerError::Connect {
            url: url.to_string(),
            source: Box::new(source),
        })?;
        Ok(Self {
            context: jetstream::new(client),
            namespace_bytes: NAMESPACE_BYTES,
        })
    }

    /// What each namespace's stream holds at most (default [`NAMESPACE_BYTES`]).
    pub fn with_namespace_bytes(mut self, bytes: i64) -> Self {
        self.namespace_bytes = bytes;
        self
    }

    async fn stream(&self, consumer: &ConsumerSpec) -> Result<jetstream::stream::Stream, BrokerError> {
        let name = crate::names::stream(&consumer.trigger.namespace);
        self.context
            .get_stream(&name)
            .await
            .map_err(|error| BrokerError::refused(format!("open stream {name}"), error))
    }
}

impl Broker for JetStream {
    type Delivery = JetStreamDelivery;

    async fn ensure_namespace(&self, namespace: &str) -> Result<(), BrokerError> {
        let name = crate::names::stream(namespace);
        let config = stream::Config {
            name: name.clone(),
            subjects: vec![crate::names::namespace_subjects(namespace)],
            // Limits, not a work queue: each trigger on a subject has a consumer of its
            // own and gets every message.
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            max_age: KEEP_FOR,
            max_bytes: self.namespace_bytes,
            max_message_size: MAX_MESSAGE_BYTES + HEADER_ROOM,
            discard: stream::DiscardPolicy::New,
            duplicate_window: DUPLICATE_WINDOW,
            ..Default::default()
        };
        self.context
            .create_or_update_stream(config)
            .await
            .map(drop)
            .map_err(|error| BrokerError::refused(format!("make stream {name}"), error))
    }

    async fn ensure_consumer(&self, spec: &ConsumerSpec) -> Result<(), BrokerError> {
        let durable = spec.trigger.durable();
        let config = consumer::pull::Config {
            durable_name: Some(durable.clone()),
            filter_subject: spec.subject.clone(),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: spec.ack_wait,
            max_deliver: i64::from(spec.max_deliver),
            max_ack_pending: i64::from(spec.max_in_flight),
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        };
        // Made, or changed to this spec (the server's create is create-or-update).
        self.stream(spec)
            .await?
            .create_consumer(config)
            .await
            .map(drop)
            .map_err(|error| BrokerError::refused(format!("make consumer {durable}"), error))
    }

    async fn publish(&self, message: Publish) -> Result<(), BrokerError> {
        let mut headers = async_nats::HeaderMap::new();
        for (name, value) in &message.headers {
            headers.append(name.as_str(), value.as_str());
        }
        if let Some(id) = &message.id {
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
        }
        let subject = message.subject.clone();
        let no_stream_or = |error: jetstream::context::PublishError, what: &str| {
            if error.kind() == jetstream::context::PublishErrorKind::StreamNotFound {
                BrokerError::NoStream {
                    subject: subject.clone(),
                }
            } else {
                BrokerError::refused(format!("{what} {subject}"), error)
            }
        };
        let acknowledged = self
            .context
            .publish_with_headers(message.subject.clone(), headers, message.payload)
            .await
            .map_err(|error| no_stream_or(error, "publish to"))?;
        // Durable only once the stream has acknowledged it.
        acknowledged
            .await
            .map(drop)
            .map_err(|error| no_stream_or(error, "store a message on"))
    }

    async fn last_id(&self, namespace: &str, subject: &str) -> Result<Option<String>, BrokerError> {
        let name = crate::names::stream(namespace);
        let Ok(stream) = self.context.get_stream(&name).await else {
            return Ok(None);
        };
        match stream.get_last_raw_message_by_subject(subject).await {
            Ok(message) => Ok(message
                .headers
                .get(async_nats::header::NATS_MESSAGE_ID)
                .map(|id| id.as_str().to_string())),
            Err(error) if error.kind() == jetstream::stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(error) => Err(BrokerError::refused(
                format!("read the last message on {subject}"),
                error,
            )),
        }
    }

    async fn trim(&self, namespace: &str, subject: &str, keep: u64) -> Result<(), BrokerError> {
        let name = crate::names::stream(namespace);
        let stream = self
            .context
            .get_stream(&name)
            .await
            .map_err(|error| BrokerError::refused(format!("open stream {name}"), error))?;
        stream
            .purge()
            .filter(subject)
            .keep(keep)
            .await
            .map(drop)
            .map_err(|error| BrokerError::refused(format!("trim {subject}"), error))
    }

    async fn consume(
        &self,
        spec: &ConsumerSpec,
    ) -> Result<BoxStream<'static, Result<JetStreamDelivery, BrokerError>>, BrokerError> {
        let durable = spec.trigger.durable();
        let consumer: consumer::PullConsumer = self
            .stream(spec)
            .await?
            .get_consumer(&durable)
            .await
            .map_err(|error| BrokerError::refused(format!("open consumer {durable}"), error))?;
        let messages = consumer
            .messages()
            .await
            .map_err(|error| BrokerError::refused(format!("read consumer {durable}"), error))?;
        Ok(messages
            .map(move |next| {
                let inner = next.map_err(|error| BrokerError::refused("hand out a message", error))?;
                JetStreamDelivery::new(inner)
            })
            .boxed())
    }

    async fn remove_consumer(&self, spec: &ConsumerSpec) -> Result<(), BrokerError> {
        let durable = spec.trigger.durable();
        let stream = match self.stream(spec).await {
            Ok(stream) => stream,
            // No stream, so no consumer.
            Err(_) => return Ok(()),
        };
        match stream.delete_consumer(&durable).await {
            Ok(_) => Ok(()),
            Err(error) if error.to_string().contains("not found") => Ok(()),
            Err(error) => Err(BrokerError::refused(format!("remove consumer {durable}"), error)),
        }
    }

    async fn progress(&self, spec: &ConsumerSpec) -> Result<Progress, BrokerError> {
        let durable = spec.trigger.durable();
        let stream = self.stream(spec).await?;
        let info = stream
            .consumer_info(&durable)
            .await
            .map_err(|error| BrokerError::refused(format!("read consumer {durable}"), error))?;
        let dead_letter = spec.trigger.dead_letter_subject();
        let read_dead_letters = |error| BrokerError::refused(format!("count the messages on {dead_letter}"), error);
        let mut subjects = stream
            .info_with_subjects(&dead_letter)
            .await
            .map_err(read_dead_letters)?;
        let mut dead_letters = 0;
        while let Some((_, count)) = subjects.try_next().await.map_err(read_dead_letters)? {
            dead_letters += count as u64;
        }
        Ok(Progress {
            lag: info.num_pending + info.num_ack_pending as u64,
            last_delivered: info.delivered.last_active.map(SystemTime::from),
            dead_letters,
        })
    }
}

pub struct JetStreamDelivery {
    inner: jetstream::Message,
    message: Message,
}

impl JetStreamDelivery {
    fn new(inner: jetstream::Message) -> Result<Self, BrokerError> {
        let info = inner
            .info()
            .map_err(|error| BrokerError::refused("say which message it handed out", error))?;
        let headers: Vec<(String, String)> = inner
            .headers
            .iter()
            .flat_map(|headers| headers.iter())
            .flat_map(|(name, values)| {
                values
                    .iter()
                    .map(move |value| (name.to_string(), value.as_str().to_string()))
            })
            .collect();
        let published = SystemTime::UNIX_EPOCH
            + Duration::from_nanos(u64::try_from(info.published.unix_timestamp_nanos()).unwrap_or(0));
        let id = headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(async_nats::header::NATS_MESSAGE_ID.as_ref()))
            .map(|(_, id)| id.clone())
            .unwrap_or_else(|| format!("{}-{}", info.stream, info.stream_sequence));
        let message = Message {
            id,
            subject: inner.subject.to_string(),
            attempt: u32::try_from(info.delivered).unwrap_or(u32::MAX),
            headers,
            payload: inner.payload.clone(),
            published,
        };
        Ok(Self { inner, message })
    }

    async fn settle(self, kind: AckKind, what: &str) -> Result<(), BrokerError> {
        self.inner
            .ack_with(kind)
            .await
            .map_err(|error| BrokerError::refused(format!("{what} message {}", self.message.id), error))
    }
}

impl Delivery for JetStreamDelivery {
    fn message(&self) -> &Message {
        &self.message
    }

    async fn in_progress(&self) -> Result<(), BrokerError> {
        self.inner
            .ack_with(AckKind::Progress)
            .await
            .map_err(|error| BrokerError::refused(format!("extend message {}", self.message.id), error))
    }

    async fn ack(self) -> Result<(), BrokerError> {
        self.settle(AckKind::Ack, "acknowledge").await
    }

    async fn retry_in(self, delay: Duration) -> Result<(), BrokerError> {
        self.settle(AckKind::Nak(Some(delay)), "hand out again later").await
    }

    async fn give_up(self) -> Result<(), BrokerError> {
        self.settle(AckKind::Term, "stop handing out").await
    }
}
