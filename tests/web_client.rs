//! The web client that `courier serve` serves at `/`: its files are served with their
//! content types, cache headers and a Content-Security-Policy, and every file the pages
//! load is embedded (always runs); the SDK copy under `web/vendor` is what `tsc` makes of
//! `clients/js/src`; and the browser tests of `web/test` (Debian's Chromium driven by
//! playwright-core against this build's server) pass. The last two skip, saying why, where
//! node, chromium or the npm packages are missing; CI installs them (`.ci/run`).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::kinds::{build, kind_target, new_kind};
use common::repo_root;
use common::server::{Backend, Db, Server, request};
use courier::api::web::{CSP, FILES, content_type};
use serde_json::json;

fn tool_runs(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Every file under `dir`, as paths relative to it, but the ones `skip` names.
fn files_under(dir: &Path, skip: &[&str]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            if skip
                .iter()
                .any(|s| rel == *s || rel.starts_with(&format!("{s}/")))
            {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(rel);
            }
        }
    }
    out
}

/// The `/web/…` files a page or script names (`src=`, `href=`, `import … from`).
fn references(text: &str, base: &str) -> Vec<String> {
    let mut out = Vec::new();
    for quote in ['"', '\''] {
        for piece in text.split(quote).skip(1).step_by(2) {
            let target = if let Some(p) = piece.strip_prefix("/web/") {
                p.to_string()
            } else if let Some(p) = piece.strip_prefix("./") {
                format!("{base}{p}")
            } else {
                continue;
            };
            if target.ends_with(".js") || target.ends_with(".css") || target.ends_with(".svg") {
                out.push(target);
            }
        }
    }
    out
}

#[test]
fn every_file_of_the_pages_is_embedded_and_nothing_is_inline() {
    let web = repo_root().join("web");
    let on_disk = files_under(&web, &["test", "vendor/tsconfig.json"]);
    let embedded: BTreeSet<String> = FILES.iter().map(|(p, _)| p.to_string()).collect();
    assert_eq!(
        on_disk, embedded,
        "web/ and api::web::FILES differ: add new files to FILES"
    );
    for (path, body) in FILES {
        let text = std::str::from_utf8(body).unwrap();
        let base = path
            .rsplit_once('/')
            .map_or(String::new(), |(d, _)| format!("{d}/"));
        for r in references(text, &base) {
            assert!(
                embedded.contains(&r),
                "{path} loads {r}, which is not served"
            );
        }
        if path.ends_with(".html") {
            // The CSP allows no inline script or style.
            for tag in text.split("<script").skip(1) {
                assert!(
                    tag.split('>').next().unwrap().contains("src="),
                    "{path}: an inline script"
                );
            }
            assert!(!text.contains(" style="), "{path}: an inline style");
            assert!(!text.contains(" onclick="), "{path}: an inline handler");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_client_and_its_files_are_served_with_their_types_and_headers() {
    let db = Db::new(&Backend::Sqlite, "web-client").await;
    let server = Server::start(&db, "").await;
    let addr = server.addr.clone();
    let mut pages = vec![
        ("/".to_string(), "index.html"),
        ("/operator".into(), "operator.html"),
    ];
    for (path, _) in FILES.iter().filter(|(p, _)| !p.ends_with(".html")) {
        pages.push((format!("/web/{path}"), path));
    }
    for (url, file) in &pages {
        let a = request(&addr, "GET", url, &[], "").await;
        assert_eq!(a.status, 200, "GET {url}: {}", a.body);
        let want = content_type(file);
        assert_eq!(a.header("content-type"), Some(want), "GET {url}");
        assert_eq!(a.header("content-security-policy"), Some(CSP), "GET {url}");
        assert_eq!(a.header("cache-control"), Some("no-cache"), "GET {url}");
        assert_eq!(
            a.header("x-content-type-options"),
            Some("nosniff"),
            "GET {url}"
        );
        assert_eq!(a.header("x-frame-options"), Some("DENY"), "GET {url}");
        assert_eq!(
            a.header("referrer-policy"),
            Some("no-referrer"),
            "GET {url}"
        );
        let on_disk = std::fs::read_to_string(repo_root().join("web").join(file)).unwrap();
        assert_eq!(a.body, on_disk, "GET {url} is not web/{file}");
        // A revalidation with the ETag is answered 304, without the body.
        let etag = a.header("etag").expect("an etag").to_string();
        let again = request(&addr, "GET", url, &[("If-None-Match", &etag)], "").await;
        assert_eq!(again.status, 304, "GET {url} with its ETag");
        assert_eq!(again.body, "");
        // A weak tag, and a list that holds it, match too; another tag does not.
        for tags in [format!("W/{etag}"), format!("\"0000\", {etag}")] {
            let weak = request(&addr, "GET", url, &[("If-None-Match", &tags)], "").await;
            assert_eq!(weak.status, 304, "GET {url} with If-None-Match: {tags}");
        }
        let other = request(&addr, "GET", url, &[("If-None-Match", "\"0000\"")], "").await;
        assert_eq!(other.status, 200, "GET {url} with another tag");
    }
    for (url, ty) in [
        ("/", "text/html; charset=utf-8"),
        ("/web/app/main.js", "text/javascript; charset=utf-8"),
        ("/web/app/style.css", "text/css; charset=utf-8"),
        ("/web/app/icon.svg", "image/svg+xml"),
        (
            "/web/vendor/courier-client/index.js",
            "text/javascript; charset=utf-8",
        ),
    ] {
        let a = request(&addr, "GET", url, &[], "").await;
        assert_eq!(a.header("content-type"), Some(ty), "GET {url}");
    }
    // Pages only at their own paths; unknown files in the error envelope; the API unchanged.
    for url in [
        "/web/index.html",
        "/web/app/nope.js",
        "/web/../Cargo.toml",
        "/index.html",
    ] {
        let a = request(&addr, "GET", url, &[], "").await;
        assert_eq!(a.status, 404, "GET {url}: {}", a.body);
        assert!(a.body.contains("\"not_found\""), "GET {url}: {}", a.body);
    }
    let (code, health) = server.http("GET", "/healthz", None, None).await;
    assert_eq!((code, health["status"].as_str()), (200, Some("ok")));
    let (code, _) = server.http("GET", "/admin/plugins", None, None).await;
    assert_eq!(code, 401);
}

/// What the client shows a kind it has no view of by: `previews=true` on a pull.
#[tokio::test(flavor = "multi_thread")]
async fn pulls_carry_each_messages_preview_when_asked() {
    let db = Db::new(&Backend::Sqlite, "web-previews").await;
    let server = Server::start(&db, "").await;
    let alice = server.user("alice").await;
    server.user("bob").await;
    let mut seqs = Vec::new();
    for payload in [json!({"text": "  hello bob "}), json!({"text": "oops"})] {
        let send = json!({"conversationType": 1, "peerId": "bob", "contentType": 1,
            "clientMsgId": format!("c{}", seqs.len()), "payload": payload});
        let (code, ack) = server
            .http("POST", "/v1/messages", Some(&alice.token), Some(send))
            .await;
        assert_eq!(code, 200, "{ack}");
        seqs.push(ack["seq"].as_i64().unwrap());
    }
    let id = {
        let (_, one) = server
            .http("GET", "/v1/conversations", Some(&alice.token), None)
            .await;
        one["conversations"][0]["conversationId"].as_i64().unwrap()
    };
    let recall = json!({"conversationType": 1, "conversationId": id, "contentType": 4,
        "clientMsgId": "r", "payload": {"seq": seqs[1]}});
    let (code, ack) = server
        .http("POST", "/v1/messages", Some(&alice.token), Some(recall))
        .await;
    assert_eq!(code, 200, "{ack}");

    let pull = |q: &'static str| {
        let token = alice.token.clone();
        let server = &server;
        async move {
            let (code, page) = server
                .http(
                    "GET",
                    &format!("/v1/conversations/{id}/messages{q}"),
                    Some(&token),
                    None,
                )
                .await;
            assert_eq!(code, 200, "{page}");
            page["messages"].as_array().unwrap().clone()
        }
    };
    let with: Vec<_> = pull("?previews=true")
        .await
        .iter()
        .map(|m| m["preview"].as_str().unwrap_or("<none>").to_string())
        .collect();
    assert_eq!(with, ["hello bob", "[recalled]", "a message was recalled"]);
    let back: Vec<_> = pull("?beforeSeq=3&limit=1&previews=true")
        .await
        .iter()
        .map(|m| m["preview"].clone())
        .collect();
    assert_eq!(back, [json!("[recalled]")]);
    for m in pull("").await.iter().chain(&pull("?previews=false").await) {
        assert!(m.get("preview").is_none(), "a preview without asking: {m}");
    }
    server
        .expect_error(
            "GET",
            &format!("/v1/conversations/{id}/messages?previews=maybe"),
            Some(&alice.token),
            None,
            400,
            "bad_request",
        )
        .await;
}

#[test]
fn the_vendored_sdk_is_what_tsc_makes_of_its_sources() {
    let root = repo_root();
    let tsc = root.join("clients/js/node_modules/typescript/bin/tsc");
    if !tool_runs("node", &["--version"]) {
        eprintln!("SKIPPED: node is not on PATH; CI installs it");
        return;
    }
    if !tsc.is_file() {
        eprintln!(
            "SKIPPED: clients/js/node_modules is missing (npm ci in clients/js); CI installs it"
        );
        return;
    }
    let out_dir = common::scratch("web-vendor");
    let out = Command::new("node")
        .arg(&tsc)
        .arg("-p")
        .arg(root.join("web/vendor/tsconfig.json"))
        .arg("--outDir")
        .arg(&out_dir)
        .output()
        .expect("run tsc");
    assert!(
        out.status.success(),
        "tsc failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let committed = root.join("web/vendor/courier-client");
    let built = files_under(&out_dir, &[]);
    assert_eq!(
        files_under(&committed, &[]),
        built,
        "web/vendor/courier-client has other files than tsc makes: rebuild it (see docs/web.md)"
    );
    for file in &built {
        let want = std::fs::read_to_string(out_dir.join(file)).unwrap();
        let have = std::fs::read_to_string(committed.join(file)).unwrap();
        assert!(
            want == have,
            "web/vendor/courier-client/{file} is not what tsc makes of clients/js/src: \
             rebuild it with `node clients/js/node_modules/typescript/bin/tsc -p web/vendor` (docs/web.md)"
        );
    }
}

/// The system Chromium: `CHROMIUM_PATH`, else Debian's; `Err` names the path looked at.
fn chromium() -> Result<PathBuf, PathBuf> {
    let path = std::env::var_os("CHROMIUM_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if path.is_file() { Ok(path) } else { Err(path) }
}

#[test]
fn the_web_client_passes_its_browser_tests() {
    let dir = repo_root().join("web/test");
    if !tool_runs("node", &["--version"]) || !tool_runs("npm", &["--version"]) {
        eprintln!("SKIPPED: node or npm is not on PATH; CI installs them");
        return;
    }
    let chromium = match chromium() {
        Ok(path) => path,
        Err(path) => {
            eprintln!(
                "SKIPPED: no Chromium at {} (apt-get install chromium, or set CHROMIUM_PATH); CI installs it",
                path.display()
            );
            return;
        }
    };
    if !dir.join("node_modules/playwright-core").is_dir() {
        eprintln!("SKIPPED: web/test/node_modules is missing (npm ci in web/test); CI installs it");
        return;
    }
    // The third-party kind the client has never heard of: the template of `courier plugin
    // new`, built as its author would.
    let kind_dir = common::scratch("web-kind").join("note");
    new_kind("note", "rust", &kind_dir);
    build(&kind_dir);
    let wasm = kind_dir.join("build/note.wasm");
    println!("nested builds in {}", kind_target().display());
    // A plugin that traps, for the operator page's circuit breaker.
    let trap = common::fixture("trap");

    let artifacts = std::env::var_os("COURIER_ARTIFACTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/web-screenshots"));
    let out = common::without_outer_cargo(&mut Command::new("npm"))
        .arg("test")
        .current_dir(&dir)
        .env("COURIER_BIN", env!("CARGO_BIN_EXE_courier"))
        .env("CHROMIUM_PATH", &chromium)
        .env("COURIER_TEST_KIND_WASM", &wasm)
        .env("COURIER_TEST_TRAP_WASM", &trap)
        .env("COURIER_ARTIFACTS_DIR", &artifacts)
        .output()
        .expect("run npm test in web/test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    println!("screenshots in {}", artifacts.display());
    assert!(
        out.status.success(),
        "npm test in web/test failed:\n{stdout}\n{stderr}"
    );
}
