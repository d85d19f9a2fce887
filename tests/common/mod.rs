//! Shared by the integration tests: the misbehaving fixture plugins (built from source
//! once per test binary), the bundled plugins, and scratch directories.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn target_root() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Removes the outer build's CARGO_*/RUSTC*/RUSTDOC*/RUSTFLAGS variables from `cmd`
/// (registry and network settings kept): a nested build as an author's shell would run it.
pub fn without_outer_cargo(cmd: &mut Command) -> &mut Command {
    const KEEP: &[&str] = &[
        "CARGO_HOME",
        "CARGO_NET_",
        "CARGO_HTTP_",
        "CARGO_REGISTRIES_",
        "CARGO_REGISTRY_",
        "CARGO_TERM_",
    ];
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        let outer = (key.starts_with("CARGO_") && !KEEP.iter().any(|k| key.starts_with(k)))
            || key.starts_with("RUSTC")
            || key.starts_with("RUSTDOC")
            || key == "RUSTFLAGS";
        if outer {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// The cargo running these tests, for building guest crates for wasm32-wasip2.
fn cargo() -> Command {
    let mut cmd = Command::new(option_env!("CARGO").unwrap_or("cargo"));
    without_outer_cargo(&mut cmd);
    cmd
}

/// The `courier` binary under test, with no COURIER_* settings from the environment but
/// the log filter (only the test's config speaks). `BENCH_SERVER_BIN` names another build
/// of it, for a benchmark that compares two; `BENCH_CALLGRIND=1` runs it under valgrind's
/// callgrind with its instrumentation off until a phase switches it on, for a benchmark
/// that counts a phase's instructions (`callgrind_control`).
pub fn courier() -> Command {
    let bin = std::env::var_os("BENCH_SERVER_BIN")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_courier").into());
    let mut cmd = match callgrind_dir() {
        Some(dir) => {
            let mut cmd = Command::new("valgrind");
            cmd.arg("--tool=callgrind")
                .arg("--instr-atstart=no")
                .arg(format!(
                    "--callgrind-out-file={}/callgrind.%p",
                    dir.display()
                ))
                .arg(bin);
            cmd
        }
        None => Command::new(bin),
    };
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("COURIER_") && key != "COURIER_LOG" {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// With `BENCH_CALLGRIND` set, the folder where callgrind writes its counts.
pub fn callgrind_dir() -> Option<PathBuf> {
    std::env::var_os("BENCH_CALLGRIND")?;
    let dir = std::env::temp_dir().join("courier-bench-callgrind");
    std::fs::create_dir_all(&dir).ok()?;
    Some(dir)
}

/// Builds a guest workspace or crate for wasm32-wasip2 (release) into `target`; returns the
/// folder holding its `.wasm` files.
pub fn build_wasm(manifest: &Path, target: &Path) -> PathBuf {
    let status = cargo()
        .args([
            "build",
            "--release",
            "--quiet",
            "--target",
            "wasm32-wasip2",
            "--manifest-path",
        ])
        .arg(manifest)
        .env("CARGO_TARGET_DIR", target)
        .status()
        .expect("run cargo for a guest crate");
    assert!(status.success(), "building {} failed", manifest.display());
    target.join("wasm32-wasip2/release")
}

/// Builds `tests/fixtures/plugins` for wasm32-wasip2 (once) and returns the path of one
/// fixture's component, e.g. `fixture("endless-loop")`.
pub fn fixture(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let target = target_root().join("wasm-fixtures");
        build_wasm(
            &repo_root().join("tests/fixtures/plugins/Cargo.toml"),
            &target,
        )
    });
    let path = dir.join(format!("fixture_{}.wasm", name.replace('-', "_")));
    assert!(path.is_file(), "no fixture {}", path.display());
    path
}

/// A bundled plugin's component file, as the build leaves it next to the binary.
pub fn builtin(name: &str) -> Vec<u8> {
    courier::builtin::BUILTINS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, b)| b.to_vec())
        .unwrap_or_else(|| panic!("no bundled plugin {name}"))
}

/// A fresh, empty directory under the target dir.
pub fn scratch(label: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{label}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// TOML-escaped path.
pub fn toml_path(p: &Path) -> String {
    format!("{:?}", p.display().to_string())
}
/// Each scenario once per backend: `sqlite::name`, and `postgres::name` when
/// `PG_TEST_URL` is set (else it says it skipped). Use with `#[macro_use] mod common;`.
#[allow(unused_macros)]
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::common::server::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(b) = crate::common::server::Backend::postgres(stringify!($name)) {
                        super::$name(b).await
                    }
                }
            )*
        }
    };
}

pub mod cluster;
pub mod groups;
pub mod kinds;
pub mod server;
pub mod webhook;
