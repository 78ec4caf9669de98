//! The runtime binary, over real HTTP on loopback, serving handlers built with the
//! real toolchains: a Rust component built with the SDK, Goless handlers built with Go,
//! and small WAT commands. One test binary; its modules, by concern:

/// Building the handlers, running the binary, and the helpers every module uses.
mod support;

mod abis;
mod adversarial;
mod code_store;
mod failures;
mod loading;
mod observability;
mod outbound;
mod pool;
mod precompiled;
mod reactor;
mod split;
mod streaming;
mod traces;
