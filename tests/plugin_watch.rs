//! `courier plugin watch` against a real dev server: a change that passes the contract
//! suite is built, checked and hot-reloaded (the server runs the new version); a change
//! that fails it prints the failing check, and the server keeps the version it had;
//! Ctrl-C stops the watch cleanly.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use common::kinds::{author_env, build, courier, new_kind};
use common::server::{ADMIN_TOKEN, Backend, Db, Server};
use common::{scratch, toml_path};

/// A safety net only: every wait below ends on a line of output or a server's answer.
/// Generous, for a release build of a kind on a busy 2-core machine.
const DEADLINE: Duration = Duration::from_secs(900);

/// The watch process and the lines it printed.
struct Watch {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Watch {
    fn start(dir: &Path, server: &Server) -> Watch {
        let mut child = author_env(&mut courier())
            .args(["plugin", "watch"])
            .arg(dir)
            .args(["--server", &format!("http://{}", server.addr)])
            .args(["--token", ADMIN_TOKEN, "--fuzz", "200"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start courier plugin watch");
        let (tx, lines) = channel();
        let out = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Watch {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads lines until one starts with `prefix`; returns it.
    fn expect(&mut self, prefix: &str) -> String {
        let until = Instant::now() + DEADLINE;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    println!("watch| {line}");
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!(
                    "no line starting {prefix:?} within {DEADLINE:?}; watch printed:\n{}",
                    self.seen.join("\n")
                ),
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "watch ended before printing {prefix:?}; it printed:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// The lines printed since the last line starting with `from`.
    fn since(&self, from: &str) -> String {
        let start = self
            .seen
            .iter()
            .rposition(|l| l.starts_with(from))
            .unwrap_or(0);
        self.seen[start..].join("\n")
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The version of `name` the server runs.
async fn running_version(server: &Server, name: &str) -> String {
    let (status, body) = server
        .http("GET", "/admin/plugins", Some(ADMIN_TOKEN), None)
        .await;
    assert_eq!(status, 200, "{body}");
    let p = body["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {body}"));
    p["version"].as_str().unwrap().to_string()
}

/// Replaces `from` by `to` in a file of the kind (as an author's editor would save it).
fn edit(file: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.contains(from), "{} has no {from:?}", file.display());
    std::fs::write(file, text.replacen(from, to, 1)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_reloads_a_passing_change_and_keeps_the_old_version_on_a_failing_one() {
    let root = scratch("watch");
    let kind = root.join("wkind");
    new_kind("wkind", "rust", &kind);
    build(&kind);
    let db = Db::new(&Backend::Sqlite, "watch").await;
    let wasm = kind.join("build/wkind.wasm");
    let server = Server::start(
        &db,
        &format!("[plugins.wkind]\npath = {}\n", toml_path(&wasm)),
    )
    .await;
    assert_eq!(running_version(&server, "wkind").await, "0.1.0");

    let mut watch = Watch::start(&kind, &server);
    // The first round: built, checked, and reloaded as it is.
    watch.expect("check: PASS — wkind 0.1.0");
    let line = watch.expect("reload: ");
    assert!(
        line.starts_with("reload: done — wkind 0.1.0 is running"),
        "{line}"
    );
    watch.expect("watch: waiting for a change");

    // A new version that passes: reloaded, and the server runs it.
    edit(
        &kind.join("Cargo.toml"),
        "version = \"0.1.0\"",
        "version = \"0.2.0\"",
    );
    watch.expect("watch: changed: Cargo.toml");
    watch.expect("check: PASS — wkind 0.2.0");
    let line = watch.expect("reload: ");
    assert!(
        line.starts_with("reload: done — wkind 0.2.0 is running"),
        "{line}"
    );
    assert_eq!(running_version(&server, "wkind").await, "0.2.0");
    watch.expect("watch: waiting for a change");

    // An example that no longer comes out as declared (an accepted one now rejected),
    // then a version bump: the suite fails, nothing is reloaded.
    edit(
        &kind.join("src/lib.rs"),
        r##"Example::accept("plain", 1, r#"{"title":"Hello"}"#)"##,
        r##"Example::accept("plain", 1, r#"{"title":""}"#)"##,
    );
    edit(
        &kind.join("Cargo.toml"),
        "version = \"0.2.0\"",
        "version = \"0.3.0\"",
    );
    watch.expect("check: FAIL — wkind 0.3.0");
    let line = watch.expect("reload: ");
    assert_eq!(
        line,
        "reload: skipped, the suite failed; the server keeps the version it has"
    );
    let verdict = watch.since("check: FAIL — wkind 0.3.0");
    assert!(
        verdict.contains("  FAIL  examples") && verdict.contains("plain"),
        "{verdict}"
    );
    assert_eq!(running_version(&server, "wkind").await, "0.2.0");

    // A build that fails prints the build's error, and waits.
    edit(
        &kind.join("src/lib.rs"),
        "export_plugin!(Kind);",
        "export_plugin!(Kind)",
    );
    let line = watch.expect("build: FAILED");
    assert!(line.contains("exit status"), "{line}");
    assert!(
        watch.expect("  | error").contains("error"),
        "the compiler's error is shown"
    );
    watch.expect("watch: waiting for a change");
    assert_eq!(running_version(&server, "wkind").await, "0.2.0");

    // Ctrl-C: a clean stop.
    let pid = watch.child.id().to_string();
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    watch.expect("watch: stopped");
    let until = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(s) = watch.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < until, "watch did not exit after Ctrl-C");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "watch exited with {status}");
}
