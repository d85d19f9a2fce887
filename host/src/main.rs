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
            name: p.manifest.name,
            content_type: p.manifest.content_type,
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

/// The log on stderr: `COURIER_LOG` filters it; colours only on a terminal; JSON lines
/// when the config says `[log] format = "json"`.
fn init_log(format: courier::config::LogFormat) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_env("COURIER_LOG")
        .unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        courier::config::LogFormat::Text => {
            builder.with_ansi(std::io::stderr().is_terminal()).init()
        }
        courier::config::LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The server's log takes its format from the config (read again, and checked, by
    // `serve`); the other commands log as text.
    let format = match &cli.command {
        Command::Serve { config } => courier::config::Config::load(config.as_deref())
            .map(|c| c.log.format)
            .unwrap_or_default(),
        Command::Plugin(_) => Default::default(),
    };
    init_log(format);
    match cli.command {
        Command::Serve { config } => {
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
