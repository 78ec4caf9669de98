//! The store a WASI preview1 guest (a CGI command or a Go reactor) runs a request in: its
//! WASI context, with stdout and stderr captured, the memory limiter, the deadline, and
//! its outbound calls.

use super::output::CapturedOutput;
use super::stream::ResponseSink;
use super::{MAX_HANDLER_OUTPUT, Shared, log_handler_output};
use crate::engine::arm_timeout;
use crate::limits::RequestLimiter;
use crate::outbound_abi::GuestCalls;
use crate::request_memory::RequestShare;
use std::sync::Arc;
use std::time::Instant;
use wasmless_outbound::CallLog;
use wasmtime::{Engine, Linker, Store};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::p1::WasiP1Ctx;

pub struct GuestState {
    pub wasi: WasiP1Ctx,
    pub limiter: RequestLimiter,
    pub calls: GuestCalls,
    /// Where a Go reactor streams its response; a CGI command cannot.
    pub response: ResponseSink,
    /// When the request's timeout stops the guest.
    pub deadline: Instant,
}

/// A linker with WASI preview1 and the `wasmless` imports (outbound calls, a streamed
/// response), nothing else.
pub fn linker(engine: &Engine) -> wasmtime::Result<Linker<GuestState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_async(&mut linker, |state: &mut GuestState| &mut state.wasi)?;
    crate::outbound_abi::add_to_linker(&mut linker, |state: &mut GuestState| &mut state.calls)?;
    super::stream::add_to_linker(&mut linker, |state: &mut GuestState| &mut state.response)?;
    Ok(linker)
}

/// What a guest writes to stdout and stderr during one request, each cut off at
/// [`MAX_HANDLER_OUTPUT`] (writes past it fail), and in a pool taken from the request's
/// `share` of the shared memory.
pub struct Output {
    pub stdout: CapturedOutput,
    pub stderr: CapturedOutput,
}

impl Output {
    pub fn new(share: Option<RequestShare>) -> Self {
        Self {
            stdout: CapturedOutput::new(MAX_HANDLER_OUTPUT, share.clone()),
            stderr: CapturedOutput::new(MAX_HANDLER_OUTPUT, share),
        }
    }

    /// The WASI context every request starts from: the Function's name as `argv[0]`, its
    /// env, its files as `/`, and stdout and stderr going here. The caller adds what its ABI
    /// needs.
    pub fn wasi(&self, shared: &Shared) -> WasiCtxBuilder {
        let mut wasi = WasiCtxBuilder::new();
        wasi.args(&[shared.function.as_str()])
            .envs(&shared.env)
            .stdout(self.stdout.clone())
            .stderr(self.stderr.clone());
        if let Some(files) = &shared.files
            && let Err(error) = files.preopen(&mut wasi)
        {
            tracing::error!(%error, "cannot open the handler's files for this request");
        }
        wasi
    }

    pub fn log_stdout(&self) {
        log_handler_output("stdout", &self.stdout.contents());
    }

    pub fn log_stderr(&self) {
        log_handler_output("stderr", &self.stderr.contents());
    }
}

/// A store for one request, with the memory limit and the timeout armed; its outbound
/// calls are told to `log`, its memory taken from `share` in a pool.
pub fn new_store(
    engine: &Engine,
    shared: &Shared,
    wasi: WasiP1Ctx,
    log: Arc<CallLog>,
    share: Option<RequestShare>,
) -> Store<GuestState> {
    let deadline = Instant::now() + shared.limits.timeout;
    let state = GuestState {
        wasi,
        limiter: RequestLimiter::new(&shared.limits, share.clone()),
        calls: GuestCalls::new(shared.outbound.clone(), log, deadline, share),
        response: ResponseSink::default(),
        deadline,
    };
    let mut store = Store::new(engine, state);
    store.limiter(|state| &mut state.limiter);
    arm_timeout(&mut store, deadline);
    store
}

/// Makes a kept store ready for its next request: a WASI context of its own (fresh
/// output, the env as deployed), the memory flags cleared, a new deadline, and its
/// outbound bodies taken from this request's `share`. The memory limit itself stays: it
/// bounds what the instance holds, across requests.
pub fn renew(
    store: &mut Store<GuestState>,
    shared: &Shared,
    wasi: WasiP1Ctx,
    log: Arc<CallLog>,
    share: Option<RequestShare>,
) {
    let deadline = Instant::now() + shared.limits.timeout;
    let state = store.data_mut();
    state.wasi = wasi;
    state.limiter.clear_refusals();
    state.calls = GuestCalls::new(shared.outbound.clone(), log, deadline, share);
    state.response = ResponseSink::default();
    state.deadline = deadline;
    arm_timeout(store, deadline);
}
