//! Write a Wasmless HTTP handler in Rust: a function from [`Request`] to [`Response`],
//! exported as `wasi:http/incoming-handler` and built with
//! `cargo build --release --target wasm32-wasip2`.
//!
//! ```ignore
//! use wasmless_sdk::{Request, Response};
//!
//! pub fn handler(request: Request) -> Response {
//!     let name = wasmless_sdk::query(&request, "name").unwrap_or_else(|| "world".into());
//!     Response::new(format!("hello, {name}\n").into_bytes())
//! }
//!
//! wasmless_sdk::export!(handler);
//! ```
//!
//! Headers, status and body are the [`http`] crate's types; the query is in
//! `request.uri()`; the Function's `env` is the process environment (`std::env::var`).
//! A panic in the handler answers 500 with the panic message on stderr, and the
//! runtime goes on serving.
//!
//! [`stream`] sends the head at once and the body as it is written: Server-Sent Events, a
//! long export that never lies whole in memory.
//!
//! [`send`] calls another service (`wasi:http/outgoing-handler`), where the Function's
//! `spec.outbound.allow` lets it.

mod guest;
mod outbound;
mod query;
mod stream;

pub use http;
pub use outbound::{OutboundError, send};
pub use query::{query, query_pairs};
pub use stream::{BodyWriter, StreamError, stream};

/// A request with its whole body.
pub type Request = http::Request<Vec<u8>>;
/// A response with its whole body.
pub type Response = http::Response<Vec<u8>>;

/// Exports `handler` (a `fn(Request) -> Response`) as the component's
/// `wasi:http/incoming-handler`.
#[macro_export]
macro_rules! export {
    ($handler:path) => {
        struct __WasmlessHandler;

        impl $crate::__private::Guest for __WasmlessHandler {
            fn handle(request: $crate::__private::IncomingRequest, response_out: $crate::__private::ResponseOutparam) {
                $crate::__private::serve(request, response_out, $handler)
            }
        }

        $crate::__private::wasip2::http::proxy::export!(__WasmlessHandler with_types_in $crate::__private::wasip2);
    };
}

#[doc(hidden)]
pub mod __private {
    pub use crate::guest::serve;
    pub use wasip2;
    pub use wasip2::exports::http::incoming_handler::Guest;
    pub use wasip2::http::types::{IncomingRequest, ResponseOutparam};
}
