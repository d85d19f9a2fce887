//! Courier's plugin host: the sandboxed runtime, loading and its checks, the registry the
//! send path calls, and the contract suite (`courier plugin check`). The server uses the
//! registry and its errors; nothing outside this crate knows how a plugin is called.

mod assemble;
pub mod bindings;
pub mod cache;
pub mod check;
pub mod config;
pub mod loader;
pub mod manifest;
pub mod meters;
pub mod plugin;
pub mod pool;
pub mod registry;
pub mod runtime;

pub use config::{Isolation, PluginEntry, RuntimeConfig, Setup};
pub use loader::{LoadError, LoadFailure, Source};
pub use manifest::{Delivery, MAX_SHOWN_CHARS, Manifest, SenderKind, display, shown};
pub use pool::InstancePool;
pub use registry::{
    LoadErrors, LoadedPlugin, PluginInfo, PluginRegistry, SendContext, ValidateError, Validated,
};
pub use runtime::{CallCost, CallFailure, Limits};
