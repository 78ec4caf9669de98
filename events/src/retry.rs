//! What a delivery's answer means for its message: done, tried again after a delay, or
//! given up on. Pure: the delivery loop (`deliver.rs`) does the I/O and draws the jitter.

use std::time::Duration;

/// A Function's `spec.delivery`: how often and how patiently its events are tried.
#[derive(Clone, Debug, PartialEq)]
pub struct DeliveryPolicy {
    /// Tries after the first.
    pub retries: u32,
    /// The first retry's delay; each next one doubles it.
    pub backoff: Duration,
    /// How long one try may take, to the response's headers.
    pub timeout: Duration,
    /// Whether a message given up on is parked as a dead letter (else it is dropped).
    pub dead_letter: bool,
}

impl Default for DeliveryPolicy {
    fn default() -> Self {
        Self {
            retries: 3,
            backoff: Duration::from_secs(1),
            timeout: Duration::from_secs(30),
            dead_letter: true,
        }
    }
}

/// No retry waits longer, whatever the doubling or a `Retry-After` ask for: a Function
/// that comes back is tried again within this.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// How far a retry's delay is moved at random, either way: retries of many messages that
/// failed at once then spread out instead of arriving together again.
pub const JITTER: f64 = 0.2;

/// What one try came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// The Function answered with this status (and `Retry-After`, if it said one).
    Status { status: u16, retry_after: Option<Duration> },
    /// No answer: refused, reset, or slower than the policy's timeout.
    NoAnswer,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// A 2xx: the message is acknowledged.
    Done,
    /// Tried again after this delay.
    RetryIn(Duration),
    /// No more tries: parked as a dead letter, or dropped when the policy says none.
    GiveUp,
}

/// The decision after try number `attempt` (1 for the first). `jitter` is drawn by the
/// caller from `-JITTER..=JITTER`.
///
/// Retried as Knative Eventing retries: no answer, a 5xx, 404 (a Function being
/// replaced), 408, 409 and 429. Any other 4xx says the event itself is wrong, and
/// trying it again would only say so again: given up on at once.
pub fn decide(policy: &DeliveryPolicy, attempt: u32, answer: &Answer, jitter: f64) -> Decision {
    let retry_after = match answer {
        Answer::Status { status, .. } if (200..300).contains(status) => return Decision::Done,
        Answer::Status { status, retry_after } if retryable(*status) => *retry_after,
        Answer::Status { .. } => return Decision::GiveUp,
        Answer::NoAnswer => None,
    };
    if attempt > policy.retries {
        return Decision::GiveUp;
    }
    let doubled = policy.backoff.as_secs_f64() * 2f64.powi(attempt.saturating_sub(1).min(30) as i32);
    let jittered =
        Duration::from_secs_f64((doubled * (1.0 + jitter.clamp(-JITTER, JITTER))).min(MAX_BACKOFF.as_secs_f64()));
    Decision::RetryIn(
        retry_after
            .map_or(jittered, |asked| asked.max(jittered))
            .min(MAX_BACKOFF),
    )
}

fn retryable(status: u16) -> bool {
    matches!(status, 404 | 408 | 409 | 429) || status >= 500
}

/// A `Retry-After` in seconds (the HTTP-date form is not honoured: a Function's clock and
/// ours need not agree).
pub fn retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16) -> Answer {
        Answer::Status {
            status,
            retry_after: None,
        }
    }

    #[test]
    fn a_2xx_is_done_on_any_try() {
        let policy = DeliveryPolicy::default();
        assert_eq!(decide(&policy, 1, &status(200), 0.0), Decision::Done);
        assert_eq!(decide(&policy, 9, &status(204), 0.0), Decision::Done);
    }

    #[test]
    fn retries_double_until_the_policy_runs_out() {
        let policy = DeliveryPolicy {
            retries: 3,
            backoff: Duration::from_millis(100),
            ..Default::default()
        };
        let delays: Vec<Decision> = (1..=4)
            .map(|attempt| decide(&policy, attempt, &status(503), 0.0))
            .collect();
        assert_eq!(
            delays,
            [
                Decision::RetryIn(Duration::from_millis(100)),
                Decision::RetryIn(Duration::from_millis(200)),
                Decision::RetryIn(Duration::from_millis(400)),
                Decision::GiveUp,
            ]
        );
        assert_eq!(
            decide(&policy, 1, &Answer::NoAnswer, 0.0),
            Decision::RetryIn(Duration::from_millis(100))
        );
    }

    #[test]
    fn jitter_moves_a_delay_at_most_a_fifth() {
        let policy = DeliveryPolicy {
            backoff: Duration::from_secs(1),
            ..Default::default()
        };
        assert_eq!(
            decide(&policy, 1, &status(500), 0.2),
            Decision::RetryIn(Duration::from_secs_f64(1.2))
        );
        assert_eq!(
            decide(&policy, 1, &status(500), -5.0),
            Decision::RetryIn(Duration::from_secs_f64(0.8))
        );
    }

    #[test]
    fn a_client_error_is_given_up_on_at_once_but_not_a_busy_or_missing_function() {
        let policy = DeliveryPolicy::default();
        for given_up in [400, 401, 403, 413, 422] {
            assert_eq!(
                decide(&policy, 1, &status(given_up), 0.0),
                Decision::GiveUp,
                "{given_up}"
            );
        }
        for retried in [404, 408, 409, 429, 500, 502, 503] {
            assert!(
                matches!(decide(&policy, 1, &status(retried), 0.0), Decision::RetryIn(_)),
                "{retried}"
            );
        }
    }

    #[test]
    fn retry_after_is_honoured_up_to_the_cap() {
        let policy = DeliveryPolicy {
            backoff: Duration::from_secs(1),
            ..Default::default()
        };
        let asked = |seconds| Answer::Status {
            status: 429,
            retry_after: Some(Duration::from_secs(seconds)),
        };
        assert_eq!(
            decide(&policy, 1, &asked(7), 0.0),
            Decision::RetryIn(Duration::from_secs(7))
        );
        assert_eq!(
            decide(&policy, 1, &asked(0), 0.0),
            Decision::RetryIn(Duration::from_secs(1))
        );
        assert_eq!(decide(&policy, 1, &asked(86_400), 0.0), Decision::RetryIn(MAX_BACKOFF));
        assert_eq!(retry_after(" 12 "), Some(Duration::from_secs(12)));
        assert_eq!(retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
    }

    #[test]
    fn a_long_run_of_failures_waits_the_cap_not_forever() {
        let policy = DeliveryPolicy {
            retries: 100,
            ..Default::default()
        };
        assert_eq!(decide(&policy, 60, &status(500), 0.0), Decision::RetryIn(MAX_BACKOFF));
    }
}
