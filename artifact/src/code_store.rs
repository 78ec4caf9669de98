//! How a runtime talks to its node's store of verified compiled code
//! (`wasmless-node-agent`, docs/plans/node-code-store.md).
//!
//! One request and one reply per connection, each a single message on a Unix
//! `SOCK_SEQPACKET` socket (the kernel keeps message boundaries, so nothing frames them),
//! in text; a file travels beside a message as a descriptor (`SCM_RIGHTS`):
//!
//! ```text
//! get sha256:<hex>              -> found\n<the code's header lines>   + the code's file, read-only
//!                               -> absent | corrupt
//! put sha256:<hex>  + a file    -> stored | refused <why>
//! ```
//!
//! The digest is the pinned `codeDigest`, of the code as stored (compressed). A `put`'s
//! file holds those stored bytes: the store checks them against the digest itself, so a
//! caller can only place under a digest the bytes that hash to it. A `get`'s file is the
//! decompressed `.cwasm`, which wasmtime maps as it lies. Which namespace asks is not in
//! the message: each namespace has a socket of its own.

use crate::{CodeError, CodeHeader, Digest};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

/// Longest message either side sends: a verb, a digest, a header of a few lines, or a
/// refusal's reason.
pub const MAX_MESSAGE_BYTES: usize = 4 << 10;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// The code stored under this digest, if this namespace has put it.
    Get(Digest),
    /// Store the bytes in the file sent beside, which must hash to this digest.
    Put(Digest),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The code is stored: its header, and its file beside.
    Found(CodeHeader),
    /// Not stored for this namespace.
    Absent,
    /// Stored, but its file no longer holds what was verified: removed.
    Corrupt,
    Stored,
    /// A put that came while the node's store checked another (it checks one at a time):
    /// the same put may be made again shortly. On the wire a refusal whose reason starts
    /// with `busy:`, as agents before this variant sent it.
    Busy,
    Refused(String),
}

const BUSY: &str = "busy: another put is being checked; try again later";

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("the code store's socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("the code store sent a message that is not its protocol: {0}")]
    Malformed(String),
    #[error("a message over {MAX_MESSAGE_BYTES} bytes, or with more than one file")]
    TooLarge,
    #[error("the code store's header does not parse: {0}")]
    Header(#[from] CodeError),
}

impl From<rustix::io::Errno> for ProtocolError {
    fn from(errno: rustix::io::Errno) -> Self {
        Self::Io(errno.into())
    }
}

impl Request {
    pub fn encode(&self) -> String {
        match self {
            Self::Get(digest) => format!("get {digest}"),
            Self::Put(digest) => format!("put {digest}"),
        }
    }

    pub fn parse(text: &str) -> Result<Self, ProtocolError> {
        let (verb, digest) = text
            .split_once(' ')
            .ok_or_else(|| ProtocolError::Malformed(format!("{:.64?}", text)))?;
        let digest = digest
            .parse::<Digest>()
            .map_err(|e| ProtocolError::Malformed(format!("{verb}: {e}")))?;
        match verb {
            "get" => Ok(Self::Get(digest)),
            "put" => Ok(Self::Put(digest)),
            other => Err(ProtocolError::Malformed(format!("no request {other:.16?}"))),
        }
    }
}

impl Reply {
    pub fn encode(&self) -> String {
        match self {
            Self::Found(header) => format!("found\n{}", header.to_lines()),
            Self::Absent => "absent".into(),
            Self::Corrupt => "corrupt".into(),
            Self::Stored => "stored".into(),
            Self::Busy => format!("refused {BUSY}"),
            // One line of printable text, whatever the reason held.
            Self::Refused(why) => {
                let why: String = why.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
                let mut reply = format!("refused {why}");
                if reply.len() > MAX_MESSAGE_BYTES {
                    let mut end = MAX_MESSAGE_BYTES;
                    while !reply.is_char_boundary(end) {
                        end -= 1;
                    }
                    reply.truncate(end);
                }
                reply
            }
        }
    }

    pub fn parse(text: &str) -> Result<Self, ProtocolError> {
        if let Some(lines) = text.strip_prefix("found\n") {
            return Ok(Self::Found(CodeHeader::parse(lines)?));
        }
        if let Some(why) = text.strip_prefix("refused ") {
            if why.starts_with("busy:") {
                return Ok(Self::Busy);
            }
            return Ok(Self::Refused(why.to_string()));
        }
        match text {
            "absent" => Ok(Self::Absent),
            "corrupt" => Ok(Self::Corrupt),
            "stored" => Ok(Self::Stored),
            other => Err(ProtocolError::Malformed(format!("{other:.64?}"))),
        }
    }
}

/// A connection to the store's socket at `path`; each send and receive on it gives up
/// after `timeout`.
pub fn connect(path: &Path, timeout: Duration) -> Result<OwnedFd, ProtocolError> {
    let socket = rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
    set_timeouts(&socket, timeout)?;
    rustix::net::connect(&socket, &SocketAddrUnix::new(path)?)?;
    Ok(socket)
}

/// A socket listening at `path` (which must not exist), for [`accept`].
pub fn listen(path: &Path) -> Result<OwnedFd, ProtocolError> {
    let socket = rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
    rustix::net::bind(&socket, &SocketAddrUnix::new(path)?)?;
    rustix::net::listen(&socket, 64)?;
    Ok(socket)
}

/// The next connection to `listener`, whose sends and receives give up after `timeout`.
pub fn accept(listener: BorrowedFd, timeout: Duration) -> Result<OwnedFd, ProtocolError> {
    let connection = rustix::net::accept_with(listener, SocketFlags::CLOEXEC)?;
    set_timeouts(&connection, timeout)?;
    Ok(connection)
}

fn set_timeouts(socket: &OwnedFd, timeout: Duration) -> std::io::Result<()> {
    rustix::net::sockopt::set_socket_timeout(socket, rustix::net::sockopt::Timeout::Recv, Some(timeout))?;
    rustix::net::sockopt::set_socket_timeout(socket, rustix::net::sockopt::Timeout::Send, Some(timeout))?;
    Ok(())
}

/// Sends `message` as one message, with `file` beside it.
pub fn send(socket: BorrowedFd, message: &str, file: Option<BorrowedFd>) -> Result<(), ProtocolError> {
    if message.len() > MAX_MESSAGE_BYTES {
        return Err(ProtocolError::TooLarge);
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let files = file.map(|file| [file]);
    if let Some(files) = &files {
        control.push(SendAncillaryMessage::ScmRights(files));
    }
    rustix::net::sendmsg(
        socket,
        &[IoSlice::new(message.as_bytes())],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// The next message and the file beside it, if one came. A message cut short (longer than
/// [`MAX_MESSAGE_BYTES`], or with more files than one) is refused, and every file that
/// came with it closed. An empty message is the peer gone.
pub fn receive(socket: BorrowedFd) -> Result<(String, Option<OwnedFd>), ProtocolError> {
    let mut buffer = vec![0; MAX_MESSAGE_BYTES + 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = rustix::net::recvmsg(
        socket,
        &mut [IoSliceMut::new(&mut buffer)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut files = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            files.extend(received);
        }
    }
    if received.bytes > MAX_MESSAGE_BYTES
        || received.flags.intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC)
        || files.len() > 1
    {
        return Err(ProtocolError::TooLarge);
    }
    buffer.truncate(received.bytes);
    let text = String::from_utf8(buffer).map_err(|_| ProtocolError::Malformed("not UTF-8".into()))?;
    Ok((text, files.pop()))
}

/// One request and its reply on a new connection to `path`.
pub fn call(
    path: &Path,
    request: &Request,
    file: Option<BorrowedFd>,
    timeout: Duration,
) -> Result<(Reply, Option<OwnedFd>), ProtocolError> {
    let socket = connect(path, timeout)?;
    send(socket.as_fd(), &request.encode(), file)?;
    let (text, file) = receive(socket.as_fd())?;
    Ok((Reply::parse(&text)?, file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CodeKind;

    fn header() -> CodeHeader {
        CodeHeader {
            module_digest: Digest::of(b"module"),
            engine: "ab".repeat(32),
            kind: CodeKind::Module,
            target: "x86-64-v3".into(),
            module_files: true,
        }
    }

    #[test]
    fn requests_and_replies_read_back_as_written() {
        let digest = Digest::of(b"code");
        for request in [Request::Get(digest), Request::Put(digest)] {
            assert_eq!(Request::parse(&request.encode()).unwrap(), request);
        }
        for reply in [
            Reply::Found(header()),
            Reply::Absent,
            Reply::Corrupt,
            Reply::Stored,
            Reply::Busy,
            Reply::Refused("the bytes are not what the digest pins".into()),
        ] {
            assert_eq!(Reply::parse(&reply.encode()).unwrap(), reply);
        }
        // As an agent that knew no `Busy` refused a put that came meanwhile.
        assert_eq!(
            Reply::parse("refused busy: another put is being checked; try again later").unwrap(),
            Reply::Busy
        );
        assert!(Request::parse("get sha256:12").is_err());
        assert!(Request::parse("delete sha256:".to_string().as_str()).is_err());
        assert!(Reply::parse("found\nnot a header\n").is_err());
    }

    #[test]
    fn a_refusal_is_one_bounded_line_whatever_its_reason() {
        let reply = Reply::Refused(format!("a\nb{}", "é".repeat(MAX_MESSAGE_BYTES))).encode();
        assert!(reply.len() <= MAX_MESSAGE_BYTES);
        assert!(!reply.contains('\n'));
    }

    #[test]
    fn a_message_and_its_file_cross_a_socket_and_an_oversized_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.sock");
        let listener = listen(&path).unwrap();
        let client = connect(&path, Duration::from_secs(5)).unwrap();
        let server = accept(listener.as_fd(), Duration::from_secs(5)).unwrap();
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        send(client.as_fd(), "put sha256:00", Some(file.as_fd())).unwrap();
        let (text, received) = receive(server.as_fd()).unwrap();
        assert_eq!(text, "put sha256:00");
        let received = std::fs::File::from(received.expect("the file came along"));
        assert_eq!(received.metadata().unwrap().len(), file.metadata().unwrap().len());

        let long = "x".repeat(MAX_MESSAGE_BYTES + 1);
        assert!(matches!(
            send(client.as_fd(), &long, None),
            Err(ProtocolError::TooLarge)
        ));
        rustix::net::send(&client, long.as_bytes(), SendFlags::NOSIGNAL).unwrap();
        assert!(matches!(receive(server.as_fd()), Err(ProtocolError::TooLarge)));
    }
}
