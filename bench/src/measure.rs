//! Timing servers from outside, as a client sees them: time to first 200, and wrk.

use anyhow::{Context, bail};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server process, killed when dropped; its stderr kept for when it fails.
pub struct Server(pub Child, tempfile::NamedTempFile);

impl Server {
    pub fn spawn(command: &mut Command) -> anyhow::Result<Self> {
        let stderr = tempfile::NamedTempFile::new()?;
        let child = command
            .stdout(Stdio::null())
            .stderr(stderr.reopen()?)
            .spawn()
            .with_context(|| format!("cannot start {command:?}"))?;
        Ok(Self(child, stderr))
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.1.path()).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One GET /; true on a 200.
pub fn get_ok(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    if stream
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && &head[9..12] == b"200"
}

/// Waits for the first 200 on `port`; the time since `started`.
pub fn until_first_200(port: u16, started: Instant, server: &mut Server) -> anyhow::Result<Duration> {
    let deadline = started + Duration::from_secs(180);
    loop {
        if get_ok(port) {
            return Ok(started.elapsed());
        }
        if let Some(status) = server.0.try_wait()? {
            bail!("the server exited with {status} before answering:\n{}", server.stderr());
        }
        if Instant::now() > deadline {
            bail!("no 200 on port {port} within 3 minutes");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Load {
    pub requests_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub errors: u64,
}

/// `wrk --latency` against GET /.
pub fn wrk(port: u16, seconds: u64, connections: u32) -> anyhow::Result<Load> {
    let output = Command::new("wrk")
        .args([
            "--latency",
            "-t2",
            &format!("-c{connections}"),
            &format!("-d{seconds}s"),
        ])
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .context("cannot run wrk (bench/run.sh installs it)")?;
    let text = String::from_utf8_lossy(&output.stdout);
    let mut load = Load::default();
    for line in text.lines().map(str::trim) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["Requests/sec:", value] => load.requests_per_second = value.parse()?,
            ["50%", value] => load.p50_ms = milliseconds(value)?,
            ["99%", value] => load.p99_ms = milliseconds(value)?,
            ["Non-2xx", "or", "3xx", "responses:", count] => load.errors += count.parse::<u64>()?,
            ["Socket", "errors:", rest @ ..] => {
                load.errors += rest
                    .iter()
                    .filter_map(|f| f.trim_end_matches(',').parse::<u64>().ok())
                    .sum::<u64>()
            }
            _ => {}
        }
    }
    if load.requests_per_second == 0.0 {
        bail!("wrk reported nothing:\n{text}");
    }
    Ok(load)
}

fn milliseconds(text: &str) -> anyhow::Result<f64> {
    let (number, unit) = text.split_at(text.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(text.len()));
    let value: f64 = number.parse()?;
    Ok(match unit {
        "us" => value / 1000.0,
        "ms" => value,
        "s" => value * 1000.0,
        other => bail!("unknown wrk unit {other:?}"),
    })
}

/// Resident memory of a process now, and its peak.
pub fn rss_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    (status_mib(&status, "VmRSS:"), status_mib(&status, "VmHWM:"))
}

/// A process's resident memory (MiB) and the part of it only it holds: anonymous and
/// shared-memory pages (a copy of code, a memfd), not the file pages it maps, which the
/// page cache holds once for every process mapping the same file.
#[derive(Debug, Clone, Copy, Default)]
pub struct Resident {
    pub rss: f64,
    pub private: f64,
    /// Proportional: each resident page divided by the processes that map it.
    pub pss: f64,
}

pub fn resident_mib(pid: u32) -> Resident {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    Resident {
        rss: status_mib(&status, "VmRSS:"),
        private: status_mib(&status, "RssAnon:") + status_mib(&status, "RssShmem:"),
        pss: status_mib(&rollup, "Pss:"),
    }
}

fn status_mib(status: &str, name: &str) -> f64 {
    status
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Runs `command` to completion; its wall time.
pub fn time_command(command: &mut Command) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let output = command.output().with_context(|| format!("cannot run {command:?}"))?;
    if !output.status.success() {
        bail!("{command:?} failed:\n{}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(started.elapsed())
}
