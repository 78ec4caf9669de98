//! The runtime's test handler: echoes the request as JSON, and misbehaves on request.

use wasmless_sdk::{Request, Response, http, query, query_pairs};

/// `n` Server-Sent Events, `ms` apart, each sent as it is written.
fn events(request: &Request) -> Response {
    use std::io::Write;
    let count: u32 = query(request, "n").and_then(|n| n.parse().ok()).unwrap_or(3);
    let millis = query(request, "ms").and_then(|ms| ms.parse().ok()).unwrap_or(300);
    let head = http::Response::builder()
        .header("content-type", "text/event-stream")
        .body(())
        .unwrap();
    let mut body = wasmless_sdk::stream(head).expect("the first answer");
    for i in 0..count {
        if i > 0 {
            std::thread::sleep(std::time::Duration::from_millis(millis));
        }
        write!(body, "data: event {i}\n\n").unwrap();
    }
    body.finish()
}

pub fn handler(request: Request) -> Response {
    match request.uri().path() {
        "/panic" => panic!("deliberate panic for the test"),
        "/loop" => loop {
            std::hint::black_box(());
        },
        "/grow" => {
            let mut hoard = Vec::new();
            loop {
                hoard.push(vec![1u8; 1 << 20]);
                std::hint::black_box(&hoard);
            }
        }
        "/sleep" => {
            let millis = query(&request, "ms").and_then(|ms| ms.parse().ok()).unwrap_or(500);
            std::thread::sleep(std::time::Duration::from_millis(millis));
            Response::new(b"slept\n".to_vec())
        }
        "/hold" => {
            // Holds `mib` MiB of linear memory, every page touched, for `ms` milliseconds.
            let mib: usize = query(&request, "mib").and_then(|mib| mib.parse().ok()).unwrap_or(1);
            let millis = query(&request, "ms").and_then(|ms| ms.parse().ok()).unwrap_or(0);
            let held = vec![1u8; mib << 20];
            std::thread::sleep(std::time::Duration::from_millis(millis));
            Response::new(format!("held {} MiB\n", std::hint::black_box(&held).len() >> 20).into_bytes())
        }
        "/reserve" => {
            // Asks for `mib` MiB it may not get; when refused it goes on (4 MiB more, every
            // page touched) and then fails on its own.
            let mib: usize = query(&request, "mib").and_then(|mib| mib.parse().ok()).unwrap_or(1);
            let mut wanted: Vec<u8> = Vec::new();
            if wanted.try_reserve_exact(mib << 20).is_ok() {
                return Response::new(format!("reserved {mib} MiB\n").into_bytes());
            }
            let fallback = vec![1u8; 4 << 20];
            std::hint::black_box(&fallback);
            panic!("could not reserve {mib} MiB, and failed afterwards for a reason of its own");
        }
        "/write" => {
            // Writes `mib` MiB to stdout and as much to stderr.
            use std::io::Write;
            let mib: usize = query(&request, "mib").and_then(|mib| mib.parse().ok()).unwrap_or(1);
            let chunk = vec![b'.'; 64 << 10];
            for _ in 0..mib * 16 {
                std::io::stdout().write_all(&chunk).unwrap();
                std::io::stderr().write_all(&chunk).unwrap();
            }
            Response::new(format!("wrote {mib} MiB twice\n").into_bytes())
        }
        "/hello" => Response::new(b"Hello, world!\n".to_vec()),
        "/events" => events(&request),
        "/fetch" => fetch(&query(&request, "url").unwrap_or_default()),
        "/stderr" => {
            eprintln!("a line the handler wrote to stderr");
            Response::new(b"wrote to stderr\n".to_vec())
        }
        _ => echo(&request),
    }
}

/// Calls `url` with the SDK and answers "<status> <body>" or "error: <why>".
fn fetch(url: &str) -> Response {
    let request = http::Request::get(url).body(Vec::new()).unwrap();
    match wasmless_sdk::send(request) {
        Ok(response) => Response::new(
            [
                response.status().as_str().as_bytes(),
                b" ",
                response.body(),
            ]
            .concat(),
        ),
        Err(error) => Response::new(format!("error: {error} denied={}", error.is_denied()).into_bytes()),
    }
}

fn echo(request: &Request) -> Response {
    let headers: Vec<String> = request
        .headers()
        .iter()
        .map(|(name, value)| format!("{}:{}", json(name.as_str()), json(value.to_str().unwrap_or(""))))
        .collect();
    let query: Vec<String> = query_pairs(request)
        .iter()
        .map(|(k, v)| format!("{}:{}", json(k), json(v)))
        .collect();
    let body = format!(
        "{{\"method\":{},\"path\":{},\"query\":{{{}}},\"headers\":{{{}}},\"body\":{},\"env\":{}}}\n",
        json(request.method().as_str()),
        json(request.uri().path()),
        query.join(","),
        headers.join(","),
        json(&String::from_utf8_lossy(request.body())),
        json(&std::env::var("GREETING").unwrap_or_default()),
    );
    let status = wasmless_sdk::query(request, "status")
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("x-echo", "rust")
        .body(body.into_bytes())
        .unwrap()
}

fn json(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

wasmless_sdk::export!(handler);
