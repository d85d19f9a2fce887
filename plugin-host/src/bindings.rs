//! Host-side bindings of `wit/v1` (the frozen `courier:plugin@1.0.0` contract).

wasmtime::component::bindgen!({
    path: "../wit/v1",
    world: "plugin",
    // `log` may trap: a plugin that logs past its per-call allowance is stopped.
    imports: { default: trappable },
});

pub use self::courier::plugin::log::Level as LogLevel;
pub use exports::courier::plugin::kind::{
    Context as WitContext, Delivery as WitDelivery, Example as WitExample,
    KindManifest as WitManifest, Rejection as WitRejection, Sender as WitSender,
};
