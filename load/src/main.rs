//! A request loop for the zero-failed-requests test: `--clients` keep-alive clients send
//! GETs to one URL at `--rate` requests a second in all, until SIGTERM/SIGINT or
//! `--duration`, and report every failure with its time, its cause and the phase it fell in
//! (`--phases FILE`, lines of `<epoch seconds> <name>` that the driver appends as it makes
//! each change), and how soon after each change each answer first came. A phase whose
//! name has a word `rate=N` sets the rate from then on (e.g. to let a Function go idle).
//!
//! A client behaves as an HTTP client library does: it keeps its connection while the
//! server keeps it, opens a new one after `Connection: close`, and sends a request again
//! once, on a new connection, when a reused connection was closed before any byte of the
//! answer (Go's `net/http` and curl do the same for a GET); those are counted apart. Every
//! other error, timeout and non-2xx answer is a failure.

mod record;

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;
use record::{Outcome, Record};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::net::TcpStream;

#[derive(Parser)]
struct Args {
    /// What to GET: `http://host:port/path`.
    url: Uri,
    /// Requests a second, in all.
    #[arg(long, default_value_t = 1000)]
    rate: u32,
    /// Clients sending at once, each with its own connection.
    #[arg(long, default_value_t = 8)]
    clients: u32,
    /// How many of the clients open a new connection for every request (as a script of
    /// curl calls does), which a route to a pod that went away fails at once.
    #[arg(long, default_value_t = 0)]
    fresh_clients: u32,
    /// Stop after this many seconds (else at SIGTERM or SIGINT).
    #[arg(long)]
    duration: Option<f64>,
    /// The phases the driver marks, read when the loop stops.
    #[arg(long)]
    phases: Option<PathBuf>,
    /// Where to write the report as JSON.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Time to connect, and to get a whole answer.
    #[arg(long, default_value_t = 5.0)]
    timeout: f64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let target = Arc::new(Target::new(&args.url, Duration::from_secs_f64(args.timeout))?);
    let stop = Arc::new(AtomicBool::new(false));
    let retried = Arc::new(AtomicU64::new(0));
    let rate = Arc::new(AtomicU32::new(args.rate.max(1)));
    if let Some(phases) = args.phases.clone() {
        tokio::spawn(follow_rate(phases, rate.clone()));
    }
    let clients_count = args.clients.max(1);
    let mut clients = Vec::new();
    for client in 0..args.clients.max(1) {
        let (target, stop, retried, rate) = (target.clone(), stop.clone(), retried.clone(), rate.clone());
        let keeps_connection = client >= args.fresh_clients;
        clients.push(tokio::spawn(async move {
            let pace = Pace {
                rate: &rate,
                clients: clients_count,
            };
            run_client(&target, pace, keeps_connection, &stop, &retried).await
        }));
    }
    wait_for_the_end(args.duration).await?;
    stop.store(true, Ordering::Relaxed);
    let mut records = Vec::new();
    for client in clients {
        records.extend(client.await?);
    }
    let phases = match &args.phases {
        Some(path) => record::parse_phases(&std::fs::read_to_string(path).unwrap_or_default()),
        None => Vec::new(),
    };
    let report = record::report(&records, &phases, retried.load(Ordering::Relaxed));
    print!("{}", record::render(&report));
    if let Some(output) = &args.output {
        std::fs::write(output, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", output.display()))?;
    }
    Ok(())
}

async fn wait_for_the_end(duration: Option<f64>) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let limit = async {
        match duration {
            Some(seconds) => tokio::time::sleep(Duration::from_secs_f64(seconds)).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
        () = limit => {}
    }
    Ok(())
}

/// Where the requests go.
struct Target {
    address: String,
    host: String,
    path: String,
    timeout: Duration,
}

impl Target {
    fn new(url: &Uri, timeout: Duration) -> anyhow::Result<Self> {
        anyhow::ensure!(
            url.scheme_str() == Some("http"),
            "{url}: only http:// URLs are supported"
        );
        let host = url.host().with_context(|| format!("{url} names no host"))?;
        let port = url.port_u16().unwrap_or(80);
        Ok(Self {
            address: format!("{host}:{port}"),
            host: url.authority().map_or_else(|| host.to_string(), ToString::to_string),
            path: url.path_and_query().map_or("/", |path| path.as_str()).to_string(),
            timeout,
        })
    }
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

async fn run_client(
    target: &Target,
    pace: Pace<'_>,
    keeps_connection: bool,
    stop: &AtomicBool,
    retried: &AtomicU64,
) -> Vec<Record> {
    let mut records = Vec::new();
    let mut connection: Option<SendRequest<Empty<Bytes>>> = None;
    let mut next = tokio::time::Instant::now();
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep_until(next).await;
        // A client late by more than its interval sends at once and does not catch up.
        next = (next + pace.every()).max(tokio::time::Instant::now());
        let at = now();
        let reused = connection.as_ref().is_some_and(|sender| !sender.is_closed());
        let mut attempt = send(target, &mut connection, keeps_connection).await;
        if reused && matches!(attempt, Err(Failure::ClosedBeforeAnswer(_))) {
            retried.fetch_add(1, Ordering::Relaxed);
            attempt = send(target, &mut connection, keeps_connection).await;
        }
        let outcome = match attempt {
            Ok(body) => Outcome::Answered(body),
            Err(Failure::ClosedBeforeAnswer(cause) | Failure::Other(cause)) => Outcome::Failed(cause),
        };
        records.push(Record { at, outcome });
        if !keeps_connection {
            connection = None;
        }
    }
    records
}

/// Each client's share of the rate, which the phases may change.
#[derive(Clone, Copy)]
struct Pace<'a> {
    rate: &'a AtomicU32,
    clients: u32,
}

impl Pace<'_> {
    fn every(&self) -> Duration {
        Duration::from_secs_f64(f64::from(self.clients) / f64::from(self.rate.load(Ordering::Relaxed).max(1)))
    }
}

/// Sets the rate from the last phase whose name has a word `rate=N`, every 200 ms.
async fn follow_rate(phases: PathBuf, rate: Arc<AtomicU32>) {
    let initial = rate.load(Ordering::Relaxed);
    loop {
        let text = tokio::fs::read_to_string(&phases).await.unwrap_or_default();
        let set = record::rate_set_by(&record::parse_phases(&text));
        rate.store(set.unwrap_or(initial), Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

enum Failure {
    /// The connection ended before any byte of the answer: a reused one may be retried.
    ClosedBeforeAnswer(String),
    Other(String),
}

/// One GET on the kept connection (a new one when there is none): the answer's body, trimmed.
async fn send(
    target: &Target,
    connection: &mut Option<SendRequest<Empty<Bytes>>>,
    keeps_connection: bool,
) -> Result<String, Failure> {
    let result = tokio::time::timeout(target.timeout, exchange(target, connection, keeps_connection)).await;
    let result = result.unwrap_or_else(|_| Err(Failure::Other(format!("no whole answer within {:?}", target.timeout))));
    if result.is_err() {
        *connection = None;
    }
    result
}

async fn exchange(
    target: &Target,
    connection: &mut Option<SendRequest<Empty<Bytes>>>,
    keeps_connection: bool,
) -> Result<String, Failure> {
    let mut sender = match connection.take() {
        Some(sender) if !sender.is_closed() => sender,
        _ => connect(target).await?,
    };
    sender
        .ready()
        .await
        .map_err(|error| Failure::ClosedBeforeAnswer(format!("connection: {}", chain(&error))))?;
    let mut request = Request::get(target.path.as_str()).header(hyper::header::HOST, target.host.as_str());
    if !keeps_connection {
        // The server closes first, so the socket's TIME_WAIT is its own: a client that
        // closed first would hold a port of its own for a minute per request, and run out
        // of them at ~470 new connections a second (Linux's 28,232 ephemeral ports).
        request = request.header(hyper::header::CONNECTION, "close");
    }
    let request = request
        .body(Empty::new())
        .map_err(|error| Failure::Other(error.to_string()))?;
    let response = sender.send_request(request).await.map_err(|error| {
        let cause = format!("request: {}", chain(&error));
        if error.is_incomplete_message() || error.is_canceled() {
            Failure::ClosedBeforeAnswer(cause)
        } else {
            Failure::Other(cause)
        }
    })?;
    let status = response.status();
    let closes = response
        .headers()
        .get(hyper::header::CONNECTION)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"close"));
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|error| Failure::Other(format!("answer's body ({status}): {}", chain(&error))))?
        .to_bytes();
    let body = String::from_utf8_lossy(&body)
        .trim()
        .chars()
        .take(60)
        .collect::<String>();
    if !status.is_success() {
        return Err(Failure::Other(format!("HTTP {status}: {body}")));
    }
    if !closes {
        *connection = Some(sender);
    }
    Ok(body)
}

async fn connect(target: &Target) -> Result<SendRequest<Empty<Bytes>>, Failure> {
    let stream = TcpStream::connect(&target.address)
        .await
        .map_err(|error| Failure::Other(format!("connect to {}: {error}", target.address)))?;
    let _ = stream.set_nodelay(true);
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|error| Failure::Other(format!("handshake: {}", chain(&error))))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// An error with its causes, as one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
