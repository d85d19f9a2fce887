//! `courier plugin new NAME --lang rust|python|js`: a complete kind in a new folder that
//! builds anywhere. Everything it writes is embedded in this binary: the templates, the
//! contract (`wit/v1`) and, for Rust, a copy of the SDK (it is not on crates.io).

use std::path::{Path, PathBuf};

use crate::plugins::{Delivery, Manifest, SenderKind};

/// The language of a new kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

impl Lang {
    /// The language's name, for people.
    pub fn title(self) -> &'static str {
        match self {
            Lang::Rust => "Rust",
            Lang::Python => "Python",
            Lang::Js => "JavaScript",
        }
    }
}

/// The lowest content type `plugin new` gives a kind: 1-999 are the bundled kinds' range.
pub const FIRST_OWN_CONTENT_TYPE: u32 = 1000;

/// The componentize-py a Python kind builds with (the version CI installs, `.ci/run`).
pub const COMPONENTIZE_PY: &str = "0.25.1";

/// The contract, as this binary implements it.
pub const WIT: &[(&str, &str)] = &[(
    "wit/v1/plugin.wit",
    include_str!("../../../wit/v1/plugin.wit"),
)];

/// The Rust SDK's sources, copied into a Rust kind (its manifest is written from a template:
/// the checkout's inherits from Courier's workspace).
pub const SDK: &[(&str, &str)] = &[
    (
        "courier-plugin-sdk/src/lib.rs",
        include_str!("../../../plugin-sdk/src/lib.rs"),
    ),
    (
        "courier-plugin-sdk/src/check.rs",
        include_str!("../../../plugin-sdk/src/check.rs"),
    ),
    (
        "courier-plugin-sdk/src/types.rs",
        include_str!("../../../plugin-sdk/src/types.rs"),
    ),
];

/// The lock file Courier's bundled kinds build with: a Rust kind starts from the same
/// versions of serde and wit-bindgen (cargo drops the entries it does not use).
const PLUGINS_LOCK: &str = include_str!("../../../plugins/Cargo.lock");
/// The toolchain Courier builds with; a Rust kind pins the same channel.
const TOOLCHAIN: &str = include_str!("../../../rust-toolchain.toml");
/// The JS example's package.json: its componentize-js pins are reused.
const JS_EXAMPLE_PACKAGE: &str = include_str!("../../../examples/js-location/package.json");

mod tmpl {
    pub const README: &str = include_str!("templates/README.md.tmpl");
    pub const RUST_LIB: &str = include_str!("templates/lib.rs.tmpl");
    pub const RUST_CARGO: &str = include_str!("templates/Cargo.toml.tmpl");
    pub const RUST_SDK_CARGO: &str = include_str!("templates/sdk-Cargo.toml.tmpl");
    pub const RUST_TOOLCHAIN: &str = include_str!("templates/rust-toolchain.toml.tmpl");
    pub const RUST_BUILD: &str = include_str!("templates/build-rust.sh.tmpl");
    pub const PY_APP: &str = include_str!("templates/app.py.tmpl");
    pub const PY_BUILD: &str = include_str!("templates/build-python.sh.tmpl");
    pub const JS_KIND: &str = include_str!("templates/kind.js.tmpl");
    pub const JS_BUILD: &str = include_str!("templates/build-js.sh.tmpl");
}

/// What to make.
#[derive(Debug, Clone)]
pub struct NewKind {
    pub name: String,
    pub lang: Lang,
    pub content_type: u32,
    /// The folder to create (must not exist, or be empty).
    pub dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum NewError {
    /// The name or content type breaks a manifest rule; each problem is one sentence.
    #[error("{}", .0.join("; "))]
    Invalid(Vec<String>),
    #[error("{} already exists and is not an empty folder: give a new one", .0.display())]
    NotEmpty(PathBuf),
    #[error("cannot write {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// One data-driven case: its input and the normalized payload or the error code expected.
struct Case {
    name: &'static str,
    input: String,
    expected: Result<&'static str, &'static str>,
    context: Option<&'static str>,
}

/// The cases every new kind starts with, the same for each language.
fn cases() -> Vec<Case> {
    let case = |name, input: &str, expected| Case {
        name,
        input: input.to_string(),
        expected,
        context: None,
    };
    vec![
        case(
            "title-only",
            r#"{"title":"Hello"}"#,
            Ok(r#"{"title":"Hello"}"#),
        ),
        case(
            "trimmed",
            r#"{"title":"  Hello  ","note":"  see you  "}"#,
            Ok(r#"{"title":"Hello","note":"see you"}"#),
        ),
        case(
            "blank-note-dropped",
            r#"{"title":"Hello","note":"   "}"#,
            Ok(r#"{"title":"Hello"}"#),
        ),
        case("blank-title", r#"{"title":"   "}"#, Err("empty")),
        case(
            "title-too-long",
            &format!(r#"{{"title":"{}"}}"#, "a".repeat(101)),
            Err("too_long"),
        ),
        case("title-not-text", r#"{"title":5}"#, Err("invalid_field")),
        case(
            "unknown-field",
            r#"{"title":"Hello","colour":"red"}"#,
            Err("invalid_field"),
        ),
        Case {
            context: Some(r#"{"conversationType": 3}"#),
            ..case(
                "in-a-channel",
                r#"{"title":"Hello"}"#,
                Err("conversation_type_not_allowed"),
            )
        },
        case(
            "too-large",
            &format!(r#"{{"title":"{}"}}"#, "a".repeat(5000)),
            Err("payload_too_large"),
        ),
    ]
}

/// The manifest every template declares for `k` (so the name and content type are held to
/// the host's own rules before anything is written).
fn manifest(k: &NewKind) -> Manifest {
    Manifest {
        name: k.name.clone(),
        version: "0.1.0".into(),
        content_type: k.content_type,
        delivery: Delivery::Persistent,
        counts_unread: true,
        conversation_types: vec![1, 2],
        sender: SenderKind::User,
        max_payload_bytes: 4096,
        description: description(&k.name),
    }
}

fn description(name: &str) -> String {
    format!("A {name} message: a title and an optional note")
}

/// Checks `k` against the manifest rules and the content-type range.
pub fn validate(k: &NewKind) -> Result<(), NewError> {
    let mut problems = manifest(k).problems();
    if (1..FIRST_OWN_CONTENT_TYPE).contains(&k.content_type) {
        problems.push(format!(
            "content type {} is in the bundled kinds' range (1-{}): choose {FIRST_OWN_CONTENT_TYPE} or above",
            k.content_type,
            FIRST_OWN_CONTENT_TYPE - 1
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(NewError::Invalid(problems))
    }
}

/// Writes the new kind's folder; returns the files written, relative to it.
pub fn create(k: &NewKind) -> Result<Vec<String>, NewError> {
    validate(k)?;
    match std::fs::read_dir(&k.dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(NewError::NotEmpty(k.dir.clone()));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(_) => return Err(NewError::NotEmpty(k.dir.clone())),
    }
    let files = files(k);
    for (rel, text) in &files {
        write(&k.dir.join(rel), text)?;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let script = k.dir.join("build.sh");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).map_err(
            |source| NewError::Io {
                path: script,
                source,
            },
        )?;
    }
    Ok(files.into_iter().map(|(rel, _)| rel).collect())
}

fn write(path: &Path, text: &str) -> Result<(), NewError> {
    let io = |source| NewError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    std::fs::write(path, text).map_err(io)
}

/// Every file of the new folder: (relative path, contents).
fn files(k: &NewKind) -> Vec<(String, String)> {
    let name = k.name.as_str();
    let crate_name = format!("courier_kind_{}", name.replace('-', "_"));
    let content_type = k.content_type.to_string();
    let description = description(name);
    let channel = toolchain_channel();
    let vars: &[(&str, &str)] = &[
        ("name", name),
        ("crate", &crate_name),
        ("content_type", &content_type),
        ("description", &description),
        ("rust_channel", &channel),
        ("courier_version", env!("CARGO_PKG_VERSION")),
        ("componentize_py", COMPONENTIZE_PY),
    ];
    let fill = |t: &str| render(t, vars);
    let mut out: Vec<(String, String)> = Vec::new();
    let (lang, lang_title, table, needs) = match k.lang {
        Lang::Rust => {
            out.push(("Cargo.toml".into(), fill(tmpl::RUST_CARGO)));
            out.push(("Cargo.lock".into(), PLUGINS_LOCK.into()));
            out.push(("rust-toolchain.toml".into(), fill(tmpl::RUST_TOOLCHAIN)));
            out.push(("src/lib.rs".into(), fill(tmpl::RUST_LIB)));
            out.push(("build.sh".into(), fill(tmpl::RUST_BUILD)));
            out.push((
                "courier-plugin-sdk/Cargo.toml".into(),
                fill(tmpl::RUST_SDK_CARGO),
            ));
            out.extend(SDK.iter().map(|(p, t)| (p.to_string(), t.to_string())));
            (
                "rust",
                Lang::Rust.title(),
                "| `src/lib.rs` | the kind: payload type, manifest, checks, preview, examples |\n\
                 | `Cargo.toml`, `Cargo.lock` | the crate, a workspace of its own; the lock starts from the versions Courier's own kinds build with |\n\
                 | `rust-toolchain.toml` | the Rust toolchain and the `wasm32-wasip2` target |\n\
                 | `courier-plugin-sdk/` | a copy of Courier's Rust SDK (it is not on crates.io): the `Plugin` trait, `export_plugin!`, the `check` helpers |\n",
                format!(
                    "Needs rustup; the first build downloads serde and wit-bindgen from crates.io.\n\
                     `rust-toolchain.toml` pins Rust {channel}, and build.sh adds the `wasm32-wasip2`\n\
                     target (`rustup target add`) when the toolchain lacks it."
                ),
            )
        }
        Lang::Python => {
            out.push(("app.py".into(), fill(tmpl::PY_APP)));
            out.push(("build.sh".into(), fill(tmpl::PY_BUILD)));
            (
                "python",
                Lang::Python.title(),
                "| `app.py` | the kind: manifest, checks, preview, examples |\n",
                format!(
                    "Needs componentize-py: `pip install componentize-py=={COMPONENTIZE_PY}`.\n\
                     The component is about 18 MB and takes some seconds to compile at load."
                ),
            )
        }
        Lang::Js => {
            out.push(("kind.js".into(), fill(tmpl::JS_KIND)));
            out.push(("build.sh".into(), fill(tmpl::JS_BUILD)));
            out.push(("package.json".into(), package_json(name)));
            (
                "js",
                Lang::Js.title(),
                "| `kind.js` | the kind: manifest, checks, preview, examples |\n\
                 | `package.json` | componentize-js, pinned |\n",
                "Needs Node.js and npm; build.sh runs `npm install` once (componentize-js is\n\
                 pinned in package.json). The component is about 12 MB."
                    .to_string(),
            )
        }
    };
    out.extend(WIT.iter().map(|(p, t)| (p.to_string(), t.to_string())));
    out.push((
        ".gitignore".into(),
        "build/\ntarget/\nnode_modules/\n__pycache__/\n".into(),
    ));
    let readme = render(
        tmpl::README,
        &[
            vars,
            &[
                ("lang", lang),
                ("lang_title", lang_title),
                ("files", table),
                ("build_needs", &needs),
            ],
        ]
        .concat(),
    );
    out.push(("README.md".into(), readme));
    for c in cases() {
        let dir = format!("cases/{}", c.name);
        out.push((format!("{dir}/input.json"), c.input + "\n"));
        match c.expected {
            Ok(json) => out.push((format!("{dir}/expected.json"), format!("{json}\n"))),
            Err(code) => out.push((format!("{dir}/error.txt"), format!("{code}\n"))),
        }
        if let Some(ctx) = c.context {
            out.push((format!("{dir}/context.json"), format!("{ctx}\n")));
        }
    }
    out
}

/// `{{key}}` replaced by its value, for each pair.
fn render(template: &str, vars: &[(&str, &str)]) -> String {
    vars.iter().fold(template.to_string(), |t, (k, v)| {
        t.replace(&format!("{{{{{k}}}}}"), v)
    })
}

/// The channel of Courier's own rust-toolchain.toml.
fn toolchain_channel() -> String {
    toml::from_str::<toml::Value>(TOOLCHAIN)
        .ok()
        .and_then(|v| {
            v.get("toolchain")?
                .get("channel")?
                .as_str()
                .map(String::from)
        })
        .unwrap_or_else(|| "stable".into())
}

/// A JS kind's package.json, with the example's pinned build tools.
fn package_json(name: &str) -> String {
    let example: serde_json::Value = serde_json::from_str(JS_EXAMPLE_PACKAGE).unwrap_or_default();
    let pkg = serde_json::json!({
        "name": format!("courier-kind-{name}"),
        "private": true,
        "version": "0.1.0",
        "description": description(name),
        "type": "module",
        "scripts": { "build": "bash build.sh" },
        "devDependencies": example["devDependencies"],
    });
    serde_json::to_string_pretty(&pkg).unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(name: &str, content_type: u32) -> NewKind {
        NewKind {
            name: name.into(),
            lang: Lang::Rust,
            content_type,
            dir: PathBuf::new(),
        }
    }

    /// The copies this binary writes are the whole SDK and the whole contract: a file
    /// added to either must be embedded too.
    #[test]
    fn the_embedded_sdk_and_contract_are_complete() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        for (dir, embedded, prefix) in [
            ("plugin-sdk/src", SDK, "courier-plugin-sdk/src/"),
            ("wit/v1", WIT, "wit/v1/"),
        ] {
            let mut on_disk: Vec<String> = std::fs::read_dir(root.join(dir))
                .unwrap()
                .map(|e| format!("{prefix}{}", e.unwrap().file_name().to_string_lossy()))
                .collect();
            on_disk.sort();
            let mut have: Vec<String> = embedded.iter().map(|(p, _)| p.to_string()).collect();
            have.sort();
            assert_eq!(have, on_disk, "{dir}");
        }
    }

    #[test]
    fn names_and_content_types_follow_the_manifest_rules() {
        assert!(validate(&kind("my-kind", 1000)).is_ok());
        let long = "a".repeat(33);
        for (name, ct) in [
            ("Bad", 1000),
            ("-a", 1000),
            (long.as_str(), 1000),
            ("a_b", 1000),
        ] {
            let e = validate(&kind(name, ct)).unwrap_err().to_string();
            assert!(e.contains("must be 1-32 characters"), "{name}: {e}");
        }
        assert!(validate(&kind("a", 0)).is_err());
        let e = validate(&kind("a", 7)).unwrap_err().to_string();
        assert!(e.contains("bundled kinds' range"), "{e}");
    }

    #[test]
    fn templates_leave_no_placeholder_and_pin_the_toolchain() {
        for lang in [Lang::Rust, Lang::Python, Lang::Js] {
            let k = NewKind {
                lang,
                ..kind("note-x", 1234)
            };
            for (path, text) in files(&k) {
                assert!(
                    !text.contains("{{name}}") && !text.contains("{{content_type}}"),
                    "{path}"
                );
            }
        }
        // Pinned like Courier's own toolchain, with the wasm target.
        let ours: toml::Value = toml::from_str(TOOLCHAIN).unwrap();
        let rust = files(&kind("note-x", 1234));
        let (_, pinned) = rust
            .iter()
            .find(|(p, _)| p == "rust-toolchain.toml")
            .unwrap();
        let pinned: toml::Value = toml::from_str(pinned).unwrap();
        assert_eq!(pinned["toolchain"]["channel"], ours["toolchain"]["channel"]);
        assert_eq!(
            pinned["toolchain"]["targets"],
            toml::Value::from(vec!["wasm32-wasip2"])
        );
        let pkg: serde_json::Value = serde_json::from_str(&package_json("x")).unwrap();
        assert!(pkg["devDependencies"]["@bytecodealliance/componentize-js"].is_string());
    }
}
