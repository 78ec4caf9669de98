//! `wasmless-load` against a server this test runs on loopback, which answers, then closes
//! every connection after its answer, then goes away: what the tool counts as a failure,
//! which change it puts it in, and how soon it says the new answer came.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const ANSWER_A: u8 = 0;
const ANSWER_B_AND_CLOSE: u8 = 1;
const GONE: u8 = 2;

async fn serve_connection(mut stream: TcpStream, mode: Arc<AtomicU8>) {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        while !buffer.windows(4).any(|window| window == b"\r\n\r\n") {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        buffer.clear();
        let response: &[u8] = match mode.load(Ordering::SeqCst) {
            ANSWER_A => b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\na",
            ANSWER_B_AND_CLOSE => b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\nconnection: close\r\n\r\nb",
            _ => return,
        };
        if stream.write_all(response).await.is_err() || mode.load(Ordering::SeqCst) != ANSWER_A {
            return;
        }
    }
}

fn mark(phases: &std::path::Path, name: &str) {
    use std::io::Write;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(phases)
        .unwrap();
    writeln!(file, "{now} {name}").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_counted_with_their_cause_and_phase_and_closed_connections_are_not_failures() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let mode = Arc::new(AtomicU8::new(ANSWER_A));
    let server = {
        let mode = mode.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                tokio::spawn(serve_connection(stream, mode.clone()));
            }
        })
    };
    let dir = tempfile::tempdir().unwrap();
    let (phases, output) = (dir.path().join("phases"), dir.path().join("report.json"));
    mark(&phases, "a");
    let mut load = tokio::process::Command::new(env!("CARGO_BIN_EXE_wasmless-load"))
        .arg(format!("http://{address}/"))
        .args(["--rate", "400", "--duration", "3"])
        .args(["--clients", "4", "--fresh-clients", "2"])
        .arg("--phases")
        .arg(&phases)
        .arg("--output")
        .arg(&output)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    mark(&phases, "b, closing");
    mode.store(ANSWER_B_AND_CLOSE, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // Gone before the mark: a request after it finds no server, and one cut by the going
    // counts in "b, closing" (below).
    server.abort();
    let _ = server.await;
    mode.store(GONE, Ordering::SeqCst);
    mark(&phases, "gone");

    let mut text = String::new();
    load.stdout.take().unwrap().read_to_string(&mut text).await.unwrap();
    assert!(load.wait().await.unwrap().success(), "{text}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&output).unwrap()).unwrap();
    let phase = |name: &str| {
        report["phases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["phase"] == name)
            .unwrap_or_else(|| panic!("no phase {name} in {text}"))
            .clone()
    };
    // Answered, and answered with `Connection: close`: no failure, the new answer timed.
    // A request counts in the phase it started in: one still in flight when the server went
    // away (begun in the last moments of "b", its connection not yet accepted) fails
    // there. Only those may: a closed connection counted as a failure would fail hundreds
    // across the whole phase.
    assert_eq!(phase("a")["failed"], 0, "{text}");
    let closing = phase("b, closing");
    let gone_at = phase("gone")["start"].as_f64().unwrap();
    let cut_by_the_end = report["failures"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|failure| failure["phase"] == "b, closing")
        .inspect(|failure| {
            let at = failure["at"].as_f64().unwrap();
            assert!(
                at > gone_at - 0.2,
                "a failure {:.3} s before the server went away: {text}",
                gone_at - at
            );
        })
        .count();
    assert!(
        cut_by_the_end <= 4,
        "more failures than clients in flight as the server went away: {text}"
    );
    assert!(closing["requests"].as_u64().unwrap() > 200, "{text}");
    let first_b = closing["first_answers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|answer| answer["answer"] == "b");
    assert!(
        first_b.is_some_and(|answer| answer["after"].as_f64().unwrap() < 0.1),
        "{text}"
    );
    // Gone: every request fails to connect, and says so.
    let gone = phase("gone");
    assert!(gone["failed"].as_u64().unwrap() > 100, "{text}");
    assert_eq!(gone["failed"], gone["requests"], "{text}");
    let failures: Vec<_> = report["failures"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|failure| failure["phase"] == "gone")
        .collect();
    assert!(
        failures[0]["cause"].as_str().unwrap().contains("Connection refused"),
        "{text}"
    );
    assert!(
        text.contains("FAILED at ") && text.contains("[gone]: connect to 127.0.0.1:"),
        "{text}"
    );
}
