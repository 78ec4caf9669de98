//! Command-line flags (each also a `WASMLESS_*` environment variable) and the
//! Kubernetes-style quantities they take: `64Mi`, `10s`, `1Mi`.

use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "wasmless-runtime",
    version,
    about = "Serve a WebAssembly HTTP handler with wasmtime"
)]
pub struct Config {
    /// The module: a `.wasm` file, a directory of zstd chunks (`0000.wasm.zst`, ...), or
    /// `oci://registry/repo[:tag]` (pulled by `--module-digest`).
    #[arg(long, env = "WASMLESS_MODULE")]
    pub module: String,

    /// The module's `sha256:<hex>`; nothing runs unless the bytes match. When absent,
    /// the digest is read from `<module>.sha256` (or `module.sha256` in a chunk
    /// directory), and a module replaced on disk is swapped in once it matches its
    /// new digest file.
    #[arg(long, env = "WASMLESS_MODULE_DIGEST")]
    pub module_digest: Option<wasmless_artifact::Digest>,

    /// The builder's compiled code for this module: a `.cwasm.lz4` file, a directory of its
    /// chunks (`0000.cwasm.lz4`, ...), or `oci://registry/repo[@digest]`. Loaded instead of
    /// compiling when it matches `--code-digest`, the pinned module and this engine; when
    /// it does not fit this host, the module is compiled here (and the fallback counted).
    #[arg(long, env = "WASMLESS_CODE", requires = "code_digest")]
    pub code: Option<String>,

    /// The compiled code's `sha256:<hex>` (of the stored, compressed artifact): code that
    /// does not match is refused and the runtime does not start.
    #[arg(long, env = "WASMLESS_CODE_DIGEST")]
    pub code_digest: Option<wasmless_artifact::Digest>,

    /// Port that serves the function.
    #[arg(long, env = "WASMLESS_PORT", default_value_t = 8080)]
    pub port: u16,

    /// Port that serves `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, env = "WASMLESS_ADMIN_PORT", default_value_t = 9090)]
    pub admin_port: u16,

    /// Address both ports bind to.
    #[arg(long, env = "WASMLESS_BIND", default_value = "0.0.0.0")]
    pub bind: std::net::IpAddr,

    /// The function's name, in logs and in the `function` label of every metric.
    #[arg(long, env = "WASMLESS_FUNCTION", default_value = "function")]
    pub function: String,

    /// Linear memory one request may use (e.g. `64Mi`).
    #[arg(long, env = "WASMLESS_MEMORY_LIMIT", default_value = "64Mi", value_parser = parse_bytes)]
    pub memory_limit: u64,

    /// Wall-clock time one request may take before it is cut off with a 504 (e.g. `10s`).
    #[arg(long, env = "WASMLESS_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,

    /// Requests served at once; more get a 503.
    #[arg(long, env = "WASMLESS_MAX_CONCURRENCY", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_concurrency: u32,

    /// Largest request body accepted; larger gets a 413 (e.g. `1Mi`).
    #[arg(long, env = "WASMLESS_MAX_REQUEST_BODY", default_value = "1Mi", value_parser = parse_bytes)]
    pub max_request_body: u64,

    /// Environment of the handler, `KEY=VALUE`, repeatable.
    #[arg(long = "env", value_parser = parse_env_pair)]
    pub env: Vec<(String, String)>,

    /// Directory for compiled code, so a restarted pod compiles nothing.
    #[arg(long, env = "WASMLESS_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,

    /// How often a module file is checked for replacement (0 turns watching off).
    #[arg(long, env = "WASMLESS_WATCH_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub watch_interval: Duration,

    /// Time in-flight requests get to finish after SIGTERM.
    #[arg(long, env = "WASMLESS_SHUTDOWN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
}

impl Config {
    pub fn listen_addr(&self) -> SocketAddr {
        SocketAddr::new(self.bind, self.port)
    }

    pub fn admin_addr(&self) -> SocketAddr {
        SocketAddr::new(self.bind, self.admin_port)
    }
}

/// Parses a byte quantity as Kubernetes writes it: `512`, `64Ki`, `64Mi`, `1Gi`,
/// `100k`, `100M`.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size: write a number with an optional unit, like 64Mi"))?;
    let multiplier: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => return Err(format!("{text:?} has unknown unit {unit:?}: use Ki, Mi, Gi, k, M or G")),
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// Parses a duration: `250ms`, `10s`, `2m`, `1h`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration: write a number with a unit, like 10s or 250ms"))?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return Err(format!("{text:?} has unknown unit {unit:?}: use ms, s, m or h")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("{text:?} is out of range"))
}

fn parse_env_pair(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_kubernetes_units() {
        assert_eq!(parse_bytes("64Mi"), Ok(64 << 20));
        assert_eq!(parse_bytes("1Gi"), Ok(1 << 30));
        assert_eq!(parse_bytes("100k"), Ok(100_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("64MB").unwrap_err().contains("unknown unit"));
        assert!(parse_bytes("lots").unwrap_err().contains("not a size"));
    }

    #[test]
    fn durations_take_common_units() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("10 parsecs").is_err());
    }

    #[test]
    fn env_pairs_need_a_key() {
        assert_eq!(parse_env_pair("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert!(parse_env_pair("=x").is_err());
        assert!(parse_env_pair("novalue").is_err());
    }
}
