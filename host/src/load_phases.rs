//! Where a load's time goes, step by step: most of what a first request from zero waits
//! for, and cutting it starts from knowing which step costs what. Each load's log line
//! carries its phases, and `wasmless_load_phase_seconds{phase}` adds them up per process.
//! Not in them (but in the load's `load_ms`): an attempt at the builder's code that fell
//! back to compiling, and reading the module on the compile path. A dedicated pod fetches
//! its code while its engine is made, so its phases may add up to more than it waited.

use std::fmt;
use std::time::{Duration, Instant};

/// One step of loading a Function's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoadPhase {
    /// The code asked of the node's store of verified code, and on a hit its file mapped
    /// (what a hit takes in all; a miss goes on to `fetch`).
    Store,
    /// The stored code brought into memory from the API server or a registry. Code read
    /// from files is read as it is hashed: that time is in `Verify`.
    Fetch,
    /// The stored code hashed against its pinned digest and decompressed.
    Verify,
    /// The verified code written to a file of the process's own, to be mapped from it (the
    /// pool's code; code from the node's store leaves nothing to write).
    Place,
    /// The verified code's header checked and the code handed to wasmtime: mapped from
    /// its file, or run where it was decompressed.
    Open,
    /// The module compiled here, or its code read from this node's compiled-code cache.
    Compile,
    /// The module read and verified for the files it carries, and those written out.
    Files,
    /// Imports linked and the instance template made: what requests instantiate.
    Link,
}

impl LoadPhase {
    pub fn name(self) -> &'static str {
        match self {
            Self::Store => "store",
            Self::Fetch => "fetch",
            Self::Verify => "verify",
            Self::Place => "place",
            Self::Open => "open",
            Self::Compile => "compile",
            Self::Files => "files",
            Self::Link => "link",
        }
    }
}

/// The phases one load went through, in the order they ran, each with the time it took.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadPhases(Vec<(LoadPhase, Duration)>);

impl LoadPhases {
    /// Counts `took` to `phase` (added, should a phase run twice).
    pub fn add(&mut self, phase: LoadPhase, took: Duration) {
        match self.0.iter_mut().find(|(recorded, _)| *recorded == phase) {
            Some((_, total)) => *total += took,
            None => self.0.push((phase, took)),
        }
    }

    /// Counts the time since `started` to `phase`; returns now, where the next phase starts.
    pub fn since(&mut self, phase: LoadPhase, started: Instant) -> Instant {
        let now = Instant::now();
        self.add(phase, now.saturating_duration_since(started));
        now
    }

    /// The phases `other` recorded, after this one's.
    pub fn extend(&mut self, other: &LoadPhases) {
        for (phase, took) in other.iter() {
            self.add(phase, took);
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (LoadPhase, Duration)> + '_ {
        self.0.iter().copied()
    }

    pub fn get(&self, phase: LoadPhase) -> Option<Duration> {
        self.iter()
            .find(|(recorded, _)| *recorded == phase)
            .map(|(_, took)| took)
    }
}

/// `fetch 41.20 ms, verify 6.10 ms, ...`: for the log line of a load.
impl fmt::Display for LoadPhases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, (phase, took)) in self.iter().enumerate() {
            if index > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{} {:.2} ms", phase.name(), took.as_secs_f64() * 1000.0)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_run_twice_counts_both_times_in_its_first_place() {
        let mut phases = LoadPhases::default();
        phases.add(LoadPhase::Fetch, Duration::from_millis(40));
        phases.add(LoadPhase::Verify, Duration::from_micros(6100));
        phases.add(LoadPhase::Fetch, Duration::from_millis(2));
        assert_eq!(phases.get(LoadPhase::Fetch), Some(Duration::from_millis(42)));
        assert_eq!(phases.get(LoadPhase::Link), None);
        assert_eq!(phases.to_string(), "fetch 42.00 ms, verify 6.10 ms");
    }

    #[test]
    fn since_counts_up_to_now_and_hands_on_the_next_start() {
        let mut phases = LoadPhases::default();
        let started = Instant::now() - Duration::from_millis(5);
        let next = phases.since(LoadPhase::Open, started);
        assert!(phases.get(LoadPhase::Open).unwrap() >= Duration::from_millis(5));
        assert!(next >= started + Duration::from_millis(5));
    }
}
