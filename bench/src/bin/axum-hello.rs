//! The ceiling: a native axum hello world, answering what the hello handlers answer.

use axum::Router;
use axum::routing::get;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let port = std::env::args().nth(1).unwrap_or_else(|| "8080".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let app = Router::new().fallback(get(|| async { "Hello from Rust!\n" }));
    axum::serve(listener, app).await?;
    Ok(())
}
