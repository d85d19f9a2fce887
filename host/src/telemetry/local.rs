//! A recorder in front of the Prometheus one that keeps counts and histogram values on the
//! thread that made them until `/metrics` reads them. A live signal counts six series and
//! records two histograms on its way through; two cores adding to the same atomics pass
//! their cache lines back and forth, which cost about 8% of the server's CPU per signal
//! (ARCHITECTURE.md, "Metrics kept per thread"). `flush` folds what every thread holds
//! into the Prometheus recorder: rendering calls it first, so a scrape sees every count
//! made before it began, and the periodic upkeep calls it, so memory stays bounded.
//! Gauges and descriptions go straight through.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use metrics::{
    Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};

/// Counter slots are allocated per thread in pages of this many.
const PAGE: usize = 256;
/// At most `PAGE * PAGES` counters are kept per thread; any beyond count straight through.
const PAGES: usize = 64;
/// A thread folds its histogram values itself once it holds this many.
const VALUES: usize = 512;

/// `inner`, with counters and histograms kept per thread.
pub struct Local<R> {
    inner: R,
}

impl<R> Local<R> {
    pub fn new(inner: R) -> Self {
        Local { inner }
    }
}

/// What the threads' shards are folded into, by slot.
#[derive(Default)]
struct Table {
    counters: Slots<Counter>,
    histograms: Slots<Histogram>,
    /// Every living thread's shard that has counted something.
    shards: Mutex<Vec<Arc<Shard>>>,
    /// Histogram values of threads that ended: recording one needs a thread-local clock,
    /// gone by then, so they are recorded by the next flush.
    orphans: Mutex<Vec<(u32, f64)>>,
}

/// The Prometheus handles of one kind of series by slot, and the slot of each key, so
/// registering a series again finds its slot.
struct Slots<T> {
    by_key: RwLock<HashMap<Key, u32>>,
    handles: RwLock<Vec<T>>,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots {
            by_key: RwLock::default(),
            handles: RwLock::default(),
        }
    }
}

impl<T> Slots<T> {
    /// The slot of `key` (registering `handle` under it the first time).
    fn of(&self, key: &Key, handle: &T) -> u32
    where
        T: Clone,
    {
        if let Some(slot) = self.by_key.read().expect("slots").get(key) {
            return *slot;
        }
        let mut by_key = self.by_key.write().expect("slots");
        if let Some(slot) = by_key.get(key) {
            return *slot;
        }
        let mut handles = self.handles.write().expect("handles");
        let slot = handles.len() as u32;
        handles.push(handle.clone());
        by_key.insert(key.clone(), slot);
        slot
    }
}

static TABLE: OnceLock<Table> = OnceLock::new();

fn table() -> &'static Table {
    TABLE.get_or_init(Table::default)
}

/// One thread's counts and values not yet folded.
struct Shard {
    pages: [OnceLock<Box<[AtomicU64; PAGE]>>; PAGES],
    values: Mutex<Vec<(u32, f64)>>,
}

impl Shard {
    fn new() -> Self {
        Shard {
            pages: std::array::from_fn(|_| OnceLock::new()),
            values: Mutex::new(Vec::new()),
        }
    }

    fn add(&self, slot: usize, n: u64) {
        let page = self.pages[slot / PAGE]
            .get_or_init(|| Box::new(std::array::from_fn(|_| AtomicU64::new(0))));
        page[slot % PAGE].fetch_add(n, Ordering::Relaxed);
    }

    /// Moves what the shard holds into the Prometheus handles.
    fn fold(&self, t: &Table) {
        self.fold_counts(t);
        let values = std::mem::take(&mut *self.values.lock().expect("values"));
        fold_values(t, values);
    }

    fn fold_counts(&self, t: &Table) {
        let counters = t.counters.handles.read().expect("counters");
        for (p, page) in self.pages.iter().enumerate() {
            let Some(page) = page.get() else { continue };
            for (i, count) in page.iter().enumerate() {
                let n = count.swap(0, Ordering::Relaxed);
                if n > 0 {
                    counters[p * PAGE + i].increment(n);
                }
            }
        }
    }
}

fn fold_values(t: &Table, values: Vec<(u32, f64)>) {
    if values.is_empty() {
        return;
    }
    let histograms = t.histograms.handles.read().expect("histograms");
    for (slot, v) in values {
        histograms[slot as usize].record(v);
    }
}

/// The thread's shard, enlisted in the table on first use and folded when the thread ends.
struct Mine(Arc<Shard>);

impl Drop for Mine {
    fn drop(&mut self) {
        let t = table();
        let mut shards = t.shards.lock().expect("shards");
        self.0.fold_counts(t);
        let values = std::mem::take(&mut *self.0.values.lock().expect("values"));
        t.orphans.lock().expect("orphans").extend(values);
        shards.retain(|s| !Arc::ptr_eq(s, &self.0));
    }
}

thread_local! {
    static MINE: Mine = {
        let shard = Arc::new(Shard::new());
        table().shards.lock().expect("shards").push(shard.clone());
        Mine(shard)
    };
}

/// Folds every thread's counts and values into the Prometheus recorder.
pub fn flush() {
    let t = table();
    let shards = t.shards.lock().expect("shards");
    for shard in shards.iter() {
        shard.fold(t);
    }
    drop(shards);
    let orphans = std::mem::take(&mut *t.orphans.lock().expect("orphans"));
    fold_values(t, orphans);
}

struct LocalCounter {
    slot: usize,
    inner: Counter,
}

impl CounterFn for LocalCounter {
    fn increment(&self, n: u64) {
        if self.slot >= PAGE * PAGES || MINE.try_with(|m| m.0.add(self.slot, n)).is_err() {
            self.inner.increment(n);
        }
    }

    /// Counters set whole (copied from elsewhere when scraped) are never incremented.
    fn absolute(&self, value: u64) {
        self.inner.absolute(value);
    }
}

struct LocalHistogram {
    slot: u32,
    inner: Histogram,
}

impl HistogramFn for LocalHistogram {
    fn record(&self, value: f64) {
        let kept = MINE.try_with(|m| {
            let mut values = m.0.values.lock().expect("values");
            values.push((self.slot, value));
            if values.len() >= VALUES {
                let full = std::mem::take(&mut *values);
                drop(values);
                fold_values(table(), full);
            }
        });
        if kept.is_err() {
            self.inner.record(value);
        }
    }
}

impl<R: Recorder> Recorder for Local<R> {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        let inner = self.inner.register_counter(key, metadata);
        let slot = table().counters.of(key, &inner);
        Counter::from_arc(Arc::new(LocalCounter {
            slot: slot as usize,
            inner,
        }))
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.inner.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        let inner = self.inner.register_histogram(key, metadata);
        let slot = table().histograms.of(key, &inner);
        Histogram::from_arc(Arc::new(LocalHistogram { slot, inner }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_exporter_prometheus::PrometheusBuilder;

    /// Counts and values made on threads that ended, and on one that lives on, are all
    /// in the rendered text after a flush, each once.
    #[test]
    fn every_thread_counts_once() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let local = Local::new(recorder);
        let key = Key::from_name("local_test_total");
        let meta = Metadata::new("test", metrics::Level::INFO, None);
        let counter = local.register_counter(&key, &meta);
        let histogram = local.register_histogram(&Key::from_name("local_test_seconds"), &meta);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        counter.increment(1);
                        histogram.record(0.5);
                    }
                });
            }
        });
        // Registered again (as `counter!` does on each call): the same slot.
        local.register_counter(&key, &meta).increment(3);
        counter.increment(2);
        flush();
        let text = handle.render();
        assert!(text.contains("local_test_total 4005\n"), "{text}");
        assert!(text.contains("local_test_seconds_count 4000\n"), "{text}");
        flush();
        assert!(handle.render().contains("local_test_total 4005\n"));
    }
}
