//! What a guest writes to stdout or stderr during one request, held in memory up to a
//! capacity (writes past it fail). In a pool each byte is also taken from the memory the
//! pool's requests share, as their linear memory is: output is host memory one Function
//! could otherwise pile up beside its neighbours'.

use crate::request_memory::{Refused, RequestShare};
use bytes::Bytes;
use std::pin::Pin;
use std::task::{Context, Poll};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

#[derive(Clone)]
pub struct CapturedOutput {
    pipe: MemoryOutputPipe,
    share: Option<RequestShare>,
}

impl CapturedOutput {
    pub fn new(capacity: usize, share: Option<RequestShare>) -> Self {
        Self {
            pipe: MemoryOutputPipe::new(capacity),
            share,
        }
    }

    pub fn contents(&self) -> Bytes {
        self.pipe.contents()
    }

    /// Takes `bytes` from the shared memory, where there is one.
    fn take(&self, bytes: usize) -> bool {
        self.share.as_ref().is_none_or(|share| share.take(bytes))
    }
}

impl IsTerminal for CapturedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl Pollable for CapturedOutput {
    async fn ready(&mut self) {}
}

impl OutputStream for CapturedOutput {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        // Over the capacity the pipe refuses it: nothing is taken for bytes never held.
        if bytes.len() <= self.pipe.check_write()? && !self.take(bytes.len()) {
            let refused = Refused {
                what: "output",
                bytes: bytes.len(),
            };
            return Err(StreamError::Trap(wasmtime::Error::new(refused)));
        }
        self.pipe.write(bytes)
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        self.pipe.flush()
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        self.pipe.check_write()
    }
}

impl tokio::io::AsyncWrite for CapturedOutput {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let room = self.pipe.check_write().unwrap_or(0);
        let held = buf.len().min(room);
        if !self.take(held) {
            let refused = Refused {
                what: "output",
                bytes: held,
            };
            return Poll::Ready(Err(std::io::Error::other(refused)));
        }
        Pin::new(&mut self.pipe).poll_write(cx, &buf[..held])
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.pipe).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.pipe).poll_shutdown(cx)
    }
}
