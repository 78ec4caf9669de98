//! `spec.triggers` and `spec.delivery`: the events a Function is called on besides HTTP
//! requests (a queue's messages, a schedule's ticks), and how patiently each is delivered (docs/design.md, "Additions for the fourth
//! round"). The events component (`wasmless-events`) reads them; the operator only checks
//! them.

use super::*;

/// A subject of the namespace's own: dot-separated tokens of letters, digits, `-` and `_`,
/// `*` for any one token after the first, a last `>` for any rest. The first token is a
/// literal not starting with `_`: `_` marks Wasmless's own subjects (dead letters), which a
/// wildcard there would read.
pub const QUEUE_SUBJECT_PATTERN: &str = r"^[A-Za-z0-9-][A-Za-z0-9_-]*(\.([A-Za-z0-9_-]+|\*))*(\.>)?$";

/// A cron expression: 5 fields (minute, hour, day of month, month, day of week), 6 with
/// seconds first, or a shorthand such as `@hourly`; the events component parses it, and
/// refuses what it cannot.
pub const SCHEDULE_PATTERN: &str =
    r"^(@(yearly|annually|monthly|weekly|daily|hourly)|[0-9A-Za-z*/,?#-]+( +[0-9A-Za-z*/,?#-]+){4,5})$";

/// One way the Function is called on events: a queue's messages, or a schedule's ticks.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.queue) != has(self.schedule)").message("a trigger has a queue or a schedule, one of the two"))]
#[x_kube(validation = Rule::new("!has(self.timeZone) || has(self.schedule)").message("timeZone is a schedule's"))]
pub struct Trigger {
    /// The trigger's name: part of each event's `ce-source`
    /// (`wasmless/<namespace>/<function>/<name>`) and of its metrics.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// The path of the `POST` each event arrives as.
    #[serde(default = "default_trigger_path")]
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^/[^\s?#]*$"))]
    pub path: String,
    /// The messages published on a subject of the namespace, through NATS JetStream: each
    /// one delivered at least once, with the same `ce-id` on every try.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueTrigger>,
    /// A cron schedule (`*/5 * * * *`, `0 3 * * MON-FRI`, `*/10 * * * * *` with seconds,
    /// `@hourly`): each tick is one event, fired once, `ce-id`
    /// `<namespace>/<function>/<trigger>@<tick>`, delivered (at least once, as any event)
    /// one at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100), regex(pattern = SCHEDULE_PATTERN))]
    pub schedule: Option<String>,
    /// The schedule's time zone, from the IANA database (`Europe/Paris`); default UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 64),
        regex(pattern = r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$")
    )]
    pub time_zone: Option<String>,
}

fn default_trigger_path() -> String {
    "/".into()
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueTrigger {
    /// The subject, within the namespace's own (`orders.created`, `orders.*`, `orders.>`):
    /// a Function of another namespace publishing on the same words never reaches this one.
    #[schemars(length(min = 1, max = 200), regex(pattern = QUEUE_SUBJECT_PATTERN))]
    pub subject: String,
    /// Events delivered and not yet answered, at most, across every replica delivering.
    #[serde(default = "default_max_in_flight")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_in_flight: i32,
}

fn default_max_in_flight() -> i32 {
    10
}

/// How every trigger's events are delivered: a 2xx acknowledges; no answer, a 5xx, 404,
/// 408, 409 or 429 is tried again after a growing delay; any other 4xx, or the last
/// failure, parks the event as a dead letter. A try's `timeout` and the `backoff` are at
/// most 5 minutes: one delivery holds one of the events component's slots, which every
/// namespace shares.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("duration(self.timeout) <= duration('5m')").message("delivery.timeout is at most 5m"))]
#[x_kube(validation = Rule::new("duration(self.backoff) <= duration('5m')").message("delivery.backoff is at most 5m"))]
pub struct Delivery {
    /// Tries after the first.
    #[serde(default = "default_retries")]
    #[schemars(range(min = 0, max = 100))]
    pub retries: i32,
    /// The first retry's delay; each next one doubles it (±20 %), up to 5 minutes.
    #[serde(default = "default_backoff")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 32))]
    pub backoff: String,
    /// How long one try may take to the response's headers.
    #[serde(default = "default_delivery_timeout")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 32))]
    pub timeout: String,
    /// An event given up on is parked on `wasmless.<namespace>._deadletter.<function>.<trigger>`
    /// with its last error; `false` drops it.
    #[serde(default = "default_dead_letter")]
    pub dead_letter: bool,
}

impl Default for Delivery {
    fn default() -> Self {
        Self {
            retries: default_retries(),
            backoff: default_backoff(),
            timeout: default_delivery_timeout(),
            dead_letter: default_dead_letter(),
        }
    }
}

fn default_retries() -> i32 {
    3
}

fn default_backoff() -> String {
    "1s".into()
}

fn default_delivery_timeout() -> String {
    "30s".into()
}

fn default_dead_letter() -> bool {
    true
}
