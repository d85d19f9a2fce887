//! The OpenAPI document at `/v1/openapi.json`, from a real server: it covers every route the
//! router registers (read from `api::app`'s source), every endpoint docs/protocol.md heads
//! a section with and nothing else, and its error codes and statuses are the docs' table.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::repo_root;
use common::server::{Backend, Db, Server};
use courier::api::error::status;
use courier::api::openapi::http_codes;
use serde_json::Value;

const METHODS: &[&str] = &["get", "post", "put", "patch", "delete"];

async fn served() -> Value {
    let db = Db::new(&Backend::Sqlite, "openapi").await;
    let server = Server::start(&db, "").await;
    let (code, doc) = server.http("GET", "/v1/openapi.json", None, None).await;
    assert_eq!(code, 200, "{doc}");
    doc
}

/// `(METHOD, path)` of every operation in the document.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().unwrap().keys() {
            if METHODS.contains(&method.as_str()) {
                out.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    out
}

/// `(METHOD, path)` of every `.route(...)` in `api::app`.
fn routes() -> BTreeSet<(String, String)> {
    let src = std::fs::read_to_string(repo_root().join("host/src/api/mod.rs")).unwrap();
    let start = src
        .find("pub fn app(")
        .expect("api::app in host/src/api/mod.rs");
    let mut rest = &src[start..];
    let mut out = BTreeSet::new();
    while let Some(at) = rest.find(".route(") {
        rest = &rest[at + ".route(".len()..];
        // The call's arguments, to its closing parenthesis.
        let mut depth = 1;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                depth += match c {
                    '(' => 1,
                    ')' => -1,
                    _ => 0,
                };
                depth == 0
            })
            .map(|(i, _)| i)
            .expect("a closed .route(");
        let args = &rest[..end];
        let path = args.split('"').nth(1).expect("a route's path literal");
        let handler = &args[args.find(',').expect("a route's handler")..];
        let mut found = false;
        for method in METHODS {
            let calls = handler.match_indices(&format!("{method}(")).any(|(i, _)| {
                i == 0
                    || !handler.as_bytes()[i - 1].is_ascii_alphanumeric()
                        && handler.as_bytes()[i - 1] != b'_'
            });
            if calls {
                out.insert((method.to_uppercase(), path.to_string()));
                found = true;
            }
        }
        assert!(found, "no method found in .route({args})");
        rest = &rest[end..];
    }
    assert!(
        out.len() > 40,
        "read only {} routes from api::app",
        out.len()
    );
    out
}

/// The endpoints docs/protocol.md heads a section with: "### `GET /v1/x?…`",
/// "### `POST /a/{id}/accept`, `/reject`", "### `PUT /a/{id}` and `DELETE …`". Path
/// parameters are compared by position (`{}`), not by name.
fn headings() -> BTreeSet<(String, String)> {
    let doc = std::fs::read_to_string(repo_root().join("docs/protocol.md")).unwrap();
    let mut out = BTreeSet::new();
    for line in doc.lines().filter(|l| l.starts_with("### `")) {
        let spans: Vec<&str> = line.split('`').skip(1).step_by(2).collect();
        let (mut method, mut path) = (String::new(), String::new());
        for span in spans {
            let span = span.split('?').next().unwrap().trim();
            if span.is_empty() {
                continue; // only a query
            }
            match span.split_once(' ') {
                Some((m, p)) if m.chars().all(|c| c.is_ascii_uppercase()) => {
                    method = m.to_string();
                    if p != "…" {
                        path = p.to_string();
                    }
                }
                None if span.starts_with('/') && !path.is_empty() => {
                    // A sibling: the last segment replaced.
                    let base = path.rsplit_once('/').unwrap().0.to_string();
                    path = format!("{base}{span}");
                }
                _ => panic!("cannot read the heading {line:?}"),
            }
            out.insert((method.clone(), by_position(&path)));
        }
    }
    out
}

fn by_position(path: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for c in path.chars() {
        match c {
            '{' => {
                inside = true;
                out.push_str("{}");
            }
            '}' => inside = false,
            _ if inside => {}
            _ => out.push(c),
        }
    }
    out
}

/// The "Error codes" table of docs/protocol.md: code → HTTP status.
fn code_table() -> BTreeMap<String, u16> {
    let doc = std::fs::read_to_string(repo_root().join("docs/protocol.md")).unwrap();
    let table = doc
        .split("\n## Error codes\n")
        .nth(1)
        .expect("an Error codes section");
    let table = table.split("\n## ").next().unwrap();
    let mut out = BTreeMap::new();
    for row in table.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let code = cells[1].trim_matches('`').to_string();
        let http: u16 = cells[2].parse().expect("an HTTP status");
        assert!(out.insert(code.clone(), http).is_none(), "{code} twice");
    }
    assert!(out.len() > 40, "read only {} codes", out.len());
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn the_document_covers_every_route_and_agrees_with_the_docs() {
    let doc = served().await;
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    let ops = operations(&doc);

    // (b) every route of the router is in the document, and nothing else.
    let routes = routes();
    let missing: Vec<_> = routes.difference(&ops).collect();
    assert!(
        missing.is_empty(),
        "routes missing from the document: {missing:?}"
    );
    let extra: Vec<_> = ops.difference(&routes).collect();
    assert!(extra.is_empty(), "documented but not routed: {extra:?}");

    // (c) every endpoint docs/protocol.md heads a section with, and only those.
    let documented: BTreeSet<_> = ops
        .iter()
        .map(|(m, p)| (m.clone(), by_position(p)))
        .collect();
    let headed = headings();
    let unheaded: Vec<_> = documented.difference(&headed).collect();
    assert!(
        unheaded.is_empty(),
        "no heading in docs/protocol.md for {unheaded:?}"
    );
    let unknown: Vec<_> = headed.difference(&documented).collect();
    assert!(
        unknown.is_empty(),
        "headings for endpoints not in the document: {unknown:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn error_codes_and_statuses_are_the_docs_table() {
    let doc = served().await;
    let table = code_table();

    // The envelope's code enum is every code that reaches HTTP, each in the table with the
    // status the server answers it with.
    let schema = &doc["components"]["schemas"];
    let detail = &schema["ErrorBody"]["properties"]["error"];
    let detail = match detail.get("$ref").and_then(Value::as_str) {
        Some(r) => &schema[r.rsplit('/').next().unwrap()],
        None => detail,
    };
    assert!(
        detail["required"]
            .as_array()
            .unwrap()
            .contains(&"code".into())
    );
    let code_ref = detail["properties"]["code"]["$ref"]
        .as_str()
        .expect("code by $ref");
    let listed: BTreeSet<String> = schema[code_ref.rsplit('/').next().unwrap()]["enum"]
        .as_array()
        .expect("an enum of codes")
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    let expected: BTreeSet<String> = http_codes().map(|c| c.as_str().to_string()).collect();
    assert_eq!(listed, expected, "the ErrorCode enum is every HTTP code");
    for code in http_codes() {
        assert_eq!(
            table.get(code.as_str()).copied(),
            Some(status(code).as_u16()),
            "{code}: the docs' table and api::error::status disagree"
        );
    }
    let untold: Vec<_> = table.keys().filter(|c| !listed.contains(*c)).collect();
    assert!(
        untold.is_empty(),
        "in the docs' table, not in the enum: {untold:?}"
    );

    // Each operation's error answers: the envelope, at the status of every code it lists.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for (status, answer) in op["responses"].as_object().unwrap() {
                let Some(codes) = answer.get("x-codes") else {
                    assert!(
                        status.starts_with('1') || status.starts_with('2'),
                        "{method} {path} {status}: an error answer without x-codes"
                    );
                    continue;
                };
                let body = &answer["content"]["application/json"]["schema"]["allOf"][0];
                assert_eq!(body["$ref"], "#/components/schemas/ErrorBody");
                for code in codes.as_array().unwrap() {
                    let code = code.as_str().unwrap();
                    assert_eq!(
                        table.get(code).map(u16::to_string).as_deref(),
                        Some(status.as_str()),
                        "{method} {path}: {code} under {status}"
                    );
                }
            }
            let secured = !op["security"].as_array().is_none_or(Vec::is_empty);
            if secured && path != "/v1/ws" {
                assert!(
                    op["responses"].get("401").is_some(),
                    "{method} {path}: no 401"
                );
            }
        }
    }
}
