//! What a person looks for when a Function's events go wrong, as Kubernetes Events on the
//! Function (`kubectl describe fn`, `wasmless events`): a try that failed and is tried
//! again, an event handled after retries, an event parked as a dead letter or dropped.
//!
//! Written off the delivery path: a delivery hands its note to a bounded queue and goes on
//! (a full queue loses the note, never the delivery). At most [`NOTES_PER_MINUTE`] notes a
//! minute per Function are written, then one saying how many were not: the metrics count
//! every try, these are what a person reads. Each note is an Event of its own (kube's
//! `Recorder` folds Events of one reason into a series that keeps the first note only).

use crate::names::TriggerRef;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The Events' `reportingController`, which `wasmless events` lists by.
pub const REPORTER: &str = "wasmless-events";
/// Notes a minute per Function; the rest are counted in one more.
pub const NOTES_PER_MINUTE: u32 = 30;
/// Notes waiting to be written, over every Function.
const QUEUE: usize = 1024;
/// An Event's note is at most 1 KiB.
const NOTE_BYTES: usize = 1024;

/// The Events' reasons.
pub const RETRYING: &str = "EventRetrying";
pub const HANDLED_AFTER_RETRIES: &str = "EventHandledAfterRetries";
pub const DEAD_LETTERED: &str = "EventDeadLettered";
pub const DROPPED: &str = "EventDropped";
pub const NOTES_SKIPPED: &str = "EventNotesSkipped";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub trigger: TriggerRef,
    /// The Function's UID: `kubectl describe` finds its Events by it, and a Function made
    /// again under the name does not show its predecessor's.
    pub function_uid: Option<String>,
    pub reason: &'static str,
    pub warning: bool,
    pub text: String,
}

/// Where delivery notes go: to the API server's Events, or nowhere (tests, a component
/// without the rights).
#[derive(Clone, Default)]
pub struct Journal {
    notes: Option<mpsc::Sender<Note>>,
    function_uid: Option<String>,
}

impl Journal {
    pub fn off() -> Self {
        Self::default()
    }

    /// Notes written as Events by a task of their own; `instance` is this replica's name.
    pub fn start(kube: kube::Client, instance: String) -> Self {
        let (sender, receiver) = mpsc::channel(QUEUE);
        tokio::spawn(keep_writing(kube, instance, receiver));
        Self {
            notes: Some(sender),
            function_uid: None,
        }
    }

    /// The journal of one Function's deliveries, by its UID.
    pub fn about(&self, function_uid: Option<String>) -> Self {
        Self {
            notes: self.notes.clone(),
            function_uid,
        }
    }

    /// A journal whose notes arrive on the returned receiver (tests).
    pub fn collecting() -> (Self, mpsc::Receiver<Note>) {
        let (sender, receiver) = mpsc::channel(QUEUE);
        let journal = Self {
            notes: Some(sender),
            function_uid: None,
        };
        (journal, receiver)
    }

    fn note(&self, trigger: &TriggerRef, reason: &'static str, warning: bool, text: String) {
        if let Some(notes) = &self.notes {
            let _ = notes.try_send(Note {
                trigger: trigger.clone(),
                function_uid: self.function_uid.clone(),
                reason,
                warning,
                text: cut(printable(&text)),
            });
        }
    }

    pub fn retrying(&self, trigger: &TriggerRef, id: &str, attempt: u32, error: &str, delay: Duration) {
        self.note(
            trigger,
            RETRYING,
            true,
            format!(
                "{}: event {id} failed on try {attempt} ({error}); tried again in {:.1}s",
                trigger.trigger,
                delay.as_secs_f64()
            ),
        );
    }

    pub fn handled_after_retries(&self, trigger: &TriggerRef, id: &str, attempt: u32) {
        self.note(
            trigger,
            HANDLED_AFTER_RETRIES,
            false,
            format!("{}: event {id} handled on try {attempt}", trigger.trigger),
        );
    }

    pub fn dead_lettered(&self, trigger: &TriggerRef, id: &str, attempt: u32, error: &str) {
        self.note(
            trigger,
            DEAD_LETTERED,
            true,
            format!(
                "{}: event {id} parked on {} after try {attempt}: {error}",
                trigger.trigger,
                trigger.dead_letter_subject()
            ),
        );
    }

    pub fn dropped(&self, trigger: &TriggerRef, id: &str, attempt: u32, error: &str) {
        self.note(
            trigger,
            DROPPED,
            true,
            format!(
                "{}: event {id} dropped after try {attempt} (dead letters are off): {error}",
                trigger.trigger
            ),
        );
    }
}

/// The note with no control character: it carries a handler's answer, which a terminal
/// showing `wasmless events` must not take for escape sequences or new lines.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' | '\r' | '\t' => ' ',
            c if c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c) || ('\u{2066}'..='\u{2069}').contains(&c) => {
                '?'
            }
            c => c,
        })
        .collect()
}

/// A note cut to an Event's size, on a character boundary.
fn cut(mut text: String) -> String {
    if text.len() > NOTE_BYTES {
        let mut end = NOTE_BYTES - 3;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    text
}

/// How many notes each Function has had written this minute, and how many it lost.
#[derive(Default)]
pub struct Budget {
    minutes: HashMap<(String, String), (Instant, u32, u32)>,
}

impl Budget {
    /// Whether a note of `function` may be written `at`; when a new minute begins after
    /// notes were skipped, also how many were.
    pub fn take(&mut self, function: (String, String), at: Instant) -> (bool, Option<u32>) {
        // Functions with nothing noted for a minute and nothing skipped are forgotten, so
        // the memory follows the Functions failing now, not every name ever noted.
        if self.minutes.len() > 1024 {
            self.minutes
                .retain(|_, (since, _, skipped)| *skipped > 0 || at.duration_since(*since) < Duration::from_secs(60));
        }
        let minute = self.minutes.entry(function).or_insert((at, 0, 0));
        let mut skipped_before = None;
        if at.duration_since(minute.0) >= Duration::from_secs(60) {
            if minute.2 > 0 {
                skipped_before = Some(minute.2);
            }
            *minute = (at, 0, 0);
        }
        if minute.1 < NOTES_PER_MINUTE {
            minute.1 += 1;
            (true, skipped_before)
        } else {
            minute.2 += 1;
            (false, skipped_before)
        }
    }
}

async fn keep_writing(kube: kube::Client, instance: String, mut notes: mpsc::Receiver<Note>) {
    let mut budget = Budget::default();
    while let Some(note) = notes.recv().await {
        let function = (note.trigger.namespace.clone(), note.trigger.function.clone());
        let (write, skipped) = budget.take(function, Instant::now());
        if let Some(skipped) = skipped {
            let text = format!(
                "{skipped} notes on this Function's events were not written in a minute (at most {NOTES_PER_MINUTE}); wasmless_events_delivered_total counts every try"
            );
            let skipped = Note {
                reason: NOTES_SKIPPED,
                warning: true,
                text,
                ..note.clone()
            };
            post(&kube, &instance, &skipped).await;
        }
        if write {
            post(&kube, &instance, &note).await;
        }
    }
}

async fn post(kube: &kube::Client, instance: &str, note: &Note) {
    let trigger = &note.trigger;
    let events: kube::Api<Event> = kube::Api::namespaced(kube.clone(), &trigger.namespace);
    let now = Timestamp::now();
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{:x}", trigger.function, now.as_nanosecond())),
            namespace: Some(trigger.namespace.clone()),
            ..Default::default()
        },
        event_time: Some(MicroTime(now)),
        action: Some("Deliver".into()),
        reason: Some(note.reason.into()),
        note: Some(note.text.clone()),
        type_: Some(if note.warning { "Warning" } else { "Normal" }.into()),
        reporting_controller: Some(REPORTER.into()),
        reporting_instance: Some(instance.into()),
        regarding: Some(ObjectReference {
            api_version: Some("wasmless.io/v1alpha1".into()),
            kind: Some("Function".into()),
            name: Some(trigger.function.clone()),
            namespace: Some(trigger.namespace.clone()),
            uid: note.function_uid.clone(),
            ..Default::default()
        }),
        ..Default::default()
    };
    if let Err(error) = events.create(&PostParams::default(), &event).await {
        tracing::debug!(?trigger, %error, "a delivery note not written as an Event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_function_gets_its_notes_a_minute_then_a_count_of_the_rest() {
        let mut budget = Budget::default();
        let start = Instant::now();
        let shop = || ("shop".to_string(), "orders".to_string());
        for _ in 0..NOTES_PER_MINUTE {
            assert_eq!(budget.take(shop(), start), (true, None));
        }
        for _ in 0..5 {
            assert_eq!(budget.take(shop(), start + Duration::from_secs(30)), (false, None));
        }
        // Another Function's notes are its own.
        assert_eq!(
            budget.take(("other".into(), "orders".into()), start + Duration::from_secs(30)),
            (true, None)
        );
        assert_eq!(budget.take(shop(), start + Duration::from_secs(61)), (true, Some(5)));
        assert_eq!(budget.take(shop(), start + Duration::from_secs(62)), (true, None));
    }

    #[test]
    fn a_handlers_answer_cannot_drive_the_readers_terminal() {
        assert_eq!(
            printable("out of stock\r\n\u{1b}]52;c;cGF3bmVk\u{7}\u{202e}kcots"),
            "out of stock  ?]52;c;cGF3bmVk??kcots"
        );
    }

    #[test]
    fn a_long_error_is_cut_to_an_events_size() {
        let cut = cut("é".repeat(2000));
        assert!(cut.len() <= NOTE_BYTES && cut.ends_with("..."), "{}", cut.len());
    }
}
