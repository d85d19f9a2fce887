//! Courier: an instant-messaging server whose message kinds are WebAssembly plugins.
//! See ARCHITECTURE.md for the code map and the invariants.

pub mod api;
pub mod auth;
pub mod builtin;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod devkit;
pub mod e2e;
pub mod gateway;
pub mod limits;
pub mod messaging;
/// The plugin host (its own crate): the registry, its errors, the contract suite.
pub use courier_plugin_host as plugins;
pub mod protocol;
pub mod push;
pub mod server;
pub mod social;
pub mod store;
pub mod telemetry;
