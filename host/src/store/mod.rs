//! Persistence: one `Store` over SQLite or PostgreSQL through sqlx's `Any` driver, with the
//! schema from `migrations/<backend>`. Callers never know which database they hold; the
//! few statements where the dialects differ ask `Dialect`.
//!
//! Writes that must be ordered (sends, read positions) go through `batch::commit` on the
//! committer's connection; everything here is reads or independent writes.

pub mod accounts;
pub mod batch;
pub mod devices;
pub mod groups;
pub mod keys;
pub mod mailbox;
pub mod receipts;
pub mod social;
pub mod stream;
pub mod sync;

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::{FutureExt as _, StreamExt as _, TryFutureExt as _, TryStreamExt as _};
use sqlx::any::{
    AnyConnectOptions, AnyPoolOptions, AnyQueryResult, AnyRow, AnyStatement, AnyTypeInfo,
};
use sqlx::migrate::Migrator;
use sqlx::{Any, AnyPool, Connection as _, Either, Execute, Executor as _};

use crate::config::{SqliteSync, StorageConfig};
use crate::telemetry::{Repeats, Say};

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("../migrations/postgres");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// What a query ends with to lock the rows it reads until the transaction ends:
    /// PostgreSQL's `FOR UPDATE`; nothing on SQLite, whose one writer orders its
    /// transactions.
    pub fn for_update(self) -> &'static str {
        match self {
            Dialect::Postgres => " FOR UPDATE",
            Dialect::Sqlite => "",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    // The causes are in the messages, not the error chain: printed with its chain (`{:#}`),
    // a cause would be said twice.
    #[error("cannot open the database {url}: {cause}")]
    Open { url: String, cause: sqlx::Error },
    #[error("cannot apply the {dialect:?} migrations: {cause}")]
    Migrate {
        dialect: Dialect,
        cause: sqlx::migrate::MigrateError,
    },
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// A conversation's head row, as the transaction that holds its lock sees it: where its
/// stream is (the last seq and the running count of counting messages up to it) and, for a
/// group, its settings read under the lock.
#[derive(Debug, Clone)]
pub struct Head {
    pub conversation_id: i64,
    pub conversation_type: u8,
    pub last_seq: i64,
    /// Counting messages in seq 1..=last_seq.
    pub unread_acc: i64,
    /// Groups: everyone but owner and admins is muted.
    pub mute_all: bool,
    pub dissolved: bool,
    /// Moved by this transaction: written back before it commits.
    pub dirty: bool,
    /// The head's version (moved by every change of its members or a group's settings, but
    /// for a private conversation's members inserted with its head) and its last seq, as
    /// read: the batch's write compares both, so a head remembered from an earlier batch is
    /// written only if neither moved since.
    pub version: i64,
    pub base_seq: i64,
    /// Created by this transaction (PostgreSQL): no other one can see it before the commit,
    /// so it is not locked, and its version is the one the batch's write answers with.
    pub created: bool,
}

impl Head {
    /// A head as read from its row.
    pub fn read(
        conversation_id: i64,
        conversation_type: u8,
        last_seq: i64,
        unread_acc: i64,
        version: i64,
    ) -> Head {
        Head {
            conversation_id,
            conversation_type,
            last_seq,
            unread_acc,
            mute_all: false,
            dissolved: false,
            dirty: false,
            version,
            base_seq: last_seq,
            created: false,
        }
    }
}

/// The database. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    /// Pulls, overviews, lookups.
    read: AnyPool,
    /// The committer's transactions and other writes. On SQLite a single connection, so
    /// writers queue here instead of failing with `SQLITE_BUSY`.
    write: AnyPool,
    dialect: Dialect,
    health: Arc<Health>,
    /// Group receipts' passes over the members, shared by the asks of a group in flight.
    passes: Arc<receipts::Passes>,
    /// SQLite: who else waits for the one writer connection the committer keeps.
    asks: Arc<Asks>,
}

/// What a committer keeps between its batches. On PostgreSQL a connection of its own,
/// taken out of the pool, whose statements keep generic plans (the batch's few statements,
/// their arguments JSON arrays, planned once rather than at every execution: a third of a
/// millisecond each); the pool's connections plan every execution. On SQLite the one
/// writer connection, shared with every other write (`Store::write`): the committer keeps
/// it from one batch to the next until another writer asks for it (`Asks`), because sqlx
/// pings a connection each time it goes back to its pool — one more hand-off to the
/// connection's thread per batch, which the next batch's acquire waited for.
#[derive(Default)]
pub struct Writer {
    postgres: Option<sqlx::AnyConnection>,
    sqlite: Option<sqlx::pool::PoolConnection<Any>>,
}

impl Writer {
    /// Holds SQLite's writer connection between batches.
    pub fn holds(&self) -> bool {
        self.sqlite.is_some()
    }

    /// Gives SQLite's writer connection back to its pool, to the writer who asked.
    pub fn release(&mut self) {
        self.sqlite = None;
    }

    /// Whether it keeps a PostgreSQL connection, so its next batch takes none from the
    /// pool.
    pub fn connected(&self) -> bool {
        self.postgres.is_some()
    }

    /// Closes PostgreSQL's connection, one whose answer did not come (`Store::answered_by`):
    /// the next batch opens another. Closing rolls back whatever it had begun; where the
    /// close never reaches the database, its session ends a transaction left idle after
    /// the deadline (`Store::open`).
    pub fn close(&mut self) {
        self.postgres = None;
    }
}

/// The writers other than the committer waiting for SQLite's one writer connection
/// (`Store::write`), and the signal that one began to. The committer gives the connection
/// back when it hears the signal while idle, or sees a writer waiting after a batch.
#[derive(Debug, Default)]
pub(crate) struct Asks {
    waiting: std::sync::atomic::AtomicUsize,
    signal: tokio::sync::Notify,
}

impl Asks {
    /// A writer waits (until the guard drops).
    fn ask(&self) -> Asking<'_> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        self.signal.notify_one();
        Asking(self)
    }
}

/// A writer's wait for SQLite's writer connection, over when dropped.
pub(crate) struct Asking<'a>(&'a Asks);

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The transaction a commit batch runs in. On PostgreSQL an ordinary one on the
/// committer's connection (`Writer`), or none: a batch of heads remembered from an earlier
/// one is a single statement, its own transaction. On SQLite every statement is a hand-off
/// to the connection's thread and back, so `BEGIN` goes with the batch's first statement
/// and `COMMIT` with its last (`opening`, `closing`): a batch of sends is one or two
/// hand-offs. If it ends any other way — an error not followed by `abort`, or the future
/// dropped — the connection is closed rather than reused, and closing rolls back.
pub struct BatchTx<'w> {
    conn: BatchConn<'w>,
    /// The transaction was started (`BEGIN` sent) and not ended yet.
    open: bool,
}

enum BatchConn<'w> {
    Postgres(&'w mut Option<sqlx::AnyConnection>),
    Sqlite(&'w mut Option<sqlx::pool::PoolConnection<Any>>),
}

const UNTIL_THE_END: &str = "the connection until the batch is finished";

impl BatchTx<'_> {
    pub fn conn(&mut self) -> &mut sqlx::AnyConnection {
        match &mut self.conn {
            BatchConn::Postgres(c) => c.as_mut().expect(UNTIL_THE_END),
            BatchConn::Sqlite(c) => c.as_mut().expect(UNTIL_THE_END),
        }
    }

    /// What the batch's first statement starts with: SQLite's `BEGIN`, once.
    pub fn opening(&mut self) -> &'static str {
        match self.conn {
            BatchConn::Sqlite(_) if !self.open => {
                self.open = true;
                "BEGIN IMMEDIATE; "
            }
            _ => "",
        }
    }

    /// What the batch's last statement may end with: SQLite's `COMMIT` (then `finish` with
    /// `committed`).
    pub fn closing(&self) -> &'static str {
        match self.conn {
            BatchConn::Sqlite(_) => "; COMMIT",
            BatchConn::Postgres(_) => "",
        }
    }

    /// Commits, unless the last statement did (`committed`) or there is no transaction.
    pub async fn finish(mut self, committed: bool) -> sqlx::Result<()> {
        if self.open && !committed {
            self.conn().execute("COMMIT").await?;
        }
        self.open = false;
        Ok(())
    }

    /// Closes the connection (it broke): the next batch takes another.
    pub fn discard(mut self) {
        self.open = true;
    }

    /// Rolls back after a failed statement, so the connection is kept; if even that
    /// fails, dropping closes it.
    pub async fn abort(mut self) {
        if self.open && self.conn().execute("ROLLBACK").await.is_ok() {
            self.open = false;
        }
    }
}

impl Drop for BatchTx<'_> {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        match &mut self.conn {
            // Closed, not reused: closing rolls the transaction back.
            BatchConn::Postgres(c) => drop(c.take()),
            // Taken out of the pool first, so the pool opens another.
            BatchConn::Sqlite(c) => {
                if let Some(c) = c.take() {
                    drop(c.detach());
                }
            }
        }
    }
}

/// Whether the database's connections can be trusted. Pooled connections are not pinged
/// before use (a round trip each). Once one is found broken — the server terminated it,
/// restarted, or the network dropped it — the others may be dead too, or about to be: a
/// server terminating every connection reaches them one after another, so one that answers
/// a ping now may be cut a moment later. So every pooled connection opened before the
/// break is closed as it leaves the pool, and for a while the newer ones are pinged.
///
/// A connection can also go silent: the database's machine lost power, or the network
/// between dropped it without a reset. Nothing then ends the wait for an answer, so on
/// PostgreSQL every wait has a deadline (`storage.answer_timeout_secs`): the pool's
/// acquire timeout for a connection (a miss there is a busy pool, not a break), and
/// `within` for the answers (a miss there fails as if the connection broke, and is noted
/// so): twice the deadline for work that takes its connection from the pool itself
/// (`pooled`), what is left of a commit batch's for its runs (`Store::answered_by`).
#[derive(Debug)]
pub struct Health {
    /// What `broken_at_us` counts from.
    origin: std::time::Instant,
    /// When the last broken connection was found, in µs since `origin` (0: never).
    broken_at_us: AtomicU64,
    /// How long an answer is waited for (PostgreSQL); `None`: as long as it takes (SQLite,
    /// whose statements wait for a disk, not a network).
    answer: Option<Duration>,
}

/// How long connections are pinged before use after one was found broken.
const SUSPECT: Duration = Duration::from_secs(5);

impl Health {
    fn new(answer: Option<Duration>) -> Health {
        Health {
            origin: std::time::Instant::now(),
            broken_at_us: AtomicU64::new(0),
            answer,
        }
    }

    /// Notes a failed statement: a broken connection retires every pooled connection
    /// opened before it.
    pub fn note(&self, e: &sqlx::Error) {
        if is_broken(e) {
            let now = self.origin.elapsed().as_micros().max(1) as u64;
            self.broken_at_us.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// The last break, as time since `origin`, if any.
    fn broken_at(&self) -> Option<Duration> {
        match self.broken_at_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// Whether a connection `age` old was opened before the last break.
    fn opened_before_break(&self, age: Duration) -> bool {
        self.broken_at()
            .is_some_and(|broken_at| self.origin.elapsed().saturating_sub(age) <= broken_at)
    }

    /// Whether a pooled connection `age` old may be used: not if it was opened before the
    /// last break; pinged if the break was recent.
    async fn usable(&self, conn: &mut sqlx::AnyConnection, age: Duration) -> bool {
        let Some(broken_at) = self.broken_at() else {
            return true;
        };
        if self.opened_before_break(age) {
            return false;
        }
        self.origin.elapsed() - broken_at > SUSPECT || conn.ping().await.is_ok()
    }

    /// What work that takes its connection from the pool may wait in all: the pool's wait
    /// for one (its acquire timeout, one deadline), then the answers (one more). A commit
    /// batch has as much for all its runs.
    fn budget(&self) -> Option<Duration> {
        self.answer.map(|answer| answer * 2)
    }

    /// `work`, which takes its connection from the pool, `within` the `budget`.
    pub async fn pooled<F: Future>(&self, work: F) -> sqlx::Result<F::Output> {
        self.within(self.budget(), work).await
    }

    /// `work`'s output, or, when it is not done within `deadline` (`None`: no deadline),
    /// an I/O error (`TimedOut`) noted as a break. The break is noted before `work` is
    /// dropped: a pooled connection it held goes back to the pool then, and one opened
    /// before the break is closed there rather than pinged (a ping on a silent
    /// connection would wait for ever, holding its place in the pool).
    async fn within<F: Future>(
        &self,
        deadline: Option<Duration>,
        work: F,
    ) -> sqlx::Result<F::Output> {
        let Some(deadline) = deadline else {
            return Ok(work.await);
        };
        let mut work = std::pin::pin!(work);
        tokio::select! {
            out = &mut work => Ok(out),
            () = tokio::time::sleep(deadline) => Err(self.missed(deadline)),
        }
    }

    /// The error of an answer not had within `deadline`, noted as a break.
    fn missed(&self, deadline: Duration) -> sqlx::Error {
        let e = sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the database did not answer within {deadline:?}"),
        ));
        self.note(&e);
        e
    }
}

/// Whether `e` is an answer the database did not give within the deadline
/// (`Health::within`).
pub fn missed(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut)
}

/// Whether `e` says the connection itself is gone (rather than the statement failing):
/// I/O and protocol errors, PostgreSQL's connection exceptions (class 08) and its
/// shutdown codes (`57P01` terminated by the administrator, `57P02` crash, `57P03` not
/// accepting connections yet).
pub fn is_broken(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(d) => d
            .code()
            .is_some_and(|c| c.starts_with("08") || matches!(&*c, "57P01" | "57P02" | "57P03")),
        _ => false,
    }
}

/// One of the store's pools, noting every failure of a statement, a `BEGIN` or an acquire
/// in the store's `Health`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Db<'a> {
    pool: &'a AnyPool,
    health: &'a Health,
    /// SQLite's writer: each use asks the committer for the connection it keeps.
    asks: Option<&'a Asks>,
}

impl<'a> Db<'a> {
    /// Asks the committer for SQLite's writer connection, if this is it.
    fn ask(&self) -> Option<Asking<'a>> {
        self.asks.map(Asks::ask)
    }

    /// `work`, asking for SQLite's writer connection until it is done.
    fn asking<'e, T: 'e>(&self, work: BoxFuture<'e, T>) -> BoxFuture<'e, T>
    where
        'a: 'e,
    {
        let asking = self.ask();
        async move {
            let _asking = asking;
            work.await
        }
        .boxed()
    }

    pub async fn begin(&self) -> sqlx::Result<sqlx::Transaction<'static, Any>> {
        let _asking = self.ask();
        self.pool.begin().await.inspect_err(|e| self.health.note(e))
    }

    pub async fn acquire(&self) -> sqlx::Result<sqlx::pool::PoolConnection<Any>> {
        let _asking = self.ask();
        self.pool
            .acquire()
            .await
            .inspect_err(|e| self.health.note(e))
    }
}

impl<'c> sqlx::Executor<'c> for Db<'c> {
    type Database = Any;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, sqlx::Result<Either<AnyQueryResult, AnyRow>>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Any>,
    {
        let health = self.health;
        let asking = self.ask();
        let rows = self.pool.fetch_many(query);
        // The whole answer, the pool's wait for a connection included, within the
        // `budget` (as `pooled`): one timer, not one a row. The stream ends with a miss.
        let rows = match health.budget() {
            None => rows,
            Some(answer) => {
                let deadline = Box::pin(tokio::time::sleep(answer));
                futures_util::stream::unfold(Some((rows, deadline)), move |state| async move {
                    let (mut rows, mut deadline) = state?;
                    tokio::select! {
                        next = rows.next() => next.map(|r| (r, Some((rows, deadline)))),
                        () = &mut deadline => Some((Err(health.missed(answer)), None)),
                    }
                })
                .boxed()
            }
        };
        rows.inspect_err(move |e| health.note(e))
            .map(move |r| {
                let _asking = &asking;
                r
            })
            .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, sqlx::Result<Option<AnyRow>>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Any>,
    {
        let health = self.health;
        self.asking(
            health
                .pooled(self.pool.fetch_optional(query))
                .map(Result::flatten)
                .inspect_err(move |e| health.note(e))
                .boxed(),
        )
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [AnyTypeInfo],
    ) -> BoxFuture<'e, sqlx::Result<AnyStatement<'q>>>
    where
        'c: 'e,
    {
        self.asking(self.pool.prepare_with(sql, parameters))
    }

    fn describe<'e, 'q: 'e>(self, sql: &'q str) -> BoxFuture<'e, sqlx::Result<sqlx::Describe<Any>>>
    where
        'c: 'e,
    {
        self.asking(self.pool.describe(sql))
    }
}

impl Store {
    /// Opens (creating a SQLite file if missing) and migrates the database.
    pub async fn open(cfg: &StorageConfig) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let answer = Duration::from_secs(cfg.answer_timeout_secs);
        let health = Arc::new(Health::new(
            (!cfg.url.starts_with("sqlite:")).then_some(answer),
        ));
        let open_err = |cause| StoreError::Open {
            url: redact(&cfg.url),
            cause,
        };
        let store = if cfg.url.starts_with("sqlite:") {
            let url = sqlite_url(&cfg.url).map_err(open_err)?;
            let sync = match cfg.sqlite_synchronous {
                SqliteSync::Full => "FULL",
                SqliteSync::Normal => "NORMAL",
            };
            // Temporary storage in memory: a statement that may have to undo itself inside a
            // transaction keeps the pages it changes in a statement journal, which SQLite
            // spills to a new temporary file past 64 KiB — a batch of sends in as many
            // conversations does, so every commit created, wrote and deleted a file.
            // A new database gets 2 KiB pages (an existing one keeps its own; the size is
            // set before WAL mode writes the first page): a commit writes every page it
            // changed whole into the log, and a batch of sends in as many conversations
            // changes a leaf of each conversation's messages and of the resend index, so
            // smaller pages write less (ARCHITECTURE.md, Decisions).
            let pragmas = format!(
                "PRAGMA page_size = 2048; PRAGMA journal_mode = WAL; \
                 PRAGMA synchronous = {sync}; \
                 PRAGMA busy_timeout = 10000; PRAGMA foreign_keys = ON; \
                 PRAGMA temp_store = MEMORY;"
            );
            let options = AnyConnectOptions::from_str(&url).map_err(open_err)?;
            let pool = |max: u32, extra: &str| {
                let pragmas = format!("{pragmas} {extra}");
                AnyPoolOptions::new()
                    .max_connections(max)
                    .test_before_acquire(false)
                    .idle_timeout(None)
                    .max_lifetime(None)
                    .acquire_timeout(Duration::from_secs(30))
                    .after_connect(move |conn, _| {
                        let pragmas = pragmas.clone();
                        Box::pin(async move {
                            conn.execute(sqlx::raw_sql(&pragmas)).await?;
                            Ok(())
                        })
                    })
                    .connect_with(options.clone())
            };
            // The writer first: it sets WAL mode before any reader opens the file. It leaves
            // checkpoints to the background task below unless the log grows past 10,000
            // pages (20 MB with 2 KiB pages, 40 MB in an older file's 4 KiB ones), so a
            // commit rarely pays for copying the log into the database.
            let write = pool(1, WRITER_PRAGMAS).await.map_err(open_err)?;
            let read = pool(cfg.max_connections, "").await.map_err(open_err)?;
            // `normal` syncs the log only in checkpoints, so they come faster while it grows.
            let busy = match cfg.sqlite_synchronous {
                SqliteSync::Full => Duration::from_millis(100),
                SqliteSync::Normal => Duration::from_millis(25),
            };
            tokio::spawn(checkpoints(read.clone(), busy));
            Store {
                read,
                write,
                dialect: Dialect::Sqlite,
                health,
                passes: Arc::default(),
                asks: Arc::default(),
            }
        } else {
            // No ping before each use while the database is healthy (a round trip each).
            // Once a connection is found broken, those opened before are closed and the
            // newer ones pinged for a while (`Health`); the batch that met the broken one
            // runs again (`messaging::commit`).
            let (pinging, releasing) = (health.clone(), health.clone());
            let pool = AnyPoolOptions::new()
                .max_connections(cfg.max_connections)
                .test_before_acquire(false)
                .before_acquire(move |conn, meta| {
                    let health = pinging.clone();
                    Box::pin(async move { Ok(health.usable(conn, meta.age).await) })
                })
                // sqlx pings every connection given back; one opened before a break is
                // closed instead (a statement that missed its deadline left it silent).
                .after_release(move |_, meta| {
                    let health = releasing.clone();
                    Box::pin(async move { Ok(!health.opened_before_break(meta.age)) })
                })
                // A connection not had by then (the pool busy, or the database not
                // answering a new one) is an answer not had; not a break (`Health`).
                .acquire_timeout(answer)
                // The batch statements are prepared once and run with new values every
                // time; a generic plan for their `IN (VALUES …)` lists can turn an index
                // lookup into a scan of the whole table. Plan each execution for its values.
                // No JIT: the planner guesses 100 elements for every JSON array a statement
                // reads, so once a group has thousands of members its guess for a batch
                // passes JIT's thresholds, and compiling the plan took 20–460 ms for a
                // statement that runs in under 1 ms.
                // And the database's side of a connection the server gave up on
                // (`Health::within`): when the network went silent the close never
                // reached it, and a session left inside a transaction would hold its locks
                // (a conversation's head, a user's stream) until the database's own TCP
                // keepalive ends it, two hours by default. It ends one idle in a
                // transaction after the deadline, and probes an idle connection after the
                // deadline too.
                .after_connect(move |conn, _| {
                    let secs = answer.as_secs();
                    let settings = format!(
                        "SET plan_cache_mode = force_custom_plan; SET jit = off; \
                         SET idle_in_transaction_session_timeout = {}; \
                         SET tcp_keepalives_idle = {secs}; \
                         SET tcp_keepalives_interval = {}; SET tcp_keepalives_count = 3",
                        secs * 1000,
                        secs.div_ceil(3),
                    );
                    Box::pin(async move {
                        conn.execute(sqlx::raw_sql(&settings)).await?;
                        Ok(())
                    })
                })
                .connect(&cfg.url)
                .await
                .map_err(open_err)?;
            Store {
                read: pool.clone(),
                write: pool,
                dialect: Dialect::Postgres,
                health,
                passes: Arc::default(),
                asks: Arc::default(),
            }
        };
        let migrator = match store.dialect {
            Dialect::Sqlite => &SQLITE_MIGRATIONS,
            Dialect::Postgres => &POSTGRES_MIGRATIONS,
        };
        migrator
            .run(&store.write)
            .await
            .map_err(|cause| StoreError::Migrate {
                dialect: store.dialect,
                cause,
            })?;
        Ok(store)
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The connection pools' use now: (name, open, idle, most).
    pub fn pools(&self) -> [(&'static str, u32, usize, u32); 2] {
        let of = |name, p: &AnyPool| {
            (
                name,
                p.size(),
                p.num_idle(),
                p.options().get_max_connections(),
            )
        };
        [of("read", &self.read), of("write", &self.write)]
    }

    pub(crate) fn read(&self) -> Db<'_> {
        Db {
            pool: &self.read,
            health: &self.health,
            asks: None,
        }
    }

    /// Writes other than the committer's. On SQLite they ask the committer for the one
    /// writer connection it keeps between batches (`Writer`).
    pub(crate) fn write(&self) -> Db<'_> {
        Db {
            pool: &self.write,
            health: &self.health,
            asks: (self.dialect == Dialect::Sqlite).then_some(&*self.asks),
        }
    }

    /// Resolves once another writer asks for SQLite's writer connection (at once if one
    /// asked since the last time), for a committer that keeps it while idle.
    pub async fn writer_asked(&self) {
        self.asks.signal.notified().await;
    }

    /// Gives SQLite's writer connection back if another writer waits for it, else keeps
    /// it for the next batch (after a batch, and when `writer_asked` resolves: a signal
    /// may be older than a release that already answered it).
    pub fn release_if_asked(&self, writer: &mut Writer) {
        if self.asks.waiting.load(Ordering::SeqCst) > 0 {
            writer.release();
        }
    }

    /// A transaction of the committer's (see `BatchTx`): `explicit`, or on PostgreSQL none
    /// (the batch is one statement).
    pub(crate) async fn begin_batch<'w>(
        &self,
        writer: &'w mut Writer,
        explicit: bool,
    ) -> sqlx::Result<BatchTx<'w>> {
        let noted = |e: sqlx::Error| {
            self.health.note(&e);
            e
        };
        match self.dialect {
            Dialect::Postgres => {
                if writer.postgres.is_none() {
                    // Generic plans, which do not depend on the values (every look-up is an
                    // index probe per key), and never a sequential scan: a generic plan
                    // made while a table is still empty (a new database) scans it for
                    // every key, and keeps doing so on this connection as the table grows.
                    let mut conn = self.write.acquire().await.map_err(noted)?.detach();
                    conn.execute(sqlx::raw_sql(
                        "SET plan_cache_mode = auto; SET enable_seqscan = off",
                    ))
                    .await
                    .map_err(noted)?;
                    writer.postgres = Some(conn);
                }
                let mut tx = BatchTx {
                    conn: BatchConn::Postgres(&mut writer.postgres),
                    open: false,
                };
                if explicit {
                    if let Err(e) = tx.conn().execute("BEGIN").await {
                        // A connection that failed its `BEGIN` is not kept.
                        tx.open = true;
                        return Err(noted(e));
                    }
                    tx.open = true;
                }
                Ok(tx)
            }
            Dialect::Sqlite => {
                // The committer's own acquire asks nobody (`Store::write` would ask it).
                if writer.sqlite.is_none() {
                    let conn = self.write.acquire().await.map_err(noted)?;
                    writer.sqlite = Some(conn);
                }
                Ok(BatchTx {
                    conn: BatchConn::Sqlite(&mut writer.sqlite),
                    open: false,
                })
            }
        }
    }

    /// Runs a read, and once more when its connection broke (after the first failure the
    /// pool hands out only connections opened since, pinged: `Health`). Only for reads:
    /// a write outside a transaction may have happened.
    pub(crate) async fn read_twice<T, F, Fut>(&self, read: F) -> sqlx::Result<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = sqlx::Result<T>>,
    {
        match read().await {
            // Not after a missed answer: the read had its deadline.
            Err(e) if is_broken(&e) && !missed(&e) => {
                self.health.note(&e);
                read().await
            }
            other => other,
        }
    }

    /// `work`, which takes its connection from the pool, under the deadline (`Health::pooled`;
    /// on SQLite none).
    pub async fn pooled<F: Future>(&self, work: F) -> sqlx::Result<F::Output> {
        self.health.pooled(work).await
    }

    /// How long an answer is waited for (`storage.answer_timeout_secs`; on SQLite none).
    pub fn answer_timeout(&self) -> Option<Duration> {
        self.health.answer
    }

    /// What a commit batch may wait for the database in all, its runs again included
    /// (`Health::budget`; on SQLite no limit).
    pub fn batch_budget(&self) -> Option<Duration> {
        self.health.budget()
    }

    /// `work` under a deadline at `until` (`None`: none), a miss noted as a break.
    pub async fn answered_by<F: Future>(
        &self,
        until: Option<tokio::time::Instant>,
        work: F,
    ) -> sqlx::Result<F::Output> {
        let left = until.map(|until| until.saturating_duration_since(tokio::time::Instant::now()));
        self.health.within(left, work).await
    }

    /// Notes a failed statement of a transaction (see `Health`).
    pub fn note(&self, e: &sqlx::Error) {
        self.health.note(e);
    }

    pub async fn close(&self) {
        self.read.close().await;
        // A committer keeping SQLite's writer connection gives it back, which closing
        // the pool waits for.
        let _asking = self.write().ask();
        self.write.close().await;
    }
}

/// The SQLite writer's own settings: checkpoint only as a fallback (10,000 pages), and
/// truncate the log back to 64 MiB after one.
const WRITER_PRAGMAS: &str =
    "PRAGMA wal_autocheckpoint = 10000; PRAGMA journal_size_limit = 67108864;";

/// Copies the SQLite write-ahead log into the database from a reader connection: a passive
/// checkpoint never blocks the writer, so commits do not stall on it. Every `busy` while
/// the log's frame count moves (it grows, or starts over); when a look finds it where the
/// last left it, the next waits twice as long, up to 100 ms (after a failure, 100 ms).
/// With `synchronous = normal` the checkpoint is what syncs the log, so a commit reaches
/// the disk within about 100 ms, as it did when this ran every 100 ms. Failures (a full
/// disk) are logged when they start, then counted into a line every 10 s, and the first
/// checkpoint that works again says so.
async fn checkpoints(read: AnyPool, busy: Duration) {
    const IDLE: Duration = Duration::from_millis(100);
    let (mut wait, mut frames) = (busy, None);
    let failures = Repeats::new();
    loop {
        tokio::time::sleep(wait).await;
        if read.is_closed() {
            return;
        }
        // One row: busy, the log's frames, the frames now in the database.
        match sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_one(&read)
            .await
        {
            Ok(row) => {
                let now: Option<i64> = sqlx::Row::try_get(&row, 1).ok();
                wait = match now != frames {
                    true => busy,
                    false => (wait * 2).min(IDLE),
                };
                frames = now;
                if let Some(failed) = failures.worked() {
                    tracing::info!(failures = failed, "SQLite checkpoints work again");
                }
            }
            Err(e) => {
                match failures.failed() {
                    Say::First => tracing::warn!("SQLite checkpoint failed: {e}"),
                    Say::Again(n) => tracing::warn!(
                        failures = n,
                        "SQLite checkpoint failed {n} times since the last line: {e}"
                    ),
                    Say::Quiet => {}
                }
                wait = IDLE;
            }
        }
    }
}

/// `sqlite://relative/or/absolute/path.db`: creates the parent folder and asks sqlx to
/// create the file.
fn sqlite_url(url: &str) -> Result<String, sqlx::Error> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(url);
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path != ":memory:"
        && let Some(parent) = std::path::Path::new(path).parent()
        && !parent.as_os_str().is_empty()
    {
        std::fs::create_dir_all(parent).map_err(sqlx::Error::Io)?;
    }
    let query = if query.is_empty() {
        "mode=rwc".to_string()
    } else if query.contains("mode=") {
        query.to_string()
    } else {
        format!("{query}&mode=rwc")
    };
    Ok(format!("sqlite://{path}?{query}"))
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// Database errors answered `store_unavailable`, for the log: a database gone fails every
/// request, and says so once (`Repeats`).
pub(crate) static FAILURES: Repeats = Repeats::new();

/// Logs a database error that an answer will only call `store_unavailable`.
pub(crate) fn log_failure(e: &dyn std::fmt::Display) {
    match FAILURES.failed() {
        Say::First => tracing::error!("database: {e}"),
        Say::Again(n) => tracing::error!(
            failures = n,
            "database: {n} requests failed since the last line: {e}"
        ),
        Say::Quiet => {}
    }
}

/// A database error, for an answer: logged (`log_failure`), answered `store_unavailable`.
pub fn unavailable(e: sqlx::Error) -> crate::protocol::Error {
    log_failure(&e);
    crate::protocol::Error::unavailable("the database could not answer; retry")
}

/// `n` placeholders numbered from `first`: `$3, $4` on PostgreSQL, `?, ?` on SQLite.
/// (SQLite resolves a named `$n` by walking a list per parameter, quadratic in a statement
/// of thousands; positional `?` costs nothing. A statement using this must take all its
/// parameters from it, in order.)
pub(crate) fn placeholders(d: Dialect, first: usize, n: usize) -> String {
    let mut s = String::with_capacity(n * 4);
    for i in 0..n {
        if i > 0 {
            s.push_str(", ");
        }
        match d {
            Dialect::Sqlite => s.push('?'),
            Dialect::Postgres => {
                s.push('$');
                s.push_str(&(first + i).to_string());
            }
        }
    }
    s
}

/// A statement's argument as JSON text (arrays of numbers, strings and tuples of them).
pub(crate) fn json<T: serde::Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).expect("numbers and strings serialize")
}

/// Columns of numbers, each in a PostgreSQL array's text form (`{1,2}`), for a statement
/// that casts each to `BIGINT[]` and takes the rows apart with `unnest`: no JSON to parse
/// (PostgreSQL reads a JSON number as `numeric`, and prints it again before each cast).
pub(crate) fn pg_ints<const N: usize>(
    rows: impl ExactSizeIterator<Item = [i64; N]>,
) -> [String; N] {
    let mut columns: [String; N] = std::array::from_fn(|_| {
        let mut s = String::with_capacity(rows.len() * 12 + 2);
        s.push('{');
        s
    });
    for row in rows {
        for (column, n) in columns.iter_mut().zip(row) {
            if column.len() > 1 {
                column.push(',');
            }
            column.push_str(itoa::Buffer::new().format(n));
        }
    }
    columns.map(|mut s| {
        s.push('}');
        s
    })
}

/// A column of strings in a PostgreSQL array's text form, for `TEXT[]` (`pg_ints`): every
/// string quoted, `"` and `\` escaped.
pub(crate) fn pg_texts<'a>(values: impl ExactSizeIterator<Item = &'a str> + Clone) -> String {
    let bytes: usize = values.clone().map(|v| v.len() + 3).sum();
    let mut s = String::with_capacity(bytes + 2);
    s.push('{');
    for v in values {
        if s.len() > 1 {
            s.push(',');
        }
        s.push('"');
        let mut rest = v;
        while let Some(at) = rest.find(['"', '\\']) {
            s.push_str(&rest[..at]);
            s.push('\\');
            s.push_str(&rest[at..=at]);
            rest = &rest[at + 1..];
        }
        s.push_str(rest);
        s.push('"');
    }
    s.push('}');
    s
}

/// The rows of columns bound as arrays (`pg_ints`, `pg_texts`) from parameter `$first` on,
/// one named column each: `(SELECT unnest(CAST($first AS BIGINT[])) AS id, …)`. Each
/// `unnest` in the select list, not one `unnest` of every column in `FROM`: PostgreSQL
/// stores what a function in `FROM` returns before the first row is read, and the select
/// list's are read row by row in step (measured in ARCHITECTURE.md, Decisions).
pub(crate) fn pg_rows(first: usize, columns: &[(&str, &str)]) -> String {
    let columns: Vec<String> = columns
        .iter()
        .enumerate()
        .map(|(i, (name, ty))| format!("unnest(CAST(${} AS {ty}[])) AS {name}", first + i))
        .collect();
    format!("(SELECT {})", columns.join(", "))
}

/// An aggregate joining `expr` of every row into one text, one line per row (NULL rows
/// left out), and the lines back. sqlx hands SQLite's rows over from its worker thread one
/// at a time (1–4 µs each), so reading a large group's members as one row is several times
/// cheaper than as 10,000. `expr` must hold no newline (user ids hold none).
pub(crate) fn lines_of(d: Dialect, expr: &str) -> String {
    match d {
        Dialect::Sqlite => format!("group_concat({expr}, char(10))"),
        Dialect::Postgres => format!("string_agg({expr}, chr(10))"),
    }
}

/// The lines of a [`lines_of`] aggregate (none for NULL: no rows).
pub(crate) fn lines(joined: Option<String>) -> Vec<String> {
    joined
        .map(|all| all.split('\n').map(str::to_string).collect())
        .unwrap_or_default()
}

/// A statement reading the rows of `table` whose `keys` (columns, `true` for an integer
/// one) match one of the tuples of the JSON array `$1` (`[[k0, k1], …]`), `extra` anded to
/// the match (a tuple given twice yields its rows twice). `columns` are plain names;
/// `extra` must not name a column of SQLite's `json_each` (`key`, `value`, `type`, `id`, …).
/// The same statement serves any number of tuples. On PostgreSQL each tuple is
/// an index probe of its own (a lateral subquery, `OFFSET 0` keeping it one), whatever
/// the planner guesses of the array's length — so a generic plan is as good as a custom
/// one.
pub(crate) fn lookup(
    d: Dialect,
    columns: &str,
    table: &str,
    keys: &[(&str, bool)],
    extra: &str,
) -> String {
    match d {
        Dialect::Postgres => {
            let matches: Vec<String> = keys
                .iter()
                .enumerate()
                .map(|(i, (k, int))| match int {
                    true => format!("{k} = CAST(e->>{i} AS BIGINT)"),
                    false => format!("{k} = e->>{i}"),
                })
                .collect();
            format!(
                "SELECT x.* FROM jsonb_array_elements(CAST($1 AS jsonb)) e CROSS JOIN LATERAL \
                 (SELECT {columns} FROM {table} WHERE {} {extra} OFFSET 0) x",
                matches.join(" AND ")
            )
        }
        // A join, not a row-value `IN`: SQLite's `IN` used only the first column of a
        // two-column key when that column is an integer (every member of the group read
        // to find one).
        Dialect::Sqlite => {
            let matches: Vec<String> = keys
                .iter()
                .enumerate()
                .map(|(i, (k, _))| format!("t.{k} = e.value->>{i}"))
                .collect();
            let columns: Vec<String> = columns
                .split(',')
                .map(|c| format!("t.{}", c.trim()))
                .collect();
            format!(
                "SELECT {} FROM json_each($1) e JOIN {table} t ON {} WHERE 1 {extra}",
                columns.join(", "),
                matches.join(" AND ")
            )
        }
    }
}

/// Splits `items` into runs of 128, 64, 32, … 1, so a batch of any size uses a handful of
/// statement shapes the connection's statement cache keeps prepared.
pub(crate) fn shaped_chunks<T>(items: &[T]) -> Vec<&[T]> {
    let mut out = Vec::new();
    let mut rest = items;
    while !rest.is_empty() {
        let n = if rest.len() >= 128 {
            128
        } else {
            1 << (usize::BITS - 1 - rest.len().leading_zeros())
        };
        let (head, tail) = rest.split_at(n);
        out.push(head);
        rest = tail;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh SQLite store in a folder of its own under the system's temporary folder
    /// (removed first, if an earlier run left it), and that folder.
    pub(super) async fn scratch_store(name: &str) -> (std::path::PathBuf, Store) {
        let dir = std::env::temp_dir().join(format!("courier-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cfg = StorageConfig {
            url: format!("sqlite://{}/t.db", dir.display()),
            ..StorageConfig::default()
        };
        (dir, Store::open(&cfg).await.unwrap())
    }

    /// A store on a database of its own on the PostgreSQL server `PG_TEST_URL` names (its
    /// name and the admin URL, to drop it after), or `None` with the reason printed.
    pub(super) async fn scratch_postgres(name: &str) -> Option<(Store, (String, String))> {
        use sqlx::Connection as _;
        let Ok(admin) = std::env::var("PG_TEST_URL") else {
            eprintln!("{name}: PostgreSQL skipped (PG_TEST_URL is not set)");
            return None;
        };
        let db = format!("courier_unit_{name}_{}", std::process::id()).replace('-', "_");
        let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
        for sql in [
            format!("DROP DATABASE IF EXISTS {db}"),
            format!("CREATE DATABASE {db}"),
        ] {
            sqlx::raw_sql(&sql).execute(&mut conn).await.unwrap();
        }
        let (base, _) = admin.rsplit_once('/').expect("a URL ending in /database");
        let cfg = StorageConfig {
            url: format!("{base}/{db}"),
            ..StorageConfig::default()
        };
        Some((Store::open(&cfg).await.unwrap(), (admin, db)))
    }

    /// Drops what `scratch_postgres` made, its store closed.
    pub(super) async fn drop_postgres(store: Store, (admin, db): (String, String)) {
        use sqlx::Connection as _;
        store.close().await;
        let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
        sqlx::raw_sql(&format!("DROP DATABASE {db} WITH (FORCE)"))
            .execute(&mut conn)
            .await
            .unwrap();
    }

    /// Writes `body` as a whole batch in `tx` (with its `BEGIN` and `COMMIT`) and commits.
    async fn commit_batch(mut tx: BatchTx<'_>, body: &str) {
        let sql = format!("{}{body}{}", tx.opening(), tx.closing());
        tx.conn().execute(sql.as_str()).await.unwrap();
        tx.finish(true).await.unwrap();
    }

    /// A SQLite batch sends `BEGIN` with its first statement and `COMMIT` with its last; one
    /// that ends otherwise must leave nothing written and the single writer usable.
    #[tokio::test]
    async fn a_batch_that_does_not_finish_rolls_back_and_frees_the_writer() {
        let (dir, store) = scratch_store("batch-tx").await;
        let insert = "INSERT INTO server_secrets (name, value) VALUES ('k', 'v')";
        let count = || async {
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM server_secrets WHERE name = 'k'")
                .fetch_one(store.write())
                .await
                .unwrap();
            n
        };
        let mut writer = Writer::default();
        {
            let mut tx = store.begin_batch(&mut writer, true).await.unwrap();
            let sql = format!("{}{insert}", tx.opening());
            tx.conn().execute(sql.as_str()).await.unwrap();
            // Dropped unfinished, as after an error.
        }
        assert_eq!(count().await, 0, "an unfinished batch wrote");
        {
            let mut tx = store.begin_batch(&mut writer, true).await.unwrap();
            let sql = format!("{}{insert}", tx.opening());
            tx.conn().execute(sql.as_str()).await.unwrap();
            // Rolled back after a failed statement: the connection stays usable.
            tx.abort().await;
        }
        // Kept by the committer between batches until another writer asks (the next test).
        assert!(
            writer.holds(),
            "the aborted batch's connection was not kept"
        );
        writer.release();
        assert_eq!(count().await, 0, "an aborted batch wrote");
        commit_batch(store.begin_batch(&mut writer, true).await.unwrap(), insert).await;
        writer.release();
        assert_eq!(count().await, 1, "a finished batch was not written");
        // The connection went back to the pool outside any transaction.
        let mut tx = store.write().begin().await.unwrap();
        sqlx::query("DELETE FROM server_secrets WHERE name = 'k'")
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(count().await, 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The committer keeps SQLite's one writer connection between batches; another writer
    /// that asks for it gets it, whether it asks while the committer is idle or during a
    /// batch.
    #[tokio::test]
    async fn a_writer_who_asks_gets_the_connection_the_committer_keeps() {
        let (dir, store) = scratch_store("writer-asks").await;
        let batch =
            |n: u32| format!("INSERT INTO server_secrets (name, value) VALUES ('b{n}', 'v')");
        let other_write = |n: u32| {
            let store = store.clone();
            tokio::spawn(async move {
                sqlx::query(&format!(
                    "INSERT INTO server_secrets (name, value) VALUES ('o{n}', 'v')"
                ))
                .execute(store.write())
                .await
                .unwrap()
                .rows_affected()
            })
        };
        let mut writer = Writer::default();
        commit_batch(
            store.begin_batch(&mut writer, true).await.unwrap(),
            &batch(1),
        )
        .await;
        store.release_if_asked(&mut writer);
        assert!(
            writer.holds(),
            "nobody asked, yet the connection was given back"
        );
        // Asked while the committer is idle: it hears, and gives the connection back.
        let limit = Duration::from_secs(60);
        let other = other_write(1);
        let asked = tokio::time::timeout(limit, store.writer_asked()).await;
        asked.expect("the other write never asked");
        store.release_if_asked(&mut writer);
        assert!(
            !writer.holds(),
            "asked while idle, yet the connection was kept"
        );
        let done = tokio::time::timeout(limit, other).await;
        assert_eq!(done.expect("the other write got no connection").unwrap(), 1);
        // Asked during a batch: given back after it.
        let tx = store.begin_batch(&mut writer, true).await.unwrap();
        let other = other_write(2);
        let asked = tokio::time::timeout(limit, store.writer_asked()).await;
        asked.expect("the other write never asked");
        commit_batch(tx, &batch(2)).await;
        store.release_if_asked(&mut writer);
        assert!(
            !writer.holds(),
            "a writer waits, yet the connection was kept"
        );
        let done = tokio::time::timeout(limit, other).await;
        assert_eq!(done.expect("the other write got no connection").unwrap(), 1);
        // The next batch takes it again, and everything was written once.
        commit_batch(
            store.begin_batch(&mut writer, true).await.unwrap(),
            &batch(3),
        )
        .await;
        writer.release();
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM server_secrets WHERE value = 'v'")
            .fetch_one(store.write())
            .await
            .unwrap();
        assert_eq!(n, 5);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A new SQLite database gets 2 KiB pages; a file made with another page size keeps it,
    /// and opens and migrates as before.
    #[tokio::test]
    async fn a_new_database_has_2_kib_pages_and_an_older_file_keeps_its_own() {
        let dir = std::env::temp_dir().join(format!("courier-page-size-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let open = |file: &str| {
            let cfg = StorageConfig {
                url: format!("sqlite://{}/{file}", dir.display()),
                ..StorageConfig::default()
            };
            async move { Store::open(&cfg).await.unwrap() }
        };
        let page_size = |store: Store| async move {
            let n: i64 = sqlx::query_scalar("PRAGMA page_size")
                .fetch_one(store.write())
                .await
                .unwrap();
            // Migrated: the table is there.
            sqlx::query("SELECT COUNT(*) FROM server_secrets")
                .fetch_one(store.write())
                .await
                .expect("the migrations' tables");
            n
        };
        assert_eq!(page_size(open("new.db").await).await, 2048);
        let old = format!("sqlite://{}/old.db?mode=rwc", dir.display());
        let mut conn = sqlx::AnyConnection::connect(&old).await.unwrap();
        conn.execute(
            "PRAGMA page_size = 4096; PRAGMA journal_mode = WAL; \
             CREATE TABLE made_before (x INTEGER)",
        )
        .await
        .unwrap();
        conn.close().await.unwrap();
        assert_eq!(page_size(open("old.db").await).await, 4096);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn placeholders_number_in_order() {
        assert_eq!(placeholders(Dialect::Postgres, 3, 2), "$3, $4");
        assert_eq!(placeholders(Dialect::Sqlite, 3, 2), "?, ?");
    }

    #[test]
    fn chunks_come_in_few_shapes() {
        let v: Vec<u32> = (0..300).collect();
        let sizes: Vec<usize> = shaped_chunks(&v).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, [128, 128, 32, 8, 4]);
        assert_eq!(shaped_chunks(&v[..1]).len(), 1);
        assert!(shaped_chunks::<u32>(&[]).is_empty());
    }

    #[test]
    fn passwords_do_not_reach_messages() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
    }

    #[test]
    fn sqlite_urls_create_the_file() {
        assert_eq!(
            sqlite_url("sqlite::memory:").unwrap(),
            "sqlite://:memory:?mode=rwc"
        );
    }
}
