//! The ceiling: a native axum hello world, answering what the hello handlers answer.
//! `axum-hello <port> [busy-µs]`: with a second argument, each request first keeps
//! the CPU busy that long, to show what a fixed per-request cost does to throughput
//! on this machine.

use axum::Router;
use axum::routing::get;
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let port = args.next().unwrap_or_else(|| "8080".into());
    let busy = Duration::from_micros(args.next().map(|micros| micros.parse()).transpose()?.unwrap_or(0));
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let app = Router::new().fallback(get(move || async move {
        if !busy.is_zero() {
            let started = Instant::now();
            while started.elapsed() < busy {
                std::hint::spin_loop();
            }
        }
        "Hello from Rust!\n"
    }));
    axum::serve(listener, app).await?;
    Ok(())
}
