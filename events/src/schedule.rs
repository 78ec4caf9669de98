//! Schedules: a trigger's ticks, from its cron expression in its time zone, each published as
//! a message whose id names the tick, on `wasmless.<ns>._schedule.<function>.<trigger>`;
//! delivery is then a queue's. Every replica of the component publishes every tick, and
//! the broker keeps one message per id within its duplicate window: a tick fires once with
//! no leader to elect, and a replica that dies misses nothing the others publish on time.
//! A replica that starts publishes the ticks since the last one stored (at most a minute's),
//! which the broker keeps once too, so a tick missed while every replica was down comes
//! late, not never; a new trigger has none stored, and starts with its next tick.

use crate::broker::{Broker, Publish};
use crate::names::TriggerRef;
use chrono::{DateTime, SecondsFormat, Utc};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// How far back a starting replica publishes ticks again: well inside the broker's
/// duplicate window (`broker::jetstream::DUPLICATE_WINDOW`), so each is kept once.
pub const CATCH_UP: Duration = Duration::from_secs(60);
/// How often a tick's refused publish is tried again, until the next tick is due.
const PUBLISH_AGAIN_AFTER: Duration = Duration::from_millis(500);
/// The ticks a trigger's subject keeps: the namespace's stream keeps messages for days, and
/// a per-second schedule's would fill it. A backlog of more (the Function not served for
/// that many ticks) loses its oldest.
pub const TICKS_KEPT: u64 = 100;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ScheduleError {
    #[error(
        "schedule {expression:?}: {why}; write 5 fields (minute hour day-of-month month day-of-week), 6 with seconds first, or @hourly, @daily, @weekly, @monthly, @yearly"
    )]
    Cron { expression: String, why: String },
    #[error("timeZone {0:?} is not a zone of the IANA time zone database; write one such as UTC or Europe/Paris")]
    Zone(String),
}

/// A cron expression in a time zone.
#[derive(Clone, Debug)]
pub struct Schedule {
    cron: croner::Cron,
    zone: chrono_tz::Tz,
}

impl Schedule {
    /// `time_zone`: an IANA zone name; none is UTC.
    pub fn parse(expression: &str, time_zone: Option<&str>) -> Result<Self, ScheduleError> {
        let zone = match time_zone {
            None => chrono_tz::Tz::UTC,
            Some(name) => chrono_tz::Tz::from_str(name).map_err(|_| ScheduleError::Zone(name.to_string()))?,
        };
        let cron = croner::Cron::new(expression.trim())
            .with_seconds_optional()
            .parse()
            .map_err(|error| ScheduleError::Cron {
                expression: expression.to_string(),
                why: error.to_string(),
            })?;
        Ok(Self { cron, zone })
    }

    /// The first tick after `after`. In the hour a time zone repeats (summer time ending),
    /// the parser gives a wall-clock time's first instant, which may be before `after`:
    /// such ticks are skipped, never fired a second time.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut from = after;
        // An hour of per-second ticks, and some.
        for _ in 0..4000 {
            let tick = self
                .cron
                .find_next_occurrence(&from.with_timezone(&self.zone), false)
                .ok()?
                .with_timezone(&Utc);
            if tick > after {
                return Some(tick);
            }
            from += chrono::Duration::seconds(1);
        }
        None
    }

    /// The ticks after `from` up to `to` (included), at most `limit` of them, oldest first.
    pub fn ticks(&self, from: DateTime<Utc>, to: DateTime<Utc>, limit: usize) -> Vec<DateTime<Utc>> {
        let mut ticks = Vec::new();
        let mut last = from;
        while ticks.len() < limit {
            match self.next_after(last) {
                Some(tick) if tick <= to => {
                    ticks.push(tick);
                    last = tick;
                }
                _ => break,
            }
        }
        ticks
    }
}

/// A tick's message id, the same on every replica: `<ns>/<function>/<trigger>@<RFC 3339>`,
/// and the `ce-id` its handler gets.
pub fn tick_id(trigger: &TriggerRef, tick: DateTime<Utc>) -> String {
    format!(
        "{}/{}/{}@{}",
        trigger.namespace,
        trigger.function,
        trigger.trigger,
        tick.to_rfc3339_opts(SecondsFormat::AutoSi, true)
    )
}

/// The tick a message id of this trigger's names (`tick_id`'s inverse).
fn tick_of(trigger: &TriggerRef, id: &str) -> Option<DateTime<Utc>> {
    let prefix = format!("{}/{}/{}@", trigger.namespace, trigger.function, trigger.trigger);
    let tick = id.strip_prefix(&prefix)?;
    DateTime::parse_from_rfc3339(tick)
        .ok()
        .map(|tick| tick.with_timezone(&Utc))
}

/// Publishes the trigger's ticks on `subject` until the task is aborted: first those due
/// since the last one stored (within [`CATCH_UP`]), then each one when it is due.
pub async fn keep_ticking<B: Broker>(broker: Arc<B>, trigger: TriggerRef, subject: String, schedule: Schedule) {
    let now = Utc::now();
    let stored = match broker.last_id(&trigger.namespace, &subject).await {
        Ok(id) => id.and_then(|id| tick_of(&trigger, &id)),
        Err(error) => {
            tracing::warn!(?trigger, %error, "the last tick stored not read: ticks missed while no replica ran are not published");
            None
        }
    };
    if let Some(stored) = stored {
        let since = stored.max(now - chrono::Duration::from_std(CATCH_UP).expect("a minute"));
        // At most one a second over the minute: a faster schedule than that has none.
        let missed = search(&schedule, move |schedule| schedule.ticks(since, now, 61))
            .await
            .unwrap_or_default();
        if !missed.is_empty() {
            tracing::info!(
                ?trigger,
                missed = missed.len(),
                "publishing the ticks due since the last one stored"
            );
        }
        for tick in missed {
            publish_tick(broker.as_ref(), &trigger, &subject, tick, None).await;
        }
    }
    let mut last = now;
    loop {
        let Some(tick) = search(&schedule, move |schedule| schedule.next_after(last))
            .await
            .flatten()
        else {
            tracing::warn!(?trigger, "the schedule has no tick to come");
            return;
        };
        let wait = (tick - Utc::now()).to_std().unwrap_or_default();
        tokio::time::sleep(wait).await;
        // Retried until the next tick is due, and never past the broker's duplicate window:
        // a publish stored after it would be a second one of a tick another replica stored.
        let next = search(&schedule, move |schedule| schedule.next_after(tick))
            .await
            .flatten();
        let give_up = tick + chrono::Duration::from_std(CATCH_UP).expect("a minute");
        let until = next.map_or(give_up, |next| next.min(give_up));
        publish_tick(broker.as_ref(), &trigger, &subject, tick, Some(until)).await;
        if let Err(error) = broker.trim(&trigger.namespace, &subject, TICKS_KEPT).await {
            tracing::debug!(?trigger, %error, "old ticks not trimmed");
        }
        last = tick;
    }
}

/// A search of the schedule's ticks, off the async workers: an expression that never
/// matches (`0 0 30 2 *`) has the parser walk through the years before it says so.
async fn search<T: Send + 'static>(
    schedule: &Schedule,
    find: impl FnOnce(&Schedule) -> T + Send + 'static,
) -> Option<T> {
    let schedule = schedule.clone();
    tokio::task::spawn_blocking(move || find(&schedule)).await.ok()
}

/// Publishes one tick, again after a refusal (the broker restarting), until it is stored or
/// `next` comes.
async fn publish_tick<B: Broker>(
    broker: &B,
    trigger: &TriggerRef,
    subject: &str,
    tick: DateTime<Utc>,
    next: Option<DateTime<Utc>>,
) {
    let message = Publish {
        subject: subject.to_string(),
        id: Some(tick_id(trigger, tick)),
        headers: vec![],
        payload: bytes::Bytes::new(),
    };
    loop {
        match broker.publish(message.clone()).await {
            Ok(()) => return,
            Err(error) => {
                if next.is_none_or(|next| Utc::now() + PUBLISH_AGAIN_AFTER >= next) {
                    tracing::warn!(?trigger, %tick, %error, "a tick was not published");
                    return;
                }
                tracing::debug!(?trigger, %tick, %error, "a tick's publish refused; trying again");
                tokio::time::sleep(PUBLISH_AGAIN_AFTER).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn utc(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn five_fields_tick_on_minutes_and_six_on_seconds() {
        let minutes = Schedule::parse("*/15 * * * *", None).unwrap();
        assert_eq!(
            minutes.ticks(utc("2026-12-07T10:00:00Z"), utc("2026-12-07T10:31:00Z"), 10),
            vec![utc("2026-12-07T10:15:00Z"), utc("2026-12-07T10:30:00Z")]
        );
        let seconds = Schedule::parse("*/20 * * * * *", None).unwrap();
        assert_eq!(
            seconds.ticks(utc("2026-12-07T10:00:00Z"), utc("2026-12-07T10:01:00Z"), 10),
            vec![
                utc("2026-12-07T10:00:20Z"),
                utc("2026-12-07T10:00:40Z"),
                utc("2026-12-07T10:01:00Z")
            ]
        );
        let hourly = Schedule::parse("@hourly", None).unwrap();
        assert_eq!(
            hourly.next_after(utc("2026-12-07T10:00:00Z")),
            Some(utc("2026-12-07T11:00:00Z"))
        );
    }

    #[test]
    fn a_time_zone_moves_the_ticks_with_its_summer_time() {
        let paris = Schedule::parse("0 3 * * *", Some("Europe/Paris")).unwrap();
        // 03:00 in Paris: 02:00 UTC in winter, 01:00 UTC in summer.
        assert_eq!(
            paris.next_after(utc("2026-12-07T00:00:00Z")),
            Some(chrono::Utc.with_ymd_and_hms(2026, 12, 7, 2, 0, 0).unwrap())
        );
        assert_eq!(
            paris.next_after(utc("2026-07-07T00:00:00Z")),
            Some(chrono::Utc.with_ymd_and_hms(2026, 7, 7, 1, 0, 0).unwrap())
        );
    }

    #[test]
    fn the_hour_summer_time_repeats_fires_no_tick_twice() {
        // Europe/Paris, 2026-10-25: 03:00 CEST becomes 02:00 CET (01:00 UTC); 02:00-03:00
        // local comes twice.
        let every_minute = Schedule::parse("* * * * *", Some("Europe/Paris")).unwrap();
        let mut tick = utc("2026-10-24T23:30:00Z");
        let mut fired = Vec::new();
        while tick < utc("2026-10-25T02:30:00Z") {
            let next = every_minute.next_after(tick).unwrap();
            assert!(next > tick, "{next} after {tick}");
            fired.push(next);
            tick = next;
        }
        let mut distinct = fired.clone();
        distinct.dedup();
        assert_eq!(fired, distinct);
        // Started in the repeated hour, the first tick is still ahead of it.
        let in_second_pass = utc("2026-10-25T01:30:00Z");
        assert!(every_minute.next_after(in_second_pass).unwrap() > in_second_pass);
    }

    #[test]
    fn a_schedule_that_never_matches_has_no_tick() {
        let february_30 = Schedule::parse("0 0 30 2 *", None).unwrap();
        assert_eq!(february_30.next_after(utc("2026-12-07T00:00:00Z")), None);
    }

    #[test]
    fn a_bad_expression_or_zone_says_what_to_write() {
        for expression in ["", "every minute", "61 * * * *", "* * * *"] {
            let error = Schedule::parse(expression, None).unwrap_err();
            assert!(error.to_string().contains("write 5 fields"), "{expression:?}: {error}");
        }
        assert_eq!(
            Schedule::parse("* * * * *", Some("Mars/Olympus")).unwrap_err(),
            ScheduleError::Zone("Mars/Olympus".into())
        );
    }

    #[test]
    fn a_ticks_id_is_the_same_on_every_replica() {
        let trigger = TriggerRef::new("shop", "reports", "nightly");
        let id = tick_id(&trigger, utc("2026-12-07T03:00:00Z"));
        assert_eq!(id, "shop/reports/nightly@2026-12-07T03:00:00Z");
        assert_eq!(tick_of(&trigger, &id), Some(utc("2026-12-07T03:00:00Z")));
        assert_eq!(tick_of(&TriggerRef::new("shop", "reports", "other"), &id), None);
    }
}
