//! `/metrics` as Prometheus scrapes it, after real traffic on a real server: the counters
//! move by exactly what the clients did; the address of its own needs no token; every
//! series is in docs/operations.md and nothing there is missing from the server. And the
//! log lines of a request and of a connection carry their ids.

#[macro_use]
mod common;

use std::collections::BTreeMap;

use common::server::*;
use serde_json::{Value, json};

/// One sample: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// The samples of Prometheus text (comments skipped); panics on a line that is not one.
fn parse(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line.rsplit_once(' ').expect("name and value");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value: {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.strip_suffix('}').expect("closing brace")),
            None => (series, ""),
        };
        let mut map = BTreeMap::new();
        // Label values here hold no commas or escaped quotes.
        for pair in labels.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').expect("label=value");
            map.insert(k.to_string(), v.trim_matches('"').to_string());
        }
        out.push((name.to_string(), map, value));
    }
    out
}

/// The sum of the samples of `name` whose labels include `labels`.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

async fn scrape(s: &Server) -> Vec<Sample> {
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let a = request(&s.addr, "GET", "/metrics", &[("Authorization", &auth)], "").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(
        a.header("content-type")
            .is_some_and(|c| c.starts_with("text/plain")),
        "{:?}",
        a.headers
    );
    parse(&a.body)
}

on_both!(a_committer_remembers_the_conversations_its_first_messages_created);

/// First messages to many peers at once create their conversations in the batches that
/// carry them; the next message to each of them is written from what its committer
/// remembers (`path="remembered"`), none of them run again because what it remembered
/// had moved (`stale`) or read under locks again (`locked`).
async fn a_committer_remembers_the_conversations_its_first_messages_created(b: Backend) {
    let (_db, s) = setup(&b, "remembered", FAST).await;
    let alice = s.user("alice").await;
    let peers: Vec<String> = (0..24).map(|k| format!("peer{k}")).collect();
    for p in &peers {
        s.user(p).await;
    }
    let mut a = s.connect(&alice, "phone").await;
    let paths = |samples: &[Sample]| {
        ["remembered", "stale", "locked"]
            .map(|path| value(samples, "courier_commit_paths_total", &[("path", path)]))
    };
    for round in 0..2 {
        let before = paths(&scrape(&s).await);
        for p in &peers {
            let id = format!("{p}-{round}");
            a.send(text(&id, &id, peer(p), "hi")).await;
        }
        for _ in &peers {
            let (ack, _) = a
                .until(|f| f["type"] == "ack" || f["type"] == "error")
                .await;
            assert_eq!(ack["type"], "ack", "{ack}");
        }
        let after = paths(&scrape(&s).await);
        let [remembered, stale, locked] = [0, 1, 2].map(|i| after[i] - before[i]);
        match round {
            0 => assert!(locked >= 1.0, "the first messages were decided locked"),
            _ => assert_eq!(
                (stale, locked),
                (0.0, 0.0),
                "the second messages ({remembered} batches remembered)"
            ),
        }
        assert!(remembered + locked >= 1.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counters_move_by_what_the_clients_did() {
    let db = Db::new(&Backend::Sqlite, "metrics").await;
    let s = Server::start(&db, FAST).await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let mut a = s.connect(&alice, "phone").await;
    let mut b = s.connect(&bob, "phone").await;
    let before = scrape(&s).await;
    // Series of fixed labels are there before anything happened, at 0.
    for name in [
        "courier_commit_failures_total",
        "courier_outbox_dropped_total",
        "courier_pull_seconds_count",
        "courier_slow_consumer_disconnects_total",
    ] {
        assert!(
            before.iter().any(|(n, _, _)| n == name),
            "{name} is missing before any traffic"
        );
    }
    // A method HTTP does not have is one label value, not one per name.
    for method in ["FOOBAR", "XYZZY"] {
        assert_eq!(
            request(&s.addr, method, "/healthz", &[], "").await.status,
            405
        );
    }
    let delta = |after: &[Sample], name: &str, labels: &[(&str, &str)]| {
        value(after, name, labels) - value(&before, name, labels)
    };

    // Five stored sends, one resend, one the plugin rejects, one of a kind nobody has.
    let mut cid = 0;
    for i in 0..5 {
        let ack = send_ok(
            &mut a,
            text(&i.to_string(), &format!("m-{i}"), peer("bob"), "hi"),
        )
        .await;
        cid = ack["conversationId"].as_i64().unwrap();
    }
    let dup = send_ok(&mut a, text("r", "m-0", peer("bob"), "hi")).await;
    assert_eq!(dup["duplicate"], json!(true));
    let e = send_err(&mut a, text("x", "m-x", peer("bob"), "")).await;
    assert_eq!(e["code"], "payload_invalid");
    let mut unknown = text("u", "m-u", peer("bob"), "hi");
    unknown["contentType"] = json!(4242);
    assert_eq!(
        send_err(&mut a, unknown).await["code"],
        "content_type_unknown"
    );
    // A live kind, frames the protocol does not have, a ping.
    let typing = json!({"type": "send", "id": "t", "clientMsgId": "t-1", "conversationType": 1,
        "conversationId": cid, "contentType": 5, "payload": {"state": "typing"}});
    send_ok(&mut a, typing).await;
    a.send(json!({"type": "nope", "id": "n"})).await;
    a.expect("error").await;
    a.send_text("not json").await;
    a.expect("error").await;
    a.send(json!({"type": "ping", "id": "p"})).await;
    a.expect("pong").await;
    // Bob hears the five (the resend is pushed again) and reads them.
    let mut seqs = std::collections::BTreeSet::new();
    while seqs.len() < 5 {
        let (n, _) = b
            .until(|f| f["type"] == "notify" && f["contentType"] == 1)
            .await;
        seqs.insert(n["seq"].as_i64().unwrap());
    }
    b.send(json!({"type": "read", "id": "rd", "conversationId": cid, "seq": 5}))
        .await;
    b.until(|f| f["type"] == "ack" && f["id"] == "rd").await;
    // A pull, and a friend request (an event in both users' streams).
    let page = s
        .get(
            &bob,
            &format!("/v1/conversations/{cid}/messages?afterSeq=0"),
        )
        .await;
    assert_eq!(page["messages"].as_array().unwrap().len(), 5, "{page}");
    ok(
        &s,
        &alice,
        "POST",
        "/v1/friends/requests",
        Some(json!({"userId": "bob"})),
    )
    .await;

    let after = scrape(&s).await;
    let sends = "courier_sends_total";
    assert_eq!(
        delta(&after, sends, &[("content_type", "1"), ("outcome", "ok")]),
        5.0
    );
    assert_eq!(
        delta(
            &after,
            sends,
            &[("content_type", "1"), ("outcome", "duplicate")]
        ),
        1.0
    );
    assert_eq!(
        delta(
            &after,
            sends,
            &[("content_type", "1"), ("outcome", "payload_invalid")]
        ),
        1.0
    );
    assert_eq!(
        delta(
            &after,
            sends,
            &[
                ("content_type", "unknown"),
                ("outcome", "content_type_unknown")
            ]
        ),
        1.0
    );
    assert_eq!(
        delta(&after, sends, &[("content_type", "5"), ("outcome", "ok")]),
        1.0
    );
    let acks = "courier_send_ack_seconds_count";
    assert_eq!(delta(&after, acks, &[("delivery", "stored")]), 6.0);
    assert_eq!(delta(&after, acks, &[("delivery", "live")]), 1.0);

    let frames_in = "courier_frames_in_total";
    assert_eq!(delta(&after, frames_in, &[("type", "send")]), 9.0);
    assert_eq!(delta(&after, frames_in, &[("type", "read")]), 1.0);
    assert_eq!(delta(&after, frames_in, &[("type", "ping")]), 1.0);
    assert_eq!(delta(&after, frames_in, &[("type", "unknown")]), 1.0);
    assert_eq!(delta(&after, frames_in, &[("type", "invalid")]), 1.0);
    let frames_out = "courier_frames_out_total";
    assert!(delta(&after, frames_out, &[("type", "notify")]) >= 6.0);
    assert!(delta(&after, frames_out, &[("type", "ack")]) >= 8.0);
    assert_eq!(delta(&after, frames_out, &[("type", "pong")]), 1.0);
    assert!(delta(&after, frames_out, &[("type", "error")]) >= 4.0);

    // Six sends and one read were committed, in one or more batches.
    assert_eq!(delta(&after, "courier_commit_batch_ops_sum", &[]), 7.0);
    assert!(delta(&after, "courier_commit_batch_ops_count", &[]) >= 1.0);
    assert!(delta(&after, "courier_commit_seconds_count", &[]) >= 1.0);

    // The text plugin ran for the six stored sends and the rejected one.
    let calls = "courier_plugin_calls_total";
    assert_eq!(
        delta(
            &after,
            calls,
            &[("plugin", "text"), ("outcome", "accepted")]
        ),
        6.0
    );
    assert_eq!(
        delta(
            &after,
            calls,
            &[("plugin", "text"), ("outcome", "rejected")]
        ),
        1.0
    );
    assert!(delta(&after, "courier_plugin_fuel_total", &[("plugin", "text")]) > 0.0);
    assert_eq!(
        value(&after, "courier_plugin_enabled", &[("plugin", "text")]),
        1.0
    );

    assert_eq!(
        delta(
            &after,
            "courier_pull_seconds_count",
            &[("what", "messages")]
        ),
        1.0
    );
    assert_eq!(
        delta(
            &after,
            "courier_http_requests_total",
            &[("route", "POST /v1/friends/requests"), ("status", "200")]
        ),
        1.0
    );
    assert_eq!(
        delta(
            &after,
            "courier_user_stream_events_total",
            &[("event", "friend.request")]
        ),
        2.0
    );
    assert_eq!(
        delta(
            &after,
            "courier_http_requests_total",
            &[("route", "OTHER /healthz"), ("status", "405")]
        ),
        2.0
    );
    assert!(
        !after
            .iter()
            .any(|(_, l, _)| l.get("route").is_some_and(|r| r.contains("FOOBAR"))),
        "a made-up method became a label"
    );
    assert_eq!(value(&after, "courier_connections", &[]), 2.0);
    assert_eq!(value(&after, "courier_users_online", &[]), 2.0);
    assert!(value(&after, "courier_db_pool_max", &[("pool", "read")]) >= 1.0);
    assert_eq!(
        value(
            &after,
            "courier_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );

    // Without the admin token: refused.
    let (status, body) = s.http("GET", "/metrics", Some(&alice.token), None).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (401, &json!("unauthorized"))
    );

    // A connection that goes is no longer counted.
    b.close().await;
    let left = async {
        loop {
            if value(&scrape(&s).await, "courier_connections", &[]) == 1.0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(WAIT, left)
        .await
        .expect("the closed connection leaves the gauge");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_address_needs_no_token_and_serves_nothing_else() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let db = Db::new(&Backend::Sqlite, "metrics-listen").await;
    let server = format!("metrics_listen = \"127.0.0.1:{port}\"\n");
    let s = Server::start_sections(
        &db,
        Sections {
            server: &server,
            ..Sections::default()
        },
    )
    .await;
    let alice = s.user("alice").await;
    let at = format!("127.0.0.1:{port}");
    // The listener is up once the server printed its main address.
    let a = request(&at, "GET", "/metrics", &[], "").await;
    assert_eq!(a.status, 200, "{}", a.body);
    let samples = parse(&a.body);
    assert_eq!(
        value(
            &samples,
            "courier_http_requests_total",
            &[("route", "POST /v1/auth/register"), ("status", "201")]
        ),
        1.0
    );
    assert!(a.header("x-request-id").is_some(), "{:?}", a.headers);
    let (status, body) = http_at(&at, "GET", "/v1/conversations", Some(&alice.token), "").await;
    assert_eq!((status, &body["error"]["code"]), (404, &json!("not_found")));
    let (status, body) = http_at(&at, "POST", "/metrics", None, "").await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (405, &json!("method_not_allowed"))
    );
}

/// Every series the server exports is listed in docs/operations.md, and the docs name
/// none it does not export.
#[test]
fn docs_list_every_series() {
    let docs = std::fs::read_to_string(common::repo_root().join("docs/operations.md")).unwrap();
    let named: std::collections::BTreeSet<String> = docs
        .split('`')
        .filter(|w| w.starts_with("courier_") && !w.contains(' '))
        .map(|w| w.split('{').next().unwrap().to_string())
        .collect();
    let exported: std::collections::BTreeSet<String> = courier::telemetry::SERIES
        .iter()
        .map(|s| s.name.to_string())
        .collect();
    let missing: Vec<_> = exported.difference(&named).collect();
    assert!(missing.is_empty(), "not in docs/operations.md: {missing:?}");
    // Histograms are queried by their `_bucket`, `_sum` and `_count` series.
    let unknown: Vec<_> = named
        .iter()
        .filter(|n| {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n);
            !exported.contains(*n) && !exported.contains(base)
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/operations.md names series the server does not have: {unknown:?}"
    );
    // The example dashboard queries only series the server has.
    let dashboard =
        std::fs::read_to_string(common::repo_root().join("docs/grafana-courier.json")).unwrap();
    let _: Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let mut rest = dashboard.as_str();
    while let Some(i) = rest.find("courier_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name);
        assert!(
            exported.contains(&name) || exported.contains(base),
            "the dashboard queries {name}, which the server does not have"
        );
        rest = &rest[i + name.len()..];
    }
}

/// The JSON log: a request's lines carry its id (the `x-request-id` it sent, echoed on the
/// response), a connection's carry its id and device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_lines_carry_request_and_connection_ids() {
    let db = Db::new(&Backend::Sqlite, "log-ids").await;
    let extra = "[log]\nformat = \"json\"\nfilter = \"info,courier::gateway=debug\"\n";
    let s = Server::start(&db, extra).await;
    let alice = s.user("alice").await;
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let a = request(
        &s.addr,
        "POST",
        "/admin/plugins/reload",
        &[("Authorization", &auth), ("x-request-id", "req-test-42")],
        "",
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-request-id"), Some("req-test-42"));
    // An id that is not a sane one is replaced.
    let odd = request(&s.addr, "GET", "/healthz", &[("x-request-id", "a b")], "").await;
    let made = odd.header("x-request-id").expect("an id is made");
    assert!(made != "a b" && !made.is_empty());
    let ws = s.connect(&alice, "laptop-7").await;
    let conn = ws.hello["sessionId"].clone();
    ws.close().await;

    let lines = || -> Vec<Value> {
        s.log()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let reload = lines()
        .into_iter()
        .find(|l| l["fields"]["message"] == "reload done")
        .expect("the reload is logged");
    assert_eq!(reload["span"]["id"], "req-test-42", "{reload}");
    assert_eq!(reload["span"]["route"], "POST /admin/plugins/reload");
    let gone = async {
        loop {
            if let Some(l) = lines()
                .into_iter()
                .find(|l| l["fields"]["message"] == "disconnected")
            {
                return l;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    let line = tokio::time::timeout(WAIT, gone)
        .await
        .expect("the disconnect is logged");
    assert_eq!(line["span"]["device"], "laptop-7", "{line}");
    assert_eq!(line["span"]["user"], "alice", "{line}");
    assert_eq!(line["span"]["conn"], conn, "{line}");
}
