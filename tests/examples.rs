//! The example plugins in Python (componentize-py) and JavaScript (componentize-js) are
//! built from source and must pass the same contract suite as the bundled Rust kinds.
//! Each test skips, saying why, where its toolchain is missing; CI installs both.

mod common;

use std::path::Path;
use std::process::Command;

use courier::plugins::check::{CheckOptions, Status, check_file};

fn tool_runs(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn build_and_check(example: &str, wasm: &str) {
    let dir = common::repo_root().join("examples").join(example);
    let out = Command::new("bash")
        .arg(dir.join("build.sh"))
        .output()
        .expect("run build.sh");
    assert!(
        out.status.success(),
        "{example}/build.sh failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let opts = CheckOptions {
        cases: Some(dir.join("cases")),
        ..CheckOptions::default()
    };
    let report = check_file(&dir.join("build").join(wasm), &opts);
    println!("{}", report.render());
    assert!(report.passed(), "{}", report.render());
    assert_eq!(report.check("cases").map(|c| c.status), Some(Status::Pass));
    // An example's name never takes one a user's own kind would have (`poll`, `location`).
    let name = &report.manifest.as_ref().expect("a manifest").name;
    assert!(name.starts_with("example-"), "{example} is named {name:?}");
}

#[test]
fn python_example_passes_the_contract_suite() {
    if !tool_runs("componentize-py", &["--version"]) {
        println!(
            "SKIPPED: componentize-py is not installed (pip install componentize-py); CI installs it"
        );
        return;
    }
    build_and_check("python-poll", "poll.wasm");
}

#[test]
fn javascript_example_passes_the_contract_suite() {
    let dir = common::repo_root().join("examples/js-location");
    if !tool_runs("node", &["--version"]) {
        println!("SKIPPED: node is not installed; CI installs componentize-js with npm ci");
        return;
    }
    if !Path::new(&dir.join("node_modules/.bin/componentize-js")).exists() {
        println!(
            "SKIPPED: componentize-js is not installed (npm ci in examples/js-location); CI installs it"
        );
        return;
    }
    build_and_check("js-location", "location.wasm");
}
