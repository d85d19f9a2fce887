//! A connection's bounded outbound queue, honouring each frame's delivery class:
//! `persistent` and `live` frames (and replies) are never dropped — a reader too slow for
//! them is disconnected and pulls on reconnect; `latest` frames are coalesced per key;
//! `droppable` frames are dropped first when the queue fills.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::Utf8Bytes;

use crate::plugins::Delivery;
pub use crate::protocol::Close;

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

pub use crate::messaging::LatestKey;

/// `latest` entries kept at most; beyond, the oldest goes.
const LATEST_MAX: usize = 64;

/// The bytes of every frame waiting for this node's connections (queued, or being
/// written), each frame counted once however many connections it waits for.
#[derive(Debug)]
pub struct NodeBudget {
    bytes: AtomicUsize,
    limit: usize,
}

impl NodeBudget {
    pub fn new(limit: usize) -> Arc<NodeBudget> {
        Arc::new(NodeBudget {
            bytes: AtomicUsize::new(0),
            limit,
        })
    }

    /// Bytes waiting now.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    fn over(&self) -> bool {
        self.bytes() > self.limit
    }
}

/// A frame on its way to one or more connections. Its bytes count toward the node's
/// budget until the last connection holding it has written (or dropped) it.
#[derive(Clone)]
pub struct Frame(Arc<Counted>);

struct Counted {
    text: Utf8Bytes,
    budget: Arc<NodeBudget>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.budget
            .bytes
            .fetch_sub(self.text.len(), Ordering::Relaxed);
    }
}

impl Frame {
    pub fn new(text: Utf8Bytes, budget: &Arc<NodeBudget>) -> Frame {
        budget.bytes.fetch_add(text.len(), Ordering::Relaxed);
        Frame(Arc::new(Counted {
            text,
            budget: budget.clone(),
        }))
    }

    pub fn len(&self) -> usize {
        self.0.text.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.text.is_empty()
    }

    pub fn text(&self) -> Utf8Bytes {
        self.0.text.clone()
    }
}

struct State {
    /// In the order they were queued; a `latest` frame carries its key.
    frames: VecDeque<(Option<LatestKey>, Frame)>,
    /// `latest` frames among `frames`.
    latest: usize,
    /// Bytes of `frames`.
    queued_bytes: usize,
    /// Bytes handed to the writer by the last `next` (being written until it asks again).
    writing_bytes: usize,
    closing: Option<Close>,
    dropped: u64,
}

impl State {
    fn held(&self) -> usize {
        self.queued_bytes + self.writing_bytes
    }

    fn remove(&mut self, i: usize) {
        if let Some((_, f)) = self.frames.remove(i) {
            self.queued_bytes -= f.len();
        }
    }
}

pub struct Outbox {
    state: Mutex<State>,
    ready: Notify,
    limit: usize,
    byte_limit: usize,
    budget: Arc<NodeBudget>,
}

impl Outbox {
    /// At most `limit` frames and `byte_limit` bytes wait for this connection.
    pub fn new(limit: usize, byte_limit: usize, budget: Arc<NodeBudget>) -> Outbox {
        Outbox {
            state: Mutex::new(State {
                frames: VecDeque::new(),
                latest: 0,
                queued_bytes: 0,
                writing_bytes: 0,
                closing: None,
                dropped: 0,
            }),
            ready: Notify::new(),
            limit,
            byte_limit,
            budget,
        }
    }

    /// Queues a reply (ack, error, pong): never dropped.
    pub fn reply(&self, frame: Utf8Bytes) -> Queued {
        self.push(Frame::new(frame, &self.budget), Delivery::Live, None)
    }

    /// Queues a push of the given delivery class.
    pub fn push(&self, frame: Frame, class: Delivery, key: Option<LatestKey>) -> Queued {
        let (queued, wake) = self.queue(frame, class, key);
        if wake {
            self.wake();
        }
        queued
    }

    /// Queues a push without waking the connection's task, and says whether it must be
    /// woken (`wake`): only when the queue was empty before, since a queue with frames in
    /// it has a wake-up on its way already. Many pushes of one commit wake each task once.
    pub fn queue(&self, frame: Frame, class: Delivery, key: Option<LatestKey>) -> (Queued, bool) {
        let len = frame.len();
        let mut s = self.state.lock().expect("outbox lock");
        if s.closing.is_some() {
            return (Queued::Closed, false);
        }
        let node_over = self.budget.over();
        let queued = match (class, key) {
            (Delivery::Latest, Some(key)) => {
                // The newer frame replaces the waiting one and takes its own place at the
                // end, so it still follows everything queued before it.
                let older = s.frames.iter().position(|(k, _)| *k == Some(key));
                match older {
                    Some(i) => {
                        s.remove(i);
                        Queued::Coalesced
                    }
                    None if node_over || s.held() + len > self.byte_limit * 3 / 4 => {
                        s.dropped += 1;
                        crate::telemetry::outbox_dropped(class);
                        return (Queued::Dropped, false);
                    }
                    None if s.latest >= LATEST_MAX => {
                        if let Some(i) = s.frames.iter().position(|(k, _)| k.is_some()) {
                            s.remove(i);
                        }
                        s.dropped += 1;
                        crate::telemetry::outbox_dropped(class);
                        Queued::Yes
                    }
                    None => {
                        s.latest += 1;
                        Queued::Yes
                    }
                }
            }
            (Delivery::Droppable | Delivery::Latest, _) => {
                if node_over
                    || s.frames.len() >= self.limit * 3 / 4
                    || s.held() + len > self.byte_limit * 3 / 4
                {
                    s.dropped += 1;
                    crate::telemetry::outbox_dropped(class);
                    return (Queued::Dropped, false);
                }
                Queued::Yes
            }
            (Delivery::Persistent | Delivery::Live, _) => {
                // Over the node's budget, a connection that is behind (frames still queued)
                // goes; one that keeps up still gets what is pushed to it.
                if s.frames.len() - s.latest >= self.limit
                    || s.held() + len > self.byte_limit
                    || (node_over && !s.frames.is_empty())
                {
                    s.closing = Some(Close::SlowConsumer);
                    s.frames.clear();
                    s.latest = 0;
                    s.queued_bytes = 0;
                    drop(s);
                    self.ready.notify_one();
                    return (Queued::Overflow, false);
                }
                Queued::Yes
            }
        };
        let wake = s.frames.is_empty();
        s.queued_bytes += len;
        s.frames
            .push_back((key.filter(|_| class == Delivery::Latest), frame));
        (queued, wake)
    }

    /// Wakes the connection's task to write what is queued.
    pub fn wake(&self) {
        self.ready.notify_one();
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

    /// Waits until something is queued, then moves it all into `into` (whatever it handed
    /// out before counts as written). Returns the close reason once the connection must
    /// close. Cancel-safe.
    pub async fn next(&self, into: &mut Vec<Frame>) -> Option<Close> {
        loop {
            if let Some(closing) = self.try_next(into) {
                return closing;
            }
            self.ready.notified().await;
        }
    }

    /// `next` without the wait: `None` while nothing is queued and no close waits.
    pub fn try_next(&self, into: &mut Vec<Frame>) -> Option<Option<Close>> {
        let mut s = self.state.lock().expect("outbox lock");
        if !s.frames.is_empty() || s.closing.is_some() {
            into.extend(s.frames.drain(..).map(|(_, f)| f));
            s.latest = 0;
            s.writing_bytes = s.queued_bytes;
            s.queued_bytes = 0;
            return Some(s.closing);
        }
        s.writing_bytes = 0;
        None
    }

    /// Resolves once the outbox overflowed (the connection closes as a slow consumer).
    pub async fn overflowed(&self) {
        loop {
            if self.state.lock().expect("outbox lock").closing == Some(Close::SlowConsumer) {
                return;
            }
            // Pushes wake this too; `next` checks the state before it waits, so a wake-up
            // taken here is never lost to it.
            self.ready.notified().await;
        }
    }

    /// Frames waiting now.
    pub fn queued(&self) -> usize {
        self.state.lock().expect("outbox lock").frames.len()
    }

    /// Bytes waiting now, queued or being written.
    pub fn held_bytes(&self) -> usize {
        self.state.lock().expect("outbox lock").held()
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

    fn budget() -> Arc<NodeBudget> {
        NodeBudget::new(1 << 30)
    }

    fn f(s: &str) -> Frame {
        Frame::new(Utf8Bytes::from(s.to_string()), &budget())
    }

    fn outbox(frames: usize) -> Outbox {
        Outbox::new(frames, 1 << 20, budget())
    }

    #[tokio::test]
    async fn latest_coalesces_and_droppable_goes_first() {
        let o = outbox(16);
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
        assert_eq!(out[0].text().as_str(), "t2");
        assert_eq!(
            out.iter()
                .filter(|f| f.text().as_str().starts_with('t'))
                .count(),
            1
        );
        assert_eq!(o.dropped(), 1);
    }

    #[tokio::test]
    async fn a_latest_frame_keeps_its_place_after_earlier_frames() {
        let o = outbox(16);
        o.push(f("m1"), Delivery::Persistent, None);
        o.push(f("typing"), Delivery::Latest, Some((1, 7, 5)));
        o.push(f("m2"), Delivery::Persistent, None);
        let mut out = Vec::new();
        o.next(&mut out).await;
        let order: Vec<String> = out.iter().map(|f| f.text().to_string()).collect();
        assert_eq!(order, ["m1", "typing", "m2"]);
    }

    #[tokio::test]
    async fn reliable_frames_overflow_into_a_close() {
        let o = outbox(16);
        for i in 0..16 {
            o.push(f(&format!("m{i}")), Delivery::Live, None);
        }
        assert_eq!(o.push(f("x"), Delivery::Persistent, None), Queued::Overflow);
        let mut out = Vec::new();
        assert_eq!(o.next(&mut out).await, Some(Close::SlowConsumer));
        assert!(out.is_empty());
    }
}

#[cfg(test)]
mod byte_tests {
    use super::*;

    fn bytes(n: usize, budget: &Arc<NodeBudget>) -> Frame {
        Frame::new(Utf8Bytes::from("x".repeat(n)), budget)
    }

    #[tokio::test]
    async fn bytes_close_a_slow_reader_before_the_frame_count_does() {
        let node = NodeBudget::new(1 << 30);
        let o = Outbox::new(1000, 10_000, node.clone());
        for _ in 0..9 {
            assert_eq!(
                o.push(bytes(1000, &node), Delivery::Persistent, None),
                Queued::Yes
            );
        }
        // Droppable frames go once three quarters of the bytes are taken.
        assert_eq!(
            o.push(bytes(1000, &node), Delivery::Droppable, None),
            Queued::Dropped
        );
        // Bytes handed to the writer still count until it asks for more.
        let mut out = Vec::new();
        o.next(&mut out).await;
        assert_eq!(o.held_bytes(), 9000);
        assert_eq!(
            o.push(bytes(1001, &node), Delivery::Persistent, None),
            Queued::Overflow
        );
        assert_eq!(o.next(&mut out).await, Some(Close::SlowConsumer));
        drop(out);
        assert_eq!(node.bytes(), 0, "every frame's bytes came back to the node");
    }

    #[tokio::test]
    async fn over_the_node_budget_only_readers_that_are_behind_go() {
        let node = NodeBudget::new(5000);
        let behind = Outbox::new(1000, 1 << 20, node.clone());
        let keeping_up = Outbox::new(1000, 1 << 20, node.clone());
        for _ in 0..5 {
            assert_eq!(
                behind.push(bytes(1000, &node), Delivery::Persistent, None),
                Queued::Yes
            );
        }
        assert_eq!(node.bytes(), 5000, "at the node's budget, not over it");
        // A frame shared by both counts once.
        let shared = bytes(100, &node);
        assert_eq!(
            keeping_up.push(shared.clone(), Delivery::Persistent, None),
            Queued::Yes
        );
        assert_eq!(
            behind.push(shared, Delivery::Persistent, None),
            Queued::Overflow
        );
        assert_eq!(node.bytes(), 100);
    }
}
