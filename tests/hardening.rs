//! Slow, idle and hostile clients against the real binary on loopback: stalled and idle
//! HTTP connections, connection caps, bodies left unread, the WebSocket closing handshake,
//! slow readers held to a byte budget, bounded password hashing and the login limits
//! (properties of the HTTP and WebSocket layers, not of the database: SQLite); and a
//! PostgreSQL that drops every connection mid-burst, or stops answering on them.

#[macro_use]
mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use common::groups::gtext;
use common::server::{
    ADMIN_TOKEN, Backend, Db, Sections, Server, User, Ws, call, conv, ok, peer, send_err, send_ok,
    setup, text, with_token,
};
use common::webhook::{Mode, Receiver};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

/// The longest any test here waits for something it expects (a safety net, far above the
/// deadlines under test).
const SAFETY: Duration = Duration::from_secs(60);

async fn server(sections: Sections<'_>, name: &str) -> (Db, Server) {
    let db = Db::new(&Backend::Sqlite, name).await;
    let s = Server::start_sections(&db, sections).await;
    (db, s)
}

/// A TCP connection to the server from the loopback address `from` (127.0.0.x: every
/// address of 127/8 is this machine, so tests can be several clients).
async fn connect_from(server: &Server, from: [u8; 4]) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::from((from, 0)))
        .expect("bind a loopback address");
    socket
        .connect(server.addr.parse().unwrap())
        .await
        .expect("connect")
}

/// An HTTP answer as read off the wire.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

/// Reads one HTTP/1.1 response (head, then a `content-length` body); `None` if the
/// connection ended first.
async fn read_answer(conn: &mut TcpStream) -> Option<Answer> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        match tokio::time::timeout(SAFETY, conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return None,
            Ok(Ok(n)) => raw.extend_from_slice(&buf[..n]),
            Err(_) => panic!("no answer within {SAFETY:?}"),
        }
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = raw[head_end + 4..].to_vec();
    while body.len() < length {
        match tokio::time::timeout(SAFETY, conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => body.extend_from_slice(&buf[..n]),
            Err(_) => panic!("no body within {SAFETY:?}"),
        }
    }
    Some(Answer {
        status,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    })
}

/// A keep-alive request on `conn` and its answer.
async fn request(
    conn: &mut TcpStream,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> Option<Answer> {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: courier\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.ok()?;
    read_answer(conn).await
}

/// Waits until the server closes `conn`; the bytes it sent meanwhile. Panics after
/// `SAFETY`.
async fn until_closed(conn: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(SAFETY, conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return got,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!("the server kept the connection open past {SAFETY:?}"),
        }
    }
}

/// A user a real client registers, and a WebSocket round trip with it.
async fn a_real_client_is_served(s: &Server, name: &str) {
    let (status, body) = s.http("GET", "/healthz", None, None).await;
    assert_eq!((status, &body["status"]), (200, &json!("ok")), "{body}");
    let u = s.user(name).await;
    let mut ws = s.connect(&u, "phone").await;
    ws.send(json!({"type": "ping", "id": "p"})).await;
    ws.expect("pong").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_and_idle_connections_are_closed_while_real_clients_are_served() {
    let (_db, s) = server(
        Sections {
            server: "header_timeout_secs = 2\nbody_timeout_secs = 2\nidle_timeout_secs = 2\n\
                     max_connections_per_address = 0\n",
            ..Sections::default()
        },
        "stalled",
    )
    .await;
    const EACH: usize = 100;
    let from = [127, 0, 0, 9];
    let started = Instant::now();
    let mut silent = Vec::new();
    let mut half_head = Vec::new();
    let mut half_body = Vec::new();
    let mut idle = Vec::new();
    for _ in 0..EACH {
        silent.push(connect_from(&s, from).await);
        let mut c = connect_from(&s, from).await;
        c.write_all(b"POST /v1/auth/login HTTP/1.1\r\nHost: courier\r\nContent-")
            .await
            .unwrap();
        half_head.push(c);
        let mut c = connect_from(&s, from).await;
        c.write_all(
            b"POST /v1/auth/login HTTP/1.1\r\nHost: courier\r\nContent-Type: application/json\r\n\
              Content-Length: 1000\r\n\r\n{",
        )
        .await
        .unwrap();
        half_body.push(c);
        let mut c = connect_from(&s, from).await;
        let a = request(&mut c, "GET", "/healthz", None, "").await.unwrap();
        assert_eq!(a.status, 200);
        idle.push(c);
    }
    // A head sent one byte at a time keeps arriving, and is still cut off.
    let mut drip = connect_from(&s, from).await;
    let dripping = tokio::spawn(async move {
        for b in b"GET /healthz HTTP/1.1\r\nHost: courier\r\nX-Slow: "
            .iter()
            .cycle()
        {
            if drip.write_all(&[*b]).await.is_err() {
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            if started.elapsed() > SAFETY {
                panic!("a drip-fed head was never cut off");
            }
        }
        unreachable!()
    });

    // 401 connections held open: everyone else is still served.
    a_real_client_is_served(&s, "alice").await;

    for c in &mut silent {
        assert!(
            until_closed(c).await.is_empty(),
            "a silent connection got bytes"
        );
    }
    for c in &mut half_head {
        until_closed(c).await;
    }
    for c in &mut half_body {
        let a = read_answer(c).await.expect("an answer to the stalled body");
        assert_eq!((a.status, a.code()), (408, "request_timeout"), "{a:?}");
        assert_eq!(a.header("connection"), Some("close"));
        until_closed(c).await;
    }
    for c in &mut idle {
        assert!(
            until_closed(c).await.is_empty(),
            "an idle connection got bytes"
        );
    }
    dripping.await.unwrap();
    // And afterwards, as before.
    a_real_client_is_served(&s, "bob").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_connection_in_use_is_not_closed_as_idle() {
    let (_db, s) = server(
        Sections {
            server: "idle_timeout_secs = 3\n",
            ..Sections::default()
        },
        "keep-alive",
    )
    .await;
    let mut c = connect_from(&s, [127, 0, 0, 1]).await;
    // Requests one second apart for six seconds: never idle for three.
    for _ in 0..6 {
        let a = request(&mut c, "GET", "/healthz", None, "").await;
        assert_eq!(a.map(|a| a.status), Some(200));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(until_closed(&mut c).await.is_empty());
}

/// `courier_refusals_total{guard}` on the admin's `/metrics`.
async fn refusals(s: &Server, guard: &str) -> u64 {
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let a =
        common::server::request(&s.addr, "GET", "/metrics", &[("Authorization", &auth)], "").await;
    let sample = format!("courier_refusals_total{{guard=\"{guard}\"}} ");
    a.body
        .lines()
        .find_map(|l| l.strip_prefix(&sample))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {sample} in /metrics: {}", a.body))
}

/// Waits (bounded by `SAFETY`) until the server closed connections for `guard`.
async fn until_counted(s: &Server, guard: &str, n: u64) {
    let started = Instant::now();
    while refusals(s, guard).await < n {
        assert!(
            started.elapsed() < SAFETY,
            "no connection closed for {guard}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_phase_of_a_kept_connection_is_held_to_its_own_deadline() {
    // Idle far longer than the safety net: a connection held to it would never close here.
    let (_db, s) = server(
        Sections {
            server: "header_timeout_secs = 2\nrequest_timeout_secs = 2\nidle_timeout_secs = 600\n",
            ..Sections::default()
        },
        "phases",
    )
    .await;
    // A head begun on a kept connection idle for a while: the head's deadline, from its
    // first byte.
    let mut c = connect_from(&s, [127, 0, 0, 1]).await;
    let a = request(&mut c, "GET", "/healthz", None, "").await.unwrap();
    assert_eq!(a.status, 200);
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    assert!(until_closed(&mut c).await.is_empty());
    assert_eq!(refusals(&s, "header_timeout").await, 1);

    // A client that asks for large answers and stops reading them: cut off by the
    // request's deadline, counted as such, while its answers cannot all be written.
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut c = socket.connect(s.addr.parse().unwrap()).await.unwrap();
    let ask = "GET /v1/openapi.json HTTP/1.1\r\nHost: courier\r\n\r\n".repeat(400);
    c.write_all(ask.as_bytes()).await.unwrap();
    until_counted(&s, "request_timeout", 1).await;
    until_closed(&mut c).await;
    assert_eq!(refusals(&s, "idle").await, 0);

    // Idle shorter than the head's deadline: the idle one closes a kept connection.
    let (_db, s) = server(
        Sections {
            server: "header_timeout_secs = 600\nidle_timeout_secs = 2\n",
            ..Sections::default()
        },
        "phases-idle",
    )
    .await;
    let mut c = connect_from(&s, [127, 0, 0, 1]).await;
    let a = request(&mut c, "GET", "/healthz", None, "").await.unwrap();
    assert_eq!(a.status, 200);
    assert!(until_closed(&mut c).await.is_empty());
    assert_eq!(refusals(&s, "idle").await, 1);
    assert_eq!(refusals(&s, "header_timeout").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_caps_refuse_with_503_and_log_once_per_interval() {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let (_db, s) = server(
        Sections {
            server: "max_connections = 300\nmax_connections_per_address = 200\n",
            ..Sections::default()
        },
        "caps",
    )
    .await;
    let attacker = [127, 0, 0, 7];
    let mut held = Vec::new();
    for _ in 0..200 {
        held.push(connect_from(&s, attacker).await);
    }
    // A request on the first held connection is answered: they were all admitted.
    let a = request(&mut held[0], "GET", "/healthz", None, "")
        .await
        .unwrap();
    assert_eq!(a.status, 200);
    // Past the cap per address: refused, with a clear answer.
    for _ in 0..50 {
        let mut c = connect_from(&s, attacker).await;
        let a = read_answer(&mut c).await.expect("a refusal");
        assert_eq!((a.status, a.code()), (503, "too_many_connections"), "{a:?}");
        assert_eq!(a.header("connection"), Some("close"));
        assert!(a.header("retry-after").is_some());
        let id = a.header("x-request-id").unwrap_or_default();
        assert!(
            id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{a:?}"
        );
    }
    // Another client is served meanwhile.
    let mut other = connect_from(&s, [127, 0, 0, 8]).await;
    let a = request(&mut other, "GET", "/healthz", None, "")
        .await
        .unwrap();
    assert_eq!(a.status, 200);
    // Up to the total cap from other addresses, then refused too.
    let mut more = Vec::new();
    for i in 0..99 {
        more.push(connect_from(&s, [127, 0, 1, (i % 50) as u8 + 1]).await);
    }
    let mut c = connect_from(&s, [127, 0, 2, 1]).await;
    let a = read_answer(&mut c).await.expect("a refusal");
    assert_eq!((a.status, a.code()), (503, "too_many_connections"), "{a:?}");
    // A place freed is a place taken.
    drop(held.pop());
    drop(more.pop());
    let started = Instant::now();
    loop {
        let mut c = connect_from(&s, [127, 0, 2, 2]).await;
        match request(&mut c, "GET", "/healthz", None, "").await {
            Some(a) if a.status == 200 => break,
            _ if started.elapsed() < SAFETY => tokio::time::sleep(Duration::from_millis(50)).await,
            other => panic!("no place freed: {other:?}"),
        }
    }
    // The refusals are counted and logged in a summary, not one line per connection.
    let started = Instant::now();
    let per_address = "connections refused over server.max_connections_per_address";
    loop {
        let log = s.log();
        let total: u64 = log
            .lines()
            .filter_map(|l| l.split_once(per_address).map(|(before, _)| before))
            .filter_map(|before| before.rsplit([' ', ';', ':']).nth(1)?.parse::<u64>().ok())
            .sum();
        if total >= 50 {
            assert_eq!(total, 50, "{log}");
            let lines = log.lines().filter(|l| l.contains(per_address)).count();
            assert!(
                lines <= 2,
                "one summary per interval, not per refusal: {log}"
            );
            break;
        }
        assert!(
            started.elapsed() < SAFETY,
            "no summary of refusals in the log: {log}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_left_unread_says_connection_close() {
    let (_db, s) = server(Sections::default(), "unread-body").await;
    let alice = s.user("alice").await;
    let body = json!({"clientMsgId": "k-1", "conversationType": 1, "peerId": "alice",
                      "contentType": 1, "payload": {"text": "hi"}})
    .to_string();
    // No token: answered before the body is read, and the connection says it closes.
    let mut c = connect_from(&s, [127, 0, 0, 1]).await;
    let a = request(&mut c, "POST", "/v1/messages", None, &body)
        .await
        .unwrap();
    assert_eq!((a.status, a.code()), (401, "unauthorized"));
    assert_eq!(a.header("connection"), Some("close"), "{a:?}");
    until_closed(&mut c).await;
    // Too large: the same.
    let mut c = connect_from(&s, [127, 0, 0, 1]).await;
    let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(1_200_000));
    let a = request(&mut c, "POST", "/v1/messages", Some(&alice.token), &big)
        .await
        .unwrap();
    assert_eq!((a.status, a.code()), (413, "request_too_large"));
    // Either the server read the body away (then the connection carries on) or it says
    // it closes the connection (and does).
    if a.header("connection") == Some("close") {
        until_closed(&mut c).await;
    } else {
        let a = request(&mut c, "GET", "/healthz", None, "").await;
        assert_eq!(a.map(|a| a.status), Some(200));
    }
    // Announced too large by a client that waits for `100 Continue`: refused at once,
    // before it sends the body, and the connection closes.
    let mut c = connect_from(&s, [127, 0, 0, 1]).await;
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: courier\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nExpect: 100-continue\r\n\
         Content-Length: 50000000\r\n\r\n",
        alice.token
    );
    c.write_all(head.as_bytes()).await.unwrap();
    let a = read_answer(&mut c)
        .await
        .expect("an answer without the body");
    assert_eq!((a.status, a.code()), (413, "request_too_large"), "{a:?}");
    assert_eq!(a.header("connection"), Some("close"), "{a:?}");
    until_closed(&mut c).await;
    // A body read whole keeps the connection for the next request.
    let mut c = connect_from(&s, [127, 0, 0, 1]).await;
    let a = request(
        &mut c,
        "POST",
        "/v1/auth/login",
        None,
        r#"{"userId": "alice", "password": "wrong-password"}"#,
    )
    .await
    .unwrap();
    assert_eq!((a.status, a.code()), (401, "invalid_credentials"));
    assert_eq!(a.header("connection"), None, "{a:?}");
    let a = request(&mut c, "GET", "/healthz", None, "").await.unwrap();
    assert_eq!(a.status, 200);
}

async fn ws_of(s: &Server, u: &User, device: &str) -> Ws {
    s.connect(u, device).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_closes_follow_rfc_6455() {
    let (_db, s) = server(
        Sections {
            extra: "[gateway]\nmax_frame_bytes = 1024\noutbox_bytes = 65536\n",
            ..Sections::default()
        },
        "ws-close",
    )
    .await;
    let alice = s.user("alice").await;
    // The client's close is answered with its own code, before the server closes TCP.
    for code in [1000, 4321] {
        let ws = ws_of(&s, &alice, "phone").await;
        assert_eq!(ws.close_with(code).await, Some(code));
    }
    // Text that is not UTF-8: 1007.
    let mut ws = ws_of(&s, &alice, "phone").await;
    ws.send_frame(Frame::message(
        vec![b'{', 0xff, 0xfe, b'}'],
        OpCode::Data(Data::Text),
        true,
    ))
    .await;
    assert_eq!(ws.closed().await.0, Some(1007));
    // A frame far above four times the limit: 1009 arrives every time, not a reset, though
    // most of the frame is still on its way when the server refuses it.
    for _ in 0..10 {
        let mut ws = ws_of(&s, &alice, "phone").await;
        ws.send_frame(Frame::message(
            vec![b'x'; 2 << 20],
            OpCode::Data(Data::Text),
            true,
        ))
        .await;
        assert_eq!(ws.closed().await.0, Some(1009));
    }
    // The connection after all of that works.
    let mut ws = ws_of(&s, &alice, "phone").await;
    ws.send(json!({"type": "ping", "id": "p"})).await;
    ws.expect("pong").await;
}

/// The server's resident memory, in MiB.
fn rss_mib(s: &Server) -> f64 {
    s.rss_kib().expect("the server's VmRSS (Linux /proc)") as f64 / 1024.0
}

/// Samples the server's RSS every 20 ms until `stop` is set; the highest, in MiB.
fn sample_peak(
    s: &Server,
) -> (
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    tokio::task::JoinHandle<f64>,
) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pid = s.pid().unwrap();
    let flag = stop.clone();
    let sampler = tokio::spawn(async move {
        let mut peak = 0f64;
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status"))
                && let Some(kib) = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            {
                peak = peak.max(kib / 1024.0);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        peak
    });
    (stop, sampler)
}

/// Waits (up to `SAFETY`) until the server's RSS is at most `mib`, and a second more for
/// it to settle; what it is then.
async fn rss_falls_to(s: &Server, mib: f64) -> f64 {
    let started = Instant::now();
    while rss_mib(s) > mib && started.elapsed() < SAFETY {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    rss_mib(s)
}

/// The byte budget of `slow_readers_are_held_to_a_byte_budget`, in MiB.
const OUTBOX_MIB: usize = 1;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_readers_are_held_to_a_byte_budget_and_the_memory_comes_back() {
    let extra = format!(
        "[gateway]\nmax_frame_bytes = 65536\noutbox_bytes = {}\nsend_rate_per_sec = 1000000\n\
         send_burst = 1000000\n",
        OUTBOX_MIB << 20
    );
    let (_db, s) = server(
        Sections {
            extra: &extra,
            ..Sections::default()
        },
        "byte-budget",
    )
    .await;
    let alice = s.user("alice").await;
    let mut sender = s.connect(&alice, "sender").await;
    const READERS: usize = 10;
    let mut stuck = Vec::new();
    let mut cids = Vec::new();
    for i in 0..READERS {
        let bob = s.user(&format!("bob{i}")).await;
        stuck.push(Ws::connect_with_buffer(&s.addr, &bob.token, "stuck", 8192).await);
        let ack = send_ok(
            &mut sender,
            text(&format!("hi{i}"), &format!("hi-{i}"), peer(&bob.id), "hi"),
        )
        .await;
        cids.push(ack["conversationId"].as_i64().unwrap());
    }
    let baseline = rss_mib(&s);
    let (stop, sampler) = sample_peak(&s);
    // Distinct 16 KB messages to each reader, none of which reads: rounds until every
    // reader must have overflowed its budget (and the kernel's buffers), at most 40.
    let big = "😀".repeat(3990);
    let mut sent = 0usize;
    for round in 0..40 {
        let frames: Vec<Value> = (0..READERS * 20)
            .map(|i| {
                let cid = cids[i % READERS];
                text(
                    &format!("{round}-{i}"),
                    &format!("big-{round}-{i}"),
                    json!({ "conversationId": cid }),
                    &format!("{round} {i} {big}"),
                )
            })
            .collect();
        let answers = sender.send_all(&frames, 200).await;
        assert!(answers.values().all(|a| a["type"] == "ack"));
        sent += 20;
        if s.log().contains("slow consumers") && round >= 10 {
            break;
        }
    }
    // Every reader was dropped as a slow consumer before it had everything.
    for ws in &mut stuck {
        let (code, frames) = ws.closed().await;
        assert!(
            frames.len() < sent + 1,
            "a reader that never read got all {sent} messages"
        );
        assert!(matches!(code, Some(4008) | None), "closed with {code:?}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.await.unwrap();
    drop(stuck);
    let after = rss_falls_to(&s, baseline + 12.0).await;
    println!(
        "server RSS with {READERS} stuck readers, outbox_bytes {OUTBOX_MIB} MiB: \
         before {baseline:.1} MiB, peak {peak:.1} MiB, after they were dropped {after:.1} MiB"
    );
    // Queued frames: at most the budget per reader (without it, 1,024 frames of 16 KB
    // each: 160 MiB); the rest is the senders' traffic in flight.
    assert!(
        peak - baseline < (READERS * OUTBOX_MIB) as f64 + 112.0,
        "peak {peak:.1} MiB over a baseline of {baseline:.1} MiB"
    );
    assert!(
        after <= baseline + 12.0,
        "memory not returned: {after:.1} MiB after, {baseline:.1} MiB before"
    );
}

/// A reader that stops reading while pushes keep coming, then reads again, gets every push
/// whole and in order: the kernel's buffers fill partway through a frame, and the
/// connection's task finishes that frame before it writes the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_pauses_gets_every_push_whole_and_in_order() {
    let extra = "[gateway]\nmax_frame_bytes = 65536\noutbox_frames = 8192\n\
                 outbox_bytes = 67108864\nsend_rate_per_sec = 1000000\nsend_burst = 1000000\n";
    let (_db, s) = server(
        Sections {
            extra,
            ..Sections::default()
        },
        "paused-reader",
    )
    .await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let mut sender = s.connect(&alice, "sender").await;
    // A small receive buffer, so the server's writes stop partway through a frame soon.
    let mut reader = Ws::connect_with_buffer(&s.addr, &bob.token, "paused", 8192).await;
    // Texts of 0.5 to 3.8 KB (a text holds at most 4,000 characters), their lengths
    // stepping by an odd amount so frames end anywhere in the socket's buffer: about 2.6
    // MB in all, sent while the reader reads nothing (far past the reader's 8 KiB
    // buffer, and sent well within the 30 s a write may wait for a reader).
    const N: usize = 1200;
    let body = |i: usize| format!("{i:05} {}", "x".repeat(500 + i * 1237 % 3300));
    let frames: Vec<Value> = (0..N)
        .map(|i| text(&format!("t{i}"), &format!("p-{i}"), peer(&bob.id), &body(i)))
        .collect();
    for chunk in frames.chunks(500) {
        let answers = sender.send_all(chunk, 100).await;
        if let Some(refused) = answers.values().find(|a| a["type"] != "ack") {
            panic!("a send refused: {refused}");
        }
    }
    for i in 0..N {
        let n = reader.expect("notify").await;
        assert_eq!(
            n["payload"]["text"].as_str(),
            Some(body(i).as_str()),
            "push {i} out of order or broken"
        );
    }
    // And the connection goes on as before.
    send_ok(&mut sender, text("last", "p-last", peer(&bob.id), "after")).await;
    assert_eq!(reader.expect("notify").await["payload"]["text"], "after");
}

/// Registers (or logs in) as a client honouring `503 busy` and `Retry-After` would; the
/// answer that was not `busy`.
async fn auth_call(s: &Server, path: &str, user: &str) -> Answer {
    let body = json!({"userId": user, "password": format!("password-of-{user}")}).to_string();
    loop {
        let mut c = connect_from(s, [127, 0, 0, 1]).await;
        let a = request(&mut c, "POST", path, None, &body)
            .await
            .expect("an answer");
        if a.status == 503 && a.code() == "busy" {
            let secs = a
                .header("retry-after")
                .and_then(|v| v.parse().ok())
                .unwrap_or(1);
            tokio::time::sleep(Duration::from_secs(secs)).await;
            continue;
        }
        return a;
    }
}

/// The bound `docs/operations.md` states for password hashing: 20 MiB per hashing slot,
/// beyond what the server used before.
const HASH_SLOT_MIB: f64 = 20.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_registrations_and_logins_stay_in_bounded_memory() {
    let (_db, s) = server(
        Sections {
            auth: "hash_concurrency = 2\nhash_queue_secs = 30\n",
            server: "max_connections_per_address = 0\n",
            ..Sections::default()
        },
        "hashing",
    )
    .await;
    a_real_client_is_served(&s, "warm").await;
    let baseline = rss_mib(&s);
    let (stop, sampler) = sample_peak(&s);
    let s = std::sync::Arc::new(s);
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let user = format!("user{i}");
                let a = auth_call(&s, "/v1/auth/register", &user).await;
                assert_eq!(a.status, 201, "register {user}: {a:?}");
                let a = auth_call(&s, "/v1/auth/login", &user).await;
                assert_eq!(a.status, 200, "login {user}: {a:?}");
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.await.unwrap();
    let after = rss_falls_to(&s, baseline + 8.0).await;
    println!(
        "server RSS, 200 concurrent registrations and logins, 2 hashing slots: before \
         {baseline:.1} MiB, peak {peak:.1} MiB, after {after:.1} MiB"
    );
    assert!(
        peak <= baseline + 2.0 * HASH_SLOT_MIB + 32.0,
        "peak {peak:.1} MiB over a baseline of {baseline:.1} MiB"
    );
    assert!(
        after <= baseline + HASH_SLOT_MIB,
        "memory kept: {after:.1} MiB"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_beyond_the_hashing_slots_wait_then_get_busy() {
    let (_db, s) = server(
        Sections {
            auth: "hash_concurrency = 1\nhash_queue_secs = 1\n",
            server: "max_connections_per_address = 0\n",
            ..Sections::default()
        },
        "busy",
    )
    .await;
    s.user("alice").await;
    let body = json!({"userId": "alice", "password": "password-of-"}).to_string();
    let s = std::sync::Arc::new(s);
    // Each hash takes tens of milliseconds: 100 at once cannot all get the one slot
    // within a second.
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let (s, body) = (s.clone(), body.clone());
            tokio::spawn(async move {
                let mut c = connect_from(&s, [127, 0, 0, 1]).await;
                request(&mut c, "POST", "/v1/auth/login", None, &body)
                    .await
                    .expect("an answer")
            })
        })
        .collect();
    let (mut ok, mut busy) = (0, 0);
    for t in tasks {
        let a = t.await.unwrap();
        match (a.status, a.code()) {
            (200, _) => ok += 1,
            (503, "busy") => {
                assert!(a.header("retry-after").is_some(), "{a:?}");
                busy += 1;
            }
            _ => panic!("unexpected {a:?}"),
        }
    }
    assert!(ok >= 1 && busy >= 1, "{ok} logged in, {busy} busy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_are_rate_limited_per_address_and_per_account() {
    let (_db, s) = server(
        Sections {
            auth: "attempts_per_minute_per_address = 5\nfailed_logins_per_hour_per_account = 3\n",
            ..Sections::default()
        },
        "login-limits",
    )
    .await;
    let login =
        |user: &str, password: &str| json!({"userId": user, "password": password}).to_string();
    let call = |from: [u8; 4], path: &'static str, body: String| {
        let s = &s;
        async move {
            let mut c = connect_from(s, from).await;
            request(&mut c, "POST", path, None, &body).await.unwrap()
        }
    };
    let register = |user: &str| json!({"userId": user, "password": "a-good-password"}).to_string();
    // Five attempts a minute from one address (a registration is one), then 429.
    let a = call([127, 0, 0, 11], "/v1/auth/register", register("alice")).await;
    assert_eq!(a.status, 201);
    let a = call([127, 0, 0, 11], "/v1/auth/register", register("bob")).await;
    assert_eq!(a.status, 201);
    for _ in 0..3 {
        let a = call(
            [127, 0, 0, 11],
            "/v1/auth/login",
            login("alice", "a-good-password"),
        )
        .await;
        assert_eq!(a.status, 200);
    }
    let a = call(
        [127, 0, 0, 11],
        "/v1/auth/login",
        login("alice", "a-good-password"),
    )
    .await;
    assert_eq!((a.status, a.code()), (429, "rate_limited"), "{a:?}");
    let retry: u64 = a.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    // Another address is not affected.
    let a = call(
        [127, 0, 0, 12],
        "/v1/auth/login",
        login("alice", "a-good-password"),
    )
    .await;
    assert_eq!(a.status, 200);
    // Three failed logins of one account, from three addresses: then even the right
    // password is refused for a while; another account is not affected.
    for i in 0..3 {
        let a = call(
            [127, 0, 0, 20 + i],
            "/v1/auth/login",
            login("bob", "wrong-password"),
        )
        .await;
        assert_eq!((a.status, a.code()), (401, "invalid_credentials"));
    }
    let a = call(
        [127, 0, 0, 30],
        "/v1/auth/login",
        login("bob", "a-good-password"),
    )
    .await;
    assert_eq!((a.status, a.code()), (429, "rate_limited"), "{a:?}");
    let a = call(
        [127, 0, 0, 31],
        "/v1/auth/login",
        login("alice", "a-good-password"),
    )
    .await;
    assert_eq!(a.status, 200);
}

on_both!(
    logout_and_revoke_all_end_tokens_and_their_connections,
    connections_racing_a_logout_are_closed,
    a_deleted_account_is_never_shown_by_its_name,
    a_deletion_its_tip_kind_cannot_write_changes_nothing,
);

/// Connections opened with a token at the moment it is logged out: each is refused (401)
/// or, if it got its hello, closed with 4003 after it — none stays.
async fn connections_racing_a_logout_are_closed(b: Backend) {
    let (_db, s) = setup(&b, "logout-race", "").await;
    s.user("alice").await;
    for round in 0..10 {
        let token = s.login("alice").await.token;
        let devices: Vec<String> = (0..3).map(|i| format!("d{round}-{i}")).collect();
        let connects =
            futures_util::future::join_all(devices.iter().map(|d| Ws::connect(&s.addr, &token, d)));
        let logout = s.http("POST", "/v1/auth/logout", Some(&token), None);
        let (connected, (status, body)) = tokio::join!(connects, logout);
        assert_eq!(status, 200, "{body}");
        for ws in connected {
            match ws {
                Err(status) => assert_eq!(status, 401, "round {round}"),
                Ok(mut ws) => {
                    let (code, frames) = ws.closed().await;
                    assert_eq!(code, Some(4003), "round {round}: {frames:?}");
                    assert!(
                        frames.iter().any(|f| f["type"] == "kicked"),
                        "round {round}: {frames:?}"
                    );
                }
            }
        }
    }
}

/// While the kind of the tips a deletion writes is switched off, the deletion is refused
/// before anything changes; once it is on again, the deletion goes through.
async fn a_deletion_its_tip_kind_cannot_write_changes_nothing(b: Backend) {
    let (_db, s) = setup(&b, "delete-kind-off", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let group = common::server::ok(
        &s,
        &alice,
        "POST",
        "/v1/groups",
        Some(json!({"name": "Hiking", "members": ["bob"]})),
    )
    .await["conversationId"]
        .as_i64()
        .unwrap();
    let admin = |verb: &str| format!("/admin/plugins/group-update/{verb}");
    let (status, _) = s
        .http("POST", &admin("disable"), Some(ADMIN_TOKEN), None)
        .await;
    assert_eq!(status, 200);
    let password = json!({"password": "password-of-"});
    s.expect_error(
        "DELETE",
        "/v1/account",
        Some(&alice.token),
        Some(password.clone()),
        422,
        "content_type_disabled",
    )
    .await;
    // Nothing changed: her token works, she is still the group's owner, bob sees her.
    let members = s.get(&alice, &format!("/v1/groups/{group}/members")).await;
    let owner = members["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["userId"] == "alice")
        .cloned()
        .unwrap_or_else(|| panic!("alice is still a member: {members}"));
    assert_eq!(owner["role"], "owner", "{members}");
    let seen = s.get(&bob, &format!("/v1/groups/{group}/members")).await;
    assert!(seen.to_string().contains("\"alice\""), "{seen}");

    let (status, _) = s
        .http("POST", &admin("enable"), Some(ADMIN_TOKEN), None)
        .await;
    assert_eq!(status, 200);
    let gone = common::server::ok(&s, &alice, "DELETE", "/v1/account", Some(password)).await;
    assert_eq!(gone["deleted"], true, "{gone}");
    let left = s.get(&bob, &format!("/v1/groups/{group}/members")).await;
    assert!(!left.to_string().contains("\"alice\""), "{left}");
}

async fn logout_and_revoke_all_end_tokens_and_their_connections(b: Backend) {
    let (_db, s) = setup(&b, "tokens", "").await;
    let alice = s.user("alice").await;
    let second = s.login("alice").await;
    let mut phone = s.connect(&alice, "phone").await;
    let mut laptop = s.connect(&second, "laptop").await;
    // Logout ends this token and its connection only.
    let (status, body) = s
        .http("POST", "/v1/auth/logout", Some(&alice.token), None)
        .await;
    assert_eq!((status, &body["revoked"]), (200, &json!(true)), "{body}");
    let (code, frames) = phone.closed().await;
    assert_eq!(code, Some(4003));
    assert!(
        frames
            .iter()
            .any(|f| f["type"] == "kicked" && f["reason"] == "token_revoked"),
        "{frames:?}"
    );
    s.expect_error(
        "GET",
        "/v1/conversations",
        Some(&alice.token),
        None,
        401,
        "unauthorized",
    )
    .await;
    assert_eq!(
        Ws::connect(&s.addr, &alice.token, "phone").await.err(),
        Some(401)
    );
    s.get(&second, "/v1/conversations").await;
    laptop.send(json!({"type": "ping", "id": "p"})).await;
    laptop.expect("pong").await;

    // A deployer's token (no iat) and a fresh login's, then revoke-all: all of them end,
    // and every connection closes; a login right after (the same second) works.
    let deployer = s.deployer_token("alice", None);
    s.get(
        &User {
            id: "alice".into(),
            token: deployer.clone(),
        },
        "/v1/conversations",
    )
    .await;
    let (status, body) = s
        .http("POST", "/v1/auth/revoke-all", Some(&second.token), None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(body["tokensValidFrom"].as_i64().unwrap() > 0);
    assert_eq!(laptop.closed().await.0, Some(4003));
    // A deployer's token issued "later" would outlive the revoke-all: refused outright.
    let ahead = body["tokensValidFrom"].as_i64().unwrap() + 3600;
    let later = s.deployer_token("alice", Some(ahead));
    for token in [&second.token, &deployer, &later] {
        s.expect_error(
            "GET",
            "/v1/conversations",
            Some(token),
            None,
            401,
            "unauthorized",
        )
        .await;
    }
    let fresh = s.login("alice").await;
    s.get(&fresh, "/v1/conversations").await;
    // The admin can do the same for any user.
    let admin = Some(common::server::ADMIN_TOKEN);
    let (status, _) = s
        .http("POST", "/admin/users/alice/revoke-all", admin, None)
        .await;
    assert_eq!(status, 200);
    s.expect_error(
        "GET",
        "/v1/conversations",
        Some(&fresh.token),
        None,
        401,
        "unauthorized",
    )
    .await;
    s.expect_error(
        "POST",
        "/admin/users/nobody/revoke-all",
        admin,
        None,
        404,
        "user_not_found",
    )
    .await;
    // Revocations survive a restart (they are in the database).
    let mut s = s;
    s.restart();
    s.expect_error(
        "GET",
        "/v1/conversations",
        Some(&second.token),
        None,
        401,
        "unauthorized",
    )
    .await;
}

/// Every string anywhere in `v`.
fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(o) => o.iter().for_each(|(k, x)| {
            out.push(k.clone());
            strings(x, out)
        }),
        _ => {}
    }
}

async fn a_deleted_account_is_never_shown_by_its_name(b: Backend) {
    let (_db, s) = setup(&b, "delete", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let carol = s.user("carol").await;
    let ok = |u: &User, m: &'static str, p: String, body: Option<Value>| {
        let (s, u) = (&s, u.clone());
        async move { common::server::ok(s, &u, m, &p, body).await }
    };
    // alice: a private conversation with bob, a group she owns with bob and carol (carol
    // an admin), a friendship with carol, a request to dave, mentions of her.
    let mut a = s.connect(&alice, "phone").await;
    let mut bob_ws = s.connect(&bob, "phone").await;
    let private = send_ok(&mut a, text("1", "a-1", peer("bob"), "hi bob")).await["conversationId"]
        .as_i64()
        .unwrap();
    let group = ok(
        &alice,
        "POST",
        "/v1/groups".into(),
        Some(json!({"name": "Hiking", "members": ["bob", "carol"]})),
    )
    .await["conversationId"]
        .as_i64()
        .unwrap();
    ok(
        &alice,
        "PUT",
        format!("/v1/groups/{group}/admins/carol"),
        None,
    )
    .await;
    send_ok(
        &mut a,
        json!({"type": "send", "id": "2", "clientMsgId": "a-2", "conversationType": 2,
               "conversationId": group, "contentType": 1, "payload": {"text": "hello all"}}),
    )
    .await;
    send_ok(
        &mut bob_ws,
        json!({"type": "send", "id": "3", "clientMsgId": "b-1", "conversationType": 2,
               "conversationId": group, "contentType": 1,
               "payload": {"text": "hi all", "mentions": ["alice"]}}),
    )
    .await;
    ok(
        &alice,
        "POST",
        "/v1/friends/requests".into(),
        Some(json!({"userId": "carol"})),
    )
    .await;
    let req =
        ok(&carol, "GET", "/v1/friends/requests".into(), None).await["requests"][0]["requestId"]
            .as_str()
            .unwrap()
            .to_string();
    ok(
        &carol,
        "POST",
        format!("/v1/friends/requests/{req}/accept"),
        None,
    )
    .await;
    let dave = s.user("dave").await;
    ok(
        &alice,
        "POST",
        "/v1/friends/requests".into(),
        Some(json!({"userId": "dave"})),
    )
    .await;

    // Deleting needs the password again.
    s.expect_error(
        "DELETE",
        "/v1/account",
        Some(&alice.token),
        Some(json!({"password": "wrong-one"})),
        401,
        "invalid_credentials",
    )
    .await;
    s.expect_error(
        "DELETE",
        "/v1/account",
        Some(&alice.token),
        None,
        401,
        "invalid_credentials",
    )
    .await;
    let gone = ok(
        &alice,
        "DELETE",
        "/v1/account".into(),
        Some(json!({"password": "password-of-"})),
    )
    .await;
    assert_eq!(gone["deleted"], true, "{gone}");
    let alias = gone["alias"].as_str().unwrap().to_string();
    assert!(alias.starts_with("deleted-"), "{alias}");
    assert_eq!(a.closed().await.0, Some(4004));

    // The account is gone for good: its token, its password, its id.
    let credentials = json!({"userId": "alice", "password": "password-of-"});
    let deployer = s.deployer_token("alice", Some(0));
    for (method, path, token, body, status, code) in [
        (
            "GET",
            "/v1/conversations",
            Some(alice.token.as_str()),
            None,
            401,
            "account_deleted",
        ),
        (
            "GET",
            "/v1/conversations",
            Some(deployer.as_str()),
            None,
            401,
            "account_deleted",
        ),
        (
            "POST",
            "/v1/auth/login",
            None,
            Some(credentials.clone()),
            401,
            "invalid_credentials",
        ),
        (
            "POST",
            "/v1/auth/register",
            None,
            Some(credentials.clone()),
            409,
            "user_exists",
        ),
    ] {
        s.expect_error(method, path, token, body, status, code)
            .await;
    }

    // Its messages stay, from the alias; nothing anyone can read names alice.
    let mut seen = Vec::new();
    for u in [&bob, &carol] {
        for path in [
            "/v1/conversations".to_string(),
            format!("/v1/conversations/{group}/messages?afterSeq=0&limit=500"),
            format!("/v1/groups/{group}"),
            format!("/v1/groups/{group}/members"),
            format!("/v1/conversations/{group}/read-positions"),
            "/v1/user-stream?afterSeq=0&limit=500".to_string(),
            "/v1/friends".to_string(),
            "/v1/groups".to_string(),
        ] {
            strings(&ok(u, "GET", path, None).await, &mut seen);
        }
    }
    for path in [
        format!("/v1/conversations/{private}/messages?afterSeq=0&limit=500"),
        format!("/v1/conversations/{private}/read-positions"),
    ] {
        strings(&ok(&bob, "GET", path, None).await, &mut seen);
    }
    assert!(
        !seen.iter().any(|x| x.contains("alice")),
        "alice is still shown: {seen:?}"
    );
    let pulled = s.pull_all(&bob, private).await;
    assert_eq!(pulled[0]["senderId"], alias);
    assert_eq!(pulled[0]["payload"]["text"], "hi bob");
    let in_group = s.pull_all(&bob, group).await;
    assert!(
        in_group
            .iter()
            .any(|m| m["senderId"] == alias && m["payload"]["text"] == "hello all")
    );
    assert!(
        in_group
            .iter()
            .any(|m| m["payload"]["mentions"] == json!([alias]))
    );
    // The group lives on under carol (the admin), without alias among its members.
    let info = ok(&carol, "GET", format!("/v1/groups/{group}"), None).await;
    assert_eq!(info["ownerId"], "carol", "{info}");
    let members = ok(&carol, "GET", format!("/v1/groups/{group}/members"), None).await;
    assert!(!members.to_string().contains(&alias), "{members}");
    // Nothing can reach it any more.
    let err = common::server::send_err(
        &mut bob_ws,
        text("4", "b-2", common::server::conv(private), "still there?"),
    )
    .await;
    assert_eq!(err["code"], "user_not_found", "{err}");
    let err =
        common::server::send_err(&mut bob_ws, text("5", "b-3", peer("alice"), "hello?")).await;
    assert_eq!(err["code"], "user_not_found", "{err}");
    // Live kinds too (typing), by conversation and by the old id.
    for (n, to) in [(6, common::server::conv(private)), (7, peer("alice"))] {
        let mut typing = json!({"type": "send", "id": n.to_string(), "clientMsgId": format!("t-{n}"),
            "conversationType": 1, "contentType": 5, "payload": {"state": "typing"}});
        typing
            .as_object_mut()
            .unwrap()
            .extend(to.as_object().unwrap().clone());
        let err = common::server::send_err(&mut bob_ws, typing).await;
        assert_eq!(err["code"], "user_not_found", "{err}");
    }
    s.expect_error(
        "POST",
        "/v1/friends/requests",
        Some(&bob.token),
        Some(json!({"userId": "alice"})),
        404,
        "user_not_found",
    )
    .await;
    // dave's request from alice is gone from his list.
    let requests = ok(&dave, "GET", "/v1/friends/requests".into(), None).await;
    assert_eq!(requests["requests"], json!([]), "{requests}");
    // Deleting again (the admin finishing an interrupted deletion) changes nothing.
    let admin = Some(common::server::ADMIN_TOKEN);
    let (status, again) = s.http("DELETE", "/admin/users/alice", admin, None).await;
    assert_eq!(
        (status, again["alias"].as_str()),
        (200, Some(alias.as_str())),
        "{again}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_blip_mid_burst_is_invisible_to_senders() {
    let Some(b) = Backend::postgres("a_database_blip_mid_burst_is_invisible_to_senders") else {
        return;
    };
    let (db, s) = setup(&b, "pg-blip", common::server::FAST).await;
    let bob = s.user("bob").await;
    const SENDERS: usize = 8;
    const EACH: usize = 400;
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..SENDERS {
        let user = s.user(&format!("alice{i}")).await;
        let mut ws = s.connect(&user, "phone").await;
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            let frames: Vec<Value> = (0..EACH)
                .map(|n| {
                    text(
                        &format!("{n}"),
                        &format!("a{i}-{n}"),
                        peer("bob"),
                        &format!("{i} {n}"),
                    )
                })
                .collect();
            let mut answers = Vec::new();
            for chunk in frames.chunks(50) {
                let got = ws.send_all(chunk, 50).await;
                acked.fetch_add(got.len(), std::sync::atomic::Ordering::Relaxed);
                answers.extend(got.into_values());
            }
            answers
        }));
    }
    // Mid-burst, the database terminates every connection of the server.
    let started = Instant::now();
    while acked.load(std::sync::atomic::Ordering::Relaxed) < SENDERS * EACH / 4 {
        assert!(started.elapsed() < SAFETY, "the burst did not start");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    use sqlx::Connection as _;
    let mut admin = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let terminated: Vec<(bool,)> = sqlx::query_as(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert!(!terminated.is_empty(), "no server connection to terminate");
    let mut acks = Vec::new();
    for t in tasks {
        acks.extend(t.await.unwrap());
    }
    let errors: Vec<&Value> = acks.iter().filter(|a| a["type"] != "ack").collect();
    assert!(errors.is_empty(), "senders saw errors: {errors:?}");
    assert_eq!(acks.len(), SENDERS * EACH);
    // Everything acked is stored, once, where its ack said.
    let mut stored = std::collections::HashMap::new();
    let conversations: std::collections::BTreeSet<i64> = acks
        .iter()
        .map(|a| a["conversationId"].as_i64().unwrap())
        .collect();
    for cid in conversations {
        for m in s.pull_all(&bob, cid).await {
            let key = (cid, m["seq"].as_i64().unwrap());
            assert!(stored.insert(key, m).is_none());
        }
    }
    assert_eq!(
        stored.len(),
        SENDERS * EACH,
        "a message is missing or stored twice"
    );
    for a in &acks {
        let key = (
            a["conversationId"].as_i64().unwrap(),
            a["seq"].as_i64().unwrap(),
        );
        assert_eq!(stored[&key]["msgId"], a["msgId"], "{a}");
    }
    println!(
        "terminated {} connections mid-burst; {} acks, no errors",
        terminated.len(),
        acks.len()
    );
}

/// A relayed connection's switches: (the server's way, the database's way) muted.
type Mutes = (Arc<AtomicBool>, Arc<AtomicBool>);

/// A relay to PostgreSQL that can go silent, as a database does whose machine lost power
/// or whose network drops packets without a reset: its connections stay open, and nothing
/// sent on them is answered.
struct SilentRelay {
    addr: SocketAddr,
    /// Whether connections opened from now on are silent.
    silent: Arc<AtomicBool>,
    /// Each connection's switches.
    links: Arc<std::sync::Mutex<Vec<Mutes>>>,
}

impl SilentRelay {
    async fn start(target: String) -> SilentRelay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let silent = Arc::new(AtomicBool::new(false));
        let links: Arc<std::sync::Mutex<Vec<_>>> = Arc::default();
        let (new_silent, all) = (silent.clone(), links.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let muted = new_silent.load(SeqCst);
                let (asks, answers) = (
                    Arc::new(AtomicBool::new(muted)),
                    Arc::new(AtomicBool::new(muted)),
                );
                all.lock().unwrap().push((asks.clone(), answers.clone()));
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&target).await else {
                        return;
                    };
                    let (from_client, to_client) = client.into_split();
                    let (from_server, to_server) = server.into_split();
                    tokio::join!(
                        relay(from_client, to_server, asks),
                        relay(from_server, to_client, answers)
                    );
                });
            }
        });
        SilentRelay {
            addr,
            silent,
            links,
        }
    }

    /// Every connection, open or opened from now on, goes silent both ways.
    fn silence(&self) {
        self.silent.store(true, SeqCst);
        for (asks, answers) in self.links.lock().unwrap().iter() {
            asks.store(true, SeqCst);
            answers.store(true, SeqCst);
        }
    }

    /// The open connections carry what the server sends, and lose every answer.
    fn lose_answers(&self) {
        for (_, answers) in self.links.lock().unwrap().iter() {
            answers.store(true, SeqCst);
        }
    }

    /// New connections are answered again; those that went silent stay so.
    fn answer_new_connections(&self) {
        self.silent.store(false, SeqCst);
    }
}

/// Copies one direction of a relayed connection until it goes silent: then what it reads
/// is dropped and both ends are held open, unanswered.
async fn relay(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mute: Arc<AtomicBool>,
) {
    let mut buf = vec![0; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if mute.load(SeqCst) {
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A server on a database of its own through a `SilentRelay`, with a 2 s deadline for the
/// database's answers (and `extra` in its config); alice and bob, alice's phone, and her
/// first message to bob (its conversation).
async fn through_a_relay(name: &str, extra: &str) -> (Db, SilentRelay, Server, [User; 2], Ws, i64) {
    let mut db = Db::new(&Backend::postgres(name).unwrap(), name).await;
    let (scheme, rest) = db.url.split_once("://").unwrap();
    let (authority, path) = rest.split_once('/').unwrap();
    let host = authority.rsplit('@').next().unwrap();
    let target = if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:5432")
    };
    let relay = SilentRelay::start(target).await;
    let through = authority.replacen(host, &relay.addr.to_string(), 1);
    db.url = format!("{scheme}://{through}/{path}");
    let s = Server::start_with(&db, "answer_timeout_secs = 2", extra).await;
    let bob = s.user("bob").await;
    let alice = s.user("alice").await;
    let mut ws = s.connect(&alice, "phone").await;
    let first = send_ok(&mut ws, text("1", "c1", peer("bob"), "before")).await;
    let conversation = first["conversationId"].as_i64().unwrap();
    (db, relay, s, [alice, bob], ws, conversation)
}

/// What bob pulls of the conversation is "before", "during" and "after" at seqs 1, 2
/// and 3, each once, and the acks of the second and the third say seqs 2 and 3.
async fn stored_once_in_order(s: &Server, bob: &User, conversation: i64, acks: [&Value; 2]) {
    let texts: Vec<(i64, String)> = s
        .pull_all(bob, conversation)
        .await
        .iter()
        .map(|m| {
            (
                m["seq"].as_i64().unwrap(),
                m["payload"]["text"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        texts,
        [
            (1, "before".into()),
            (2, "during".into()),
            (3, "after".into())
        ],
        "acks: {} {}",
        acks[0],
        acks[1]
    );
    assert_eq!(acks.map(|a| a["seq"].as_i64()), [Some(2), Some(3)]);
}

/// PostgreSQL stops answering without closing its connections: a send is answered
/// `store_unavailable` and a pull `503 store_unavailable` (each within the harness's 20 s
/// wait, where without the deadline neither comes for minutes), the connection stays
/// open, and once the database answers new connections the resend is stored, once, in
/// order with the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_stops_answering_is_answered_for_by_the_deadline() {
    let name = "a_database_that_stops_answering_is_answered_for_by_the_deadline";
    if Backend::postgres(name).is_none() {
        return;
    }
    let (_db, relay, s, [_, bob], mut ws, conversation) = through_a_relay("pg-silent", "").await;
    relay.silence();
    let sent = Instant::now();
    let refused = send_err(&mut ws, text("2", "c2", peer("bob"), "during")).await;
    let send_answered = sent.elapsed();
    assert_eq!(refused["code"], "store_unavailable", "{refused}");
    let path = format!("/v1/conversations/{conversation}/messages?afterSeq=0");
    let asked = Instant::now();
    let (status, pulled) = s.http("GET", &path, Some(&bob.token), None).await;
    println!(
        "deadline 2 s: the send answered after {send_answered:.1?}, the pull after {:.1?}",
        asked.elapsed()
    );
    assert_eq!(
        (status, pulled["error"]["code"].as_str()),
        (503, Some("store_unavailable")),
        "{pulled}"
    );

    relay.answer_new_connections();
    let resent = send_ok(&mut ws, text("3", "c2", peer("bob"), "during")).await;
    let last = send_ok(&mut ws, text("4", "c3", peer("bob"), "after")).await;
    stored_once_in_order(&s, &bob, conversation, [&resent, &last]).await;
}

/// While a frame waits for a database that does not answer (a send to a conversation the
/// node has never looked up), the connection goes on: a ping sent after it is answered at
/// once and a typing signal from the peer is pushed at once, both before the waiting
/// send's `store_unavailable`; the send pipelined after the ping waits after it, and the
/// first's answer comes out while the second waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_waiting_for_the_database_holds_neither_pings_nor_pushes() {
    let name = "a_frame_waiting_for_the_database_holds_neither_pings_nor_pushes";
    if Backend::postgres(name).is_none() {
        return;
    }
    let (_db, relay, s, [_, bob], mut alice_ws, conversation) =
        through_a_relay("pg-waiting-frame", "").await;
    let mut bob_ws = s.connect(&bob, "laptop").await;
    let typing = |n: u32| {
        json!({"type": "send", "id": format!("t{n}"), "clientMsgId": format!("typing-{n}"),
            "conversationType": 1, "conversationId": conversation, "contentType": 5,
            "payload": {"state": "typing"}})
    };
    // The members of the conversation are cached for live kinds from here on.
    send_ok(&mut bob_ws, typing(1)).await;
    alice_ws.expect("notify").await;

    relay.silence();
    let sent = Instant::now();
    let nowhere = |id: &str, conversation: i64| text(id, id, conv(conversation), "nowhere");
    alice_ws
        .send_together(&[
            nowhere("w1", 9_000_001),
            json!({"type": "ping", "id": "p"}),
            nowhere("w2", 9_000_002),
        ])
        .await;
    // The typing goes once alice's connection waits on the first send.
    let (pong, before) = alice_ws.until(|f| f["type"] == "pong").await;
    assert_eq!(pong["id"], "p", "{pong}");
    assert!(before.is_empty(), "before the pong: {before:?}");
    let ponged = sent.elapsed();
    send_ok(&mut bob_ws, typing(2)).await;
    let (pushed, before) = alice_ws.until(|f| f["type"] == "notify").await;
    assert_eq!(pushed["contentType"], 5, "{pushed}");
    assert!(before.is_empty(), "before the typing: {before:?}");
    // Each waiting send is answered as it ends: the first while the second still waits,
    // so a ping sent once the first is answered is answered before the second.
    let first = alice_ws.next().await.unwrap();
    let first_answered = sent.elapsed();
    assert_eq!(
        (first["id"].as_str(), first["code"].as_str()),
        (Some("w1"), Some("store_unavailable")),
        "{first}"
    );
    alice_ws.send(json!({"type": "ping", "id": "p2"})).await;
    let (pong, before) = alice_ws.until(|f| f["type"] == "pong").await;
    assert_eq!(pong["id"], "p2", "{pong}");
    assert!(before.is_empty(), "before the second pong: {before:?}");
    let second = alice_ws.next().await.unwrap();
    println!(
        "deadline 2 s: the pong after {ponged:.1?}, the waiting sends' answers after \
         {first_answered:.1?} and {:.1?}",
        sent.elapsed()
    );
    assert_eq!(
        (second["id"].as_str(), second["code"].as_str()),
        (Some("w2"), Some("store_unavailable")),
        "{second}"
    );
}

/// The database takes a send and commits it, but its answer is lost on the way: the
/// server, given no answer by the deadline, runs the batch again on a new connection, and
/// the sender gets one ack for one stored message, in order, as for a send whose answer
/// came: `"duplicate": false`, an offline notice for the peer, a push to the online members
/// of a group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_is_lost_is_acked_and_delivered_once() {
    let name = "a_commit_whose_answer_is_lost_is_acked_and_delivered_once";
    if Backend::postgres(name).is_none() {
        return;
    }
    let mut hook = Receiver::start(Mode::Ok).await;
    let push = format!(
        "[push]\nwebhook_url = \"http://{}/hook\"\n\
         webhook_secret = \"lost-answer-secret-lost-answer-secret\"\n",
        hook.addr
    );
    let (_db, relay, s, [alice, bob], mut ws, conversation) =
        through_a_relay("pg-lost", &push).await;
    // bob is offline with a push token (none when "before" was sent: no notice for it);
    // carol is online in a group alice texted before, so its committer remembers it too.
    with_token(&s, &bob, "phone").await;
    let carol = s.user("carol").await;
    let group = json!({"name": "G", "members": ["carol"]});
    let gid = ok(&s, &alice, "POST", "/v1/groups", Some(group)).await["conversationId"]
        .as_i64()
        .unwrap();
    let mut c = s.connect(&carol, "laptop").await;
    send_ok(&mut ws, gtext("g1", gid, 2, "g-before")).await;
    c.until(|f| f["type"] == "notify" && f["payload"]["text"] == "g-before")
        .await;

    relay.lose_answers();
    let acked = send_ok(&mut ws, text("2", "c2", peer("bob"), "during")).await;
    // The second run found what the first stored: a message the committer remembers the
    // conversation of is written by one statement, its own transaction, which the database
    // committed before its answer was lost. It is answered as the first run would have been.
    assert_eq!(acked["duplicate"], false, "{acked}");
    // (A notice of "before" may come first: the bridge reads the tokens after the send.)
    let notice = loop {
        let notice = hook.next().await;
        if notice.body["seq"] != 1 {
            break notice;
        }
    };
    assert_eq!(
        (
            &notice.body["userId"],
            &notice.body["seq"],
            &notice.body["preview"]
        ),
        (&json!("bob"), &json!(2), &json!("during")),
        "{:?}",
        notice.body
    );
    let last = send_ok(&mut ws, text("3", "c3", peer("bob"), "after")).await;
    stored_once_in_order(&s, &bob, conversation, [&acked, &last]).await;

    // In a group too: carol's device gets the message whose answer was lost.
    relay.lose_answers();
    let acked = send_ok(&mut ws, gtext("g2", gid, 2, "g-during")).await;
    assert_eq!(acked["duplicate"], false, "{acked}");
    let (got, _) = c
        .until(|f| f["type"] == "notify" && f["payload"]["text"] == "g-during")
        .await;
    assert_eq!(got["seq"], acked["seq"], "{got}");
}

/// The log, in either format, holds no terminal escapes when it is a file, and never a
/// password, a token or a message's payload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_plain_or_json_lines_and_holds_no_secrets() {
    for format in ["text", "json"] {
        let db = Db::new(&Backend::Sqlite, &format!("log-{format}")).await;
        let extra = format!("[log]\nformat = \"{format}\"\n");
        let s = Server::start_sections(
            &db,
            Sections {
                extra: &extra,
                ..Sections::default()
            },
        )
        .await;
        let alice = s.user("alice").await; // password "password-of-"
        let bob = s.user("bob").await;
        let mut a = s.connect(&alice, "phone").await;
        let mut b = s.connect(&bob, "phone").await;
        send_ok(&mut a, text("1", "c-1", peer("bob"), "secret-payload-7f3a")).await;
        b.until(|f| f["type"] == "notify").await;
        let (st, _) = s
            .http(
                "POST",
                "/v1/auth/login",
                None,
                Some(serde_json::json!({"userId": "alice", "password": "wrong-password-9c2e"})),
            )
            .await;
        assert_eq!(st, 401);
        let log = s.log();
        assert!(!log.is_empty());
        assert!(
            !log.contains('\u{1b}'),
            "{format}: a terminal escape in a log file"
        );
        for secret in [
            "password-of-",
            "wrong-password-9c2e",
            "secret-payload-7f3a",
            alice.token.as_str(),
            bob.token.as_str(),
        ] {
            assert!(
                !log.contains(secret),
                "{format}: the log holds {secret:?}:\n{log}"
            );
        }
        if format == "json" {
            for line in log.lines().filter(|l| !l.trim().is_empty()) {
                let v: serde_json::Value = serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
                assert!(v["level"].is_string() && v["fields"].is_object(), "{line}");
            }
        }
    }
}

/// A tmpfs of `mib` MiB mounted at `at` for as long as it lives (needs root: `None`
/// where the mount is refused).
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &std::path::Path, mib: u32) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).unwrap();
        let done = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(at)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        done.then(|| Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Fills the file system of `file` to the last byte, then gives `spare` bytes back.
fn fill_but(file: &std::path::Path, spare: u64) {
    use std::io::Write as _;
    let mut f = std::fs::File::create(file).unwrap();
    let chunk = vec![7u8; 64 * 1024];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => written += n as u64,
        }
    }
    f.set_len(written.saturating_sub(spare)).unwrap();
}

/// SQLite on a disk that fills up: sends are refused with `store_unavailable` and nothing
/// acked is lost, in order, through a `kill -9` on the full disk; once there is room the
/// refused sends go through with their own `clientMsgId`s; the log says so without a line
/// per failed checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_sends_and_loses_nothing() {
    let mut db = Db::new(&Backend::Sqlite, "disk-full").await;
    let Some(_disk) = Tmpfs::mount(&db.dir.join("disk"), 8) else {
        println!("skipped: mounting a tmpfs needs root");
        return;
    };
    db.url = format!("sqlite://{}", db.dir.join("disk/courier.db").display());
    let mut s = Server::start(&db, "").await;
    let (alice, bob) = (s.user("alice").await, s.user("bob").await);
    let mut a = s.connect(&alice, "phone").await;
    let started = Instant::now();
    let filler = db.dir.join("disk/filler");
    fill_but(&filler, 1536 * 1024);

    let body = "x".repeat(3000);
    let (mut acked, mut refused) = (Vec::new(), None);
    for i in 0..3000 {
        let cmid = format!("m{i}");
        let id = format!("s{i}");
        a.send(text(&id, &cmid, peer("bob"), &body)).await;
        let (answer, _) = a.until(|f| f["id"] == id.as_str()).await;
        if answer["type"] == "ack" {
            acked.push(answer["msgId"].as_str().unwrap().to_string());
            continue;
        }
        assert_eq!(answer["code"], "store_unavailable", "{answer}");
        refused = Some(cmid);
        break;
    }
    let refused = refused.expect("the disk filled up within 3000 sends");
    assert!(!acked.is_empty(), "sends were acked before the disk filled");
    let conversation = 1;
    let stored = |msgs: Vec<Value>| -> Vec<String> {
        msgs.iter()
            .map(|m| m["msgId"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(stored(s.pull_all(&bob, conversation).await), acked);

    // kill -9 on the full disk; the restarted server reads everything acked.
    s.restart();
    assert_eq!(stored(s.pull_all(&bob, conversation).await), acked);
    let mut a = s.connect(&alice, "phone").await;
    let err = send_err(&mut a, text("again", &refused, peer("bob"), &body)).await;
    assert_eq!(err["code"], "store_unavailable", "{err}");
    // More refused sends, over the WebSocket and over HTTP (counted below in the log).
    for i in 0..10 {
        let (id, cmid) = (format!("w{i}"), format!("full-w{i}"));
        let err = send_err(&mut a, text(&id, &cmid, peer("bob"), &body)).await;
        assert_eq!(err["code"], "store_unavailable", "{err}");
        let send = json!({"clientMsgId": format!("full-h{i}"), "conversationType": 1,
            "peerId": "bob", "contentType": 1, "payload": {"text": body}});
        let (status, answer) = call(&s, &alice, "POST", "/v1/messages", Some(send)).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (503, Some("store_unavailable")),
            "{answer}"
        );
    }

    // Room again: the refused send is stored as new, and the next after it.
    std::fs::remove_file(&filler).unwrap();
    let ack = send_ok(&mut a, text("room", &refused, peer("bob"), &body)).await;
    assert_eq!(ack["duplicate"], false, "{ack}");
    acked.push(ack["msgId"].as_str().unwrap().to_string());
    let ack = send_ok(&mut a, text("next", "after", peer("bob"), "after")).await;
    acked.push(ack["msgId"].as_str().unwrap().to_string());
    assert_eq!(stored(s.pull_all(&bob, conversation).await), acked);
    s.restart();
    assert_eq!(stored(s.pull_all(&bob, conversation).await), acked);

    // A failing checkpoint, and a failing commit, is logged when it starts and then every
    // 10 s at most (each of the two runs on the full disk starts its own), not once or
    // twice per refused send: 22 were refused.
    let log = s.log();
    let most = 2 * (2 + started.elapsed().as_secs() / 10) as usize;
    let lines = log.matches("SQLite checkpoint failed").count();
    assert!(lines <= most, "{lines} checkpoint lines (at most {most})");
    let lines = log.matches("commit failed").count() + log.matches("batches failed").count();
    assert!(
        lines <= most,
        "{lines} lines of failed commits (at most {most})"
    );
    assert!(
        !log.contains("did not accept the write"),
        "a line per refused answer:\n{log}"
    );
}
