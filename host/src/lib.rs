//! `wasmless-host`: the host of handlers. One module, verified by its digest before
//! anything reads it ([`module_source`], [`precompiled`]), compiled or opened from the
//! builder's code ([`loader`], [`compile`], [`engine`]) or mapped from the node's store of
//! verified code ([`code_store`]), and run per request in a fresh
//! instance under its limits ([`handler`]: one file per guest ABI, [`limits`],
//! [`request_memory`]), with the per-Function metrics the servers export ([`metrics`]).
//!
//! It serves nothing itself: the runtime (`wasmless-runtime`) puts a Function, or a pool of
//! them, behind its servers and the edge; the builder uses the same engine, snapshots and
//! code format to make what the runtime loads.

pub mod abi;
pub mod clocks;
pub mod code_cost;
pub mod code_store;
pub mod compile;
pub mod configmap_chunks;
pub mod engine;
pub mod guest_root;
pub mod handler;
pub mod limits;
pub mod load_phases;
pub mod loader;
pub mod mapped_text;
pub mod metrics;
pub mod module_source;
pub mod oci;
pub mod outbound_abi;
pub mod precompiled;
pub mod request_memory;
pub mod snapshot;
