//! Plugin runtime benchmark. Prints: validate cost per call (µs) for text at 100 B and
//! 10 KB in each instantiation mode; validate calls/s on one and on both cores; compile and
//! load time per plugin; memory per loaded plugin and per warm instance.
//!
//! Run: `cargo bench -p courier --bench plugins` (optionally `-- --quick`).
//! Extra components to time (e.g. the Python/JS examples): `COURIER_BENCH_EXTRA=a.wasm:b.wasm`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use courier::builtin::BUILTINS;
use courier::config::Config;
use courier::plugins::runtime::{Limits, Runtime};
use courier::plugins::{PluginRegistry, SendContext, SenderKind};

const CTX: SendContext<'static> = SendContext {
    sender_id: "alice",
    sender: SenderKind::User,
    conversation_type: 2,
    conversation_id: "c1",
};

/// A text payload of exactly `bytes` bytes. CJK characters (3 bytes each) keep a 10 KB
/// payload under the text kind's 4000-character limit.
fn text_payload(bytes: usize) -> String {
    let fill = bytes - r#"{"text":""}"#.len();
    format!(
        r#"{{"text":"{}{}"}}"#,
        "日".repeat(fill / 3),
        "x".repeat(fill % 3)
    )
}

/// Calls `f` until `max_calls` or `max_time`, returns (calls, µs per call).
fn time_calls(max_calls: u64, max_time: Duration, mut f: impl FnMut()) -> (u64, f64) {
    for _ in 0..50.min(max_calls) {
        f();
    }
    let start = Instant::now();
    let mut n = 0;
    while n < max_calls && start.elapsed() < max_time {
        f();
        n += 1;
    }
    (n, start.elapsed().as_secs_f64() * 1e6 / n as f64)
}

fn rss_bytes() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<usize>().ok())
        })
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (calls, time) = if quick {
        (20_000, Duration::from_secs(1))
    } else {
        (200_000, Duration::from_secs(4))
    };
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!(
        "courier plugin benchmark ({} mode, {cores} cores)\n",
        if quick { "quick" } else { "full" }
    );

    println!("memory (resident set, measured first in a fresh process):");
    let before = rss_bytes();
    let reg = PluginRegistry::load(&Config::default()).unwrap();
    let loaded = rss_bytes();
    let n = BUILTINS.len();
    // One warm instance per plugin: validate one of each plugin's examples.
    for info in reg.list() {
        let p = reg.by_name(&info.manifest.name).unwrap();
        let _ = p
            .pool()
            .call(|s, b| b.courier_plugin_kind().call_examples(s))
            .0;
    }
    let warm = rss_bytes();
    println!(
        "  {n} bundled plugins loaded (compiled, no instance kept): {:.2} MiB total, {:.0} KiB per plugin",
        (loaded - before) as f64 / 1048576.0,
        (loaded - before) as f64 / 1024.0 / n as f64
    );
    println!(
        "  one warm pooled instance each: +{:.2} MiB total, {:.0} KiB per instance",
        (warm.saturating_sub(loaded)) as f64 / 1048576.0,
        warm.saturating_sub(loaded) as f64 / 1024.0 / n as f64
    );

    // 1. Validate cost per call, per mode and size.
    println!("\nvalidate cost per call, text plugin, through PluginRegistry::validate:");
    println!(
        "  {:<8} {:>8} {:>12} {:>10}",
        "mode", "payload", "µs/call", "calls"
    );
    for mode in ["pooled", "fresh"] {
        let reg = PluginRegistry::load(
            &Config::from_toml(&format!("[runtime]\nisolation = \"{mode}\"\n")).unwrap(),
        )
        .unwrap();
        for size in [100, 10_000] {
            let payload = text_payload(size);
            assert_eq!(payload.len(), size);
            let budget = if mode == "fresh" { calls / 10 } else { calls };
            let (n, us) = time_calls(budget, time, || {
                reg.validate(1, &CTX, payload.as_bytes()).expect("valid");
            });
            println!("  {mode:<8} {:>7}B {us:>12.2} {n:>10}", size);
        }
    }

    // 2. Throughput on one and on all cores (pooled: one warm instance per thread).
    println!("\nvalidate throughput, text 100 B, pooled:");
    let reg = Arc::new(PluginRegistry::load(&Config::default()).unwrap());
    let payload = Arc::new(text_payload(100));
    for threads in [1, cores] {
        let start = Instant::now();
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (reg, payload) = (reg.clone(), payload.clone());
                std::thread::spawn(move || {
                    time_calls(calls * 10, time, || {
                        reg.validate(1, &CTX, payload.as_bytes()).expect("valid");
                    })
                    .0
                })
            })
            .collect();
        let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        let secs = start.elapsed().as_secs_f64();
        println!(
            "  {threads} thread(s): {:>10.0} calls/s ({total} calls in {secs:.2} s)",
            total as f64 / secs
        );
    }

    // 3. Compile and load time per plugin; 4. memory.
    println!("\ncompile and load per plugin (cranelift, opt-level speed):");
    println!("  (validate µs: warm pooled instance, the plugin's first accepted example)");
    println!(
        "  {:<16} {:>9} {:>12} {:>12} {:>14} {:>12}",
        "plugin", "size KiB", "code KiB", "compile ms", "instantiate µs", "validate µs"
    );
    let runtime = Runtime::new().unwrap();
    let mut files: Vec<(String, Vec<u8>)> = BUILTINS
        .iter()
        .map(|(n, b)| (n.to_string(), b.to_vec()))
        .collect();
    if let Ok(extra) = std::env::var("COURIER_BENCH_EXTRA") {
        for path in extra.split(':').filter(|p| !p.is_empty()) {
            match std::fs::read(path) {
                Ok(b) => files.push((path.rsplit('/').next().unwrap_or(path).to_string(), b)),
                Err(e) => println!("  (skipping {path}: {e})"),
            }
        }
    }
    let limits = Limits::from_config(&Config::default().runtime, None);
    for (name, bytes) in &files {
        let t = Instant::now();
        let component = runtime.compile(bytes).unwrap();
        let compile_ms = t.elapsed().as_secs_f64() * 1e3;
        let image = component.image_range();
        let code_kib = (image.end as usize - image.start as usize) / 1024;
        let pre = runtime.prepare(&component).unwrap();
        let pool = courier::plugins::pool::InstancePool::new(
            name,
            &runtime,
            pre,
            Limits {
                isolation: courier::config::Isolation::Fresh,
                ..limits
            },
        );
        let t = Instant::now();
        let n = 20;
        for _ in 0..n {
            pool.call(|s, b| b.courier_plugin_kind().call_manifest(s))
                .0
                .unwrap();
        }
        let inst_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        let warm = courier::plugins::pool::InstancePool::new(
            name,
            &runtime,
            runtime.prepare(&component).unwrap(),
            limits,
        );
        let examples = warm
            .call(|s, b| b.courier_plugin_kind().call_examples(s))
            .0
            .unwrap();
        let validate_us = examples.iter().find(|e| e.accepted).map(|e| {
            let ctx = SendContext {
                conversation_type: e.conversation_type,
                ..CTX
            };
            time_calls(calls / 4, time / 4, || {
                warm.validate(&ctx, &e.payload).0.unwrap().unwrap();
            })
            .1
        });
        println!(
            "  {name:<16} {:>9} {code_kib:>12} {compile_ms:>12.1} {inst_us:>14.1} {:>12}",
            bytes.len() / 1024,
            validate_us.map_or("-".into(), |v| format!("{v:.1}"))
        );
    }
}
