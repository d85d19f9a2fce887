//! The plugin platform end to end: the contract suite over every bundled plugin and over
//! misbehaving fixtures built from source; start-up refusals; containment at runtime; the
//! circuit breaker; enable/disable; reload rules.

mod common;

use common::{builtin, fixture, scratch, toml_path};
use courier::config::Config;
use courier::plugins::check::{CheckOptions, Status, check_bytes, check_file};
use courier::plugins::{CallFailure, PluginRegistry, SendContext, SenderKind, ValidateError};

fn user(conversation_type: u8) -> SendContext<'static> {
    SendContext {
        sender_id: "alice",
        sender: SenderKind::User,
        conversation_type,
        conversation_id: "c1",
    }
}

fn system(conversation_type: u8) -> SendContext<'static> {
    SendContext {
        sender_id: "system",
        sender: SenderKind::System,
        conversation_type,
        conversation_id: "c1",
    }
}

fn quick() -> CheckOptions {
    CheckOptions {
        fuzz: 100,
        ..CheckOptions::default()
    }
}

/// A config of the test's, without the default compiled-plugin cache (it would be left
/// in the source tree) unless the test names a cache of its own.
fn config(toml: &str) -> Config {
    let mut c = Config::from_toml(toml).expect("config");
    if !toml.contains("cache_dir") {
        c.runtime.cache_dir = None;
    }
    c
}

fn registry(toml: &str) -> PluginRegistry {
    PluginRegistry::load(&config(toml)).expect("plugins load")
}

fn load_error(toml: &str) -> String {
    match PluginRegistry::load(&config(toml)) {
        Ok(_) => panic!("expected the plugins to be refused"),
        Err(e) => e.to_string(),
    }
}

// ---- the contract suite over the bundled plugins ------------------------------------

#[test]
fn every_bundled_plugin_passes_the_contract_suite() {
    let names: Vec<&str> = courier::builtin::BUILTINS.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "encrypted",
            "file",
            "friend-request",
            "group-kick",
            "group-update",
            "image",
            "recall",
            "rtc-call",
            "text",
            "typing"
        ]
    );
    for name in names {
        let cases = common::repo_root().join("plugins").join(name).join("cases");
        let has_cases = cases.is_dir();
        let opts = CheckOptions {
            cases: has_cases.then_some(cases),
            ..CheckOptions::default()
        };
        let report = check_bytes(name, &builtin(name), &opts);
        assert!(report.passed(), "{}", report.render());
        let want = if has_cases {
            Status::Pass
        } else {
            Status::Skip
        };
        assert_eq!(
            report.check("cases").map(|c| c.status),
            Some(want),
            "{name}\n{}",
            report.render()
        );
        for check in [
            "examples",
            "determinism",
            "idempotence",
            "malformed",
            "oversized",
            "fuzz",
            "budget",
        ] {
            assert_eq!(
                report.check(check).map(|c| c.status),
                Some(Status::Pass),
                "{name}: {check}\n{}",
                report.render()
            );
        }
    }
}

#[test]
fn the_suite_replays_data_driven_cases_and_reports_a_wrong_one() {
    let dir = scratch("cases");
    let case = |name: &str, input: &str, file: &str, content: &str| {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("input.json"), input).unwrap();
        std::fs::write(d.join(file), content).unwrap();
    };
    case(
        "ok",
        r#"{"text":"  hi  "}"#,
        "expected.json",
        r#"{"text":"hi"}"#,
    );
    case(
        "too-long",
        &format!(r#"{{"text":"{}"}}"#, "a".repeat(5000)),
        "error.txt",
        "too_long\n",
    );
    case(
        "wrong-expectation",
        r#"{"text":"x"}"#,
        "expected.json",
        r#"{"text":"y"}"#,
    );
    let opts = CheckOptions {
        cases: Some(dir),
        ..quick()
    };
    let report = check_bytes("text", &builtin("text"), &opts);
    let cases = report.check("cases").unwrap();
    assert_eq!(cases.status, Status::Fail, "{}", report.render());
    assert!(
        cases
            .detail
            .contains("wrong-expectation: expected {\"text\":\"y\"}, got {\"text\":\"x\"}"),
        "{}",
        cases.detail
    );
    assert!(!cases.detail.contains("too-long"), "{}", cases.detail);
    assert!(!cases.detail.contains("ok:"), "{}", cases.detail);
}

// ---- the contract suite over misbehaving fixtures -----------------------------------

fn failed_check(fixture_name: &str, check: &str) -> String {
    let report = check_file(&fixture(fixture_name), &quick());
    assert!(
        !report.passed(),
        "{fixture_name} passed:\n{}",
        report.render()
    );
    let c = report
        .check(check)
        .unwrap_or_else(|| panic!("no {check} check:\n{}", report.render()));
    assert_eq!(
        c.status,
        Status::Fail,
        "{fixture_name}: {check}\n{}",
        report.render()
    );
    c.detail.clone()
}

#[test]
fn an_endless_loop_is_stopped_by_the_fuel_budget() {
    let detail = failed_check("endless-loop", "budget");
    assert!(
        detail.contains("exceeded its budget of 50000000 fuel units"),
        "{detail}"
    );
    assert!(
        detail.contains("calls failed and were contained"),
        "{detail}"
    );
}

#[test]
fn a_1_gib_allocation_hits_the_memory_cap() {
    let detail = failed_check("huge-alloc", "budget");
    assert!(
        detail.contains("over the cap of 67108864 bytes"),
        "{detail}"
    );
    let asked: u64 = detail
        .split("grow its memory to ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(asked >= 1 << 30, "asked {asked}");
}

#[test]
fn a_trap_is_reported_as_a_trap() {
    let detail = failed_check("trap", "budget");
    assert!(
        detail.contains("trapped: wasm trap: wasm `unreachable` instruction executed"),
        "{detail}"
    );
    // The panic message the plugin wrote to stderr explains the trap.
    assert!(
        detail.contains("the plugin wrote: thread '<unnamed>'")
            && detail.contains("panicked at trap/src/lib.rs")
            && detail.contains("fixture panics on purpose"),
        "{detail}"
    );
}

#[test]
fn a_wrong_contract_version_is_named() {
    let detail = failed_check("wrong-version", "contract");
    assert_eq!(detail, "plugin targets 1.3, host supports 1.0–1.0");
}

#[test]
fn an_extra_import_is_named() {
    let detail = failed_check("extra-import", "imports");
    assert!(
        detail.starts_with("imports outside the contract: fixture:net/fetch"),
        "{detail}"
    );
}

#[test]
fn an_invalid_manifest_lists_its_problems() {
    let detail = failed_check("bad-manifest", "manifest");
    assert!(
        detail.contains("name \"Bad Manifest\" must be 1-32 characters"),
        "{detail}"
    );
    assert!(detail.contains("content type 0 is reserved"), "{detail}");
    assert!(
        detail.contains("a live kind is never stored, so it cannot count toward unread"),
        "{detail}"
    );
}

#[test]
fn state_leaking_between_calls_fails_determinism_and_idempotence() {
    assert!(failed_check("stateful", "determinism").contains("fresh instance"));
    assert!(failed_check("stateful", "idempotence").contains("which validates to"));
}

#[test]
fn files_that_are_not_components_are_refused() {
    let dir = scratch("not-components");
    let garbage = dir.join("garbage.wasm");
    std::fs::write(&garbage, b"hello, not wasm").unwrap();
    let core = dir.join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let r = check_file(&garbage, &quick());
    assert!(
        r.check("component")
            .unwrap()
            .detail
            .contains("does not start with the WebAssembly magic bytes")
    );
    let r = check_file(&core, &quick());
    assert!(
        r.check("component")
            .unwrap()
            .detail
            .contains("it is a core wasm module")
    );
    assert!(!r.passed());
}

// ---- start-up refusals ---------------------------------------------------------------

#[test]
fn start_up_refuses_two_plugins_claiming_one_content_type_naming_both() {
    let err = load_error(&format!(
        "[plugins.text-clone]\npath = {}\n",
        toml_path(&fixture("text-clone"))
    ));
    assert!(
        err.contains("content type 1 is claimed by two plugins"),
        "{err}"
    );
    assert!(err.contains("text (built-in text.wasm)"), "{err}");
    assert!(err.contains("fixture_text_clone.wasm"), "{err}");
}

#[test]
fn start_up_refuses_bad_files_in_the_plugin_dir_naming_each() {
    let dir = scratch("plugin-dir");
    std::fs::copy(fixture("wrong-version"), dir.join("old.wasm")).unwrap();
    std::fs::copy(fixture("extra-import"), dir.join("net.wasm")).unwrap();
    std::fs::copy(fixture("bad-manifest"), dir.join("bad.wasm")).unwrap();
    std::fs::write(dir.join("notes.wasm"), b"just text").unwrap();
    let err = load_error(&format!("[runtime]\ndir = {}\n", toml_path(&dir)));
    let line = |file: &str| {
        err.lines()
            .find(|l| l.contains(file))
            .unwrap_or_else(|| panic!("{file} not named in\n{err}"))
            .to_string()
    };
    assert!(
        line("old.wasm").ends_with("plugin targets 1.3, host supports 1.0–1.0"),
        "{err}"
    );
    assert!(
        line("net.wasm").contains("imports outside the contract: fixture:net/fetch"),
        "{err}"
    );
    assert!(
        line("bad.wasm").contains("invalid manifest: name \"Bad Manifest\""),
        "{err}"
    );
    assert!(
        line("notes.wasm").contains("not a WebAssembly component"),
        "{err}"
    );
}

#[test]
fn start_up_refuses_a_sha256_mismatch() {
    let pin = "0".repeat(64);
    let err = load_error(&format!("[plugins.text]\nsha256 = \"{pin}\"\n"));
    assert!(
        err.starts_with("built-in text.wasm: sha256 mismatch: the config pins 000"),
        "{err}"
    );
    let actual = courier::plugins::loader::sha256_hex(&builtin("text"));
    assert!(err.contains(&actual), "{err}");
    // The right pin loads.
    let reg = registry(&format!("[plugins.text]\nsha256 = \"{actual}\"\n"));
    assert!(reg.get(1).is_some());
}

#[test]
fn start_up_refuses_an_unknown_config_key_and_an_unknown_plugin_name() {
    let err = Config::from_toml("[runtime]\nfuel_per_cal = 5\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("fuel_per_cal"), "{err}");
    let err = load_error("[plugins.txet]\nenabled = false\n");
    assert!(
        err.contains("config names plugin \"txet\", but no plugin of that name was loaded"),
        "{err}"
    );
}

// ---- the send-path API ---------------------------------------------------------------

#[test]
fn validate_normalizes_and_previews() {
    let reg = registry("");
    let v = reg
        .validate(1, &user(1), br#"{"text":"  hello  "}"#)
        .unwrap();
    assert_eq!(v.payload.get(), r#"{"text":"hello"}"#);
    assert_eq!(v.plugin.manifest.name, "text");
    assert_eq!(reg.preview(1, v.payload.get()), "hello");
    assert_eq!(
        reg.preview(
            10,
            r#"{"v":1,"type":"message","senderDeviceId":"p","header":"AQ==","ciphertext":"AAAA"}"#
        ),
        "[encrypted message]"
    );
}

#[test]
fn each_refusal_has_its_code() {
    let reg = registry("");
    let code =
        |ct: u32, ctx: SendContext<'_>, p: &[u8]| reg.validate(ct, &ctx, p).unwrap_err().code();
    assert_eq!(code(4242, user(1), b"{}"), "content_type_unknown");
    assert_eq!(
        code(8, user(2), br#"{"operatorId":"o","kickedUserIds":["b"]}"#),
        "content_type_forbidden"
    );
    assert_eq!(
        code(5, user(3), br#"{"state":"typing"}"#),
        "conversation_type_not_allowed"
    );
    assert_eq!(code(5, user(1), &[b' '; 257]), "payload_too_large");
    assert_eq!(code(1, user(1), b"{\"text\":\"\xff\"}"), "payload_invalid");
    let e = reg.validate(1, &user(1), br#"{"text":""}"#).unwrap_err();
    assert_eq!((e.code(), e.reason()), ("payload_invalid", Some("empty")));
    assert_eq!(e.to_string(), "text must not be empty");
    // The server itself may emit system kinds.
    assert!(
        reg.validate(
            8,
            &system(2),
            br#"{"operatorId":"o","kickedUserIds":["b"]}"#
        )
        .is_ok()
    );
}

#[test]
fn a_disabled_kind_rejects_sends_and_stays_readable() {
    let reg = registry("[plugins.image]\nenabled = false\n");
    let img = br#"{"url":"https://x.example/a.png","mime":"image/png","width":1,"height":1,"size":1,"caption":"cat"}"#;
    let e = reg.validate(2, &user(1), img).unwrap_err();
    assert_eq!(e.code(), "content_type_disabled");
    assert_eq!(
        reg.preview(2, std::str::from_utf8(img).unwrap()),
        "[image] cat"
    );
    reg.set_enabled("image", true).unwrap();
    assert!(reg.validate(2, &user(1), img).is_ok());
    reg.set_enabled("image", false).unwrap();
    assert_eq!(
        reg.validate(2, &user(1), img).unwrap_err().code(),
        "content_type_disabled"
    );
}

#[test]
fn misbehaving_plugins_fail_one_message_and_the_host_keeps_serving() {
    let reg = registry(&format!(
        "[runtime]\nbreaker_failures = 100\n[plugins.endless-loop]\npath = {}\n[plugins.huge-alloc]\npath = {}\n[plugins.trap]\npath = {}\n",
        toml_path(&fixture("endless-loop")),
        toml_path(&fixture("huge-alloc")),
        toml_path(&fixture("trap")),
    ));
    for (ct, want) in [(9001, "budget"), (9002, "memory"), (9003, "trap")] {
        let e = reg
            .validate(ct, &user(1), br#"{"text":"misbehave"}"#)
            .unwrap_err();
        assert_eq!(e.code(), "plugin_failed", "{e}");
        let ValidateError::PluginFailed { failure, name, .. } = &e else {
            panic!("{e:?}")
        };
        let kind = match failure {
            CallFailure::Budget { .. } => "budget",
            CallFailure::Memory { .. } => "memory",
            CallFailure::Trap(_) => "trap",
            other => panic!("unexpected failure {other}"),
        };
        assert_eq!(kind, want, "{name}: {e}");
        // The same plugin still serves good input on a fresh instance, and so do the others.
        assert_eq!(
            reg.validate(ct, &user(1), br#"{"text":"ok"}"#)
                .unwrap()
                .into_text(),
            r#"{"text":"ok"}"#
        );
        assert_eq!(
            reg.validate(1, &user(1), br#"{"text":"still here"}"#)
                .unwrap()
                .into_text(),
            r#"{"text":"still here"}"#
        );
        let stats = reg.by_name(name).unwrap().stats();
        assert_eq!((stats.failed, stats.accepted), (1, 1), "{name}");
    }
}

#[test]
fn the_circuit_breaker_switches_a_failing_plugin_off_and_enable_resets_it() {
    let reg = registry(&format!(
        "[runtime]\nbreaker_failures = 3\n[plugins.trap]\npath = {}\n",
        toml_path(&fixture("trap"))
    ));
    for _ in 0..3 {
        assert_eq!(
            reg.validate(9003, &user(1), br#"{"text":"boom"}"#)
                .unwrap_err()
                .code(),
            "plugin_failed"
        );
    }
    let e = reg
        .validate(9003, &user(1), br#"{"text":"ok"}"#)
        .unwrap_err();
    assert_eq!(e.code(), "content_type_disabled");
    let info = reg.by_name("trap").unwrap().info();
    assert!(!info.enabled);
    let tripped = info.tripped.expect("breaker reason");
    assert!(
        tripped.starts_with("3 failures within 60 s, the last: trapped"),
        "{tripped}"
    );
    assert!(
        reg.validate(1, &user(1), br#"{"text":"others unaffected"}"#)
            .is_ok()
    );
    let info = reg.set_enabled("trap", true).unwrap();
    assert!(info.enabled && info.tripped.is_none());
    assert!(reg.validate(9003, &user(1), br#"{"text":"ok"}"#).is_ok());
}

#[test]
fn fresh_and_pooled_isolation_give_the_same_results() {
    let pooled = registry("");
    let fresh = registry("[runtime]\nisolation = \"fresh\"\n");
    for payload in [
        &br#"{"text":" a "}"#[..],
        br#"{"text":""}"#,
        b"{",
        br#"{"text":"b","mentions":["x"]}"#,
    ] {
        let a = pooled
            .validate(1, &user(2), payload)
            .map(|v| v.into_text())
            .map_err(|e| e.to_string());
        let b = fresh
            .validate(1, &user(2), payload)
            .map(|v| v.into_text())
            .map_err(|e| e.to_string());
        assert_eq!(a, b);
    }
}

// ---- reload --------------------------------------------------------------------------

#[test]
fn reload_swaps_plugins_and_refuses_to_change_delivery_or_unread_counting() {
    let reg = registry("");
    // Add a plugin and switch one off.
    let list = reg
        .reload(&config(&format!(
            "[plugins.stateful]\npath = {}\n[plugins.typing]\nenabled = false\n",
            toml_path(&fixture("stateful"))
        )))
        .unwrap();
    assert_eq!(list.len(), 11);
    assert!(reg.get(9005).is_some());
    assert_eq!(
        reg.validate(5, &user(1), br#"{"state":"typing"}"#)
            .unwrap_err()
            .code(),
        "content_type_disabled"
    );
    // Replacing text with a live, non-counting kind would corrupt history: refused.
    let err = reg
        .reload(&config(&format!(
            "[plugins.text]\npath = {}\n",
            toml_path(&fixture("changed-text"))
        )))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "reload refused: text (content type 1) would change delivery from persistent to live"
        ),
        "{err}"
    );
    assert!(
        err.contains("would change counts-unread from true to false"),
        "{err}"
    );
    // The running set is untouched.
    assert_eq!(
        reg.get(1).unwrap().manifest.delivery.to_string(),
        "persistent"
    );
    assert!(reg.get(9005).is_some());
    // A reload that fails to load keeps the running set too.
    assert!(
        reg.reload(&config("[plugins.nope]\nenabled = true\n"))
            .is_err()
    );
    assert!(reg.get(9005).is_some());
}

#[test]
fn the_plugin_template_builds_and_passes_the_contract_suite() {
    let template = common::repo_root().join("plugin-sdk/template");
    let target = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("template-target");
    let built = common::build_wasm(&template.join("Cargo.toml"), &target);
    let report = check_file(&built.join("courier_kind_sticker.wasm"), &quick());
    assert!(report.passed(), "{}", report.render());
    assert_eq!(report.manifest.unwrap().content_type, 1100);
}

#[test]
fn compiled_plugins_are_cached_on_disk_and_a_bad_entry_is_recompiled() {
    let cache = scratch("compile-cache");
    let toml = format!("[runtime]\ncache_dir = {}\n", toml_path(&cache));
    let first = registry(&toml);
    let entries = |ext: &str| {
        std::fs::read_dir(&cache)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == ext)
            })
            .count()
    };
    assert_eq!(entries("cwasm"), 10);
    assert_eq!(entries("sha256"), 10);
    drop(first);
    // A second start loads from the cache and behaves the same.
    let second = registry(&toml);
    assert_eq!(
        second
            .validate(1, &user(1), br#"{"text":" hi "}"#)
            .unwrap()
            .into_text(),
        r#"{"text":"hi"}"#
    );
    // A corrupted entry is detected by its hash and recompiled, not run.
    let text_sha = courier::plugins::loader::sha256_hex(&builtin("text"));
    let entry = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.extension().is_some_and(|x| x == "cwasm")
                && p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&text_sha)
        })
        .unwrap();
    let mut bytes = std::fs::read(&entry).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&entry, &bytes).unwrap();
    let third = registry(&toml);
    assert_eq!(
        third
            .validate(1, &user(1), br#"{"text":" ok "}"#)
            .unwrap()
            .into_text(),
        r#"{"text":"ok"}"#
    );
    assert_ne!(
        std::fs::read(&entry).unwrap(),
        bytes,
        "the bad entry was rewritten"
    );
}

#[test]
fn a_file_in_the_plugin_dir_named_by_a_path_entry_loads_once() {
    let dir = scratch("dir-and-path");
    let poll = dir.join("text-clone.wasm");
    std::fs::copy(fixture("text-clone"), &poll).unwrap();
    let reg = registry(&format!(
        "[runtime]\nbuiltins = false\ndir = {}\n[plugins.text-clone]\npath = {}\n",
        toml_path(&dir),
        toml_path(&poll)
    ));
    assert_eq!(reg.list().len(), 1);
    assert!(reg.get(1).is_some());
}

#[test]
fn instances_per_plugin_are_capped_and_failures_free_their_place() {
    let reg = std::sync::Arc::new(registry(&format!(
        "[runtime]\nmax_instances = 1\nbreaker_failures = 100\n[plugins.trap]\npath = {}\n",
        toml_path(&fixture("trap"))
    )));
    // Eight threads at once on one plugin: all served, never more than one instance.
    let (tx, rx) = std::sync::mpsc::channel();
    for t in 0..8 {
        let (reg, tx) = (reg.clone(), tx.clone());
        std::thread::spawn(move || {
            let mut most = 0;
            for i in 0..200 {
                let payload = format!(r#"{{"text":"t{t} m{i}"}}"#);
                reg.validate(1, &user(1), payload.as_bytes()).unwrap();
                most = most.max(reg.get(1).unwrap().pool().live_instances());
            }
            tx.send(most).unwrap();
        });
    }
    for _ in 0..8 {
        let most = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("a thread finished");
        assert_eq!(most, 1);
    }
    // A trapped instance gives its place back: the next call is not left waiting.
    let trap = reg.clone();
    std::thread::spawn(move || {
        for _ in 0..3 {
            assert_eq!(
                trap.validate(9003, &user(1), br#"{"text":"boom"}"#)
                    .unwrap_err()
                    .code(),
                "plugin_failed"
            );
        }
        tx.send(usize::from(
            trap.validate(9003, &user(1), br#"{"text":"ok"}"#).is_ok(),
        ))
        .unwrap();
    });
    assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(60)), Ok(1));
    assert_eq!(reg.get(9003).unwrap().pool().live_instances(), 1);
}

#[test]
fn a_plugin_that_sleeps_does_not_hold_the_host() {
    let reg = registry(&format!(
        "[plugins.sleeper]\npath = {}\n",
        toml_path(&fixture("sleeper"))
    ));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // An hour's sleep, then Duration::MAX: time does not pass inside the sandbox.
        let r = reg
            .validate(9008, &user(1), br#"{"text":"zzz"}"#)
            .map(|v| v.into_text());
        tx.send(r.map_err(|e| e.to_string())).unwrap();
    });
    let result = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("validate returned");
    assert_eq!(result, Ok(r#"{"text":"zzz"}"#.to_string()));
}

#[test]
fn plugins_called_on_the_async_runtime_write_stderr_and_sleep_without_it() {
    // The server calls plugins inline on its runtime's threads (a WebSocket send), where
    // wasmtime-wasi's own blocking calls cannot run: a panic's message written to stderr
    // and a sleep must not need them.
    let reg = std::sync::Arc::new(registry(&format!(
        "[runtime]\nbreaker_failures = 100\n[plugins.trap]\npath = {}\n[plugins.sleeper]\npath = {}\n",
        toml_path(&fixture("trap")),
        toml_path(&fixture("sleeper")),
    )));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (trapped, slept, text) = rt.block_on(async move {
        tokio::spawn(async move {
            let trapped = reg
                .validate(9003, &user(1), br#"{"text":"boom"}"#)
                .unwrap_err();
            let slept = reg
                .validate(9008, &user(1), br#"{"text":"zzz"}"#)
                .map(|v| v.into_text())
                .map_err(|e| e.to_string());
            let text = reg
                .validate(1, &user(1), br#"{"text":"still here"}"#)
                .map(|v| v.into_text())
                .map_err(|e| e.to_string());
            (trapped, slept, text)
        })
        .await
        .expect("the calls did not panic")
    });
    assert_eq!(trapped.code(), "plugin_failed", "{trapped}");
    assert!(
        trapped.to_string().contains("fixture panics on purpose"),
        "the panic's message, read from stderr: {trapped}"
    );
    assert_eq!(slept, Ok(r#"{"text":"zzz"}"#.to_string()));
    assert_eq!(text, Ok(r#"{"text":"still here"}"#.to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_panics_over_a_websocket_fails_its_message_and_the_connection_stays() {
    use common::server::{Backend, Server, peer, send_err, send_ok, text};
    let db = common::server::Db::new(&Backend::Sqlite, "ws-plugin-panics").await;
    let s = Server::start(
        &db,
        &format!(
            "[plugins.trap]\npath = {}\n[plugins.sleeper]\npath = {}\n",
            toml_path(&fixture("trap")),
            toml_path(&fixture("sleeper")),
        ),
    )
    .await;
    let (alice, _bob) = (s.user("alice").await, s.user("bob").await);
    let mut ws = s.connect(&alice, "phone").await;
    let mut boom = text("t1", "c1", peer("bob"), "boom");
    boom["contentType"] = 9003.into();
    let err = send_err(&mut ws, boom).await;
    assert_eq!(err["code"], "plugin_failed", "{err}");
    assert!(
        err["message"]
            .as_str()
            .unwrap_or("")
            .contains("fixture panics on purpose"),
        "{err}"
    );
    let mut zzz = text("t2", "c2", peer("bob"), "zzz");
    zzz["contentType"] = 9008.into();
    send_ok(&mut ws, zzz).await;
    send_ok(&mut ws, text("t3", "c3", peer("bob"), "still here")).await;
}

#[test]
fn the_host_checks_what_a_plugin_returns() {
    use courier::plugins::Manifest;
    let m = Manifest {
        name: "t".into(),
        version: "1.0.0".into(),
        content_type: 1,
        delivery: courier::plugins::Delivery::Persistent,
        counts_unread: true,
        conversation_types: vec![1],
        sender: SenderKind::User,
        max_payload_bytes: 20,
        description: "t".into(),
    };
    let check = |r| courier::plugins::registry::check_output(&m, r);
    assert_eq!(
        check(Ok(r#"{"a":1}"#.into())).unwrap(),
        Ok(r#"{"a":1}"#.into())
    );
    // Over the limit after normalizing: the sender's payload is refused, not a failure.
    let too_big = check(Ok(format!(r#"{{"a":"{}"}}"#, "x".repeat(30))))
        .unwrap()
        .unwrap_err();
    assert_eq!(too_big.0, "normalized_too_large");
    assert!(
        too_big.1.contains("over the kind's maximum of 20"),
        "{}",
        too_big.1
    );
    let not_json = check(Ok("{oops".into())).unwrap_err().to_string();
    assert!(not_json.contains("not JSON"), "{not_json}");
    let bad_code = check(Err(("Bad Code".into(), "m".into())))
        .unwrap_err()
        .to_string();
    assert!(bad_code.contains("not 1-64 characters"), "{bad_code}");
    let long = check(Err(("ok".into(), "y".repeat(1000))))
        .unwrap()
        .unwrap_err();
    assert_eq!(long.1.chars().count(), 300);
}

#[test]
fn a_kind_removed_and_added_back_changed_is_still_refused() {
    let reg = registry("");
    // Reload without the bundled kinds: text (content type 1) is gone…
    reg.reload(&config("[runtime]\nbuiltins = false\n"))
        .unwrap();
    assert!(reg.get(1).is_none());
    // …and may not come back as a live kind.
    let err = reg
        .reload(&config(&format!(
            "[runtime]\nbuiltins = false\n[plugins.text]\npath = {}\n",
            toml_path(&fixture("changed-text"))
        )))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("would change delivery from persistent to live"),
        "{err}"
    );
}

#[test]
fn a_plugin_from_the_dir_gets_its_fuel_override() {
    let dir = scratch("dir-fuel");
    std::fs::copy(fixture("endless-loop"), dir.join("loop.wasm")).unwrap();
    let reg = registry(&format!(
        "[runtime]\ndir = {}\n[plugins.endless-loop]\nfuel_per_call = 20000\n",
        toml_path(&dir)
    ));
    let e = reg
        .validate(9001, &user(1), br#"{"text":"spin"}"#)
        .unwrap_err();
    assert!(e.to_string().contains("budget of 20000 fuel units"), "{e}");
}

#[cfg(unix)]
#[test]
fn a_cache_dir_others_can_write_is_not_used() {
    use std::os::unix::fs::PermissionsExt;
    let cache = scratch("open-cache");
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
    let reg = registry(&format!("[runtime]\ncache_dir = {}\n", toml_path(&cache)));
    assert!(reg.validate(1, &user(1), br#"{"text":"hi"}"#).is_ok());
    assert_eq!(
        std::fs::read_dir(&cache).unwrap().count(),
        0,
        "nothing written to a shared dir"
    );
}

// ---- what a plugin says never reaches an output raw or unbounded ------------------------

#[test]
fn a_hostile_manifest_is_reported_short_and_escaped_everywhere() {
    // The name is 10 MiB and starts with a newline, a forged line and a screen clear.
    let report = check_file(&fixture("hostile-manifest"), &quick());
    assert!(!report.passed());
    let text = report.render();
    assert!(text.len() < 8 * 1024, "a {}-byte report", text.len());
    assert!(
        !text.contains('\u{1b}'),
        "a terminal escape reached the report"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("FORGED LINE")),
        "a forged line:\n{text}"
    );
    assert!(text.contains("(10485780 bytes)"), "{text}");
    let manifest = report.check("manifest").unwrap();
    assert!(manifest.detail.contains("version"), "{}", manifest.detail);
    assert!(
        manifest.detail.contains("description"),
        "{}",
        manifest.detail
    );

    // The server refuses to load it, with an error as short and as clean.
    let error = load_error(&format!(
        "[plugins.hostile]\npath = {}\n",
        toml_path(&fixture("hostile-manifest"))
    ));
    assert!(error.len() < 8 * 1024, "a {}-byte load error", error.len());
    assert!(
        !error.contains('\u{1b}') && !error.contains("\nFORGED"),
        "{error}"
    );
}

#[test]
fn a_plugin_stopped_by_the_host_fails_with_one_clear_line() {
    let reg = registry(&format!(
        "[plugins.chatty]\npath = {}\n",
        toml_path(&fixture("chatty"))
    ));
    let e = reg
        .validate(9011, &user(1), br#"{"text":"misbehave"}"#)
        .unwrap_err();
    assert_eq!(e.code(), "plugin_failed", "{e}");
    let message = e.to_string();
    assert_eq!(message.lines().count(), 1, "{message}");
    assert!(message.contains("logged more than 100 lines"), "{message}");
    assert!(
        !message.contains("wasm backtrace") && !message.contains("_ZN"),
        "{message}"
    );
}

#[test]
fn a_reload_refuses_a_plugin_that_fails_its_own_examples() {
    let reg = registry("");
    // The trap fixture declares {"text":"hi"} accepted, and panics on it.
    let err = reg
        .reload(&config(&format!(
            "[plugins.trap]\npath = {}\n",
            toml_path(&fixture("trap"))
        )))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("trap") && err.contains("fails its own examples"),
        "{err}"
    );
    assert!(err.contains("\"any\" declared accepted"), "{err}");
    assert!(reg.get(9003).is_none(), "the refused plugin is not loaded");
    assert!(reg.get(1).is_some(), "the running set stays");
}

/// A plugin that recurses without end is stopped, and the client reads "stack overflow"
/// (not the out-of-bounds access a Rust plugin's overflowing stack in linear memory makes).
#[test]
fn a_stack_overflow_is_called_one() {
    let reg = registry(&format!(
        "[plugins.deep-recursion]\npath = {}\n",
        toml_path(&fixture("deep-recursion"))
    ));
    let e = reg
        .validate(9013, &user(1), br#"{"text":"misbehave"}"#)
        .unwrap_err();
    assert_eq!(e.code(), "plugin_failed", "{e}");
    let message = e.to_string();
    assert!(message.contains("stack overflow"), "{message}");
    assert!(!message.contains("out of bounds"), "{message}");
    assert!(!message.contains('\n'), "{message}");
    // The plugin serves the next message on a fresh instance.
    assert!(reg.validate(9013, &user(1), br#"{"text":"ok"}"#).is_ok());
}
