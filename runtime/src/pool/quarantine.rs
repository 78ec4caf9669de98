//! A port one Function leaves is not given to another for a while. Its clients do not
//! learn at once that it is gone: a kube-proxy that has not yet seen the Service change
//! still sends new connections to the pool on that port, for seconds. Within that time
//! they are refused (nobody listens), never answered by the next Function.
//!
//! Kept here, in the pool's memory, rather than by the operator choosing ports: the
//! hazard is this process's (its port, the connections made to it), and a pool that
//! restarts has no connection from before, so memory lost with a restart protects nothing
//! that still exists. The operator's choice would have to survive the operator's restarts
//! in some object of its own, and would not cover a table written by anyone else.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a port stays unused after its Function leaves: well past the seconds a
/// Service change takes to reach every node's kube-proxy.
pub const PORT_QUARANTINE: Duration = Duration::from_secs(30);

/// Ports recently left, and by whom.
#[derive(Debug)]
pub struct PortQuarantine {
    period: Duration,
    freed: HashMap<u16, Freed>,
}

#[derive(Debug)]
struct Freed {
    function: String,
    at: Instant,
}

/// A port `function` may not have yet: whose it was, and how long until it may.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    pub previous: String,
    pub remaining: Duration,
}

impl PortQuarantine {
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            freed: HashMap::new(),
        }
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    /// `function` stopped serving on `port` at `now`.
    pub fn free(&mut self, port: u16, function: &str, now: Instant) {
        self.forget_expired(now);
        self.freed.insert(
            port,
            Freed {
                function: function.to_string(),
                at: now,
            },
        );
    }

    /// Whether `function` must wait for `port`. The Function that left it may come back at
    /// once: its clients are its own.
    pub fn wait(&mut self, port: u16, function: &str, now: Instant) -> Option<Wait> {
        self.forget_expired(now);
        let freed = self.freed.get(&port).filter(|freed| freed.function != function)?;
        Some(Wait {
            previous: freed.function.clone(),
            remaining: (freed.at + self.period).saturating_duration_since(now),
        })
    }

    fn forget_expired(&mut self, now: Instant) {
        let period = self.period;
        self.freed.retain(|_, freed| now < freed.at + period);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_port_waits_for_another_function_and_not_for_its_own() {
        let start = Instant::now();
        let mut quarantine = PortQuarantine::new(Duration::from_secs(30));
        assert_eq!(quarantine.wait(20001, "b", start), None, "never used: free");
        quarantine.free(20001, "a", start);
        let later = start + Duration::from_secs(10);
        assert_eq!(
            quarantine.wait(20001, "b", later),
            Some(Wait {
                previous: "a".into(),
                remaining: Duration::from_secs(20)
            })
        );
        assert_eq!(
            quarantine.wait(20001, "a", later),
            None,
            "its own Function comes back at once"
        );
        assert_eq!(quarantine.wait(20002, "b", later), None, "another port is free");
        assert_eq!(quarantine.wait(20001, "b", start + Duration::from_secs(30)), None);
    }
}
