//! Builds the bundled plugins (`plugins/*`) for wasm32-wasip2 with a nested cargo, copies
//! them next to the server binary (`target/<profile>/plugins/`) and embeds them.
//!
//! The nested cargo gets its own target dir (sharing the outer one deadlocks on its lock)
//! and an environment without the outer build's CARGO_*/RUSTFLAGS variables.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-wasip2";

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    // OUT_DIR is <target>/[<triple>/]<profile>/build/courier-<hash>/out.
    let profile_dir = out_dir.ancestors().nth(3).unwrap().to_path_buf();
    let target_root = profile_dir.parent().unwrap().to_path_buf();
    let nested_target = target_root.join("wasm-plugins");

    // The migrations too: `sqlx::migrate!` embeds them, and cargo does not see them change.
    for p in [
        "plugins",
        "plugin-sdk/src",
        "plugin-sdk/Cargo.toml",
        "wit",
        "migrations",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }

    ensure_target();
    let status = clean_cargo()
        .args(["build", "--release", "--target", TARGET, "--manifest-path"])
        .arg(root.join("plugins/Cargo.toml"))
        .env("CARGO_TARGET_DIR", &nested_target)
        .status()
        .expect("cannot run cargo for the plugins");
    assert!(
        status.success(),
        "building the bundled plugins failed (see the cargo output above)"
    );

    let built = nested_target.join(TARGET).join("release");
    let dest = profile_dir.join("plugins");
    fs::create_dir_all(&dest).unwrap();
    let mut names: Vec<String> = fs::read_dir(root.join("plugins"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("Cargo.toml").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();

    let mut code = String::from(
        "/// The bundled plugins: (name, component bytes).\npub static BUILTINS: &[(&str, &[u8])] = &[\n",
    );
    for name in &names {
        let from = built.join(format!("courier_kind_{}.wasm", name.replace('-', "_")));
        let to = dest.join(format!("{name}.wasm"));
        fs::copy(&from, &to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
        writeln!(
            code,
            "    ({name:?}, include_bytes!({:?})),",
            to.display().to_string()
        )
        .unwrap();
    }
    code.push_str("];\n");
    fs::write(out_dir.join("builtin.rs"), code).unwrap();
}

/// `rustup target add wasm32-wasip2` when the standard library for it is missing
/// (rustup's auto-install is not relied upon).
fn ensure_target() {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc)
        .args(["--print", "target-libdir", "--target", TARGET])
        .output()
        .expect("cannot run rustc");
    let libdir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && Path::new(&libdir).is_dir() {
        return;
    }
    println!("cargo:warning=installing the {TARGET} target with rustup (once)");
    let mut cmd = Command::new("rustup");
    cmd.args(["target", "add", TARGET]);
    if let Ok(tc) = env::var("RUSTUP_TOOLCHAIN") {
        cmd.args(["--toolchain", &tc]);
    }
    let status = cmd
        .status()
        .expect("cannot run rustup: install the wasm32-wasip2 target by hand");
    assert!(status.success(), "`rustup target add {TARGET}` failed");
}

/// Cargo settings the nested build keeps: where cargo lives, how it reaches registries,
/// how it prints. Every other CARGO_* variable describes the outer build and is removed.
const KEEP: &[&str] = &[
    "CARGO_HOME",
    "CARGO_NET_",
    "CARGO_HTTP_",
    "CARGO_REGISTRIES_",
    "CARGO_REGISTRY_",
    "CARGO_SOURCE_",
    "CARGO_TERM_",
];

/// The cargo that runs this build, with the outer build's variables removed.
fn clean_cargo() -> Command {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy();
        let outer = (key.starts_with("CARGO_") && !KEEP.iter().any(|k| key.starts_with(k)))
            || key.starts_with("RUSTC")
            || key.starts_with("RUSTDOC")
            || key == "RUSTFLAGS"
            || key == "DEBUG"
            || key == "OPT_LEVEL"
            || key == "PROFILE"
            || key == "TARGET"
            || key == "HOST"
            || key == "OUT_DIR"
            || key == "NUM_JOBS";
        if outer {
            cmd.env_remove(key.as_ref());
        }
    }
    cmd
}
