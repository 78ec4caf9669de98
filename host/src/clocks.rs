//! The clocks a Go reactor sees, at build time (while it is snapshotted) and at run time.
//!
//! Go's runtime reads WASI's monotonic clock at start-up and keeps what it read (when
//! the runtime started, when the `time` package did, the GC's last cycle) in memory,
//! which a snapshot freezes. wasmtime-wasi's default monotonic clock starts near zero for
//! every `WasiCtx`, so an instance restored from the snapshot would see time go backwards
//! from what it remembers: `time.Since` of a start-up instant negative, timers that never
//! fire. So the snapshot is made with [`SnapshotClock`], which starts at one second, and
//! requests run with [`WallMonotonic`], nanoseconds since the Unix epoch: always larger
//! than anything a snapshot can hold (a snapshot would need to run for decades), and
//! consistent between instances and processes. It is kept monotonic within a process
//! with a high-water mark, so a wall clock stepped back (NTP) stalls it rather than
//! reversing it. Within a request it advances with real time, so `time.Since` inside a
//! request is the real elapsed time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock};

/// Where [`SnapshotClock`] starts: well above zero (Go treats 0 as "never"), far below
/// any [`WallMonotonic`] reading.
const SNAPSHOT_EPOCH: Duration = Duration::from_secs(1);
/// How far [`SnapshotClock`] advances per reading.
const SNAPSHOT_TICK_NANOS: u64 = 1_000;

/// The run-time monotonic clock: the wall clock in nanoseconds since the Unix epoch,
/// never going backwards within the process.
pub struct WallMonotonic;

static HIGH_WATER: AtomicU64 = AtomicU64::new(0);

impl HostMonotonicClock for WallMonotonic {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64);
        HIGH_WATER.fetch_max(wall, Ordering::Relaxed).max(wall)
    }
}

/// The build-time clock, wall and monotonic alike: starts at [`SNAPSHOT_EPOCH`] and
/// advances a microsecond per reading, so that a snapshot depends on what the
/// initialisers do and not on when they ran (the same source builds the same snapshot).
/// An initialiser that stores `time.Now()` stores an instant in January 1970.
#[derive(Clone, Default)]
pub struct SnapshotClock(std::sync::Arc<AtomicU64>);

impl SnapshotClock {
    fn read(&self) -> u64 {
        SNAPSHOT_EPOCH.as_nanos() as u64 + self.0.fetch_add(SNAPSHOT_TICK_NANOS, Ordering::Relaxed)
    }
}

impl HostMonotonicClock for SnapshotClock {
    fn resolution(&self) -> u64 {
        SNAPSHOT_TICK_NANOS
    }

    fn now(&self) -> u64 {
        self.read()
    }
}

impl HostWallClock for SnapshotClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(SNAPSHOT_TICK_NANOS)
    }

    fn now(&self) -> Duration {
        Duration::from_nanos(self.read())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_time_is_always_after_build_time_and_never_goes_back() {
        let build = SnapshotClock::default();
        let frozen = HostMonotonicClock::now(&build);
        let first = WallMonotonic.now();
        let second = WallMonotonic.now();
        assert!(first > frozen + 1_000_000_000_000_000_000, "{first} vs {frozen}");
        assert!(second >= first);
    }

    #[test]
    fn snapshot_clock_is_the_same_every_build() {
        let (a, b) = (SnapshotClock::default(), SnapshotClock::default());
        let read = |clock: &SnapshotClock| (0..3).map(|_| HostMonotonicClock::now(clock)).collect::<Vec<_>>();
        assert_eq!(read(&a), read(&b));
        assert!(read(&a).windows(2).all(|w| w[1] > w[0]));
    }
}
