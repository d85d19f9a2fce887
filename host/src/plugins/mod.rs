//! The plugin platform: the sandboxed runtime, loading and its checks, the registry the
//! send path calls, and the contract suite (`courier plugin check`).

pub mod bindings;
pub mod builtin;
pub mod cache;
pub mod check;
pub mod loader;
pub mod manifest;
pub mod registry;
pub mod runtime;

pub use loader::{LoadError, LoadFailure, Source};
pub use manifest::{Delivery, Manifest, SenderKind};
pub use registry::{
    LoadErrors, LoadedPlugin, PluginInfo, PluginRegistry, SendContext, ValidateError, Validated,
};
pub use runtime::{CallCost, CallFailure, Limits};
