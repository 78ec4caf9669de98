//! Hostile clients over real sockets, against the runtime serving the Rust test handler:
//! slow headers, slow bodies, oversized headers, idle connections, floods beyond the
//! connection cap, requests during shutdown. Each shows that a well-behaved client is
//! still served and that nothing is left behind once the attackers go.

use crate::support::*;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a well-behaved client may wait for its answer while the runtime is attacked.
const SERVED_WITHIN: Duration = Duration::from_secs(5);

/// One HTTP/1.1 response as read off the socket.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one response (head, then a `Content-Length` or chunked body) from `stream`.
async fn read_answer(stream: &mut TcpStream) -> std::io::Result<Answer> {
    let mut buffer = Vec::new();
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let mut chunk = [0u8; 4096];
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut rest = buffer[head_end..].to_vec();
    let chunked = headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        // Chunks until the zero-length one (no trailers here).
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(end) = rest.windows(2).position(|w| w == b"\r\n") {
                    break end;
                }
                read_more(stream, &mut rest).await?;
            };
            let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..line_end]).trim(), 16).unwrap();
            while rest.len() < line_end + 2 + size + 2 {
                read_more(stream, &mut rest).await?;
            }
            body.extend_from_slice(&rest[line_end + 2..line_end + 2 + size]);
            rest.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break body;
            }
        }
    } else {
        let length: usize = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .map_or(0, |(_, v)| v.parse().unwrap());
        while rest.len() < length {
            read_more(stream, &mut rest).await?;
        }
        rest
    };
    Ok(Answer { status, headers, body })
}

async fn read_more(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> std::io::Result<()> {
    let mut chunk = [0u8; 4096];
    match stream.read(&mut chunk).await? {
        0 => Err(std::io::ErrorKind::UnexpectedEof.into()),
        read => {
            buffer.extend_from_slice(&chunk[..read]);
            Ok(())
        }
    }
}

/// Sends `request` on a new connection and reads the answer, within [`SERVED_WITHIN`].
async fn exchange(addr: SocketAddr, request: &[u8]) -> Answer {
    tokio::time::timeout(SERVED_WITHIN, async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        read_answer(&mut stream).await.unwrap()
    })
    .await
    .expect("no answer in time")
}

fn get_request(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: function\r\n\r\n").into_bytes()
}

/// True once the peer has closed `stream` (EOF or reset), waiting at most `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(within, stream.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

fn open_fds(runtime: &Runtime) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", runtime.pid()))
        .unwrap()
        .count()
}

async fn metrics(runtime: &Runtime) -> String {
    get(runtime.admin_url("/metrics")).await.1
}

async fn refused(runtime: &Runtime, reason: &str) -> f64 {
    sample(&metrics(runtime).await, "wasmless_refused_total", &[("reason", reason)]).unwrap()
}

/// Waits until `condition` holds, for at most `within`; returns whether it did.
async fn eventually(within: Duration, mut condition: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if condition().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Connects, sends the headers of a 100-byte POST and its first byte, then trickles
/// one more byte every 300 ms; again on a new connection whenever the runtime closes
/// this one. Counts the 408s it is answered with.
async fn slow_body_attacker(addr: SocketAddr, stop: Arc<AtomicBool>, timeouts: Arc<AtomicU32>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            continue;
        };
        let head = "POST /echo HTTP/1.1\r\nHost: function\r\nContent-Length: 100\r\n\r\nx";
        if stream.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        let (mut reader, mut writer) = stream.into_split();
        let answer = async {
            let mut text = Vec::new();
            let _ = reader.read_to_end(&mut text).await;
            text
        };
        let trickle = async {
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(300)).await;
                if writer.write_all(b"x").await.is_err() {
                    break;
                }
            }
            std::future::pending::<()>().await
        };
        let text = tokio::select! {
            text = answer => text,
            () = trickle => unreachable!(),
            () = wait_for(&stop) => return,
        };
        if text.starts_with(b"HTTP/1.1 408") {
            timeouts.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Connects and sends a request's head one byte every 300 ms, never finishing it; again
/// whenever the runtime closes the connection.
async fn slow_header_attacker(addr: SocketAddr, stop: Arc<AtomicBool>) {
    let head = b"GET / HTTP/1.1\r\nHost: function\r\nX-Padding: ".repeat(100);
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            continue;
        };
        for byte in &head {
            if stop.load(Ordering::Relaxed) || stream.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

async fn wait_for(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_clients_do_not_starve_a_well_behaved_one_and_leave_nothing_behind() {
    let runtime = Runtime::start(
        rust_echo_with_digest(),
        &[
            "--function",
            "attacked",
            "--max-concurrency",
            "4",
            "--header-read-timeout",
            "2s",
            "--body-read-timeout",
            "2s",
        ],
    );
    let addr = runtime.function;
    // Warm up: the pool, the first instances, the allocator's arenas.
    for _ in 0..20 {
        assert_eq!(exchange(addr, &get_request("/hello")).await.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (fds_before, rss_before) = (open_fds(&runtime), runtime.rss_bytes());

    let stop = Arc::new(AtomicBool::new(false));
    let timeouts = Arc::new(AtomicU32::new(0));
    let mut attackers = Vec::new();
    for _ in 0..8 {
        attackers.push(tokio::spawn(slow_body_attacker(addr, stop.clone(), timeouts.clone())));
    }
    for _ in 0..50 {
        attackers.push(tokio::spawn(slow_header_attacker(addr, stop.clone())));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let fds_attacked = open_fds(&runtime);
    assert!(
        fds_attacked >= fds_before + 50,
        "the attackers are connected: {fds_before} fds before, {fds_attacked} now"
    );

    // For longer than the timeouts, so the attackers are cut off and come back.
    let attacked_until = Instant::now() + Duration::from_secs(5);
    let mut served = 0;
    while Instant::now() < attacked_until {
        let started = Instant::now();
        let answer = exchange(addr, &get_request("/hello")).await;
        assert_eq!(answer.status, 200, "{:?}", String::from_utf8_lossy(&answer.body));
        assert_eq!(answer.body, b"Hello, world!\n");
        let post = exchange(
            addr,
            b"POST /echo HTTP/1.1\r\nHost: function\r\nContent-Length: 5\r\n\r\nhello",
        )
        .await;
        assert_eq!(post.status, 200, "a well-behaved upload is served too");
        assert!(String::from_utf8_lossy(&post.body).contains("\"body\":\"hello\""));
        served += 1;
        tokio::time::sleep(Duration::from_millis(200).saturating_sub(started.elapsed())).await;
    }
    let metrics_text = metrics(&runtime).await;
    let count = |reason: &str| {
        sample(
            &metrics_text,
            "wasmless_refused_total",
            &[("reason", reason), ("function", "attacked")],
        )
        .unwrap()
    };
    assert!(timeouts.load(Ordering::Relaxed) >= 8, "every slow body got a 408");
    assert!(count("body_timeout") >= 8.0, "{metrics_text}");
    assert!(count("header_timeout") >= 50.0, "{metrics_text}");
    assert_eq!(
        count("busy"),
        0.0,
        "no well-behaved request was turned away: {metrics_text}"
    );

    stop.store(true, Ordering::Relaxed);
    for attacker in attackers {
        attacker.await.unwrap();
    }
    let fds_back = eventually(Duration::from_secs(10), async || open_fds(&runtime) <= fds_before + 2).await;
    let fds_after = open_fds(&runtime);
    let rss_after = runtime.rss_bytes();
    println!(
        "attacked for 5 s by 8 slow bodies and 50 slow headers ({served} well-behaved rounds served): \
         fds {fds_before} before, {fds_attacked} during, {fds_after} after; \
         RSS {:.1} MiB before, {:.1} MiB after",
        rss_before as f64 / (1 << 20) as f64,
        rss_after as f64 / (1 << 20) as f64,
    );
    assert!(
        fds_back,
        "file descriptors: {fds_before} before the attack, {fds_after} after"
    );
    assert!(
        rss_after < rss_before + (16 << 20),
        "RSS grew from {rss_before} to {rss_after} bytes"
    );
    let gauge = sample(&metrics(&runtime).await, "wasmless_connections_open", &[]).unwrap();
    assert!(gauge <= 1.0, "connections still counted open: {gauge}");
    assert_eq!(exchange(addr, &get_request("/hello")).await.status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_headers_get_431_and_large_ones_pass() {
    let runtime = Runtime::start(rust_echo_with_digest(), &[]);
    let huge = format!(
        "GET / HTTP/1.1\r\nHost: function\r\nX-Huge: {}\r\n\r\n",
        "a".repeat(200_000)
    );
    let answer = exchange(runtime.function, huge.as_bytes()).await;
    assert_eq!(answer.status, 431);
    assert_eq!(refused(&runtime, "header_too_large").await, 1.0);

    let large = format!(
        "GET /hello HTTP/1.1\r\nHost: function\r\nX-Large: {}\r\n\r\n",
        "a".repeat(60_000)
    );
    assert_eq!(
        exchange(runtime.function, large.as_bytes()).await.status,
        200,
        "60 KB is under 64 KiB"
    );

    let runtime = Runtime::start(rust_echo_with_digest(), &["--max-header-size", "8Ki"]);
    let answer = exchange(runtime.function, large.as_bytes()).await;
    assert_eq!(answer.status, 431, "--max-header-size sets the limit");
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_are_closed_after_the_idle_timeout_not_the_header_timeout() {
    let runtime = Runtime::start(
        rust_echo_with_digest(),
        &[
            "--idle-timeout",
            "5s",
            "--header-read-timeout",
            "2s",
            "--max-connections",
            "5000",
        ],
    );
    let mut stream = TcpStream::connect(runtime.function).await.unwrap();
    stream.write_all(&get_request("/hello")).await.unwrap();
    assert_eq!(read_answer(&mut stream).await.unwrap().status, 200);
    // Idle for longer than the header timeout: still open, and serves the next request.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    stream.write_all(&get_request("/hello")).await.unwrap();
    let answer = read_answer(&mut stream).await.unwrap();
    assert_eq!(answer.status, 200, "the same connection serves again");
    assert!(answer.header("connection").is_none_or(|v| v != "close"));
    // Then idle past the idle timeout: closed by the runtime.
    assert!(
        closed_within(&mut stream, Duration::from_secs(10)).await,
        "an idle connection stays open"
    );

    // Connections that never send a byte are closed after the header timeout: thousands.
    let fds_before = open_fds(&runtime);
    let mut silent = Vec::new();
    let mut peak = 0;
    for index in 0..2000 {
        silent.push(TcpStream::connect(runtime.function).await.unwrap());
        if index % 100 == 99 {
            peak = peak.max(open_fds(&runtime));
        }
    }
    assert!(
        peak >= fds_before + 500,
        "the runtime held the silent connections: {peak} fds at most"
    );
    assert_eq!(exchange(runtime.function, &get_request("/hello")).await.status, 200);
    for stream in &mut silent {
        assert!(
            closed_within(stream, Duration::from_secs(10)).await,
            "a silent connection stays open"
        );
    }
    assert!(refused(&runtime, "header_timeout").await >= 2000.0);
    drop(silent);
    let back = eventually(Duration::from_secs(5), async || open_fds(&runtime) <= fds_before + 2).await;
    println!(
        "2000 silent connections: fds {fds_before} before, {peak} at most, {} after",
        open_fds(&runtime)
    );
    assert!(
        back,
        "file descriptors: {fds_before} before, {} after",
        open_fds(&runtime)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn trickled_body_gets_408_and_uploads_have_their_own_budget() {
    let runtime = Runtime::start(
        rust_echo_with_digest(),
        &[
            "--body-read-timeout",
            "1500ms",
            "--upload-budget",
            "150",
            "--max-concurrency",
            "1",
        ],
    );
    let mut slow = TcpStream::connect(runtime.function).await.unwrap();
    slow.write_all(b"POST /echo HTTP/1.1\r\nHost: function\r\nContent-Length: 100\r\n\r\nx")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The slow upload holds 100 of the 150 bytes of the budget and no concurrency permit.
    let post_100 = format!(
        "POST /echo HTTP/1.1\r\nHost: function\r\nContent-Length: 100\r\n\r\n{}",
        "y".repeat(100)
    )
    .into_bytes();
    let answer = exchange(runtime.function, &post_100).await;
    assert_eq!(answer.status, 503, "over the upload budget");
    assert!(String::from_utf8_lossy(&answer.body).contains("request bodies"));
    assert_eq!(refused(&runtime, "upload_budget").await, 1.0);
    assert_eq!(
        exchange(runtime.function, &get_request("/hello")).await.status,
        200,
        "the one concurrency permit is free while the body trickles in"
    );

    let answer = tokio::time::timeout(SERVED_WITHIN, read_answer(&mut slow))
        .await
        .expect("the slow body is answered")
        .unwrap();
    assert_eq!(answer.status, 408);
    assert_eq!(answer.header("connection"), Some("close"));
    assert!(
        closed_within(&mut slow, SERVED_WITHIN).await,
        "and its connection closed"
    );
    assert_eq!(refused(&runtime, "body_timeout").await, 1.0);

    let answer = exchange(runtime.function, &post_100).await;
    assert_eq!(answer.status, 200, "the budget is released");
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_beyond_the_cap_are_refused_and_counted() {
    let runtime = Runtime::start(
        rust_echo_with_digest(),
        &["--max-connections", "10", "--function", "capped"],
    );
    let mut held = Vec::new();
    for _ in 0..10 {
        held.push(TcpStream::connect(runtime.function).await.unwrap());
    }
    assert!(
        eventually(Duration::from_secs(5), async || {
            sample(&metrics(&runtime).await, "wasmless_connections_open", &[]) == Some(10.0)
        })
        .await
    );
    for _ in 0..5 {
        let mut extra = TcpStream::connect(runtime.function).await.unwrap();
        let answer = tokio::time::timeout(SERVED_WITHIN, read_answer(&mut extra))
            .await
            .expect("refused at once")
            .unwrap();
        assert_eq!(answer.status, 503);
        assert!(String::from_utf8_lossy(&answer.body).contains("too many connections"));
        assert!(closed_within(&mut extra, SERVED_WITHIN).await);
    }
    assert_eq!(refused(&runtime, "connection_limit").await, 5.0);
    let warnings = || -> Vec<String> {
        runtime
            .logs()
            .into_iter()
            .filter(|line| line.contains("connection limit reached"))
            .collect()
    };
    // The runtime's stderr is read on another thread: the line may follow the metric.
    assert!(
        eventually(Duration::from_secs(5), async || !warnings().is_empty()).await,
        "no warning logged"
    );
    let warnings = warnings();
    assert_eq!(warnings.len(), 1, "one warning, not one per refusal: {warnings:?}");
    assert!(warnings[0].contains("WARN") && warnings[0].contains("\"max_connections\":10"));

    drop(held);
    assert!(
        eventually(Duration::from_secs(5), async || {
            let mut stream = TcpStream::connect(runtime.function).await.unwrap();
            stream.write_all(&get_request("/hello")).await.unwrap();
            matches!(read_answer(&mut stream).await, Ok(answer) if answer.status == 200)
        })
        .await,
        "served again once the held connections are gone"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_serves_through_the_drain_delay_then_refuses() {
    let mut runtime = Runtime::start(
        rust_echo_with_digest(),
        &["--drain-delay", "2s", "--shutdown-grace", "10s"],
    );
    let addr = runtime.function;
    let mut keep_alive = TcpStream::connect(addr).await.unwrap();
    keep_alive.write_all(&get_request("/hello")).await.unwrap();
    assert_eq!(read_answer(&mut keep_alive).await.unwrap().status, 200);
    let slow = tokio::spawn(exchange_slowly(addr));
    tokio::time::sleep(Duration::from_millis(300)).await;

    let terminated = Instant::now();
    runtime.terminate();
    assert!(
        eventually(Duration::from_secs(1), async || {
            client()
                .get(runtime.admin_url("/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status() == 503)
        })
        .await,
        "readiness goes false at once"
    );
    // During the delay: a new connection is served, and told to close.
    let answer = exchange(addr, &get_request("/hello")).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("connection"), Some("close"));
    // So is a keep-alive connection's next request, and then it is closed.
    keep_alive.write_all(&get_request("/hello")).await.unwrap();
    let answer = read_answer(&mut keep_alive).await.unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("connection"), Some("close"));
    assert!(closed_within(&mut keep_alive, SERVED_WITHIN).await);
    assert!(
        terminated.elapsed() < Duration::from_millis(1800),
        "the checks above ran inside the drain delay (took {:?})",
        terminated.elapsed()
    );

    // After the delay: the listener is closed, the request in flight still finishes.
    assert!(
        eventually(Duration::from_secs(5), async || TcpStream::connect(addr).await.is_err()).await,
        "still accepting after the drain delay"
    );
    assert!(
        terminated.elapsed() >= Duration::from_secs(2),
        "refused before the delay was over"
    );
    let answer = slow.await.unwrap();
    assert_eq!((answer.status, answer.body.as_slice()), (200, b"slept\n".as_slice()));
    assert_eq!(
        answer.header("connection"),
        Some("close"),
        "the last response closes politely"
    );
    assert!(runtime.wait().success());
}

/// A request that takes 3.5 s to serve: in flight across the whole drain delay.
async fn exchange_slowly(addr: SocketAddr) -> Answer {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(&get_request("/sleep?ms=3500")).await.unwrap();
    read_answer(&mut stream).await.unwrap()
}
