//! What an outgoing request's body is: nothing, or the guest's pieces as they come, one
//! at a time through a channel (backpressure), held to the declared length.

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// What an outgoing request's body is: the guest's pieces as they come.
pub type ClientBody = UnsyncBoxBody<Bytes, BoxError>;
pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An empty body: a request without one.
pub fn empty_body() -> ClientBody {
    http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A piece of a request body on its way from the guest to the client.
pub enum Piece {
    Data(Bytes),
    /// The guest finished the body.
    End,
}

/// A request body the guest writes piece by piece ([`body_channel`]): the channel holds
/// one piece, so the guest waits while the upstream does not read (backpressure), and
/// guest and host hold a piece at a time, whatever the body's size. A declared
/// Content-Length is held to; a body the guest abandons without finishing it fails the
/// request rather than end it short.
pub struct ChannelBody {
    pieces: mpsc::Receiver<Piece>,
    remaining: Option<u64>,
    done: bool,
}

/// The guest's end of a [`ChannelBody`] and the body; `length` is the declared one.
pub fn body_channel(length: Option<u64>) -> (mpsc::Sender<Piece>, ClientBody) {
    let (sender, pieces) = mpsc::channel(1);
    let body = ChannelBody {
        pieces,
        remaining: length,
        done: false,
    };
    (sender, body.boxed_unsync())
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let piece = std::task::ready!(self.pieces.poll_recv(cx));
        let outcome = match piece {
            Some(Piece::Data(bytes)) => match self.remaining.map(|left| left.checked_sub(bytes.len() as u64)) {
                Some(None) => Err("the request body is longer than its Content-Length"),
                Some(Some(left)) => {
                    self.remaining = Some(left);
                    return Poll::Ready(Some(Ok(Frame::data(bytes))));
                }
                None => return Poll::Ready(Some(Ok(Frame::data(bytes)))),
            },
            Some(Piece::End) if self.remaining.unwrap_or(0) > 0 => {
                Err("the request body is shorter than its Content-Length")
            }
            Some(Piece::End) => Ok(()),
            None => Err("the handler stopped sending the request body before its end"),
        };
        self.done = true;
        match outcome {
            Ok(()) => Poll::Ready(None),
            Err(why) => Poll::Ready(Some(Err(why.into()))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        self.remaining.map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}
