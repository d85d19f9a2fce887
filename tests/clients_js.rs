//! The TypeScript client SDK (`clients/js`) against the server of this build: its `npm test`
//! starts `courier serve` per test file (`COURIER_BIN`) and checks what a user of the SDK
//! sees — messages once and in order across lost connections, lost pushes and lost acks,
//! user-stream resets, close codes. Skips, saying why, where `node`/`npm` or the package's
//! `node_modules` are missing; CI installs them (`npm ci` in `.ci/run`).

mod common;

use std::process::Command;

fn tool_runs(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn client_sdk_passes_its_tests_against_the_server() {
    let dir = common::repo_root().join("clients/js");
    if !tool_runs("node", &["--version"]) || !tool_runs("npm", &["--version"]) {
        eprintln!("SKIPPED: node or npm is not on PATH; CI installs them");
        return;
    }
    if !dir.join("node_modules").is_dir() {
        eprintln!(
            "SKIPPED: clients/js/node_modules is missing (npm ci in clients/js); CI installs it"
        );
        return;
    }
    let out = Command::new("npm")
        .arg("test")
        .current_dir(&dir)
        .env("COURIER_BIN", env!("CARGO_BIN_EXE_courier"))
        .output()
        .expect("run npm test in clients/js");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "npm test in clients/js failed:\n{stdout}\n{stderr}"
    );
}
