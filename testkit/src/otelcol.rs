//! A real OpenTelemetry Collector (built from its Go modules by scripts/lib.sh) receiving
//! OTLP/HTTP on loopback and writing the spans to a file, and what the tests read of them:
//! the runtime's traces test and the operator's.

use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The collector: `WASMLESS_OTELCOL` (scripts/test.sh builds it in the background), or
/// built (once, minutes) or found in the cache by scripts/lib.sh.
fn otelcol() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| crate::lib_sh_tool("WASMLESS_OTELCOL", "otelcol_tool", "traces test"))
        .clone()
}

pub struct Collector {
    child: Child,
    pub port: u16,
    pub spans_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Collector {
    pub fn start() -> Self {
        Self::start_on(crate::free_port())
    }

    pub fn start_on(port: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let spans_file = dir.path().join("spans.jsonl");
        let config = dir.path().join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n\
                 exporters:\n  file:\n    path: {}\n    flush_interval: 100ms\n\
                 service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [file]\n",
                spans_file.display()
            ),
        )
        .unwrap();
        let mut child = Command::new(otelcol())
            .arg(format!("--config={}", config.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(child.try_wait().unwrap().is_none(), "the collector exited");
            assert!(Instant::now() < deadline, "the collector did not listen");
            std::thread::sleep(Duration::from_millis(100));
        }
        Self {
            child,
            port,
            spans_file,
            _dir: dir,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn spans(&self) -> Vec<Span> {
        read_spans(&self.spans_file)
    }

    /// Waits until the spans written so far satisfy `done`.
    pub fn wait_for(&self, what: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not in the collector's spans:\n{spans:#?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A span as the collector wrote it (OTLP JSON).
#[derive(Debug, Clone)]
pub struct Span {
    pub service: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent: String,
    pub name: String,
    /// 2 server, 3 client, 1 internal.
    pub kind: u64,
    /// 2 is an error.
    pub status: u64,
    pub attributes: HashMap<String, String>,
    pub resource: HashMap<String, String>,
    pub events: Vec<String>,
    /// Unix nanoseconds.
    pub start_ns: u64,
    pub end_ns: u64,
}

fn attributes(list: &Value) -> HashMap<String, String> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|attribute| {
            let value = &attribute["value"];
            let text = ["stringValue", "intValue", "boolValue", "doubleValue"]
                .iter()
                .find_map(|key| value.get(key))
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                .unwrap_or_default();
            (attribute["key"].as_str().unwrap().to_string(), text)
        })
        .collect()
}

fn read_spans(file: &Path) -> Vec<Span> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut spans = Vec::new();
    // A line still being written is left for the next read.
    for line in text.lines().filter_map(|line| serde_json::from_str::<Value>(line).ok()) {
        for resource_spans in line["resourceSpans"].as_array().into_iter().flatten() {
            let resource = attributes(&resource_spans["resource"]["attributes"]);
            for scope in resource_spans["scopeSpans"].as_array().into_iter().flatten() {
                for span in scope["spans"].as_array().into_iter().flatten() {
                    let text = |key: &str| span[key].as_str().unwrap_or_default().to_string();
                    spans.push(Span {
                        service: resource.get("service.name").cloned().unwrap_or_default(),
                        trace_id: text("traceId"),
                        span_id: text("spanId"),
                        parent: text("parentSpanId"),
                        name: text("name"),
                        kind: span["kind"].as_u64().unwrap_or(0),
                        status: span["status"]["code"].as_u64().unwrap_or(0),
                        attributes: attributes(&span["attributes"]),
                        resource: resource.clone(),
                        events: span["events"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|event| event["name"].as_str().unwrap_or_default().to_string())
                            .collect(),
                        start_ns: text("startTimeUnixNano").parse().unwrap_or_default(),
                        end_ns: text("endTimeUnixNano").parse().unwrap_or_default(),
                    });
                }
            }
        }
    }
    spans
}

/// The one span of `spans` matching `what`, with a message naming what was there.
pub fn one<'a>(spans: &'a [Span], what: &str, matches: impl Fn(&Span) -> bool) -> &'a Span {
    let found: Vec<&Span> = spans.iter().filter(|span| matches(span)).collect();
    assert_eq!(found.len(), 1, "{what}: {} spans in\n{spans:#?}", found.len());
    found[0]
}

pub fn children<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    spans.iter().filter(|span| span.parent == parent.span_id).collect()
}
