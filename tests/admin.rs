//! HTTP surface of the plugin platform: health, the plugin list, the admin endpoints
//! (through the router, no socket), and the real binary: start-up refusal, SIGHUP reload
//! on a live keep-alive connection, `plugin check` exit codes.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{fixture, scratch, toml_path};
use courier::api::{AppState, app};
use courier::config::Config;
use courier::plugins::PluginRegistry;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const TOKEN: &str = "admin-token-for-tests-0123456789";

async fn state_from_file(toml: &str) -> AppState {
    let dir = scratch("admin");
    let path = dir.join("courier.toml");
    let toml = format!("{toml}\n{}", storage_section(&dir));
    std::fs::write(&path, toml).unwrap();
    let config = Config::load(Some(&path)).unwrap();
    let registry = Arc::new(PluginRegistry::load(&config).unwrap());
    let core = courier::server::start_core(&config, registry)
        .await
        .unwrap();
    AppState::new(core, config, Some(path))
}

/// A SQLite database in the test's own folder, and a fixed token key.
/// The test's own database, key and compiled-plugin cache (the default cache would be left
/// in the source tree).
fn storage_section(dir: &std::path::Path) -> String {
    format!(
        "[storage]\nurl = \"sqlite://{}\"\n[auth]\njwt_secret = \"{JWT}\"\n[runtime]\ncache_dir = {}\n",
        dir.join("courier.db").display(),
        toml_path(&dir.join("plugin-cache"))
    )
}

const JWT: &str = "a-key-for-the-admin-tests-0123456789";

/// A user's token, signed with the tests' key.
fn user_token() -> String {
    courier::auth::Tokens::new(JWT.as_bytes(), 600)
        .issue("tester")
        .0
}

async fn call(
    state: &AppState,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let body = match body {
        Some(v) => {
            req = req.header("content-type", "application/json");
            Body::from(v.to_string())
        }
        None => Body::empty(),
    };
    let resp = app(state.clone())
        .oneshot(req.body(body).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// Asserts that a request fails with this status and error code; returns the body.
async fn expect_error(
    state: &AppState,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: Option<Value>,
    status: StatusCode,
    code: &str,
) -> Value {
    let (got, body) = call(state, method, uri, token, body).await;
    assert_eq!(
        (got, body["error"]["code"].as_str()),
        (status, Some(code)),
        "{method} {uri}: {body}"
    );
    body
}

fn names(list: &Value) -> Vec<String> {
    list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn health_and_the_plugin_list() {
    let s = state_from_file("").await;
    let (status, body) = call(&s, "GET", "/healthz", None, None).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"status": "ok"})));
    expect_error(
        &s,
        "GET",
        "/v1/plugins",
        None,
        None,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    let (status, body) = call(&s, "GET", "/v1/plugins", Some(&user_token()), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(names(&body).len(), 10);
    let text = body["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "text")
        .unwrap();
    assert_eq!(text["contentType"], 1);
    assert_eq!(text["delivery"], "persistent");
    assert_eq!(text["countsUnread"], true);
    assert_eq!(text["conversationTypes"], json!([1, 2, 3]));
    assert_eq!(text["sender"], "user");
    assert_eq!(text["enabled"], true);
    assert_eq!(text["source"], "built-in text.wasm");
    assert_eq!(text["contract"], "1.0.0");
    expect_error(
        &s,
        "GET",
        "/v2/nothing",
        None,
        None,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    expect_error(
        &s,
        "POST",
        "/healthz",
        None,
        None,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    )
    .await;
    let (_, body) = call(&s, "GET", "/v1/plugins", Some(&user_token()), None).await;
    let typing = body["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "typing")
        .unwrap();
    assert_eq!(
        (
            typing["delivery"].as_str(),
            typing["countsUnread"].as_bool()
        ),
        (Some("latest"), Some(false))
    );
}

#[tokio::test]
async fn admin_needs_a_configured_token_and_the_right_one() {
    let off = state_from_file("").await;
    expect_error(
        &off,
        "POST",
        "/admin/plugins/text/disable",
        Some(TOKEN),
        None,
        StatusCode::FORBIDDEN,
        "admin_disabled",
    )
    .await;
    let on = state_from_file(&format!("[server]\nadmin_token = \"{TOKEN}\"\n")).await;
    expect_error(
        &on,
        "POST",
        "/admin/plugins/text/disable",
        Some("wrong-token-wrong-token"),
        None,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    expect_error(
        &on,
        "POST",
        "/admin/plugins/text/disable",
        None,
        None,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    expect_error(
        &on,
        "POST",
        "/admin/plugins/%FF/disable",
        Some(TOKEN),
        None,
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    expect_error(
        &on,
        "POST",
        "/admin/plugins/nope/disable",
        Some(TOKEN),
        None,
        StatusCode::NOT_FOUND,
        "plugin_not_found",
    )
    .await;
}

#[tokio::test]
async fn disable_then_enable_through_the_admin_endpoint() {
    let s = state_from_file(&format!("[server]\nadmin_token = \"{TOKEN}\"\n")).await;
    let send = json!({"contentType": 1, "conversationType": 1, "payload": {"text": "  hi "}});
    let (status, body) = call(
        &s,
        "POST",
        "/admin/validate",
        Some(TOKEN),
        Some(send.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"payload": {"text": "hi"}, "preview": "hi"}));

    let (status, body) = call(&s, "POST", "/admin/plugins/text/disable", Some(TOKEN), None).await;
    assert_eq!(
        (status, &body["plugin"]["enabled"]),
        (StatusCode::OK, &json!(false))
    );
    let (status, body) = call(
        &s,
        "POST",
        "/admin/validate",
        Some(TOKEN),
        Some(send.clone()),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("content_type_disabled")
        )
    );
    let (_, list) = call(&s, "GET", "/v1/plugins", Some(&user_token()), None).await;
    let text = list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "text")
        .unwrap()
        .clone();
    assert_eq!(text["enabled"], false);

    call(&s, "POST", "/admin/plugins/text/enable", Some(TOKEN), None).await;
    let (status, _) = call(&s, "POST", "/admin/validate", Some(TOKEN), Some(send)).await;
    assert_eq!(status, StatusCode::OK);

    let bad = json!({"contentType": 1, "conversationType": 1, "payload": {"text": ""}});
    let (status, body) = call(&s, "POST", "/admin/validate", Some(TOKEN), Some(bad)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        body["error"],
        json!({"code": "payload_invalid", "reason": "empty", "message": "text must not be empty"})
    );
    let huge =
        json!({"contentType": 1, "conversationType": 1, "payload": {"text": "x".repeat(3 << 20)}});
    expect_error(
        &s,
        "POST",
        "/admin/validate",
        Some(TOKEN),
        Some(huge),
        StatusCode::PAYLOAD_TOO_LARGE,
        "request_too_large",
    )
    .await;
    expect_error(
        &s,
        "POST",
        "/admin/validate",
        Some(TOKEN),
        Some(json!({"contentType": 1})),
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    let sys = json!({"contentType": 8, "conversationType": 2, "payload": {"operatorId": "o", "kickedUserIds": ["b"]}});
    expect_error(
        &s,
        "POST",
        "/admin/validate",
        Some(TOKEN),
        Some(sys),
        StatusCode::FORBIDDEN,
        "content_type_forbidden",
    )
    .await;
}

/// A dry run as an operator writes it by hand: the body's text, not a `Value`.
async fn dry_run_text(state: &AppState, body: &str) -> (StatusCode, Value) {
    let req = Request::builder()
        .method("POST")
        .uri("/admin/validate")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app(state.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn a_dry_run_answers_as_a_send_and_never_trips_the_breaker() {
    // A budget too small for 50 mentions: the plugin fails on them.
    let s = state_from_file(&format!(
        "[server]\nadmin_token = \"{TOKEN}\"\n[plugins.text]\nfuel_per_call = 10000\n"
    ))
    .await;
    // The payload reaches the plugin as written: a duplicate key is refused as a send's
    // is, where a JSON value would have kept the last; the answer keeps the key order.
    let (status, body) = dry_run_text(
        &s,
        r#"{"contentType": 1, "conversationType": 1, "payload": {"text": "a", "text": "b"}}"#,
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("payload_invalid")),
        "{body}"
    );
    let (status, body) = dry_run_text(
        &s,
        r#"{"contentType": 1, "conversationType": 1, "payload": {"text": " hi "}}"#,
    )
    .await;
    assert_eq!(
        (status, &body["payload"]),
        (StatusCode::OK, &json!({"text": "hi"}))
    );
    let many: Vec<String> = (0..50).map(|i| format!("user-{i}")).collect();
    let heavy = json!({"contentType": 1, "conversationType": 2,
        "payload": {"text": "hi all", "mentions": many}});
    // More failures than the breaker's five.
    for _ in 0..7 {
        expect_error(
            &s,
            "POST",
            "/admin/validate",
            Some(TOKEN),
            Some(heavy.clone()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "plugin_failed",
        )
        .await;
    }
    let (_, list) = call(&s, "GET", "/admin/plugins", Some(TOKEN), None).await;
    let text = list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "text")
        .unwrap()
        .clone();
    assert_eq!(
        (&text["enabled"], &text["tripped"], &text["stats"]["calls"]),
        (&json!(true), &Value::Null, &json!(0)),
        "{text}"
    );
}

#[tokio::test]
async fn reload_through_the_admin_endpoint_rereads_the_file_and_refuses_history_breaking_changes() {
    let s = state_from_file(&format!("[server]\nadmin_token = \"{TOKEN}\"\n")).await;
    let path = s.config_path.clone().unwrap();
    let cache = format!(
        "[runtime]\ncache_dir = {}\n",
        toml_path(&path.parent().unwrap().join("plugin-cache"))
    );
    std::fs::write(
        &path,
        format!(
            "{cache}[server]\nadmin_token = \"{TOKEN}\"\n[plugins.stateful]\npath = {}\n",
            toml_path(&fixture("stateful"))
        ),
    )
    .unwrap();
    let (status, body) = call(&s, "POST", "/admin/plugins/reload", Some(TOKEN), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(names(&body).contains(&"stateful".to_string()));

    std::fs::write(
        &path,
        format!(
            "{cache}[server]\nadmin_token = \"{TOKEN}\"\n[plugins.text]\npath = {}\n",
            toml_path(&fixture("changed-text"))
        ),
    )
    .unwrap();
    let body = expect_error(
        &s,
        "POST",
        "/admin/plugins/reload",
        Some(TOKEN),
        None,
        StatusCode::CONFLICT,
        "reload_refused",
    )
    .await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("would change delivery from persistent to live")
    );
    let (_, list) = call(&s, "GET", "/v1/plugins", Some(&user_token()), None).await;
    assert!(
        names(&list).contains(&"stateful".to_string()),
        "the running set stays after a refused reload"
    );
}

// ---- the real binary -------------------------------------------------------------------

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(config: &std::path::Path) -> Server {
    start_logging(config, Stdio::null())
}

/// `start`, the server's log going to `log`.
fn start_logging(config: &std::path::Path, log: Stdio) -> Server {
    start_in(config, log, None)
}

/// `start_logging`, run in the folder `cwd` if given.
fn start_in(config: &std::path::Path, log: Stdio, cwd: Option<&std::path::Path>) -> Server {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_courier"));
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let mut child = cmd
        .args(["serve", "--config"])
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    Server { child, addr }
}

/// One HTTP/1.1 request on an existing keep-alive connection.
fn get(conn: &mut TcpStream, path: &str) -> Value {
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: courier\r\nAuthorization: Bearer {}\r\n\r\n",
        user_token()
    )
    .unwrap();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    serde_json::from_slice(&body).unwrap()
}

fn enabled(list: &Value, name: &str) -> bool {
    list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap()["enabled"]
        .as_bool()
        .unwrap()
}

#[test]
fn sighup_reloads_without_dropping_a_connection() {
    let dir = scratch("sighup");
    let config = dir.join("courier.toml");
    let storage = storage_section(&dir);
    std::fs::write(
        &config,
        format!("[server]\nlisten = \"127.0.0.1:0\"\n{storage}"),
    )
    .unwrap();
    let server = start(&config);
    let mut conn = TcpStream::connect(&server.addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert!(enabled(&get(&mut conn, "/v1/plugins"), "typing"));

    std::fs::write(
        &config,
        format!("[server]\nlisten = \"127.0.0.1:0\"\n{storage}[plugins.typing]\nenabled = false\n"),
    )
    .unwrap();
    let status = Command::new("kill")
        .args(["-HUP", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // The same connection, before and after the reload.
        if !enabled(&get(&mut conn, "/v1/plugins"), "typing") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not disable typing within 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(get(&mut conn, "/healthz"), json!({"status": "ok"}));
}

#[test]
fn the_compiled_plugin_cache_is_on_by_default_beside_the_database() {
    // No cache_dir and no storage url: both take their defaults under ./data.
    let dir = scratch("default-cache");
    let config = dir.join("courier.toml");
    std::fs::write(&config, "[server]\nlisten = \"127.0.0.1:0\"\n").unwrap();
    let start_here = || start_in(&config, Stdio::null(), Some(&dir));
    drop(start_here());
    let cache = dir.join("data/plugin-cache");
    let compiled = || {
        std::fs::read_dir(&cache)
            .map(|d| {
                d.filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .path()
                        .extension()
                        .is_some_and(|x| x == "cwasm")
                })
                .count()
            })
            .unwrap_or(0)
    };
    assert_eq!(
        compiled(),
        10,
        "every bundled plugin compiled into {}",
        cache.display()
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&cache).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            mode, 0o700,
            "the cache runs as native code: private to the server"
        );
    }
    // A second start uses the entries (none is added or rewritten).
    let before: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().modified().unwrap())
        .collect();
    drop(start_here());
    let after: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().modified().unwrap())
        .collect();
    assert_eq!(before, after);
}

#[test]
fn a_refused_reload_is_logged_however_it_was_asked_for() {
    let dir = scratch("reload-log");
    let config = dir.join("courier.toml");
    let log = dir.join("server.log");
    let storage = storage_section(&dir);
    let head = format!("[server]\nlisten = \"127.0.0.1:0\"\nadmin_token = \"{TOKEN}\"\n{storage}");
    std::fs::write(&config, &head).unwrap();
    let server = start_logging(&config, Stdio::from(std::fs::File::create(&log).unwrap()));
    std::fs::write(&config, format!("{head}[gateway]\nno_such_key = 1\n")).unwrap();
    let mut conn = TcpStream::connect(&server.addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        conn,
        "POST /admin/plugins/reload HTTP/1.1\r\nHost: courier\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut status = String::new();
    BufReader::new(conn.try_clone().unwrap())
        .read_line(&mut status)
        .unwrap();
    assert!(status.starts_with("HTTP/1.1 409"), "{status}");
    // The log line is written before the answer.
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("reload refused") && text.contains("no_such_key"),
        "the refused reload is not in the log:\n{text}"
    );
}

#[test]
fn start_up_refusal_names_the_file_and_the_reason() {
    let dir = scratch("refuse");
    let config = dir.join("courier.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[plugins.wrong-version]\npath = {}\n",
            toml_path(&fixture("wrong-version"))
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_courier"))
        .current_dir(&dir)
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("fixture_wrong_version.wasm: plugin targets 1.3, host supports 1.0–1.0"),
        "{stderr}"
    );

    std::fs::write(
        &config,
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = true\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_courier"))
        .current_dir(&dir)
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("courier.toml") && stderr.contains("admin"),
        "{stderr}"
    );
}

#[test]
fn the_cli_lists_its_subcommands_and_check_exits_by_result() {
    let out = Command::new(env!("CARGO_BIN_EXE_courier"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("serve") && help.contains("plugin"), "{help}");
    let out = Command::new(env!("CARGO_BIN_EXE_courier"))
        .args(["plugin", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("check") && help.contains("list"), "{help}");

    let dir = scratch("cli");
    let text = dir.join("text.wasm");
    std::fs::write(&text, common::builtin("text")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_courier"))
        .args(["plugin", "check", "--fuzz", "50"])
        .arg(&text)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("result: PASS"), "{report}");
    assert!(
        report.contains("PASS  conflicts"),
        "the bundled text is no clash with itself:\n{report}"
    );

    // A kind claiming a bundled content type passes with a warning; checked against a
    // server's config that has it, it fails.
    let check_clone = |config: Option<&std::path::Path>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_courier"));
        cmd.args(["plugin", "check", "--fuzz", "50"])
            .arg(fixture("text-clone"));
        if let Some(c) = config {
            cmd.arg("--config").arg(c);
        }
        cmd.current_dir(&dir).output().unwrap()
    };
    let out = check_clone(None);
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert!(
        report.contains("WARN  conflicts")
            && report.contains("text (content type 1, built-in text.wasm)"),
        "{report}"
    );
    assert!(
        !dir.join("data").exists(),
        "the check left a cache in the author's folder"
    );
    let config = dir.join("server.toml");
    std::fs::write(
        &config,
        format!("[runtime]\ncache_dir = {}\n", toml_path(&dir.join("cache"))),
    )
    .unwrap();
    let out = check_clone(Some(&config));
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(report.contains("FAIL  conflicts"), "{report}");

    // A kind of a loaded kind's name takes its place when configured by that name: no
    // clash, but changes that stored history depends on are named.
    let out = Command::new(env!("CARGO_BIN_EXE_courier"))
        .args(["plugin", "check", "--fuzz", "50"])
        .arg(fixture("changed-text"))
        .arg("--config")
        .arg(&config)
        .current_dir(&dir)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{report}");
    let line = report
        .lines()
        .find(|l| l.contains("conflicts"))
        .unwrap_or_else(|| panic!("no conflicts check:\n{report}"));
    assert!(
        line.contains("WARN")
            && line.contains("takes the place of text (built-in text.wasm)")
            && line.contains("delivery from persistent to live")
            && line.contains("counts-unread from true to false"),
        "{report}"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_courier"))
        .args(["plugin", "check", "--fuzz", "50"])
        .arg(fixture("trap"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains("FAIL  budget") && report.contains("result: FAIL"),
        "{report}"
    );
}

#[test]
fn only_environment_variables_shaped_like_config_keys_are_config() {
    let dir = scratch("env");
    let config = dir.join("courier.toml");
    std::fs::write(&config, "[server]\nlisten = \"127.0.0.1:0\"\n").unwrap();
    let list = |vars: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_courier"));
        cmd.current_dir(&dir);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("COURIER_") {
                cmd.env_remove(key);
            }
        }
        cmd.args(["plugin", "list", "--config"]).arg(&config);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    // A deployment's own variables under the prefix are not config.
    let out = list(&[
        ("COURIER_BIN", "/usr/local/bin/courier"),
        ("COURIER_HOME", "/srv"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A misspelt key of the config shape refuses, naming it.
    let out = list(&[("COURIER_GATEWAY__HEARTBEAT_SEC", "30")]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("heartbeat_sec"), "{stderr}");
    let out = list(&[("COURIER_GATEWAY__HEARTBEAT_SECS", "30")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
