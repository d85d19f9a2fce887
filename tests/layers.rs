//! The layering of `host/src` as ARCHITECTURE.md states it: a module imports only from
//! layers below its own. Read from the code itself (every `crate::<module>` it names), so
//! an import that runs back up fails here before it grows into a circle.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Module name → layer, from the numbered list between the markers in ARCHITECTURE.md.
fn layers() -> BTreeMap<String, usize> {
    let text = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap();
    let start = text
        .find("<!-- layers")
        .expect("a layers list in ARCHITECTURE.md");
    let end = text[start..].find("<!-- end of layers -->").unwrap() + start;
    let mut out = BTreeMap::new();
    for line in text[start..end].lines().skip(1) {
        let Some((n, rest)) = line.split_once(". ") else {
            continue;
        };
        let layer: usize = n.trim().parse().expect("a numbered line");
        for name in rest.split(',') {
            let name = name.trim().trim_matches('`');
            assert!(
                out.insert(name.to_string(), layer).is_none(),
                "{name} twice"
            );
        }
    }
    out
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The crate modules a file names (`crate::store::…` → `store`).
fn named(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // `crate::{a, b}` names several.
        if name.is_empty() && rest.starts_with('{') {
            let group = &rest[1..rest.find('}').unwrap_or(rest.len())];
            out.extend(
                group
                    .split(',')
                    .map(|p| p.trim().split("::").next().unwrap_or("").to_string()),
            );
        } else {
            out.push(name);
        }
    }
    out
}

#[test]
fn modules_import_only_from_layers_below() {
    let layers = layers();
    let src = repo().join("host/src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut wrong = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        if module == "lib" || module == "main" {
            continue;
        }
        let Some(&own) = layers.get(&module) else {
            wrong.push(format!(
                "{}: module {module} is in no layer of ARCHITECTURE.md",
                rel.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        for other in named(&text) {
            if other.is_empty() || other == module {
                continue;
            }
            match layers.get(&other) {
                Some(&theirs) if theirs < own => {}
                Some(&theirs) => wrong.push(format!(
                    "{}: {module} (layer {own}) imports {other} (layer {theirs})",
                    rel.display()
                )),
                None => wrong.push(format!("{}: {other} is in no layer", rel.display())),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layering:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_module_of_the_crate_has_a_layer() {
    let layers = layers();
    let lib = std::fs::read_to_string(repo().join("host/src/lib.rs")).unwrap();
    for line in lib.lines() {
        if let Some(name) = line.trim().strip_prefix("pub mod ") {
            let name = name.trim_end_matches(';');
            assert!(
                layers.contains_key(name),
                "{name} has no layer in ARCHITECTURE.md"
            );
        }
    }
}
