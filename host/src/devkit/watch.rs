//! `courier plugin watch DIR [--server URL]`: on every change under DIR, run its
//! `build.sh`, run the contract suite on the component it wrote (`build/*.wasm`, with
//! `cases/`), print the verdict, and — when it passes — ask the dev server to reload.
//!
//! Changes are seen by polling the folder's file list, sizes and modification times
//! (`build/`, `target/`, `node_modules/`, `__pycache__/`, hidden entries and the lock files
//! a build rewrites are not watched); a burst of changes is one rebuild once the folder has been quiet for a moment.
//! Ctrl-C (or SIGTERM) stops the build in progress and ends the watch.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch as signal_flag;

use super::reload::{Answer, DevServer, terminal_safe};
use crate::plugins::check::{CheckOptions, Report, Status, check_file};

/// Folders under DIR that hold outputs and downloads, never sources.
const IGNORED: &[&str] = &["build", "target", "node_modules", "__pycache__"];

/// Files the build itself rewrites (a version bump updates the lock): watching them would
/// rebuild twice.
const WRITTEN_BY_BUILDS: &[&str] = &["Cargo.lock", "package-lock.json"];

/// How many of a failed build's last output lines are printed.
const BUILD_TAIL_LINES: usize = 40;

#[derive(Debug, Clone)]
pub struct WatchOptions {
    pub dir: PathBuf,
    /// The dev server to reload; `None`: build and check only.
    pub server: Option<DevServer>,
    /// The suite's settings; `cases` defaults to DIR/cases when that folder exists.
    pub check: CheckOptions,
    /// How often the folder is looked at.
    pub poll: Duration,
    /// How long the folder must stay unchanged before a rebuild (a burst is one build).
    pub quiet: Duration,
}

/// A file's size and modification time, by path under DIR.
type Snapshot = BTreeMap<PathBuf, (u64, Option<SystemTime>)>;

/// Runs until Ctrl-C. `Err` when DIR is not a kind's folder or the watch cannot start.
pub fn run(mut opts: WatchOptions) -> Result<(), String> {
    if !opts.dir.join("build.sh").is_file() {
        return Err(format!(
            "{} has no build.sh (a folder made by `courier plugin new` has one)",
            opts.dir.display()
        ));
    }
    if opts.check.cases.is_none() && opts.dir.join("cases").is_dir() {
        opts.check.cases = Some(opts.dir.join("cases"));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let stop = stop_on_signal(&rt)?;
    let w = Watcher { opts, rt, stop };
    println!(
        "watch: {} — build, check{} on every change; Ctrl-C stops",
        w.opts.dir.display(),
        match &w.opts.server {
            Some(s) => format!(", reload {}", s.url),
            None => String::new(),
        }
    );
    let mut seen = snapshot(&w.opts.dir);
    loop {
        if w.round().is_none() {
            break;
        }
        println!("watch: waiting for a change");
        match w.next_change(&seen) {
            Some((now, changed)) => {
                println!("watch: changed: {}", changed);
                seen = now;
            }
            None => break,
        }
    }
    println!("watch: stopped");
    Ok(())
}

/// A flag that turns true on SIGINT or SIGTERM (the handlers are in place on return).
fn stop_on_signal(rt: &tokio::runtime::Runtime) -> Result<signal_flag::Receiver<bool>, String> {
    let (tx, rx) = signal_flag::channel(false);
    let _guard = rt.enter();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
        let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
        rt.spawn(async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            let _ = tx.send(true);
        });
    }
    #[cfg(not(unix))]
    rt.spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        let _ = tx.send(true);
    });
    Ok(rx)
}

struct Watcher {
    opts: WatchOptions,
    rt: tokio::runtime::Runtime,
    stop: signal_flag::Receiver<bool>,
}

impl Watcher {
    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    /// Sleeps for `d` unless stopped first; false when stopped.
    fn pause(&self, d: Duration) -> bool {
        let mut stop = self.stop.clone();
        self.rt.block_on(async {
            tokio::select! {
                _ = tokio::time::sleep(d) => true,
                _ = stop.wait_for(|s| *s) => false,
            }
        })
    }

    /// Build, check, reload. `None` when stopped on the way.
    fn round(&self) -> Option<()> {
        let Some(wasm) = self.build()? else {
            return Some(());
        };
        let report = self.check(&wasm)?;
        print_verdict(&report);
        match &self.opts.server {
            None => {}
            Some(_) if !report.passed() => {
                println!("reload: skipped, the suite failed; the server keeps the version it has")
            }
            Some(server) => self.reload(server, &report)?,
        }
        Some(())
    }

    /// Runs build.sh; the component it wrote, `Some(None)` when the build failed.
    fn build(&self) -> Option<Option<PathBuf>> {
        let dir = &self.opts.dir;
        let out_dir = dir.join("build");
        let log_path = out_dir.join("watch.log");
        let started = Instant::now();
        println!("build: running build.sh");
        let child = std::fs::create_dir_all(&out_dir)
            .and_then(|()| std::fs::File::create(&log_path))
            .and_then(|log| {
                let mut cmd = Command::new("bash");
                cmd.arg("build.sh")
                    .current_dir(dir)
                    .stdin(Stdio::null())
                    .stdout(log.try_clone()?)
                    .stderr(log);
                // Its own process group: Ctrl-C here stops the whole build (cargo, npm).
                #[cfg(unix)]
                std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
                cmd.spawn()
            });
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                println!("build: FAILED: cannot run build.sh: {e}");
                return Some(None);
            }
        };
        let status = self.wait_child(child)?;
        let took = started.elapsed().as_secs_f64();
        if !status.success() {
            let output = std::fs::read_to_string(&log_path).unwrap_or_default();
            let lines: Vec<&str> = output.lines().collect();
            println!(
                "build: FAILED ({status}) after {took:.1} s; its last lines ({} has them all):",
                log_path.display()
            );
            for l in &lines[lines.len().saturating_sub(BUILD_TAIL_LINES)..] {
                println!("  | {}", terminal_safe(l));
            }
            return Some(None);
        }
        match newest_wasm(&out_dir) {
            Some(wasm) => {
                println!("build: done in {took:.1} s: {}", wasm.display());
                Some(Some(wasm))
            }
            None => {
                println!(
                    "build: FAILED: build.sh succeeded but wrote no {}/*.wasm",
                    out_dir.display()
                );
                Some(None)
            }
        }
    }

    /// Waits for the build; on stop, ends its whole process group first.
    fn wait_child(&self, mut child: Child) -> Option<std::process::ExitStatus> {
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) => {}
                Err(e) => {
                    println!("build: cannot wait for build.sh: {e}");
                    return None;
                }
            }
            if !self.pause(Duration::from_millis(50)) {
                #[cfg(unix)]
                let _ = Command::new("kill")
                    .args(["-TERM", "--", &format!("-{}", child.id())])
                    .status();
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }

    /// The contract suite, on a thread of its own so that Ctrl-C is not kept waiting.
    fn check(&self, wasm: &Path) -> Option<Report> {
        let (wasm, opts) = (wasm.to_path_buf(), self.opts.check.clone());
        let suite = std::thread::spawn(move || check_file(&wasm, &opts));
        while !suite.is_finished() {
            if !self.pause(Duration::from_millis(50)) {
                return None;
            }
        }
        match suite.join() {
            Ok(r) => Some(r),
            Err(_) => {
                println!("check: the contract suite panicked");
                None
            }
        }
    }

    fn reload(&self, server: &DevServer, report: &Report) -> Option<()> {
        let mut stop = self.stop.clone();
        let answer = self.rt.block_on(async {
            tokio::select! {
                a = server.reload() => Some(a),
                _ = stop.wait_for(|s| *s) => None,
            }
        })?;
        let name = report.manifest.as_ref().map(|m| m.name.as_str());
        match answer {
            Err(e) => println!("reload: FAILED: {e}"),
            Ok(Answer::Reloaded(list)) => match list.iter().find(|p| p["name"].as_str() == name) {
                Some(p) => println!(
                    "reload: done — {} {} is running on {}",
                    crate::plugins::display(name.unwrap_or_default()),
                    crate::plugins::display(p["version"].as_str().unwrap_or_default()),
                    server.url
                ),
                None => println!(
                    "reload: done, but the server has no plugin named {}: name this folder's build output in its config ([plugins.<name>] path = \"…/build/….wasm\")",
                    crate::plugins::display(name.unwrap_or_default())
                ),
            },
            Ok(Answer::Refused {
                status,
                code,
                message,
            }) => {
                let mut lines = message.lines();
                println!(
                    "reload: refused (HTTP {status} {code}): {}",
                    lines.next().unwrap_or_default()
                );
                for l in lines {
                    println!("  {l}");
                }
            }
        }
        Some(())
    }

    /// Waits until DIR differs from `seen` and has then stayed unchanged for `quiet`;
    /// the new snapshot and what changed. `None` when stopped.
    fn next_change(&self, seen: &Snapshot) -> Option<(Snapshot, String)> {
        let mut now = loop {
            if self.stopped() || !self.pause(self.opts.poll) {
                return None;
            }
            let now = snapshot(&self.opts.dir);
            if now != *seen {
                break now;
            }
        };
        loop {
            if !self.pause(self.opts.quiet) {
                return None;
            }
            let again = snapshot(&self.opts.dir);
            if again == now {
                break;
            }
            now = again;
        }
        let changed = describe(seen, &now);
        Some((now, changed))
    }
}

/// The checks' outcome: one line, then each failing or warning check.
fn print_verdict(r: &Report) {
    let what = match &r.manifest {
        Some(m) => format!(
            "{} {}",
            crate::plugins::display(&m.name),
            crate::plugins::display(&m.version)
        ),
        None => r.file.clone(),
    };
    let failed = r.checks.iter().filter(|c| c.status == Status::Fail).count();
    let warned = r.checks.iter().filter(|c| c.status == Status::Warn).count();
    if failed == 0 {
        println!(
            "check: PASS — {what}: {} checks passed{}",
            r.checks.len(),
            match warned {
                0 => String::new(),
                n => format!(" ({n} with a warning)"),
            }
        );
    } else {
        println!(
            "check: FAIL — {what}: {failed} of {} checks failed",
            r.checks.len()
        );
    }
    for c in r
        .checks
        .iter()
        .filter(|c| matches!(c.status, Status::Fail | Status::Warn))
    {
        let tag = if c.status == Status::Fail {
            "FAIL"
        } else {
            "WARN"
        };
        let mut lines = c.detail.lines();
        println!(
            "  {tag}  {:<13} {}",
            c.name,
            lines.next().unwrap_or_default()
        );
        for l in lines {
            println!("  {:<4}  {:<13} {l}", "", "");
        }
    }
}

/// Every watched file under `dir`.
fn snapshot(dir: &Path) -> Snapshot {
    let mut out = Snapshot::new();
    walk(dir, dir, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut Snapshot) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name.ends_with('~') {
            continue;
        }
        let path = e.path();
        let Ok(meta) = e.metadata() else { continue };
        if meta.is_dir() {
            if !IGNORED.contains(&name.as_ref()) {
                walk(root, &path, out);
            }
        } else if !WRITTEN_BY_BUILDS.contains(&name.as_ref()) {
            let rel = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
            out.insert(rel, (meta.len(), meta.modified().ok()));
        }
    }
}

/// The paths that differ, for the "changed:" line (the first few).
fn describe(before: &Snapshot, after: &Snapshot) -> String {
    let mut changed: Vec<String> = after
        .iter()
        .filter(|(p, v)| before.get(*p) != Some(v))
        .map(|(p, _)| p.display().to_string())
        .chain(
            before
                .keys()
                .filter(|p| !after.contains_key(*p))
                .map(|p| format!("{} (removed)", p.display())),
        )
        .collect();
    let more = changed.len().saturating_sub(5);
    changed.truncate(5);
    let mut s = changed.join(", ");
    if more > 0 {
        s += &format!(" and {more} more");
    }
    s
}

/// The most recently written `.wasm` in `dir`.
fn newest_wasm(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "wasm"))
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_and_hidden_files_are_not_watched() {
        let dir = std::env::temp_dir().join(format!("courier-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for f in [
            "src/lib.rs",
            "build/x.wasm",
            "target/a",
            "node_modules/b/c.js",
            ".git/HEAD",
            "a.rs~",
        ] {
            let p = dir.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "x").unwrap();
        }
        let before = snapshot(&dir);
        assert_eq!(before.keys().collect::<Vec<_>>(), [Path::new("src/lib.rs")]);
        std::fs::write(dir.join("src/lib.rs"), "xy").unwrap();
        std::fs::write(dir.join("cases.txt"), "").unwrap();
        assert_eq!(describe(&before, &snapshot(&dir)), "cases.txt, src/lib.rs");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
