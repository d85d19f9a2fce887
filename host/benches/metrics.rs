//! What recording the metrics costs on the send path: the calls one stored 1:1 message
//! makes (its frame read, its answer counted, the ack and the push written, its commit
//! batch of one), against the installed Prometheus recorder, on one thread and on two at
//! once (the recorder's maps are shared). Prints ns per message.
//!
//! `cargo bench -p courier --bench metrics`

use std::time::{Duration, Instant};

use courier::telemetry::{self, SendOutcome};

const MESSAGES: u32 = 1_000_000;

fn one_message() {
    telemetry::frame_in("send");
    telemetry::send(
        Some(1),
        SendOutcome::Ok {
            live: false,
            took: Duration::from_micros(800),
        },
    );
    telemetry::frame_out(r#"{"type":"ack","id":"1"}"#);
    telemetry::frame_out(r#"{"type":"notify","seq":1}"#);
    telemetry::commit(1, Duration::from_micros(500), false);
}

fn run(threads: u32) -> f64 {
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                for _ in 0..MESSAGES / threads {
                    one_message();
                }
            });
        }
    });
    started.elapsed().as_nanos() as f64 / f64::from(MESSAGES)
}

fn main() {
    telemetry::install();
    run(1); // warm up: the series exist after the first call
    for threads in [1, 2] {
        let ns = run(threads);
        println!(
            "metrics per stored 1:1 message, {threads} thread(s): {ns:.0} ns (wall time / messages)"
        );
    }
    let text = telemetry::render();
    assert!(text.contains("courier_sends_total"));
}
