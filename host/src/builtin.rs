//! The plugins bundled with the server, embedded at build time by `host/build.rs`, and
//! handed to the registry through `config::Config` (`plugins::Setup`).

include!(concat!(env!("OUT_DIR"), "/builtin.rs"));
