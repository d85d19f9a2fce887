//! One log line for a failure that repeats as often as its cause: a full disk refuses every
//! commit and every checkpoint, a database gone fails every read. The first failure is
//! written at once; later ones at most once per `SUMMARY`, each line saying how many it
//! stands for; the first success after them says so once. The metrics count every one.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The longest a repeating failure goes unsaid.
pub const SUMMARY: Duration = Duration::from_secs(10);

pub struct Repeats {
    /// A failure since the last success (the fast path of `worked`).
    failing: AtomicBool,
    state: Mutex<State>,
}

struct State {
    /// Failures since the last success.
    failing: u64,
    /// Failures since the last line.
    unsaid: u64,
    /// When the last line was written.
    said: Option<Instant>,
}

/// What to write for a failure.
#[derive(Debug, PartialEq, Eq)]
pub enum Say {
    /// The first of a run: the line as it is.
    First,
    /// A later one, `SUMMARY` after the last line: this many failures since it (this one
    /// included).
    Again(u64),
    /// Nothing now.
    Quiet,
}

impl Repeats {
    pub const fn new() -> Repeats {
        Repeats {
            failing: AtomicBool::new(false),
            state: Mutex::new(State {
                failing: 0,
                unsaid: 0,
                said: None,
            }),
        }
    }

    /// A failure: what to write.
    pub fn failed(&self) -> Say {
        self.at_failure(Instant::now())
    }

    fn at_failure(&self, now: Instant) -> Say {
        self.failing.store(true, Ordering::Release);
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.failing += 1;
        s.unsaid += 1;
        let say = match s.said {
            _ if s.failing == 1 => Say::First,
            Some(said) if now.duration_since(said) < SUMMARY => return Say::Quiet,
            _ => Say::Again(s.unsaid),
        };
        (s.unsaid, s.said) = (0, Some(now));
        say
    }

    /// A success: how many failed since the last one, if any did (write that it works
    /// again).
    pub fn worked(&self) -> Option<u64> {
        if !self.failing.load(Ordering::Acquire) {
            return None;
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.failing.store(false, Ordering::Release);
        let failed = std::mem::take(&mut s.failing);
        s.unsaid = 0;
        (failed > 0).then_some(failed)
    }
}

impl Default for Repeats {
    fn default() -> Repeats {
        Repeats::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_failures_is_said_first_then_once_per_summary_then_ended() {
        let r = Repeats::new();
        let t = Instant::now();
        assert_eq!(r.worked(), None);
        assert_eq!(r.at_failure(t), Say::First);
        assert_eq!(r.at_failure(t + Duration::from_secs(1)), Say::Quiet);
        assert_eq!(r.at_failure(t + Duration::from_secs(9)), Say::Quiet);
        assert_eq!(r.at_failure(t + SUMMARY), Say::Again(3));
        assert_eq!(
            r.at_failure(t + SUMMARY + Duration::from_secs(1)),
            Say::Quiet
        );
        assert_eq!(r.worked(), Some(5));
        assert_eq!(r.worked(), None);
        // A new run starts over.
        assert_eq!(r.at_failure(t + SUMMARY * 3), Say::First);
        assert_eq!(r.worked(), Some(1));
    }
}
