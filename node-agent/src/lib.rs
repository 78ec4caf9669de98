//! The node agent: a node's one writer of verified compiled code
//! (docs/plans/node-code-store.md). A runtime that loaded a Function's code the slow way
//! (through the API server, checked against its pinned digest) puts the stored bytes here;
//! the agent checks them against that digest itself, keeps the decompressed code once as a
//! read-only file, and hands that file to any runtime of a namespace that put the same code,
//! which maps it instead of reading, verifying and writing megabytes again.
//!
//! `admission` is what a put must be, `store` the files on disk and who may get them,
//! `record` what it keeps of each file to check it again, `server` a socket per namespace,
//! `csi` the kubelet's plugin that places those sockets in pods, `metrics` what Prometheus
//! scrapes of them.

pub mod admission;
pub mod csi;
pub mod metrics;
pub mod namespace;
mod record;
pub mod server;
pub mod store;
