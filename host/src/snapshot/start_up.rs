//! What a handler's start-up (`_initialize`, at build time) sees of a machine, and what a
//! user reads when it fails: the end of what it wrote (Go prints a panic's message and stack
//! to stderr, then traps), and how it ended.
//!
//! The working directory is a read-only `/` (`crate::guest_root`), empty unless the Function
//! ships files: a file read in a package initialiser
//! fails as on a machine without it (`open countries.csv: no such file or directory`), not
//! with `Bad file number` for a directory that is not there. Go records the preopened
//! directories when it starts, so the snapshot keeps them: a request finds `/` at the same
//! descriptor, or the same `Bad file number` as before when a runtime preopens nothing.

use bytes::Bytes;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// The end of the output kept: more than any panic's message and stack a user reads, and
/// bounded however much an initialiser logs first.
const KEPT_OUTPUT: usize = 64 * 1024;
/// What a failure's message quotes of it, within the 4 KiB a build's status message keeps.
const QUOTED_OUTPUT: usize = 3 * 1024;
/// Where Go's own account of a failure starts: a panic, or a fatal error of its runtime.
const FAILURE_STARTS: [&str; 2] = ["panic: ", "fatal error: "];

/// The last [`KEPT_OUTPUT`] bytes written, stdout and stderr together.
#[derive(Clone, Default)]
pub(super) struct KeptOutput(Arc<Mutex<VecDeque<u8>>>);

impl KeptOutput {
    pub(super) fn contents(&self) -> Vec<u8> {
        self.0.lock().unwrap().iter().copied().collect()
    }

    fn keep(&self, bytes: &[u8]) {
        let mut kept = self.0.lock().unwrap();
        let tail = &bytes[bytes.len().saturating_sub(KEPT_OUTPUT)..];
        let over = (kept.len() + tail.len()).saturating_sub(KEPT_OUTPUT);
        kept.drain(..over);
        kept.extend(tail);
    }
}

impl IsTerminal for KeptOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for KeptOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl Pollable for KeptOutput {
    async fn ready(&mut self) {}
}

impl OutputStream for KeptOutput {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.keep(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(KEPT_OUTPUT)
    }
}

impl tokio::io::AsyncWrite for KeptOutput {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.keep(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Why `_initialize` failed, as a user reads it: Go's own account (from its last `panic:` or
/// `fatal error:` line, else the end of the output), then how it ended.
pub(super) fn failure(error: &wasmtime::Error, output: &[u8], timeout: Duration) -> String {
    let output = printable(&String::from_utf8_lossy(output));
    let output = output.trim();
    let ended = match (
        error.downcast_ref::<wasmtime_wasi::I32Exit>(),
        error.downcast_ref::<wasmtime::Trap>(),
    ) {
        (Some(exit), _) => format!("it exited with status {}", exit.0),
        (_, Some(wasmtime::Trap::Interrupt)) => format!("it did not finish within {timeout:?}"),
        // Go ends a panic with a trap: its own account says where, the wasm backtrace of
        // numbered functions would not.
        (_, Some(trap)) if !output.is_empty() => format!("it stopped: {trap}"),
        _ => format!("{error:#}"),
    };
    if output.is_empty() {
        return ended;
    }
    let account = FAILURE_STARTS
        .iter()
        .filter_map(|start| line_starting(output, start))
        .max()
        .unwrap_or_else(|| floor_boundary(output, output.len().saturating_sub(QUOTED_OUTPUT)));
    // Go's first line goes on the message's first line: a condition and its Event keep
    // only that one.
    let from_go = FAILURE_STARTS.iter().any(|start| output[account..].starts_with(start));
    let elided = if account > 0 && !from_go { "... " } else { "" };
    let quoted = &output[account..];
    let end = floor_boundary(quoted, quoted.len().min(QUOTED_OUTPUT));
    let cut = if end < quoted.len() { "\n..." } else { "" };
    format!("{elided}{}{cut}\n({ended})", &quoted[..end])
}

/// Where the last line of `text` that starts with `start` begins.
fn line_starting(text: &str, start: &str) -> Option<usize> {
    if let Some(at) = text.rfind(&format!("\n{start}")) {
        return Some(at + 1);
    }
    text.starts_with(start).then_some(0)
}

fn floor_boundary(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// `text` with its control characters but newlines and tabs escaped: it is shown on a
/// terminal (`wasmless deploy`, `kubectl describe`), where the guest's escape sequences
/// must not act.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' | '\t' => c.to_string(),
            c if c.is_control() => c.escape_unicode().to_string(),
            c => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(status: i32) -> wasmtime::Error {
        wasmtime::Error::new(wasmtime_wasi::I32Exit(status))
    }

    #[test]
    fn a_panic_is_quoted_from_its_first_line_however_much_came_before() {
        let logs: String = (0..500).map(|i| format!("loading row {i}\n")).collect();
        let stack: String = (0..200).map(|i| format!("main.f{i}()\n\tx.go:{i} +0x1\n")).collect();
        let output =
            format!("{logs}panic: open countries.csv: no such file or directory\n\ngoroutine 1 [running]:\n{stack}");
        let message = failure(&exited(2), output.as_bytes(), Duration::from_secs(60));
        assert!(
            message.starts_with("panic: open countries.csv: no such file or directory\n"),
            "{message}"
        );
        assert!(message.contains("goroutine 1 [running]:\nmain.f0()"), "{message}");
        assert!(message.ends_with("\n...\n(it exited with status 2)"), "{message}");
        assert!(message.len() < 3 * 1024 + 64, "{}", message.len());
    }

    #[test]
    fn without_a_panic_the_end_of_the_output_is_quoted() {
        let message = failure(
            &exited(1),
            b"fatal.go:10: DATABASE_URL is not set\n",
            Duration::from_secs(60),
        );
        assert_eq!(
            message,
            "fatal.go:10: DATABASE_URL is not set\n(it exited with status 1)"
        );
        assert_eq!(
            failure(&exited(3), b"", Duration::from_secs(60)),
            "it exited with status 3"
        );
    }

    #[test]
    fn a_trap_after_gos_account_is_named_without_its_backtrace() {
        let trap = wasmtime::Error::new(wasmtime::Trap::UnreachableCodeReached)
            .context("wasm backtrace:\n 0: 0x141cf6 - <unknown>!<wasm function 1482>");
        let message = failure(&trap, b"panic: boom\n", Duration::from_secs(60));
        assert!(
            message.ends_with("panic: boom\n(it stopped: wasm trap: wasm `unreachable` instruction executed)"),
            "{message}"
        );
        assert!(!message.contains("wasm function"), "{message}");
        // With nothing written, the backtrace is all there is to go on.
        assert!(failure(&trap, b"", Duration::from_secs(60)).contains("wasm function 1482"));
    }

    #[test]
    fn the_guests_escape_sequences_are_quoted_not_sent_to_a_terminal() {
        let message = failure(&exited(2), b"panic: \x1b]0;owned\x07 boom\n", Duration::from_secs(60));
        assert!(message.contains("panic: \\u{1b}]0;owned\\u{7} boom"), "{message}");
    }

    #[test]
    fn only_the_end_of_a_long_output_is_kept() {
        let output = KeptOutput::default();
        for i in 0..100_000 {
            output.keep(format!("line {i}\n").as_bytes());
        }
        output.keep(b"panic: at last\n");
        let kept = output.contents();
        assert_eq!(kept.len(), KEPT_OUTPUT);
        assert!(kept.ends_with(b"line 99999\npanic: at last\n"));
        output.keep(&vec![b'x'; 3 * KEPT_OUTPUT]);
        assert_eq!(output.contents(), vec![b'x'; KEPT_OUTPUT]);
    }
}
