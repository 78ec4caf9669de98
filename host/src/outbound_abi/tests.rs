//! The guest ABI's host functions, called as a guest calls them, against a real upstream.

use super::*;
use crate::metrics::Metrics;
use crate::request_memory::SharedMemory;
use wasmless_outbound::OutboundConfig;
use wasmtime::{Engine, Module, Store};

const MI: usize = 1 << 20;
/// Where the guest keeps what it hands over: the head at 0, the pair `out` at OUT, the
/// body from BODY on.
const OUT: u32 = 60_000;
const BODY: u32 = 1 << 16;

/// An upstream answering 200 to a request whose body is as long as its `x-length`
/// header says, 400 to any other.
async fn upstream() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let answer = |headers: http::HeaderMap, body: Bytes| async move {
        let expected = headers
            .get("x-length")
            .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
        match expected == Some(body.len()) {
            true => http::StatusCode::OK,
            false => http::StatusCode::BAD_REQUEST,
        }
    };
    let app = axum::Router::new()
        .fallback(answer)
        .layer(axum::extract::DefaultBodyLimit::disable());
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

/// Outbound calls allowed to `allow`, with a 5 s timeout and room for four at once.
fn outbound_allowing(allow: Vec<String>) -> Arc<Outbound> {
    let config = OutboundConfig {
        allow,
        timeout: Duration::from_secs(5),
        max_response_body: MI as u64,
        max_concurrency: 4,
        headers: Vec::new(),
        admin_port: 1,
        pod_ip: None,
        extra_roots: Vec::new(),
    };
    Arc::new(Outbound::new(&config, Arc::new(Metrics::new("f"))).unwrap())
}

/// A guest that posts to `port` a body of `length` bytes handed over as one piece, in
/// a request with `share` of the pool's memory: the errnos of http_write_body and
/// http_finish, and what http_read_head gives then.
async fn post_one_piece(port: u16, length: u32, share: Option<RequestShare>) -> (u32, u32, Vec<u8>) {
    let outbound = outbound_allowing(vec![format!("http://127.0.0.1:{port}")]);
    let url = format!("http://127.0.0.1:{port}/");
    let head = abi::encode_request("POST", &url, &[("x-length", &length.to_string())], true);
    let escaped: String = head.iter().map(|b| format!("\\{b:02x}")).collect();
    let pages = (BODY as usize + length as usize).div_ceil(1 << 16);
    let module = format!(
        r#"(module
            (import "wasmless" "http_start" (func $start (param i32 i32 i32 i32) (result i32)))
            (import "wasmless" "http_write_body" (func $write (param i32 i32 i32) (result i32)))
            (import "wasmless" "http_finish" (func $finish (param i32 i32) (result i32)))
            (import "wasmless" "http_read_head" (func $read_head (param i32 i32 i32) (result i32)))
            (memory (export "memory") {pages})
            (data (i32.const 0) "{escaped}")
            (func (export "start") (result i32) (call $start (i32.const 0) (i32.const {head_len}) (i32.const 0) (i32.const {OUT})))
            (func (export "write") (param $length i32) (result i32)
                (call $write (i32.load (i32.const {OUT})) (i32.const {BODY}) (local.get $length)))
            (func (export "finish") (result i32)
                (call $finish (i32.load (i32.const {OUT})) (i32.add (i32.const {OUT}) (i32.const 4))))
            (func (export "read_head") (result i32)
                (call $read_head (i32.load (i32.const {OUT})) (i32.const {BODY}) (i32.load (i32.add (i32.const {OUT}) (i32.const 4))))))"#,
        head_len = head.len(),
    );
    let engine = Engine::default();
    let module = Module::new(&engine, wat::parse_str(module).unwrap()).unwrap();
    let mut linker = Linker::new(&engine);
    add_to_linker(&mut linker, |calls: &mut GuestCalls| calls).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let calls = GuestCalls::new(outbound, Arc::default(), deadline, share);
    let mut store = Store::new(&engine, calls);
    let instance = linker.instantiate_async(&mut store, &module).await.unwrap();
    let mut call = |name: &str| instance.get_typed_func::<(), u32>(&mut store, name).unwrap();
    let (start, finish, read_head) = (call("start"), call("finish"), call("read_head"));
    let write = instance.get_typed_func::<u32, u32>(&mut store, "write").unwrap();
    assert_eq!(start.call_async(&mut store, ()).await.unwrap(), 0);
    let written = write.call_async(&mut store, length).await.unwrap();
    let finished = finish.call_async(&mut store, ()).await.unwrap();
    read_head.call_async(&mut store, ()).await.unwrap();
    let memory = instance.get_memory(&mut store, "memory").unwrap();
    let head_length = u32::from_le_bytes(memory.data(&store)[OUT as usize + 4..][..4].try_into().unwrap());
    let read = &memory.data(&store)[BODY as usize..][..head_length as usize];
    (written, finished, read.to_vec())
}

/// The status of a response head http_read_head gave.
fn status(head: &[u8]) -> u32 {
    u32::from_le_bytes(head[..4].try_into().unwrap())
}

/// A piece longer than the parts the host copies arrives whole, in order.
#[tokio::test]
async fn a_long_piece_of_a_body_reaches_the_upstream_whole() {
    let port = upstream().await;
    let (written, finished, head) = post_one_piece(port, 3 * MI as u32 + 5, None).await;
    assert_eq!((written, finished), (0, 0));
    assert_eq!(status(&head), 200, "the upstream got another length");
}

/// In a pool, what the host holds of an outbound body is taken from the request's
/// share: a piece that does not fit abandons the call, and the guest is told why.
#[tokio::test]
async fn a_body_piece_the_pools_memory_has_no_room_for_abandons_the_call_saying_so() {
    let port = upstream().await;
    let pool = Arc::new(SharedMemory::new(4 * MI, 100));
    let account = pool.account();
    let share = account.request();
    let neighbour = account.request();
    assert!(neighbour.take(4 * MI), "the pool's memory is held by another request");
    let (written, finished, message) = post_one_piece(port, MI as u32, Some(share)).await;
    let message = String::from_utf8_lossy(&message);
    assert_eq!(written, OutboundError::PoolMemory.errno());
    assert_eq!(finished, OutboundError::PoolMemory.errno());
    assert!(message.contains("no memory left for its request body"), "{message}");
    drop(neighbour);
    assert_eq!(account.used(), 0, "nothing of the piece is held once the call is gone");

    let share = account.request();
    let (written, finished, head) = post_one_piece(port, 3 * MI as u32, Some(share.clone())).await;
    assert_eq!(
        (written, finished),
        (0, 0),
        "a body longer than the pool's room goes in parts"
    );
    assert_eq!(status(&head), 200, "the upstream got another length");
    assert_eq!(share.held(), 0, "each part is given back once sent");
}

/// A guest that loops on calls the host refuses (a head longer than any call may send)
/// and never closes them: the host keeps at most [`MAX_OPEN`] messages for it, then tells
/// it the errno alone, with no handle.
#[tokio::test]
async fn refused_calls_left_open_hold_at_most_max_open_messages() {
    let outbound = outbound_allowing(Vec::new());
    let module = format!(
        r#"(module
            (import "wasmless" "http_start" (func $start (param i32 i32 i32 i32) (result i32)))
            (memory (export "memory") 1)
            (func (export "refused") (param $times i32) (result i32)
                (local $errno i32)
                (loop $again
                    (local.set $errno (call $start (i32.const 0) (i32.const -1) (i32.const 0) (i32.const {OUT_SMALL})))
                    (local.tee $times (i32.sub (local.get $times) (i32.const 1)))
                    (br_if $again))
                (local.get $errno)))"#,
        OUT_SMALL = 1024,
    );
    let engine = Engine::default();
    let module = Module::new(&engine, wat::parse_str(module).unwrap()).unwrap();
    let mut linker = Linker::new(&engine);
    add_to_linker(&mut linker, |calls: &mut GuestCalls| calls).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut store = Store::new(&engine, GuestCalls::new(outbound, Arc::default(), deadline, None));
    let instance = linker.instantiate_async(&mut store, &module).await.unwrap();
    let refused = instance.get_typed_func::<u32, u32>(&mut store, "refused").unwrap();
    let errno = refused.call_async(&mut store, 10_000).await.unwrap();
    assert_eq!(errno, OutboundError::BadRequest(String::new()).errno());
    assert_eq!(store.data().open.len(), MAX_OPEN, "one message held per refused call");
    let memory = instance.get_memory(&mut store, "memory").unwrap();
    let pair = &memory.data(&store)[1024..1032];
    assert_eq!(pair, &[0; 8], "past MAX_OPEN: no handle, no message");
}

/// A refused call's message quotes what the guest sent, escaped: it is kept cut to
/// [`MAX_MESSAGE`] bytes, so [`MAX_OPEN`] of them stay small whatever the head held.
#[test]
fn a_message_quoting_the_guests_head_is_kept_short() {
    let method = "\u{10}".repeat(MI - 64);
    let error = OutboundError::BadRequest(format!("the method {method:?} is not a token"));
    assert!(
        error.to_string().len() > 5 * MI,
        "the escaped head is what made it long"
    );
    let message = message_of(&error);
    assert!(message.len() <= MAX_MESSAGE, "{} bytes kept", message.len());
    let text = String::from_utf8(message).expect("cut on a character boundary");
    assert!(text.contains("is malformed: the method"), "{text}");
    assert!(text.ends_with('…'), "{text}");
}
