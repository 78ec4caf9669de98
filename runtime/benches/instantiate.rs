//! Per-request cost of the runtime's hot path, without HTTP: a fresh instance from the
//! pool, the handler called, the response read. One hello handler per ABI: the Rust
//! SDK component (wasi-http), the Goless sample (Go over CGI, and as a snapshotted
//! reactor, fresh per request and in a shared instance), and a minimal WAT command (CGI
//! without a language runtime).

#[path = "../tests/support/mod.rs"]
#[allow(dead_code, unused_imports)]
mod support;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http_body_util::BodyExt;
use std::sync::Arc;
use tokio::sync::Semaphore;
use wasmless_artifact::Digest;
use wasmless_host::handler::{Connection, LoadedHandler};
use wasmless_host::limits::{Isolation, RequestLimits};
use wasmless_host::loader::Loader;
use wasmless_host::metrics::Metrics;
use wasmless_host::module_source::VerifiedModule;
use wasmless_outbound::Outbound;

fn load(runtime: &tokio::runtime::Runtime, bytes: Vec<u8>, isolation: Isolation) -> LoadedHandler {
    let metrics = Arc::new(Metrics::new("bench"));
    let loader = Loader::new(
        RequestLimits {
            isolation,
            ..RequestLimits::default()
        },
        Vec::new(),
        "bench",
        metrics.clone(),
        Arc::new(Outbound::denied(metrics)),
        None,
    )
    .unwrap();
    let digest = Digest::of(&bytes);
    runtime.block_on(loader.load(VerifiedModule { bytes, digest })).unwrap()
}

async fn call(handler: &LoadedHandler, permits: &Arc<Semaphore>, path: &'static str) -> Bytes {
    let request = http::Request::get(path)
        .header("host", "localhost")
        .body(Bytes::new())
        .unwrap();
    let connection = Connection {
        remote: "127.0.0.1:40000".parse().unwrap(),
        local_port: 8080,
    };
    let permit = permits.clone().acquire_owned().await.unwrap();
    let response = handler
        .invoke(request, connection, permit.into())
        .await
        .expect("the hello handler answers");
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.unwrap().to_bytes()
}

fn instantiate_and_call(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let permits = Arc::new(Semaphore::new(64));
    let reactor = std::fs::read(support::go_reactor("goless-sample", true)).unwrap();
    let handlers = [
        (
            "wasi-http component (Rust SDK hello)",
            std::fs::read(support::rust_echo()).unwrap(),
            "/hello",
            Isolation::Request,
        ),
        (
            "CGI command (Goless sample, Go)",
            std::fs::read(support::go_handler("goless-sample")).unwrap(),
            "/",
            Isolation::Request,
        ),
        (
            "Go reactor (Goless sample, a fresh instance)",
            reactor.clone(),
            "/",
            Isolation::Request,
        ),
        (
            "Go reactor (Goless sample, a shared instance)",
            reactor,
            "/",
            Isolation::Shared,
        ),
        (
            "CGI command (WAT hello)",
            support::cgi_wat("Content-Type: text/plain\n\nhello\n"),
            "/",
            Isolation::Request,
        ),
    ];
    let mut group = c.benchmark_group("instantiate_and_call");
    for (name, bytes, path, isolation) in handlers {
        let handler = load(&runtime, bytes, isolation);
        runtime.block_on(call(&handler, &permits, path));
        group.bench_function(name, |b| b.to_async(&runtime).iter(|| call(&handler, &permits, path)));
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(5));
    targets = instantiate_and_call
}
criterion_main!(benches);
