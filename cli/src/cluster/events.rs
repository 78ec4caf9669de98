//! `wasmless events <fn>`: where each of a Function's triggers is (its `status.triggers`,
//! which `wasmless-events` writes from the broker: the lag, the dead letters, the last
//! delivery) and the recent deliveries that needed attention (the Events `wasmless-events`
//! writes on the Function: a failed try tried again, an event handled after retries, one
//! parked as a dead letter).

use super::get::{age, aligned};
use super::{Target, explain};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use wasmless_operator::Function;

/// The Events' `reportingController`, as `wasmless-events` writes it (`journal::REPORTER`).
const REPORTER: &str = "wasmless-events";
/// The notes shown, newest last.
const RECENT: usize = 20;

#[derive(clap::Args)]
pub struct EventsArgs {
    /// The Function.
    pub name: String,
    #[command(flatten)]
    pub target: Target,
}

pub async fn run(args: EventsArgs) -> anyhow::Result<()> {
    let (client, namespace) = args.target.connect().await?;
    let functions: Api<Function> = Api::namespaced(client.clone(), &namespace);
    let func = functions
        .get(&args.name)
        .await
        .map_err(|e| explain(e, &format!("reading Function {}", args.name)))?;
    let events: Api<Event> = Api::namespaced(client, &namespace);
    // By UID too: a Function made again under the name does not show its predecessor's.
    let mut about_it = format!("involvedObject.kind=Function,involvedObject.name={}", args.name);
    if let Some(uid) = &func.metadata.uid {
        about_it.push_str(&format!(",involvedObject.uid={uid}"));
    }
    let notes = events
        .list(&ListParams::default().fields(&about_it))
        .await
        .map_err(|e| anyhow::Error::new(e).context(format!("listing the Events of Function {}", args.name)))?
        .items;
    print!("{}", report(&func, &notes, Timestamp::now()));
    Ok(())
}

/// A cell with no control character: anyone who may create Events in the namespace writes
/// these, and a terminal must not take them for escape sequences or new rows.
fn printable(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { '?' } else { c }).collect()
}

/// What `run` prints: the triggers, then the recent notes.
pub fn report(func: &Function, events: &[Event], now: Timestamp) -> String {
    let name = func.metadata.name.clone().unwrap_or_default();
    if func.spec.triggers.is_empty() {
        return format!("{name} has no triggers: it runs on HTTP requests only (spec.triggers, docs/guide.md)\n");
    }
    let status = func.status.clone().unwrap_or_default();
    let header = ["TRIGGER", "ON", "LAG", "DEAD LETTERS", "LAST FIRED"].map(String::from);
    let rows: Vec<[String; 5]> = func
        .spec
        .triggers
        .iter()
        .map(|trigger| {
            let on = match (&trigger.queue, &trigger.schedule) {
                (Some(queue), _) => format!("queue {}", queue.subject),
                (None, Some(schedule)) => match &trigger.time_zone {
                    Some(zone) => format!("schedule {schedule} ({zone})"),
                    None => format!("schedule {schedule}"),
                },
                (None, None) => "-".into(),
            };
            let reported = status.triggers.iter().find(|t| t.name == trigger.name);
            let dash = || "-".to_string();
            [
                trigger.name.clone(),
                on,
                reported.map(|t| t.lag.to_string()).unwrap_or_else(dash),
                reported.map(|t| t.dead_letters.to_string()).unwrap_or_else(dash),
                reported
                    .and_then(|t| t.last_fired.as_ref())
                    .map(|at| format!("{} ago", age(now.duration_since(at.0))))
                    .unwrap_or_else(dash),
            ]
        })
        .collect();
    let mut out = aligned(std::iter::once(&header).chain(&rows).map(|row| row.as_slice()));
    if status.triggers.is_empty() {
        out.push_str(
            "\nwasmless-events has not reported on these triggers: is it installed (kubectl apply -k deploy/events/)?\n",
        );
    }
    let mut notes: Vec<(Timestamp, [String; 3])> = events
        .iter()
        .filter(|event| event.reporting_component.as_deref() == Some(REPORTER))
        .filter_map(|event| {
            let at = event
                .event_time
                .as_ref()
                .map(|t| t.0)
                .or(event.last_timestamp.as_ref().map(|t| t.0))?;
            Some((
                at,
                [
                    format!("{} ago", age(now.duration_since(at))),
                    printable(event.reason.as_deref().unwrap_or_default()),
                    printable(event.message.as_deref().unwrap_or_default()),
                ],
            ))
        })
        .collect();
    notes.sort_by_key(|(at, _)| *at);
    let recent = &notes[notes.len().saturating_sub(RECENT)..];
    if recent.is_empty() {
        out.push_str("\nNo failed try or dead letter noted (Kubernetes keeps Events for an hour).\n");
    } else {
        out.push_str("\nRecent deliveries that needed a retry, or were given up on (newest last):\n");
        out.push_str(&aligned(recent.iter().map(|(_, row)| row.as_slice())));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn function(status: serde_json::Value) -> Function {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "wasmless.io/v1alpha1",
            "kind": "Function",
            "metadata": {"name": "orders"},
            "spec": {"source": "package handlers", "triggers": [
                {"name": "created", "queue": {"subject": "orders.created"}},
                {"name": "nightly", "schedule": "0 3 * * *", "timeZone": "Europe/Paris"},
            ]},
            "status": status,
        }))
        .unwrap()
    }

    fn event(reporter: &str, reason: &str, at: &str, message: &str) -> Event {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("orders.{at}")},
            "involvedObject": {"kind": "Function", "name": "orders"},
            "reportingComponent": reporter,
            "reason": reason,
            "eventTime": at,
            "message": message,
        }))
        .unwrap()
    }

    #[test]
    fn shows_each_triggers_lag_dead_letters_and_last_delivery_then_the_notes_newest_last() {
        let func = function(serde_json::json!({"triggers": [
            {"name": "created", "lag": 12, "deadLetters": 2, "lastFired": "2026-12-08T10:04:00Z", "observedAt": "2026-12-08T10:04:58Z"},
            {"name": "nightly", "lag": 0, "deadLetters": 0},
        ]}));
        let events = [
            event(
                "wasmless-events",
                "EventDeadLettered",
                "2026-12-08T10:03:00.000000Z",
                "created: event order-big parked on wasmless.shop._deadletter.orders.created after try 4: status 503: out of stock",
            ),
            event(
                "wasmless-events",
                "EventRetrying",
                "2026-12-08T10:01:00.000000Z",
                "created: event order-big failed on try 1 (status 503: out of stock); tried again in 1.0s",
            ),
            event(
                "wasmless-operator",
                "ScaledUp",
                "2026-12-08T10:02:00.000000Z",
                "0 → 3 pods",
            ),
        ];
        let now: Timestamp = "2026-12-08T10:05:00Z".parse().unwrap();
        let report = report(&func, &events, now);
        let lines: Vec<&str> = report.lines().collect();
        let words = |line: &str| line.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(
            words(lines[0]),
            ["TRIGGER", "ON", "LAG", "DEAD", "LETTERS", "LAST", "FIRED"]
        );
        assert_eq!(
            words(lines[1]),
            ["created", "queue", "orders.created", "12", "2", "60s", "ago"]
        );
        assert_eq!(
            words(lines[2]),
            [
                "nightly",
                "schedule",
                "0",
                "3",
                "*",
                "*",
                "*",
                "(Europe/Paris)",
                "0",
                "0",
                "-"
            ]
        );
        let notes: Vec<&str> = lines
            .iter()
            .skip_while(|l| !l.starts_with("Recent"))
            .skip(1)
            .copied()
            .collect();
        assert_eq!(notes.len(), 2, "only wasmless-events' notes: {report}");
        assert!(notes[0].starts_with("4m ago   EventRetrying  "), "{report}");
        assert!(
            notes[1].contains("EventDeadLettered") && notes[1].contains("after try 4"),
            "{report}"
        );
    }

    #[test]
    fn says_why_there_is_nothing_to_show() {
        let now: Timestamp = "2026-12-08T10:05:00Z".parse().unwrap();
        let report = report(&function(serde_json::json!({})), &[], now);
        assert!(
            report.contains("has not reported on these triggers: is it installed"),
            "{report}"
        );
        assert!(report.contains("No failed try or dead letter noted"), "{report}");
        let mut plain = function(serde_json::json!({}));
        plain.spec.triggers.clear();
        assert_eq!(
            super::report(&plain, &[], now),
            "orders has no triggers: it runs on HTTP requests only (spec.triggers, docs/guide.md)\n"
        );
    }
}
