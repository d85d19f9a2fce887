//! `courier plugin new`: each language's new kind builds from its own folder — nothing in
//! it points back at this checkout — and passes `courier plugin check` with its own cases
//! out of the box; bad names, content types and existing folders are refused.
//! The Python and JavaScript tests skip, saying why, where their toolchain is missing.

mod common;

use std::path::Path;

use common::kinds::{build, check, kind_target, new_kind, plugin_new, text, tool_runs};
use common::scratch;

/// Makes a kind in a fresh folder, builds it, checks it; the check's output.
fn new_build_check(name: &str, lang: &str) -> String {
    let dir = scratch(&format!("new-{lang}")).join(name);
    new_kind(name, lang, &dir);
    assert_self_contained(&dir);
    build(&dir);
    let wasm = dir.join("build").join(format!("{name}.wasm"));
    let (code, report) = check(&wasm, &dir.join("cases"));
    println!("{report}");
    assert_eq!(code, Some(0), "{report}");
    for line in [
        format!("plugin {name} 0.1.0 — content type 1000, persistent"),
        "PASS  examples".into(),
        "PASS  cases".into(),
        "result: PASS".into(),
    ] {
        assert!(report.contains(&line), "no {line:?} in:\n{report}");
    }
    report
}

/// No file of the new folder names this checkout: it builds wherever it is moved.
fn assert_self_contained(dir: &Path) {
    let checkout = common::repo_root().display().to_string();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let t = std::fs::read_to_string(&p).unwrap();
                assert!(!t.contains(&checkout), "{} names {checkout}", p.display());
            }
        }
    }
}

#[test]
fn a_new_rust_kind_builds_on_its_own_and_passes_the_suite() {
    new_build_check("rkind", "rust");
    // Its own toolchain pin and workspace; the SDK is a copy inside the folder.
    let dir = scratch("new-rust-files").join("k");
    new_kind("k", "rust", &dir);
    let toolchain = std::fs::read_to_string(dir.join("rust-toolchain.toml")).unwrap();
    assert!(
        toolchain.contains(r#"targets = ["wasm32-wasip2"]"#),
        "{toolchain}"
    );
    let cargo = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    assert!(cargo.contains("\n[workspace]\n"), "{cargo}");
    assert!(cargo.contains(r#"path = "courier-plugin-sdk""#), "{cargo}");
    assert!(dir.join("courier-plugin-sdk/src/lib.rs").is_file());
    assert!(dir.join("wit/v1/plugin.wit").is_file());
    println!("nested builds in {}", kind_target().display());
}

#[test]
fn a_new_python_kind_builds_and_passes_the_suite() {
    if !tool_runs("componentize-py", &["--version"]) {
        println!(
            "SKIPPED: componentize-py is not installed (pip install componentize-py==0.25.1); CI installs it"
        );
        return;
    }
    new_build_check("pykind", "python");
}

#[test]
fn a_new_javascript_kind_builds_and_passes_the_suite() {
    if !tool_runs("npm", &["--version"]) || !tool_runs("node", &["--version"]) {
        println!("SKIPPED: node and npm are not installed; CI installs them");
        return;
    }
    new_build_check("jskind", "js");
}

#[test]
fn bad_names_content_types_and_used_folders_are_refused() {
    let root = scratch("new-refused");
    let used = root.join("used");
    std::fs::create_dir_all(&used).unwrap();
    std::fs::write(used.join("notes.txt"), "mine").unwrap();
    let long = "a".repeat(33);
    // (name, language, extra arguments, folder, what the error says)
    let rows: &[(&str, &str, &[&str], &Path, &str)] = &[
        (
            "Sticker",
            "rust",
            &[],
            &root.join("a"),
            "must be 1-32 characters of a-z, 0-9 and -",
        ),
        (
            "a_b",
            "python",
            &[],
            &root.join("b"),
            "must be 1-32 characters",
        ),
        (&long, "js", &[], &root.join("c"), "must be 1-32 characters"),
        (
            "a\u{1b}[2J",
            "rust",
            &[],
            &root.join("d"),
            r#""a\u{1b}[2J""#,
        ),
        (
            "ok",
            "rust",
            &["--content-type", "5"],
            &root.join("e"),
            "the bundled kinds' range (1-999)",
        ),
        (
            "ok",
            "rust",
            &["--content-type", "0"],
            &root.join("f"),
            "content type 0 is reserved",
        ),
        ("ok", "cobol", &[], &root.join("g"), "invalid value 'cobol'"),
        (
            "ok",
            "rust",
            &[],
            &used,
            "already exists and is not an empty folder",
        ),
    ];
    for (name, lang, extra, dir, says) in rows {
        let out = plugin_new(name, lang, dir, extra);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(2), "{name} {extra:?}: {said}");
        assert!(said.contains(says), "{name} {extra:?}: {said}");
        assert!(
            !said.contains('\u{1b}'),
            "an escape code reached the terminal: {said:?}"
        );
        if *dir != used.as_path() {
            assert!(!dir.exists(), "{} was created", dir.display());
        }
    }
    // The used folder is left as it was.
    let left: Vec<_> = std::fs::read_dir(&used).unwrap().collect();
    assert_eq!(left.len(), 1);
    assert_eq!(
        std::fs::read_to_string(used.join("notes.txt")).unwrap(),
        "mine"
    );
    // An empty folder is fine.
    let empty = root.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    new_kind("fine", "python", &empty);
    assert!(empty.join("app.py").is_file() && empty.join("cases").is_dir());
}
