use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use courier::plugins::check::{CheckOptions, check_file};

/// jemalloc gives freed memory back to the system (its background threads purge what
/// stayed unused for a while); glibc's malloc kept the 19 MiB blocks of password hashing
/// and the buffers of dropped slow readers for good (see ARCHITECTURE.md, Decisions).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Courier: an instant-messaging server whose message kinds are WebAssembly plugins.
#[derive(Parser)]
#[command(name = "courier", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (embedded defaults when no config is given).
    Serve {
        /// TOML config file (see courier.example.toml).
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Work with plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Run the contract suite against a plugin component; exits non-zero if a check fails.
    Check {
        /// The `.wasm` component to check.
        file: PathBuf,
        /// Data-driven cases: DIR/<case>/input.json with expected.json or error.txt.
        #[arg(long)]
        cases: Option<PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Fuel budget per call.
        #[arg(long, default_value_t = CheckOptions::default().fuel_per_call)]
        fuel: u64,
        /// Memory cap per instance, in MiB.
        #[arg(long, default_value_t = CheckOptions::default().memory_mib)]
        memory_mib: u32,
        /// Number of fuzzed inputs.
        #[arg(long, default_value_t = CheckOptions::default().fuzz)]
        fuzz: usize,
        /// Check against this server config's plugins: a name or content type it already
        /// has fails the check (without it, one of a bundled kind's only warns).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Load the plugins a config asks for (start-up checks included) and list them.
    List {
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Write a complete, building kind into a new folder (see its README.md).
    New {
        /// The kind's name: 1-32 characters of a-z, 0-9 and -, not starting with -.
        name: String,
        /// The language to write it in.
        #[arg(long, value_enum, default_value = "rust")]
        lang: courier::devkit::new::Lang,
        /// The content type clients send it as (the bundled kinds have 1-999).
        #[arg(long, default_value_t = courier::devkit::new::FIRST_OWN_CONTENT_TYPE)]
        content_type: u32,
        /// The folder to create (default: ./NAME); it must not exist or be empty.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Rebuild a kind's folder on every change, run the contract suite, print its verdict,
    /// and hot-reload a dev server when it passes.
    Watch {
        /// The kind's folder (with build.sh, writing build/NAME.wasm; cases/ is replayed).
        dir: PathBuf,
        /// The dev server to reload (`POST URL/admin/plugins/reload`); without it, watch
        /// only builds and checks.
        #[arg(long)]
        server: Option<String>,
        /// The server's admin token (default: $COURIER_ADMIN_TOKEN).
        #[arg(long)]
        token: Option<String>,
        /// Milliseconds the folder must stay unchanged before a rebuild.
        #[arg(long, default_value_t = 300)]
        debounce_ms: u64,
        /// Number of fuzzed inputs the suite sends.
        #[arg(long, default_value_t = CheckOptions::default().fuzz)]
        fuzz: usize,
    },
}

/// Adds the `conflicts` check: against the plugins of `config` (a clash fails), or the
/// bundled kinds (a clash warns).
fn against(
    report: &mut courier::plugins::check::Report,
    file: &std::path::Path,
    config: Option<&std::path::Path>,
) -> Result<(), String> {
    let (loaded, what, fail) = match config {
        Some(path) => {
            let c = courier::config::Config::load(Some(path)).map_err(|e| e.to_string())?;
            (c, format!("a plugin of {}", path.display()), true)
        }
        None => {
            // The bundled kinds only, compiled here (no cache left in the author's folder).
            let mut c = courier::config::Config::default();
            c.runtime.cache_dir = None;
            (c, "a bundled kind".to_string(), false)
        }
    };
    let registry = courier::plugins::PluginRegistry::load(&loaded)
        .map_err(|e| format!("the plugins of the config did not load:\n{e}"))?;
    let taken: Vec<courier::plugins::check::Taken> = registry
        .list()
        .into_iter()
        .map(|p| courier::plugins::check::Taken {
            manifest: p.manifest,
            source: p.source,
            sha256: p.sha256,
        })
        .collect();
    let sha = std::fs::read(file)
        .map(|b| courier::plugins::loader::sha256_hex(&b))
        .unwrap_or_default();
    report.against(&taken, &sha, &what, fail);
    Ok(())
}

/// The log on stderr: filtered by `COURIER_LOG`, else the config's `log.filter`; colours
/// only on a terminal; JSON lines when the config says `[log] format = "json"`. The NATS
/// client's own lines are at `warn` unless the filter names `async_nats`: it writes every
/// connection event at `info`, a line a second per node while NATS is away, where the
/// server writes one line when the bus goes and one when it is back.
fn init_log(log: courier::config::LogConfig) {
    use std::io::IsTerminal as _;
    let asked = std::env::var("COURIER_LOG").unwrap_or_else(|_| log.filter.clone());
    let mut filter = tracing_subscriber::EnvFilter::try_new(&asked).unwrap_or_else(|e| {
        eprintln!("warning: log filter {asked:?} is not a filter ({e}); logging at info");
        "info".into()
    });
    if !asked.contains("async_nats") {
        filter = filter.add_directive("async_nats=warn".parse().expect("a directive"));
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match log.format {
        courier::config::LogFormat::Text => {
            builder.with_ansi(std::io::stderr().is_terminal()).init()
        }
        courier::config::LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

/// SQLite allocates through jemalloc too. It is C and calls the C library's malloc on its
/// own, and glibc kept for good what a batch's write with large payloads had taken in its
/// arenas; jemalloc gives it back within a second like the rest of the server's memory
/// (ARCHITECTURE.md, Decisions). SQLite's memory statistics are off: they take a global
/// lock on every allocation and nothing reads them. Runs before the server's first use of
/// SQLite: `sqlite3_config` refuses after it.
#[allow(unsafe_code)]
fn sqlite_allocates_through_jemalloc() {
    use libsqlite3_sys as sqlite;
    use std::os::raw::{c_int, c_void};
    use tikv_jemalloc_sys as je;

    // SAFETY (the seven): SQLite's allocator contract. It asks for n > 0 bytes (below
    // 2 GiB, each size first rounded up by `roundup`), frees, resizes and sizes only blocks
    // these returned, never NULL; jemalloc's blocks are at least 8-byte aligned, as SQLite
    // needs. A size past `c_int` (a request over 1.75 GiB takes a 2 GiB block) is told
    // as `c_int::MAX`: still at least what was asked.
    unsafe extern "C" fn malloc(n: c_int) -> *mut c_void {
        unsafe { je::malloc(n as usize) }
    }
    unsafe extern "C" fn free(p: *mut c_void) {
        unsafe { je::free(p) }
    }
    unsafe extern "C" fn realloc(p: *mut c_void, n: c_int) -> *mut c_void {
        unsafe { je::realloc(p, n as usize) }
    }
    unsafe extern "C" fn size(p: *mut c_void) -> c_int {
        c_int::try_from(unsafe { je::malloc_usable_size(p) }).unwrap_or(c_int::MAX)
    }
    unsafe extern "C" fn roundup(n: c_int) -> c_int {
        c_int::try_from(unsafe { je::nallocx(n as usize, 0) }).unwrap_or(c_int::MAX)
    }
    unsafe extern "C" fn init(_: *mut c_void) -> c_int {
        sqlite::SQLITE_OK
    }
    unsafe extern "C" fn shutdown(_: *mut c_void) {}
    let methods = sqlite::sqlite3_mem_methods {
        xMalloc: Some(malloc),
        xFree: Some(free),
        xRealloc: Some(realloc),
        xSize: Some(size),
        xRoundup: Some(roundup),
        xInit: Some(init),
        xShutdown: Some(shutdown),
        pAppData: std::ptr::null_mut(),
    };
    let off: c_int = 0;
    // SAFETY: no SQLite call came before, and none runs meanwhile (the server's runtime is
    // not started yet); SQLite copies the methods.
    let (malloc, stats) = unsafe {
        (
            sqlite::sqlite3_config(sqlite::SQLITE_CONFIG_MALLOC, &raw const methods),
            sqlite::sqlite3_config(sqlite::SQLITE_CONFIG_MEMSTATUS, off),
        )
    };
    if malloc != sqlite::SQLITE_OK {
        tracing::warn!(code = malloc, "SQLite keeps the C library's allocator");
    }
    if stats != sqlite::SQLITE_OK {
        tracing::warn!(code = stats, "SQLite keeps its memory statistics");
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The server's log takes its format from the config (read again, and checked, by
    // `serve`); the other commands log as text.
    let log = match &cli.command {
        Command::Serve { config } => courier::config::Config::load(config.as_deref())
            .map(|c| c.log)
            .unwrap_or_default(),
        Command::Plugin(_) => Default::default(),
    };
    init_log(log);
    match cli.command {
        Command::Serve { config } => {
            sqlite_allocates_through_jemalloc();
            let rt = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(courier::server::serve(config)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Plugin(PluginCommand::Check {
            file,
            cases,
            json,
            fuel,
            memory_mib,
            fuzz,
            config,
        }) => {
            let opts = CheckOptions {
                cases,
                fuel_per_call: fuel,
                memory_mib,
                fuzz,
                ..CheckOptions::default()
            };
            let mut report = check_file(&file, &opts);
            if let Err(e) = against(&mut report, &file, config.as_deref()) {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).unwrap_or_default()
                );
            } else {
                print!("{}", report.render());
            }
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Command::Plugin(PluginCommand::New {
            name,
            lang,
            content_type,
            dir,
        }) => {
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            let kind = courier::devkit::new::NewKind {
                name,
                lang,
                content_type,
                dir,
            };
            match courier::devkit::new::create(&kind) {
                Ok(files) => {
                    println!(
                        "created {} ({} files): a {} kind named {}, content type {content_type}",
                        kind.dir.display(),
                        files.len(),
                        lang.title(),
                        kind.name
                    );
                    println!(
                        "next: cd {} && ./build.sh && courier plugin check build/{}.wasm --cases cases",
                        kind.dir.display(),
                        kind.name
                    );
                    ExitCode::SUCCESS
                }
                Err(e @ courier::devkit::new::NewError::Io { .. }) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Plugin(PluginCommand::Watch {
            dir,
            server,
            token,
            debounce_ms,
            fuzz,
        }) => {
            let server = match server {
                None => None,
                Some(url) => {
                    let Some(token) = token.or_else(|| std::env::var("COURIER_ADMIN_TOKEN").ok())
                    else {
                        eprintln!(
                            "error: --server needs the admin token: --token or COURIER_ADMIN_TOKEN"
                        );
                        return ExitCode::from(2);
                    };
                    match courier::devkit::DevServer::new(&url, token) {
                        Ok(s) => Some(s),
                        Err(e) => {
                            eprintln!("error: {e}");
                            return ExitCode::from(2);
                        }
                    }
                }
            };
            let opts = courier::devkit::watch::WatchOptions {
                dir,
                server,
                check: CheckOptions {
                    fuzz,
                    ..CheckOptions::default()
                },
                poll: std::time::Duration::from_millis(250),
                quiet: std::time::Duration::from_millis(debounce_ms),
            };
            match courier::devkit::watch::run(opts) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Plugin(PluginCommand::List { config }) => {
            let config = match courier::config::Config::load(config.as_deref()) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            match courier::plugins::PluginRegistry::load(&config) {
                Ok(reg) => {
                    println!(
                        "{:<16} {:>6}  {:<10} {:<6} {:<8} {:<8} source",
                        "name", "type", "delivery", "unread", "sender", "enabled"
                    );
                    for p in reg.list() {
                        let m = &p.manifest;
                        println!(
                            "{:<16} {:>6}  {:<10} {:<6} {:<8} {:<8} {}",
                            m.name,
                            m.content_type,
                            m.delivery.to_string(),
                            m.counts_unread,
                            format!("{:?}", m.sender).to_lowercase(),
                            p.enabled,
                            p.source
                        );
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: the plugins did not load:\n{e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
