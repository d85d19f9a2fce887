//! A plugin author's kind folder, as `courier plugin new` writes it and an author builds
//! it: the one place the `plugin new`, `plugin watch` and `plugin check` command lines and
//! the build environment are spelled out.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Where nested builds of new kinds put their outputs: shared by the tests (and their runs),
/// so serde and wit-bindgen are compiled once.
pub fn kind_target() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("kind-target")
}

pub use super::courier;

/// The environment an author's shell would give a build: the outer cargo's variables
/// removed (`without_outer_cargo`), and the shared target dir.
pub fn author_env(cmd: &mut Command) -> &mut Command {
    super::without_outer_cargo(cmd).env("CARGO_TARGET_DIR", kind_target())
}

/// `courier plugin new NAME --lang LANG --dir DIR [extra…]`.
pub fn plugin_new(name: &str, lang: &str, dir: &Path, extra: &[&str]) -> Output {
    courier()
        .args(["plugin", "new", name, "--lang", lang, "--dir"])
        .arg(dir)
        .args(extra)
        .output()
        .expect("run courier plugin new")
}

/// Writes a new kind and asserts it was written.
pub fn new_kind(name: &str, lang: &str, dir: &Path) {
    let out = plugin_new(name, lang, dir, &[]);
    assert!(out.status.success(), "plugin new: {}", text(&out));
}

/// Runs the folder's build.sh as its author would; asserts it passes.
pub fn build(dir: &Path) {
    let out = author_env(&mut Command::new("bash"))
        .arg(dir.join("build.sh"))
        .current_dir(dir)
        .output()
        .expect("run build.sh");
    assert!(out.status.success(), "build.sh failed:\n{}", text(&out));
}

/// `courier plugin check WASM --cases CASES`: its exit code and output.
pub fn check(wasm: &Path, cases: &Path) -> (Option<i32>, String) {
    let out = courier()
        .args(["plugin", "check"])
        .arg(wasm)
        .arg("--cases")
        .arg(cases)
        .output()
        .expect("run courier plugin check");
    (out.status.code(), text(&out))
}

/// stdout, then stderr.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Whether `cmd args…` runs and succeeds.
pub fn tool_runs(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}
