//! Command-line flags (each also a `WASMLESS_*` environment variable) and the
//! Kubernetes-style quantities they take: `64Mi`, `10s`, `1Mi`.

use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
pub use wasmless_formats::quantity::{parse_bytes, parse_duration};
use wasmless_host::limits::{DEFAULT_REQUESTS_PER_INSTANCE, Isolation};

#[derive(Debug, Clone, Parser)]
#[command(
    name = "wasmless-runtime",
    version,
    about = "Serve a WebAssembly HTTP handler with wasmtime"
)]
pub struct Config {
    /// The module: a `.wasm` file, a directory of zstd chunks (`0000.wasm.zst`, ...),
    /// `oci://registry/repo[:tag]` (pulled by `--module-digest`), or, in a pool that reads
    /// the API, `configmaps:<function>/<source digest sha256:hex>/<chunk count>` (the
    /// builder's chunk ConfigMaps in the pool's namespace).
    #[arg(
        long,
        env = "WASMLESS_MODULE",
        required_unless_present_any = ["pool", "traffic", "traffic_file"],
        conflicts_with = "pool"
    )]
    pub module: Option<String>,

    /// Several revisions of the Function side by side, instead of `--module`: a JSON list
    /// of `{"revision", "percent", "tag", "module", "moduleDigest", "code", "codeDigest"}`
    /// (module and code as `--module` and `--code` take them). The percents add up to 100;
    /// a revision with a `tag` also answers every request that has `Wasmless-Tag: <tag>`.
    /// Every revision is loaded, its digests checked, before the runtime reports ready.
    #[arg(
        long,
        env = "WASMLESS_TRAFFIC",
        value_parser = crate::traffic::Traffic::parse,
        conflicts_with_all = ["module", "module_digest", "code", "code_digest", "pool"]
    )]
    pub traffic: Option<crate::traffic::Traffic>,

    /// `--traffic` read from a file, and read again whenever it changes: a new list is
    /// served once each revision it names is loaded, its digests checked (until then, and
    /// if any fails, the last one serves on). Given more than once (or comma-separated in
    /// the environment), each file holds `{"generation": n, "routes": [...]}` (or a bare
    /// list, generation 0, or nothing yet) and the highest generation serves, the first
    /// file on a tie. The operator's pods follow their own `wasmless.io/routes` annotation
    /// (a downward API volume: the operator moves one pod by annotating it), then their
    /// Function's `<function>-routes` ConfigMap (what a pod started later serves).
    #[arg(
        long,
        env = "WASMLESS_TRAFFIC_FILE",
        value_delimiter = ',',
        conflicts_with_all = ["module", "module_digest", "code", "code_digest", "pool", "traffic"]
    )]
    pub traffic_file: Vec<PathBuf>,

    /// The module's `sha256:<hex>`; nothing runs unless the bytes match. When absent,
    /// the digest is read from `<module>.sha256` (or `module.sha256` in a chunk
    /// directory), and a module replaced on disk is swapped in once it matches its
    /// new digest file.
    #[arg(long, env = "WASMLESS_MODULE_DIGEST")]
    pub module_digest: Option<wasmless_artifact::Digest>,

    /// The builder's compiled code for this module: a `.cwasm.lz4` file, a directory of its
    /// chunks (`0000.cwasm.lz4`, ...), `oci://registry/repo[@digest]`, or (in a pool that
    /// reads the API) `configmaps:<function>/<source digest>/<count>`. Loaded instead of
    /// compiling when it matches `--code-digest`, the pinned module and this engine; when
    /// it does not fit this host, the module is compiled here (and the fallback counted).
    #[arg(long, env = "WASMLESS_CODE", requires = "code_digest")]
    pub code: Option<String>,

    /// The compiled code's `sha256:<hex>` (of the stored, compressed artifact): code that
    /// does not match is refused and the runtime does not start.
    #[arg(long, env = "WASMLESS_CODE_DIGEST")]
    pub code_digest: Option<wasmless_artifact::Digest>,

    /// Port that serves the function.
    #[arg(long, env = "WASMLESS_PORT", default_value_t = wasmless_artifact::ports::HTTP)]
    pub port: u16,

    /// Port that serves `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, env = "WASMLESS_ADMIN_PORT", default_value_t = wasmless_artifact::ports::ADMIN)]
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

    /// `request`: a fresh instance per request. `shared`: a Go reactor's initialised
    /// instances are kept and reused, each serving one request at a time, so that a
    /// global written by one request is seen by the next ones that instance serves (as in
    /// Goless, one Go process serving every request). An instance is replaced after a
    /// failed request (trap, timeout, memory, exit) or `--requests-per-instance`
    /// requests. Other handlers (components, CGI commands) get a fresh instance per
    /// request either way.
    #[arg(long, env = "WASMLESS_ISOLATION", value_enum, default_value_t = Isolation::Request)]
    pub isolation: Isolation,

    /// With `--isolation shared`: requests one instance serves before a fresh one
    /// replaces it, bounding what a leak can accumulate.
    #[arg(long, env = "WASMLESS_REQUESTS_PER_INSTANCE", default_value_t = DEFAULT_REQUESTS_PER_INSTANCE, value_parser = clap::value_parser!(u32).range(1..))]
    pub requests_per_instance: u32,

    /// Environment of the handler, `KEY=VALUE`, repeatable. The runtime's own environment
    /// variables named `WASMLESS_HANDLER_ENV_<KEY>` are added as `<KEY>` (and win): the
    /// operator passes values from Secrets and ConfigMaps that way, never as arguments.
    #[arg(long = "env", value_parser = parse_env_pair)]
    pub env: Vec<(String, String)>,

    /// A destination the handler may call, `scheme://host[:port]`: the host a name, an
    /// address, `*.domain` or `*`; the port a number (the scheme's own when left out) or
    /// `*`. Repeatable (or comma-separated). None: the handler may call nothing.
    #[arg(long = "outbound-allow", env = "WASMLESS_OUTBOUND_ALLOW", value_delimiter = ',')]
    pub outbound_allow: Vec<String>,

    /// Time one outbound call may take, to the end of its response body; the request's own
    /// `--timeout` bounds it too.
    #[arg(long, env = "WASMLESS_OUTBOUND_TIMEOUT", default_value = "5s", value_parser = parse_nonzero_duration)]
    pub outbound_timeout: Duration,

    /// Largest response body an outbound call may receive (e.g. `10Mi`).
    #[arg(long, env = "WASMLESS_OUTBOUND_MAX_RESPONSE_BODY", default_value = "10Mi", value_parser = parse_bytes)]
    pub outbound_max_response_body: u64,

    /// Outbound calls in flight at once, across all requests (a call holds its slot until
    /// its response body is read or closed); more wait for a slot, and fail with the limit
    /// named only when their deadline passes first.
    #[arg(long, env = "WASMLESS_OUTBOUND_MAX_CONCURRENCY", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub outbound_max_concurrency: u32,

    /// A header the runtime adds to calls to one destination, which the handler never
    /// sees: `"<url> <Header-Name> <ENV_VAR>"`, the value read from the runtime's
    /// environment variable ENV_VAR (the operator fills it from a Secret). Repeatable.
    #[arg(long = "outbound-header")]
    pub outbound_header: Vec<String>,

    /// A file of PEM certificates: certificate authorities outbound HTTPS calls trust
    /// besides Mozilla's roots (a cluster's internal CA). Read at start: a file that is not
    /// PEM certificates stops the runtime.
    #[arg(long, env = "WASMLESS_OUTBOUND_CA")]
    pub outbound_ca: Option<PathBuf>,

    /// This pod's address (the downward API's status.podIP): outbound calls to it on the
    /// admin port are refused, as on loopback.
    #[arg(long, env = "WASMLESS_POD_IP")]
    pub pod_ip: Option<std::net::IpAddr>,

    /// Directory for compiled code, so a restarted pod compiles nothing.
    #[arg(long, env = "WASMLESS_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,

    /// The node's store of verified compiled code: the socket of its agent
    /// (`wasmless-node-agent`). The builder's code is asked of it by its pinned digest
    /// before it is read, and mapped from the agent's file on a hit; code read the slow way
    /// is put there for the next process on the node. Without it, or when it fails, code
    /// is read and verified here as before.
    #[arg(long, env = "WASMLESS_CODE_STORE")]
    pub code_store: Option<PathBuf>,

    /// How often a module file is checked for replacement (0 turns watching off).
    #[arg(long, env = "WASMLESS_WATCH_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub watch_interval: Duration,

    /// Time in-flight requests get to finish once the runtime stops accepting (after
    /// SIGTERM and the drain delay).
    #[arg(long, env = "WASMLESS_SHUTDOWN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    /// After SIGTERM, how long to keep accepting and serving (with readiness false and
    /// `Connection: close` on every response) before closing the listener: the time load
    /// balancers need to stop routing here. The operator sets 5s.
    #[arg(long, env = "WASMLESS_DRAIN_DELAY", default_value = "0s", value_parser = parse_duration)]
    pub drain_delay: Duration,

    /// Time a client has to send a request's headers, from its first byte (or from
    /// connecting); then the connection is closed.
    #[arg(long, env = "WASMLESS_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_nonzero_duration)]
    pub header_read_timeout: Duration,

    /// Time a client has to send a request's whole body; then it gets a 408.
    #[arg(long, env = "WASMLESS_BODY_READ_TIMEOUT", default_value = "30s", value_parser = parse_nonzero_duration)]
    pub body_read_timeout: Duration,

    /// Time a keep-alive connection may sit idle between requests before it is closed.
    #[arg(long, env = "WASMLESS_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_nonzero_duration)]
    pub idle_timeout: Duration,

    /// Largest request line and header block; larger gets a 431 (e.g. `64Ki`).
    #[arg(long, env = "WASMLESS_MAX_HEADER_SIZE", default_value = "64Ki", value_parser = parse_header_size)]
    pub max_header_size: u64,

    /// Connections open at once on the function's port; more are answered 503 and closed.
    #[arg(long, env = "WASMLESS_MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,

    /// Request body bytes being received at once, across all requests (each request
    /// reserves its Content-Length, or `--max-request-body` when it has none); a body
    /// that does not fit gets a 503. The concurrency permit is taken only once the body
    /// is in, so slow uploads cannot hold it.
    #[arg(long, env = "WASMLESS_UPLOAD_BUDGET", default_value = "64Mi", value_parser = parse_bytes)]
    pub upload_budget: u64,

    /// Serve many Functions instead of one: a directory of `<name>.json` files, each
    /// `{"port": N, "args": ["--function", "hello", "--module", ...]}` — the Function's
    /// own runtime arguments, served on its own port. Files added, changed and removed
    /// are picked up every `--watch-interval`. Or `api:<label selector>`: the ConfigMaps
    /// of the pool's namespace (`WASMLESS_NAMESPACE`, else the service account's) that the
    /// selector picks, watched through the Kubernetes API, each holding that JSON under
    /// `entry.json`; their Functions may then read their chunks with
    /// `--module configmaps:<function>/<source digest>/<count>`. A Function is loaded on its first request
    /// (digests checked as in a dedicated runtime) and unloaded, least recently used
    /// first, when the loaded ones' code passes `--pool-memory-budget`. `--memory-limit`
    /// and `--max-concurrency` are then the largest any one Function may have and the
    /// pool's total.
    #[arg(long, env = "WASMLESS_POOL", value_parser = crate::pool::source::TableSource::parse)]
    pub pool: Option<crate::pool::source::TableSource>,

    /// Send traces over OTLP/HTTP (protobuf) to this collector, e.g.
    /// `http://otel-collector:4318` (`/v1/traces` is appended). Off when neither this nor
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set; the other
    /// standard `OTEL_*` variables (service name, resource attributes, sampler, headers)
    /// apply. Spans the collector does not take are dropped and counted, never waited for.
    #[arg(long, env = "WASMLESS_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// Bytes of the pool's own memory the loaded Functions' code may hold (code copied
    /// into memory, and what wasmtime builds from any code) before the least recently used
    /// Function is unloaded (e.g. `1Gi`). Code mapped from files counts against
    /// `--pool-mapped-code-budget` instead.
    #[arg(long, env = "WASMLESS_POOL_MEMORY_BUDGET", default_value = "1Gi", value_parser = parse_bytes)]
    pub pool_memory_budget: u64,

    /// Bytes of code files the pool maps (with `--cache-dir`, the builder's code is written
    /// there and mapped, not copied: page cache, shared and paged in where touched) before
    /// the least recently used Function is unloaded; the files Functions ship beside their
    /// handlers, written there for their guests, count too. The files are on the cache
    /// directory's disk, so its volume needs this much room.
    #[arg(long, env = "WASMLESS_POOL_MAPPED_CODE_BUDGET", default_value = "4Gi", value_parser = parse_bytes)]
    pub pool_mapped_code_budget: u64,

    /// Load Functions new to the pool's table before their first request, while the loaded
    /// code is under three quarters of `--pool-memory-budget` (false: on the first request).
    #[arg(long, env = "WASMLESS_POOL_LOAD_AHEAD", default_value_t = true, action = clap::ArgAction::Set)]
    pub pool_load_ahead: bool,

    /// How long a loaded Function goes without a request before the pages of its code
    /// mapped from a file (the node's store's copy, or one under `--cache-dir`) leave the
    /// pool process's page tables: they stay in the node's page cache, and its next request
    /// maps back what it touches. A Go Function's text is ~5 MiB of the process's RSS once
    /// a request ran it. `0s`: never.
    #[arg(long, env = "WASMLESS_POOL_RELEASE_CODE_AFTER", default_value = "10s", value_parser = parse_duration)]
    pub pool_release_code_after: Duration,

    /// Linear memory the pool's requests in flight may hold together: every byte an
    /// instance grows to is taken from it, and given back when the request ends. Growth
    /// that does not fit fails that request with a 503 and `Retry-After` (counted as
    /// `reason="pool_memory"`), instead of the pool going over its container's limit. The
    /// container needs this, `--pool-memory-budget` and room for the process beside.
    #[arg(long, env = "WASMLESS_POOL_REQUEST_MEMORY", default_value = "768Mi", value_parser = parse_bytes)]
    pub pool_request_memory: u64,

    /// The most one Function may hold of the pool's request memory, of its request slots
    /// (`--max-concurrency`) and of its connections (`--max-connections`), in percent: a
    /// Function at its share gets 503s while the others are served.
    #[arg(long, env = "WASMLESS_POOL_SHARE", default_value_t = 50, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub pool_share: u8,

    /// Not a flag: the variables read instead of the process's environment, for the
    /// handler's `WASMLESS_HANDLER_ENV_*` and the `--outbound-header` values (`wasmless
    /// dev`, which serves in its own process the values a pod's kubelet would have set).
    #[arg(skip)]
    pub environment: Option<Vec<(String, String)>>,

    /// The longest `--timeout` a pooled Function may have: an entry asking for more is not
    /// served (the operator gives such a Function pods of its own).
    #[arg(long, env = "WASMLESS_POOL_MAX_TIMEOUT", default_value = "60s", value_parser = parse_nonzero_duration)]
    pub pool_max_timeout: Duration,

    /// The largest `--max-request-body` a pooled Function may have: an entry asking for
    /// more is not served (the operator gives such a Function pods of its own).
    #[arg(long, env = "WASMLESS_POOL_MAX_REQUEST_BODY", default_value = "16Mi", value_parser = parse_bytes)]
    pub pool_max_request_body: u64,
}

pub use wasmless_artifact::HANDLER_ENV_PREFIX;

impl Config {
    /// `--pool-share` percent of `total`, rounded down: one Function's most of it.
    pub fn pool_share_of(&self, total: usize) -> usize {
        (total as u128 * u128::from(self.pool_share.min(100)) / 100) as usize
    }

    /// The limits of a request, from the flags.
    pub fn request_limits(&self) -> wasmless_host::limits::RequestLimits {
        wasmless_host::limits::RequestLimits {
            memory_bytes: usize::try_from(self.memory_limit).unwrap_or(usize::MAX),
            timeout: self.timeout,
            max_request_body: usize::try_from(self.max_request_body).unwrap_or(usize::MAX),
            max_concurrency: self.max_concurrency,
            isolation: self.isolation,
            requests_per_instance: self.requests_per_instance,
            shared_memory: None,
        }
    }

    /// The limits of the function port's edge.
    pub fn edge_limits(&self) -> wasmless_edge::EdgeLimits {
        wasmless_edge::EdgeLimits {
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            max_header_size: usize::try_from(self.max_header_size).unwrap_or(usize::MAX),
            max_connections: self.max_connections as usize,
            max_connections_per_listener: match self.pool {
                Some(_) => self.pool_share_of(self.max_connections as usize).max(1),
                None => self.max_connections as usize,
            },
        }
    }

    /// The variables a dedicated runtime reads its handler's variables and outbound header
    /// values from: [`Config::environment`], or else the process's own.
    pub fn process_env(&self) -> Vec<(String, String)> {
        match &self.environment {
            Some(environment) => environment.clone(),
            None => std::env::vars().collect(),
        }
    }

    /// The handler's environment: `--env` pairs, then `WASMLESS_HANDLER_ENV_*` from
    /// `process_env` with the prefix taken off (a name set both ways gets the latter).
    pub fn handler_env(&self, process_env: impl Iterator<Item = (String, String)>) -> Vec<(String, String)> {
        let mut env = self.env.clone();
        for (name, value) in process_env {
            if let Some(name) = name.strip_prefix(HANDLER_ENV_PREFIX).filter(|name| !name.is_empty()) {
                env.retain(|(existing, _)| existing != name);
                env.push((name.to_string(), value));
            }
        }
        env
    }

    /// The outbound policy and client settings, the injected headers' values read with
    /// `variable` (a dedicated runtime's [`Config::process_env`], or a pooled Function's
    /// own variables, which are not the pool's environment).
    pub fn outbound_with(
        &self,
        variable: impl Fn(&str) -> Option<String>,
    ) -> Result<wasmless_outbound::OutboundConfig, wasmless_outbound::OutboundConfigError> {
        let headers = self
            .outbound_header
            .iter()
            .map(|text| wasmless_outbound::parse_injected_header(text, &variable))
            .collect::<Result<_, _>>()?;
        Ok(wasmless_outbound::OutboundConfig {
            allow: self.outbound_allow.clone(),
            timeout: self.outbound_timeout,
            max_response_body: self.outbound_max_response_body,
            max_concurrency: self.outbound_max_concurrency,
            headers,
            admin_port: self.admin_port,
            pod_ip: self.pod_ip,
            extra_roots: match &self.outbound_ca {
                Some(path) => wasmless_outbound::read_ca_file(path)?,
                None => Vec::new(),
            },
        })
    }

    /// A pooled Function's configuration from its own runtime arguments. The pool's
    /// environment is not read: what the pool was started with is not the Function's.
    pub fn for_pooled_function(args: &[String]) -> Result<Self, clap::Error> {
        use clap::{CommandFactory, FromArgMatches};
        let command = Self::command().mut_args(|arg| arg.env(None::<&str>));
        let matches =
            command.try_get_matches_from(std::iter::once("wasmless-runtime").chain(args.iter().map(String::as_str)))?;
        Self::from_arg_matches(&matches)
    }

    pub fn listen_addr(&self) -> SocketAddr {
        SocketAddr::new(self.bind, self.port)
    }

    pub fn admin_addr(&self) -> SocketAddr {
        SocketAddr::new(self.bind, self.admin_port)
    }
}

fn parse_nonzero_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        Duration::ZERO => Err(format!("{text:?} must be more than zero")),
        duration => Ok(duration),
    }
}

/// hyper cannot parse a request line in less, and a header block over 16 MiB is no
/// header block.
fn parse_header_size(text: &str) -> Result<u64, String> {
    match parse_bytes(text)? {
        size @ 1024..=0x100_0000 => Ok(size),
        _ => Err(format!("{text:?} is out of range: between 1Ki and 16Mi")),
    }
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
    fn flags_reference() {
        use clap::CommandFactory;
        let page = wasmless_testkit::flags_reference::page(
            Config::command(),
            "The runtime's flags, each also an environment variable: what the operator gives a Function's pods and its namespace's pool (`docs/architecture.md`), and what `wasmless dev` gives the runtime it starts.",
        );
        let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
        wasmless_testkit::flags_reference::check(root, "docs/reference/wasmless-runtime.md", &page);
    }

    #[test]
    fn edge_limits_refuse_nonsense() {
        assert!(parse_nonzero_duration("0s").is_err());
        assert_eq!(parse_nonzero_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_header_size("64Ki"), Ok(64 << 10));
        assert!(parse_header_size("100").is_err());
        assert!(parse_header_size("1Gi").is_err());
    }

    #[test]
    fn limits_have_defaults_and_env_twins() {
        let config = Config::parse_from(["wasmless-runtime", "--module", "m.wasm"]);
        assert_eq!(config.header_read_timeout, Duration::from_secs(10));
        assert_eq!(config.body_read_timeout, Duration::from_secs(30));
        assert_eq!(config.idle_timeout, Duration::from_secs(60));
        assert_eq!(config.max_header_size, 64 << 10);
        assert_eq!(config.max_connections, 1024);
        assert_eq!(config.upload_budget, 64 << 20);
        assert_eq!(config.drain_delay, Duration::ZERO);
        assert_eq!(config.isolation, Isolation::Request);
        assert_eq!(config.requests_per_instance, 10_000);
        let command = <Config as clap::CommandFactory>::command();
        for flag in [
            "header_read_timeout",
            "body_read_timeout",
            "idle_timeout",
            "max_header_size",
            "max_connections",
            "upload_budget",
            "drain_delay",
            "isolation",
            "requests_per_instance",
        ] {
            let arg = command.get_arguments().find(|a| a.get_id() == flag).unwrap();
            assert_eq!(
                arg.get_env().and_then(|e| e.to_str()),
                Some(format!("WASMLESS_{}", flag.to_uppercase()).as_str())
            );
        }
    }

    #[test]
    fn isolation_takes_request_or_shared() {
        let parse =
            |args: &[&str]| Config::try_parse_from([&["wasmless-runtime", "--module", "m.wasm"], args].concat());
        assert_eq!(parse(&["--isolation", "shared"]).unwrap().isolation, Isolation::Shared);
        let error = parse(&["--isolation", "process"]).unwrap_err().to_string();
        assert!(error.contains("request") && error.contains("shared"), "{error}");
        assert!(parse(&["--requests-per-instance", "0"]).is_err());
    }

    #[test]
    fn handler_env_takes_prefixed_variables_last() {
        let config = Config::parse_from(["wasmless-runtime", "--module", "m.wasm", "--env", "A=1", "--env", "B=2"]);
        let process = [
            ("WASMLESS_HANDLER_ENV_B", "secret"),
            ("WASMLESS_HANDLER_ENV_", "no name"),
            ("WASMLESS_PORT", "1"),
            ("PATH", "/bin"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        assert_eq!(
            config.handler_env(process.into_iter()),
            [("A".into(), "1".into()), ("B".into(), "secret".into())]
        );
    }

    #[test]
    fn env_pairs_need_a_key() {
        assert_eq!(parse_env_pair("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert!(parse_env_pair("=x").is_err());
        assert!(parse_env_pair("novalue").is_err());
    }
}
