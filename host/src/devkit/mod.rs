//! The plugin author's tools: `courier plugin new` writes a complete kind in a new folder,
//! `courier plugin watch` rebuilds it on every change, runs the contract suite and
//! hot-reloads a dev server when the suite passes. CLI-only: nothing of the server calls
//! this module, and it calls nothing of the server but the contract suite (`plugins::check`)
//! and, over HTTP, a dev server's admin endpoint.

pub mod new;
mod reload;
pub mod watch;

pub use reload::DevServer;
