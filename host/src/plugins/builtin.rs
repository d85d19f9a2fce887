//! The plugins bundled with the server, embedded at build time by `host/build.rs`.

include!(concat!(env!("OUT_DIR"), "/builtin.rs"));
