//! Cluster tests: several `courier` nodes on one PostgreSQL database, with the Redis and
//! NATS of the machine (`.ci/run` names them) or private ones a test starts and stops.
//! Each test has its own database and its own key and subject prefix.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::server::{ADMIN_TOKEN, Backend, Db, FAST, Sections, Server, request};

pub const REDIS_ENV: &str = "REDIS_TEST_URL";
pub const NATS_ENV: &str = "NATS_TEST_URL";

/// What a cluster test runs on.
pub struct Services {
    pub postgres: Backend,
    pub redis: String,
    pub nats: String,
}

/// PostgreSQL, Redis and NATS from the environment, or `None` after saying why the test
/// is skipped.
pub fn services(test: &str) -> Option<Services> {
    let postgres = Backend::postgres(test)?;
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    match (var(REDIS_ENV), var(NATS_ENV)) {
        (Some(redis), Some(nats)) => Some(Services {
            postgres,
            redis,
            nats,
        }),
        _ => {
            eprintln!("{test}: skipped: cluster tests need {REDIS_ENV} and {NATS_ENV}");
            None
        }
    }
}

/// A prefix no other test (or run) uses.
pub fn prefix(test: &str) -> String {
    format!(
        "t{}-{}-{}",
        test.replace('_', "-"),
        std::process::id(),
        fastrand::u32(..)
    )
}

/// How the nodes of a test reach Redis and the bus.
#[derive(Clone)]
pub struct Wiring {
    pub redis: String,
    /// `nats` or `redis`.
    pub bus: &'static str,
    /// Empty: the section leaves `bus_url` out.
    pub bus_url: String,
    pub prefix: String,
    /// More `[cluster]` keys.
    pub extra: String,
}

impl Wiring {
    pub fn nats(s: &Services, test: &str) -> Wiring {
        Wiring {
            redis: s.redis.clone(),
            bus: "nats",
            bus_url: s.nats.clone(),
            prefix: prefix(test),
            extra: String::new(),
        }
    }

    fn section(&self, node: u16) -> String {
        let bus_url = if self.bus_url.is_empty() {
            String::new()
        } else {
            format!("bus_url = \"{}\"\n", self.bus_url)
        };
        format!(
            "[cluster]\nnode_id = {node}\nredis_url = \"{}\"\nbus = \"{}\"\n{bus_url}prefix = \"{}\"\nlease_secs = 3\n{}\n",
            self.redis, self.bus, self.prefix, self.extra
        )
    }
}

/// Node `node` of the cluster on `db`; `extra` adds whole sections.
pub fn node(db: &Db, w: &Wiring, node: u16, extra: &str) -> Server {
    let sections = format!("{}{FAST}{extra}", w.section(node));
    Server::start_named(
        db,
        &format!("node{node}"),
        Sections {
            extra: &sections,
            ..Sections::default()
        },
    )
}

/// Node `node` of the cluster on `db`, in a process whose machine clock is off as `skew`
/// says (`skewed`).
pub fn node_skewed(db: &Db, w: &Wiring, node: u16, skew: &Skew) -> Server {
    let sections = format!("{}{FAST}", w.section(node));
    Server::start_named_with(
        db,
        &format!("node{node}"),
        Sections {
            extra: &sections,
            ..Sections::default()
        },
        skew.0.clone(),
    )
}

/// The environment that makes a process's wall clock run off by an offset, leaving its
/// monotonic clock (timers, deadlines) alone.
pub struct Skew(Vec<(String, String)>);

/// Where Debian's `libfaketime` puts its library (`.ci/run` installs it).
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// A wall clock off by `offset` (`-5s`), or `None` after saying why the test is skipped
/// (no libfaketime on this machine).
pub fn skewed(test: &str, offset: &str) -> Option<Skew> {
    if !std::path::Path::new(FAKETIME).exists() {
        eprintln!("{test}: skipped: no {FAKETIME} (Debian's libfaketime) to skew a node's clock");
        return None;
    }
    Some(Skew(vec![
        ("LD_PRELOAD".into(), FAKETIME.into()),
        ("FAKETIME".into(), offset.into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
    ]))
}

/// `n` nodes, numbered from 1.
pub async fn nodes(db: &Db, w: &Wiring, n: u16) -> Vec<Server> {
    (1..=n).map(|i| node(db, w, i, "")).collect()
}

/// The log of a node that must refuse to start; `server` adds `[server]` keys.
pub fn refused(db: &Db, w: &Wiring, node: u16, name: &str, server: &str) -> String {
    let sections = w.section(node);
    Server::refused(
        db,
        name,
        Sections {
            server,
            extra: &sections,
            ..Sections::default()
        },
    )
}

/// `GET /healthz`.
pub async fn health(s: &Server) -> Value {
    s.http("GET", "/healthz", None, None).await.1
}

/// Waits until every node's `/healthz` says `degraded` with a reason naming `part`.
pub async fn degraded_everywhere(nodes: &[Server], part: &str) {
    for s in nodes {
        eventually(&format!("healthz says degraded, naming {part}"), || async {
            let h = health(s).await;
            h["status"] == "degraded" && h["reasons"].to_string().contains(part)
        })
        .await;
        assert_eq!(
            degraded_metric(s).await,
            "1",
            "/metrics agrees with /healthz"
        );
    }
}

/// The `courier_degraded` sample of a node's `/metrics`.
async fn degraded_metric(s: &Server) -> String {
    metric(s, "courier_degraded").await
}

/// The sample of the unlabelled series `name` in a node's `/metrics` (`none` if absent).
pub async fn metric(s: &Server, name: &str) -> String {
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let a = request(&s.addr, "GET", "/metrics", &[("Authorization", &auth)], "").await;
    let prefix = format!("{name} ");
    a.body
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or("none")
        .to_string()
}

/// Waits until every node's `/healthz` says `ok`.
pub async fn ok_everywhere(nodes: &[Server]) {
    for s in nodes {
        eventually("healthz is ok again", || async {
            health(s).await["status"] == "ok"
        })
        .await;
        assert_eq!(
            degraded_metric(s).await,
            "0",
            "/metrics agrees with /healthz"
        );
    }
}

/// Waits (bounded) until `check` holds; panics with `what` if it never does.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Redis or NATS server of the test's own, on a loopback port, that it may stop and
/// start again (on the same port).
pub struct Private {
    program: &'static str,
    args: Vec<String>,
    pub port: u16,
    child: Option<Child>,
}

impl Private {
    /// `redis-server` keeping nothing on disk, or `None` (said why) if it is not here.
    pub fn redis(test: &str) -> Option<Private> {
        let port = free_port();
        Private::start(
            test,
            "redis-server",
            vec![
                "--port".into(),
                port.to_string(),
                "--bind".into(),
                "127.0.0.1".into(),
                "--save".into(),
                String::new(),
                "--appendonly".into(),
                "no".into(),
            ],
            port,
        )
    }

    /// `nats-server` on loopback, or `None` (said why) if it is not here.
    pub fn nats(test: &str) -> Option<Private> {
        let port = free_port();
        Private::start(
            test,
            "nats-server",
            vec![
                "-a".into(),
                "127.0.0.1".into(),
                "-p".into(),
                port.to_string(),
            ],
            port,
        )
    }

    fn start(test: &str, program: &'static str, args: Vec<String>, port: u16) -> Option<Private> {
        if Command::new(program).arg("--version").output().is_err() {
            eprintln!("{test}: skipped: {program} is not installed");
            return None;
        }
        let mut p = Private {
            program,
            args,
            port,
            child: None,
        };
        p.up();
        Some(p)
    }

    pub fn url(&self) -> String {
        match self.program {
            "redis-server" => format!("redis://127.0.0.1:{}", self.port),
            _ => format!("nats://127.0.0.1:{}", self.port),
        }
    }

    /// Starts it and waits until it accepts connections.
    pub fn up(&mut self) {
        let child = Command::new(self.program)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.program));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "{} did not start", self.program);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops it (`SIGSTOP`, `on`: it answers nobody and keeps what it was sent, as
    /// a process that hangs does) or lets it go on (`SIGCONT`).
    pub fn hang(&self, on: bool) {
        let child = self.child.as_ref().expect("running");
        let done = Command::new("kill")
            .arg(if on { "-STOP" } else { "-CONT" })
            .arg(child.id().to_string())
            .status()
            .expect("kill");
        assert!(done.success(), "kill -{}", if on { "STOP" } else { "CONT" });
    }

    /// Kills it (`kill -9`).
    pub fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A TCP relay on a loopback port to `target` that may hang: while it does, it carries
/// nothing either way and holds what it read, as a network link that stalls does, and
/// hands it on when it goes on. Only for a node's link to the bus, the others' staying up.
pub struct Hanging {
    pub port: u16,
    held: tokio::sync::watch::Sender<bool>,
}

impl Hanging {
    pub async fn start(target: u16) -> Hanging {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (held, _) = tokio::sync::watch::channel(false);
        let on = held.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                let (from_client, to_client) = client.into_split();
                let (from_server, to_server) = server.into_split();
                tokio::spawn(carry(from_client, to_server, on.subscribe()));
                tokio::spawn(carry(from_server, to_client, on.subscribe()));
            }
        });
        Hanging { port, held }
    }

    pub fn hang(&self, on: bool) {
        self.held.send_replace(on);
    }
}

/// Copies one direction of a relayed connection, holding each read while the link hangs.
async fn carry(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut held: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if held.wait_for(|h| !*h).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        self.down();
    }
}
