//! A real server on loopback for the messaging tests: the `courier` binary on a SQLite file
//! or its own PostgreSQL database, real WebSocket clients, a small HTTP client.
//! The one place the tests touch the wire protocol, so it can change in one place.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::{repo_root, scratch};

/// The environment variable naming the PostgreSQL server for the tests (`.ci/run` sets it).
pub const POSTGRES_ENV: &str = "PG_TEST_URL";

/// The key test servers sign tokens with (so tests can mint a deployer's token).
pub const JWT_SECRET: &str = "test-secret-test-secret-test-secret-0123";

/// The admin token of every test server.
pub const ADMIN_TOKEN: &str = "admin-token-0123456789";

/// A test's own keys for the config sections the harness writes (`Server::start_sections`);
/// `extra` holds whole sections of its own.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sections<'a> {
    pub server: &'a str,
    pub storage: &'a str,
    pub auth: &'a str,
    pub extra: &'a str,
}

/// Gateway settings that let a test pipeline freely.
pub const FAST: &str =
    "[gateway]\nsend_rate_per_sec = 1000000\nsend_burst = 1000000\noutbox_frames = 100000\n";

#[derive(Debug, Clone)]
pub enum Backend {
    Sqlite,
    /// The URL of a database the test may create others from.
    Postgres(String),
}

impl Backend {
    /// PostgreSQL from the environment, or `None` after saying why the test is skipped.
    pub fn postgres(test: &str) -> Option<Backend> {
        match std::env::var(POSTGRES_ENV) {
            Ok(url) if !url.is_empty() => Some(Backend::Postgres(url)),
            _ => {
                eprintln!("{test}: skipped on PostgreSQL: {POSTGRES_ENV} is not set");
                None
            }
        }
    }
}

/// A database of one test's own: a SQLite file in its folder, or a fresh PostgreSQL
/// database dropped afterwards.
pub struct Db {
    pub url: String,
    pub dir: PathBuf,
    drop_pg: Option<(String, String)>,
}

impl Db {
    pub async fn new(backend: &Backend, name: &str) -> Db {
        let dir = scratch(name);
        match backend {
            Backend::Sqlite => Db {
                url: format!("sqlite://{}", dir.join("courier.db").display()),
                dir,
                drop_pg: None,
            },
            Backend::Postgres(admin) => {
                use sqlx::Connection as _;
                let db = format!(
                    "courier_{}_{}_{}",
                    name.replace('-', "_"),
                    std::process::id(),
                    fastrand::u32(..)
                );
                let mut conn = sqlx::PgConnection::connect(admin)
                    .await
                    .expect("connect to the test PostgreSQL");
                sqlx::raw_sql(&format!("CREATE DATABASE {db}"))
                    .execute(&mut conn)
                    .await
                    .expect("create the test database");
                let base = admin
                    .rsplit_once('/')
                    .map(|(b, _)| b.to_string())
                    .expect("a URL ending in /database");
                Db {
                    url: format!("{base}/{db}"),
                    dir,
                    drop_pg: Some((admin.clone(), db)),
                }
            }
        }
    }

    /// Where `needle` is in the database: on SQLite the files themselves (the database,
    /// its write-ahead log), byte for byte; on PostgreSQL every text column of every table,
    /// as `table.column`.
    pub async fn search(&self, needle: &str) -> Vec<String> {
        let Some((_, name)) = &self.drop_pg else {
            let mut found = Vec::new();
            for file in ["courier.db", "courier.db-wal"] {
                let bytes = std::fs::read(self.dir.join(file)).unwrap_or_default();
                if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    found.push(file.to_string());
                }
            }
            return found;
        };
        use sqlx::{Connection as _, Row as _};
        let _ = name;
        let mut conn = sqlx::PgConnection::connect(&self.url).await.unwrap();
        let columns = sqlx::query(
            "SELECT table_name, column_name FROM information_schema.columns \
             WHERE table_schema = 'public' AND data_type IN ('text', 'character varying')",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        let mut found = Vec::new();
        for c in columns {
            let (table, column): (String, String) = (c.get(0), c.get(1));
            let n: i64 = sqlx::query_scalar(&format!(
                "SELECT COUNT(*) FROM \"{table}\" WHERE strpos(\"{column}\", $1) > 0"
            ))
            .bind(needle)
            .fetch_one(&mut conn)
            .await
            .unwrap();
            if n > 0 {
                found.push(format!("{table}.{column}"));
            }
        }
        found
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Some((admin, db)) = self.drop_pg.take() {
            // Best effort, on a thread of its own (we may be inside a runtime).
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    use sqlx::Connection as _;
                    if let Ok(mut c) = sqlx::PgConnection::connect(&admin).await {
                        let _ =
                            sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
                                .execute(&mut c)
                                .await;
                    }
                });
            })
            .join();
        }
    }
}

/// A request that must be refused, as a row of `Server::expect_errors`: the token (or
/// `None`), method, path, body, status and error code.
pub type Refusal<'a> = (
    Option<&'a str>,
    &'a str,
    &'a str,
    Option<Value>,
    u16,
    &'a str,
);

/// The `courier` binary serving on a free loopback port.
pub struct Server {
    child: Option<Child>,
    pub addr: String,
    config: PathBuf,
    log: PathBuf,
    /// Environment variables the process gets besides the test's own.
    env: Vec<(String, String)>,
}

/// Compiled plugins shared by every test server, so start-up does not recompile them.
fn plugin_cache() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache");
    std::fs::create_dir_all(&dir).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    dir
}

impl Server {
    /// Starts a server on `db`; `extra` is appended to its config (sections other than
    /// server, storage, auth and runtime).
    pub async fn start(db: &Db, extra: &str) -> Server {
        Server::start_with(db, "", extra).await
    }

    /// As `start`, with `storage` added to the `[storage]` section.
    pub async fn start_with(db: &Db, storage: &str, extra: &str) -> Server {
        Server::start_sections(
            db,
            Sections {
                storage,
                extra,
                ..Sections::default()
            },
        )
        .await
    }

    /// A server whose config has the test's own keys in each section the harness writes.
    /// Logins and registrations are not rate-limited by address unless `auth` says so
    /// (every test client comes from 127.0.0.1).
    pub async fn start_sections(db: &Db, c: Sections<'_>) -> Server {
        Server::start_named(db, "courier", c)
    }

    /// As `start_sections`, with its config and log named after `name` (several servers
    /// on one database: the nodes of a cluster).
    pub fn start_named(db: &Db, name: &str, c: Sections<'_>) -> Server {
        Server::start_named_with(db, name, c, Vec::new())
    }

    /// As `start_named`, the process (and its restarts) with the variables `env` too.
    pub fn start_named_with(
        db: &Db,
        name: &str,
        c: Sections<'_>,
        env: Vec<(String, String)>,
    ) -> Server {
        let mut s = Server::configured(db, name, c);
        s.env = env;
        s.spawn();
        s
    }

    /// Runs a server that must refuse to start; its log.
    pub fn refused(db: &Db, name: &str, c: Sections<'_>) -> String {
        let s = Server::configured(db, name, c);
        let status = Command::new(env!("CARGO_BIN_EXE_courier"))
            .args(["serve", "--config"])
            .arg(&s.config)
            .current_dir(repo_root())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&s.log).unwrap()))
            .status()
            .expect("run courier");
        assert!(
            !status.success(),
            "the server started; its log:\n{}",
            s.log()
        );
        s.log()
    }

    fn configured(db: &Db, name: &str, c: Sections<'_>) -> Server {
        let config = db.dir.join(format!("{name}.toml"));
        let address_limit = if c.auth.contains("attempts_per_minute_per_address") {
            ""
        } else {
            "attempts_per_minute_per_address = 0\n"
        };
        std::fs::write(
            &config,
            format!(
                "[server]\nlisten = \"127.0.0.1:0\"\nadmin_token = \"{ADMIN_TOKEN}\"\n{}\n\
                 [storage]\nurl = \"{}\"\n{}\n[auth]\njwt_secret = \"{JWT_SECRET}\"\n{address_limit}{}\n\
                 [runtime]\ncache_dir = \"{}\"\n{}",
                c.server,
                db.url,
                c.storage,
                c.auth,
                plugin_cache().display(),
                c.extra,
            ),
        )
        .unwrap();
        let log = if name == "courier" {
            "server.log".to_string()
        } else {
            format!("{name}.log")
        };
        Server {
            child: None,
            addr: String::new(),
            config,
            log: db.dir.join(log),
            env: Vec::new(),
        }
    }

    fn spawn(&mut self) {
        use std::io::BufRead;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut child = super::courier()
            .args(["serve", "--config"])
            .arg(&self.config)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(repo_root())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start courier");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        self.addr = match line.trim().strip_prefix("listening on ") {
            Some(a) => a.to_string(),
            None => panic!(
                "the server did not start ({line:?}); its log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            ),
        };
        self.child = Some(child);
    }

    /// `kill -9`: no shutdown, no flush.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Starts the binary again on the same config and database (on a new port).
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    pub async fn user(&self, id: &str) -> User {
        let (status, body) = self
            .http(
                "POST",
                "/v1/auth/register",
                None,
                Some(json!({"userId": id, "password": "password-of-" })),
            )
            .await;
        assert_eq!(status, 201, "register {id}: {body}");
        User {
            id: id.to_string(),
            token: body["token"].as_str().unwrap().to_string(),
        }
    }

    /// Logs in a user that `user` registered; a new token.
    pub async fn login(&self, id: &str) -> User {
        let (status, body) = self
            .http(
                "POST",
                "/v1/auth/login",
                None,
                Some(json!({"userId": id, "password": "password-of-" })),
            )
            .await;
        assert_eq!(status, 200, "login {id}: {body}");
        User {
            id: id.to_string(),
            token: body["token"].as_str().unwrap().to_string(),
        }
    }

    /// One HTTP/1.1 request; the status and the JSON body (`Null` if none).
    pub async fn http(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        self.http_raw(method, path, token, &body).await
    }

    pub async fn http_raw(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: &str,
    ) -> (u16, Value) {
        http_at(&self.addr, method, path, token, body).await
    }

    /// A request that must fail with `status` and the error `code`; returns the body.
    pub async fn expect_error(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
        status: u16,
        code: &str,
    ) -> Value {
        let (got, body) = self.http(method, path, token, body).await;
        assert_eq!(
            (got, body["error"]["code"].as_str()),
            (status, Some(code)),
            "{method} {path}: {body}"
        );
        body
    }

    /// Each row, in order, through `expect_error`: who asks (a token, or `None`), the
    /// method, path and body, and the status and error code it must fail with.
    pub async fn expect_errors(&self, rows: &[Refusal<'_>]) {
        for (token, method, path, body, status, code) in rows {
            self.expect_error(method, path, *token, body.clone(), *status, code)
                .await;
        }
    }

    /// GET with a token, expecting 200.
    pub async fn get(&self, user: &User, path: &str) -> Value {
        let (status, body) = self.http("GET", path, Some(&user.token), None).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    /// Every message of a conversation the user may see, by paging `afterSeq`.
    pub async fn pull_all(&self, user: &User, conversation_id: i64) -> Vec<Value> {
        let mut after = 0;
        let mut all = Vec::new();
        loop {
            let page = self
                .get(
                    user,
                    &format!(
                        "/v1/conversations/{conversation_id}/messages?afterSeq={after}&limit=500"
                    ),
                )
                .await;
            let msgs = page["messages"].as_array().unwrap().clone();
            if let Some(last) = msgs.last() {
                after = last["seq"].as_i64().unwrap();
            }
            let more = page["hasMore"].as_bool().unwrap();
            all.extend(msgs);
            if !more {
                return all;
            }
        }
    }

    pub async fn connect(&self, user: &User, device: &str) -> Ws {
        Ws::connect(&self.addr, &user.token, device)
            .await
            .unwrap_or_else(|status| panic!("connect {} {device}: HTTP {status}", user.id))
    }

    /// The server process's id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server process's resident memory now, in KiB (Linux), or `None`.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// A token as a deployer's backend signs it with the shared key: `sub`, an `exp` an
    /// hour away, and `iat` only if given.
    pub fn deployer_token(&self, user_id: &str, iat: Option<i64>) -> String {
        use base64::Engine as _;
        use hmac::Mac as _;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let mut claims = json!({ "sub": user_id, "exp": now + 3600 });
        if let Some(iat) = iat {
            claims["iat"] = iat.into();
        }
        let signed = format!(
            "{}.{}",
            b64.encode(br#"{"alg":"HS256","typ":"JWT"}"#),
            b64.encode(claims.to_string())
        );
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(JWT_SECRET.as_bytes()).unwrap();
        mac.update(signed.as_bytes());
        format!("{signed}.{}", b64.encode(mac.finalize().into_bytes()))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// One HTTP/1.1 request to `addr`; the status and the JSON body (`Null` if none).
pub async fn http_at(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| ("Authorization", a))
        .into_iter()
        .collect();
    let answer = request(addr, method, path, &headers, body).await;
    (
        answer.status,
        serde_json::from_str(&answer.body).unwrap_or(Value::Null),
    )
}

/// An HTTP answer as received.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request to `addr` with the given headers (a JSON content type is added).
pub async fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let extra: String = headers
        .iter()
        .map(|(n, v)| format!("{n}: {v}\r\n"))
        .collect();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: courier\r\nConnection: close\r\n{extra}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), conn.read_to_end(&mut raw))
        .await
        .expect("HTTP answer within 30 s")
        .unwrap();
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_string(),
    }
}

#[derive(Debug, Clone)]
pub struct User {
    pub id: String,
    pub token: String,
}

type Stream = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A WebSocket client speaking the JSON frames.
pub struct Ws {
    stream: Stream,
    pub hello: Value,
}

/// How long a test waits for a frame it expects.
pub const WAIT: Duration = Duration::from_secs(20);

impl Ws {
    /// Connects with a receive buffer of `bytes` (a reader whose kernel holds little for
    /// it) and reads the `hello` frame.
    pub async fn connect_with_buffer(addr: &str, token: &str, device: &str, bytes: u32) -> Ws {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(bytes).unwrap();
        let tcp = socket.connect(addr.parse().unwrap()).await.unwrap();
        let url = format!("ws://{addr}/v1/ws?deviceId={device}&token={token}");
        let (stream, _) = tokio_tungstenite::client_async(url, MaybeTlsStream::Plain(tcp))
            .await
            .expect("WebSocket upgrade");
        Ws::greeted(stream).await
    }

    /// Connects and reads the `hello` frame; `Err(status)` if the upgrade was refused.
    pub async fn connect(addr: &str, token: &str, device: &str) -> Result<Ws, u16> {
        Ws::connect_query(addr, token, device, "").await
    }

    /// As `connect`, with `query` (`&key=value…`) added to the URL.
    pub async fn connect_query(
        addr: &str,
        token: &str,
        device: &str,
        query: &str,
    ) -> Result<Ws, u16> {
        let url = format!("ws://{addr}/v1/ws?deviceId={device}&token={token}{query}");
        match tokio_tungstenite::connect_async(url).await {
            Ok((stream, _)) => Ok(Ws::greeted(stream).await),
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => Err(resp.status().as_u16()),
            Err(e) => panic!("connect: {e}"),
        }
    }

    /// The client of an upgraded stream, once it read its `hello`.
    async fn greeted(stream: Stream) -> Ws {
        let mut ws = Ws {
            stream,
            hello: Value::Null,
        };
        let hello = ws.next().await.expect("hello frame");
        assert_eq!(hello["type"], "hello", "{hello}");
        ws.hello = hello;
        ws
    }

    pub async fn send(&mut self, frame: Value) {
        self.send_text(&frame.to_string()).await;
    }

    /// Sends the frames in one write (as far as the kernel takes them).
    pub async fn send_together(&mut self, frames: &[Value]) {
        self.feed_all(frames).await;
        self.stream.flush().await.expect("send the frames");
    }

    /// Sends the frames and then a close frame, in one write (as far as the kernel takes
    /// them).
    pub async fn send_together_and_close(&mut self, frames: &[Value]) {
        self.feed_all(frames).await;
        self.stream
            .send(Message::Close(None))
            .await
            .expect("send the frames and the close");
    }

    /// Sends a WebSocket ping and waits for its pong; the text frames before it are
    /// returned.
    pub async fn ping_pong(&mut self, data: &'static [u8]) -> Vec<Value> {
        self.stream
            .send(Message::Ping(data.into()))
            .await
            .expect("send a ping");
        let mut before = Vec::new();
        loop {
            match tokio::time::timeout(WAIT, self.stream.next()).await {
                Ok(Some(Ok(Message::Pong(d)))) if d.as_ref() == data => return before,
                Ok(Some(Ok(Message::Text(t)))) => {
                    before.push(serde_json::from_str(t.as_str()).expect("JSON frame"))
                }
                Ok(Some(Ok(_))) => {}
                other => panic!("no pong to the ping: {other:?}"),
            }
        }
    }

    /// Queues the frames without sending them.
    async fn feed_all(&mut self, frames: &[Value]) {
        for f in frames {
            self.stream
                .feed(Message::Text(f.to_string().into()))
                .await
                .expect("queue a frame");
        }
    }

    /// `false` if the connection is gone.
    pub async fn try_send(&mut self, frame: &Value) -> bool {
        self.stream
            .send(Message::Text(frame.to_string().into()))
            .await
            .is_ok()
    }

    /// Sends every frame, keeping up to `window` unanswered; returns the answers (ack or
    /// error) by request id. Pushes arriving meanwhile are skipped.
    pub async fn send_all(
        &mut self,
        frames: &[Value],
        window: usize,
    ) -> std::collections::HashMap<String, Value> {
        let mut answers = std::collections::HashMap::new();
        let mut next = 0;
        while answers.len() < frames.len() {
            while next < frames.len() && next - answers.len() < window {
                self.send(frames[next].clone()).await;
                next += 1;
            }
            let f = self.next().await.expect("closed while sending");
            if (f["type"] == "ack" || f["type"] == "error")
                && let Some(id) = f["id"].as_str()
            {
                answers.insert(id.to_string(), f);
            }
        }
        answers
    }

    pub async fn send_text(&mut self, text: &str) {
        self.stream
            .send(Message::Text(text.to_string().into()))
            .await
            .expect("send a frame");
    }

    /// The next JSON frame, `None` once the connection closed. Panics after `WAIT`.
    pub async fn next(&mut self) -> Option<Value> {
        self.next_within(WAIT)
            .await
            .unwrap_or_else(|| panic!("no frame within {WAIT:?}"))
    }

    /// `None` if nothing came within `d`; `Some(None)` if the connection closed.
    pub async fn next_within(&mut self, d: Duration) -> Option<Option<Value>> {
        let deadline = tokio::time::Instant::now() + d;
        loop {
            let msg = match tokio::time::timeout_at(deadline, self.stream.next()).await {
                Err(_) => return None,
                Ok(m) => m,
            };
            match msg {
                Some(Ok(Message::Text(t))) => {
                    return Some(Some(serde_json::from_str(t.as_str()).expect("JSON frame")));
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
                Some(Ok(Message::Binary(_))) => panic!("binary frame from the server"),
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return Some(None),
            }
        }
    }

    /// The next frame, which must be of type `kind`.
    pub async fn expect(&mut self, kind: &str) -> Value {
        let f = self
            .next()
            .await
            .unwrap_or_else(|| panic!("closed while waiting for {kind}"));
        assert_eq!(f["type"], kind, "expected a {kind} frame, got {f}");
        f
    }

    /// Frames until one satisfies `pred` (returned); the others are returned too.
    pub async fn until(&mut self, pred: impl Fn(&Value) -> bool) -> (Value, Vec<Value>) {
        let mut before = Vec::new();
        loop {
            let f = self.next().await.expect("closed while waiting");
            if pred(&f) {
                return (f, before);
            }
            before.push(f);
        }
    }

    /// Everything that arrives within `d`.
    pub async fn drain(&mut self, d: Duration) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(Some(f)) = self.next_within(d).await {
            out.push(f);
        }
        out
    }

    /// Reads until the server closes; its close code and reason.
    pub async fn closed(&mut self) -> (Option<u16>, Vec<Value>) {
        let mut frames = Vec::new();
        loop {
            let msg = tokio::time::timeout(WAIT, self.stream.next())
                .await
                .expect("the server did not close within WAIT");
            match msg {
                Some(Ok(Message::Text(t))) => {
                    frames.push(serde_json::from_str(t.as_str()).unwrap())
                }
                Some(Ok(Message::Close(Some(c)))) => {
                    let code: u16 = match c.code {
                        CloseCode::Library(n) | CloseCode::Bad(n) | CloseCode::Reserved(n) => n,
                        other => u16::from(other),
                    };
                    return (Some(code), frames);
                }
                Some(Ok(Message::Close(None))) | None | Some(Err(_)) => return (None, frames),
                Some(Ok(_)) => {}
            }
        }
    }

    pub async fn close(mut self) {
        let _ = self.stream.close(None).await;
    }

    /// Starts the closing handshake with `code`; the code of the server's answering close
    /// frame (`None` if the connection ended without one).
    pub async fn close_with(mut self, code: u16) -> Option<u16> {
        use tokio_tungstenite::tungstenite::protocol::CloseFrame;
        self.stream
            .send(Message::Close(Some(CloseFrame {
                code: CloseCode::from(code),
                reason: "bye".into(),
            })))
            .await
            .ok()?;
        self.closed().await.0
    }

    /// Sends one raw WebSocket frame (e.g. text that is not UTF-8).
    pub async fn send_frame(
        &mut self,
        frame: tokio_tungstenite::tungstenite::protocol::frame::Frame,
    ) {
        let _ = self.stream.send(Message::Frame(frame)).await;
    }
}

/// A `send` frame of a text message.
pub fn text(id: &str, cmid: &str, to: Value, body: &str) -> Value {
    let mut f = json!({
        "type": "send", "id": id, "clientMsgId": cmid, "conversationType": 1,
        "contentType": 1, "payload": {"text": body},
    });
    merge(&mut f, to);
    f
}

/// `{"peerId": p}`.
pub fn peer(p: &str) -> Value {
    json!({ "peerId": p })
}

/// `{"conversationId": id}`.
pub fn conv(id: i64) -> Value {
    json!({ "conversationId": id })
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(a), Value::Object(b)) = (into.as_object_mut(), from) {
        a.extend(b);
    }
}

/// A database of the test's own and a server on it.
pub async fn setup(backend: &Backend, name: &str, extra: &str) -> (Db, Server) {
    let db = Db::new(backend, name).await;
    let server = Server::start(&db, extra).await;
    (db, server)
}

/// A request with the user's token; status and body.
pub async fn call(
    s: &Server,
    u: &User,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    s.http(method, path, Some(&u.token), body).await
}

/// `u` has a device `device` with a push token (`token-of-` and the user's id), and no
/// connection.
pub async fn with_token(s: &Server, u: &User, device: &str) {
    ok(
        s,
        u,
        "POST",
        "/v1/devices",
        Some(json!({"deviceId": device, "platform": "ios"})),
    )
    .await;
    ok(
        s,
        u,
        "PUT",
        &format!("/v1/devices/{device}/push"),
        Some(json!({"provider": "apns", "token": format!("token-of-{}", u.id)})),
    )
    .await;
}

/// A request that must answer 200; its body.
pub async fn ok(s: &Server, u: &User, method: &str, path: &str, body: Option<Value>) -> Value {
    let (status, got) = call(s, u, method, path, body).await;
    assert_eq!(status, 200, "{} {method} {path}: {got}", u.id);
    got
}

/// Sends and returns the ack (panics on an error frame).
pub async fn send_ok(ws: &mut Ws, frame: Value) -> Value {
    let id = frame["id"].clone();
    ws.send(frame).await;
    let (ack, _) = ws.until(|f| f["id"] == id).await;
    assert_eq!(ack["type"], "ack", "{ack}");
    ack
}

/// Sends and returns the error frame (panics on an ack).
pub async fn send_err(ws: &mut Ws, frame: Value) -> Value {
    let id = frame["id"].clone();
    ws.send(frame).await;
    let (err, _) = ws.until(|f| f["id"] == id).await;
    assert_eq!(err["type"], "error", "{err}");
    err
}
