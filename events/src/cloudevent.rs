//! A message as the HTTP request a Function's handler gets: the CloudEvents binary mode
//! (`ce-specversion`, `ce-id`, `ce-source`, `ce-type`, `ce-time`, `ce-subject`, the payload
//! as the body with its `content-type`), written by the CNCF SDK. A Goless handler reads
//! the attributes as headers; no new guest ABI.

use crate::broker::Message;
use crate::names::TriggerRef;
use bytes::Bytes;
use cloudevents::message::BinaryDeserializer;
use cloudevents::{EventBuilder, EventBuilderV10};
use thiserror::Error;

/// Which try of the message this request is, 1 for the first: the same `ce-id` on every
/// try, so a handler that must not act twice keys on that, and may log this.
pub const ATTEMPT_HEADER: &str = "wasmless-delivery-attempt";

/// What a payload with no `Content-Type` of its publisher's is sent as.
const BYTES: &str = "application/octet-stream";

/// The `ce-type` of each kind of trigger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Queue,
    Schedule,
    Async,
}

impl Kind {
    pub fn event_type(self) -> &'static str {
        match self {
            Kind::Queue => "io.wasmless.queue",
            Kind::Schedule => "io.wasmless.schedule",
            Kind::Async => "io.wasmless.async",
        }
    }
}

#[derive(Debug, Error)]
pub enum EventError {
    #[error("message {id} cannot be made a CloudEvent: {source}")]
    Event {
        id: String,
        #[source]
        source: cloudevents::event::EventBuilderError,
    },
    #[error("message {id} cannot be made an HTTP request: {source}")]
    Request {
        id: String,
        #[source]
        source: cloudevents::message::Error,
    },
}

/// The POST to `url` (the Function's Service and the trigger's path) carrying `message`.
pub fn request(
    trigger: &TriggerRef,
    kind: Kind,
    url: &http::Uri,
    message: &Message,
) -> Result<http::Request<Bytes>, EventError> {
    let time: chrono::DateTime<chrono::Utc> = message.published.into();
    let mut event = EventBuilderV10::new()
        .id(&message.id)
        .source(trigger.source())
        .ty(kind.event_type())
        .time(time)
        .data(
            message.header("content-type").unwrap_or(BYTES),
            message.payload.to_vec(),
        );
    // The subject as the namespace's user wrote it, which says which of a wildcard's
    // subjects this message came on; a schedule's ticks come on Wasmless's own.
    if kind == Kind::Queue
        && let Some(subject) = message
            .subject
            .strip_prefix(&format!("wasmless.{}.", trigger.namespace))
    {
        event = event.subject(subject);
    }
    let event = event.build().map_err(|source| EventError::Event {
        id: message.id.clone(),
        source,
    })?;
    let builder = http::Request::builder()
        .method(http::Method::POST)
        .uri(url.clone())
        .header(ATTEMPT_HEADER, message.attempt);
    let request: http::Request<Option<Bytes>> =
        event
            .deserialize_binary(builder)
            .map_err(|source| EventError::Request {
                id: message.id.clone(),
                source,
            })?;
    Ok(request.map(Option::unwrap_or_default))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn message(headers: Vec<(String, String)>) -> Message {
        Message {
            id: "order-17".into(),
            subject: "wasmless.shop.orders.created".into(),
            attempt: 2,
            headers,
            payload: Bytes::from_static(b"{\"order\":17}"),
            published: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        }
    }

    #[test]
    fn a_message_is_a_binary_mode_cloudevent() {
        let trigger = TriggerRef::new("shop", "orders", "created");
        let url: http::Uri = "http://orders.shop.svc:80/hook".parse().unwrap();
        let headers = vec![("Content-Type".to_string(), "application/json".to_string())];
        let request = request(&trigger, Kind::Queue, &url, &message(headers)).unwrap();
        let header = |name: &str| request.headers()[name].to_str().unwrap().to_string();
        assert_eq!(request.method(), http::Method::POST);
        assert_eq!(request.uri(), &url);
        assert_eq!(header("ce-specversion"), "1.0");
        assert_eq!(header("ce-id"), "order-17");
        assert_eq!(header("ce-source"), "wasmless/shop/orders/created");
        assert_eq!(header("ce-type"), "io.wasmless.queue");
        assert_eq!(header("ce-subject"), "orders.created");
        assert!(
            header("ce-time").starts_with("2023-11-14T22:13:20"),
            "{}",
            header("ce-time")
        );
        assert_eq!(header("content-type"), "application/json");
        assert_eq!(header(ATTEMPT_HEADER), "2");
        assert_eq!(request.body().as_ref(), b"{\"order\":17}");
    }

    #[test]
    fn a_payload_without_a_type_is_sent_as_bytes() {
        let trigger = TriggerRef::new("shop", "orders", "created");
        let request = request(
            &trigger,
            Kind::Schedule,
            &"http://orders/".parse().unwrap(),
            &message(vec![]),
        )
        .unwrap();
        assert_eq!(request.headers()["content-type"], BYTES);
        assert_eq!(request.headers()["ce-type"], "io.wasmless.schedule");
    }
}
