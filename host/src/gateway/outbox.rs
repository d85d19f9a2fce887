//! A connection's bounded outbound queue, honouring each frame's delivery class:
//! `persistent` and `live` frames (and replies) are never dropped — a reader too slow for
//! them is disconnected and pulls on reconnect; `latest` frames are coalesced per key;
//! `droppable` frames are dropped first when the queue fills.

use std::collections::VecDeque;
use std::sync::Mutex;

use axum::extract::ws::Utf8Bytes;
use tokio::sync::Notify;

use crate::plugins::Delivery;

/// Why the server closes a connection. The code goes in the WebSocket close frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// A newer connection of the same device took over.
    Replaced,
    /// The outbound queue overflowed with frames that may not be dropped.
    SlowConsumer,
    /// Nothing heard from the device within the heartbeat.
    Heartbeat,
    /// The server is shutting down.
    Shutdown,
    /// A frame above four times the frame limit.
    TooBig,
    /// Bytes that are not the WebSocket protocol.
    Protocol,
}

impl Close {
    pub fn code(self) -> u16 {
        match self {
            Close::Replaced => 4001,
            Close::SlowConsumer => 4008,
            Close::Heartbeat => 4000,
            Close::Shutdown => 1001,
            Close::TooBig => 1009,
            Close::Protocol => 1002,
        }
    }

    pub fn reason(self) -> &'static str {
        match self {
            Close::Replaced => "replaced",
            Close::SlowConsumer => "slow_consumer",
            Close::Heartbeat => "heartbeat_timeout",
            Close::Shutdown => "shutdown",
            Close::TooBig => "frame_too_large",
            Close::Protocol => "protocol_error",
        }
    }
}

/// What happened to a pushed frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queued {
    Yes,
    /// Coalesced into (replacing) an older frame with the same key.
    Coalesced,
    Dropped,
    /// The queue was full of frames that may not be dropped: the connection is closing.
    Overflow,
    Closed,
}

/// Coalescing key of a `latest` frame: conversation, sender, content type.
pub type LatestKey = (i64, u64, u32);

/// `latest` entries kept at most; beyond, the oldest goes.
const LATEST_MAX: usize = 64;

struct State {
    /// In the order they were queued; a `latest` frame carries its key.
    frames: VecDeque<(Option<LatestKey>, Utf8Bytes)>,
    /// `latest` frames among `frames`.
    latest: usize,
    closing: Option<Close>,
    dropped: u64,
}

pub struct Outbox {
    state: Mutex<State>,
    ready: Notify,
    limit: usize,
}

impl Outbox {
    pub fn new(limit: usize) -> Outbox {
        Outbox {
            state: Mutex::new(State {
                frames: VecDeque::new(),
                latest: 0,
                closing: None,
                dropped: 0,
            }),
            ready: Notify::new(),
            limit,
        }
    }

    /// Queues a reply (ack, error, pong): never dropped.
    pub fn reply(&self, frame: Utf8Bytes) -> Queued {
        self.push(frame, Delivery::Live, None)
    }

    /// Queues a push of the given delivery class.
    pub fn push(&self, frame: Utf8Bytes, class: Delivery, key: Option<LatestKey>) -> Queued {
        let mut s = self.state.lock().expect("outbox lock");
        if s.closing.is_some() {
            return Queued::Closed;
        }
        let queued = match (class, key) {
            (Delivery::Latest, Some(key)) => {
                // The newer frame replaces the waiting one and takes its own place at the
                // end, so it still follows everything queued before it.
                let older = s.frames.iter().position(|(k, _)| *k == Some(key));
                let queued = match older {
                    Some(i) => {
                        s.frames.remove(i);
                        Queued::Coalesced
                    }
                    None if s.latest >= LATEST_MAX => {
                        if let Some(i) = s.frames.iter().position(|(k, _)| k.is_some()) {
                            s.frames.remove(i);
                        }
                        s.dropped += 1;
                        Queued::Yes
                    }
                    None => {
                        s.latest += 1;
                        Queued::Yes
                    }
                };
                s.frames.push_back((Some(key), frame));
                queued
            }
            (Delivery::Droppable | Delivery::Latest, _) => {
                if s.frames.len() >= self.limit * 3 / 4 {
                    s.dropped += 1;
                    return Queued::Dropped;
                }
                s.frames.push_back((None, frame));
                Queued::Yes
            }
            (Delivery::Persistent | Delivery::Live, _) => {
                if s.frames.len() - s.latest >= self.limit {
                    s.closing = Some(Close::SlowConsumer);
                    s.frames.clear();
                    s.latest = 0;
                    Queued::Overflow
                } else {
                    s.frames.push_back((None, frame));
                    Queued::Yes
                }
            }
        };
        drop(s);
        self.ready.notify_one();
        queued
    }

    /// Asks the connection to close (after what is queued, for a kick).
    pub fn close(&self, why: Close) {
        let mut s = self.state.lock().expect("outbox lock");
        if s.closing.is_none() {
            s.closing = Some(why);
        }
        drop(s);
        self.ready.notify_one();
    }

    /// Waits until something is queued, then moves it all into `into`. Returns the close
    /// reason once the connection must close. Cancel-safe.
    pub async fn next(&self, into: &mut Vec<Utf8Bytes>) -> Option<Close> {
        loop {
            {
                let mut s = self.state.lock().expect("outbox lock");
                if !s.frames.is_empty() || s.closing.is_some() {
                    into.extend(s.frames.drain(..).map(|(_, f)| f));
                    s.latest = 0;
                    return s.closing;
                }
            }
            self.ready.notified().await;
        }
    }

    /// Frames waiting now.
    pub fn queued(&self) -> usize {
        self.state.lock().expect("outbox lock").frames.len()
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Frames dropped so far (droppable, or `latest` beyond its cap).
    pub fn dropped(&self) -> u64 {
        self.state.lock().expect("outbox lock").dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &str) -> Utf8Bytes {
        Utf8Bytes::from(s.to_string())
    }

    #[tokio::test]
    async fn latest_coalesces_and_droppable_goes_first() {
        let o = Outbox::new(16);
        assert_eq!(
            o.push(f("t1"), Delivery::Latest, Some((1, 7, 5))),
            Queued::Yes
        );
        assert_eq!(
            o.push(f("t2"), Delivery::Latest, Some((1, 7, 5))),
            Queued::Coalesced
        );
        for i in 0..12 {
            assert_eq!(
                o.push(f(&format!("m{i}")), Delivery::Persistent, None),
                Queued::Yes
            );
        }
        assert_eq!(o.push(f("d"), Delivery::Droppable, None), Queued::Dropped);
        let mut out = Vec::new();
        assert_eq!(o.next(&mut out).await, None);
        assert_eq!(out.len(), 13);
        // One typing frame (the newest), where the newest was queued.
        assert_eq!(out[0].as_str(), "t2");
        assert_eq!(
            out.iter().filter(|f| f.as_str().starts_with('t')).count(),
            1
        );
        assert_eq!(o.dropped(), 1);
    }

    #[tokio::test]
    async fn a_latest_frame_keeps_its_place_after_earlier_frames() {
        let o = Outbox::new(16);
        o.push(f("m1"), Delivery::Persistent, None);
        o.push(f("typing"), Delivery::Latest, Some((1, 7, 5)));
        o.push(f("m2"), Delivery::Persistent, None);
        let mut out = Vec::new();
        o.next(&mut out).await;
        let order: Vec<&str> = out.iter().map(|f| f.as_str()).collect();
        assert_eq!(order, ["m1", "typing", "m2"]);
    }

    #[tokio::test]
    async fn reliable_frames_overflow_into_a_close() {
        let o = Outbox::new(16);
        for i in 0..16 {
            o.push(f(&format!("m{i}")), Delivery::Live, None);
        }
        assert_eq!(o.push(f("x"), Delivery::Persistent, None), Queued::Overflow);
        let mut out = Vec::new();
        assert_eq!(o.next(&mut out).await, Some(Close::SlowConsumer));
        assert!(out.is_empty());
    }
}
