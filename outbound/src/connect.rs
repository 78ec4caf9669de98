//! Opening a connection for the pooled client: the name resolved here, in the host, and
//! every address it resolved to checked against the policy before a socket is opened,
//! on every new connection (a name that resolves somewhere else next time — DNS
//! rebinding — is checked again).

use super::policy::{Destination, Policy};
use http::Uri;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::net::TcpStream;

/// Why no connection was opened; found again in the client's error chain to tell the
/// guest which kind of failure it was.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(
        "{authority} resolves to no address it may be called on ({addresses}): link-local, loopback and metadata addresses are refused unless an entry of spec.outbound.allow names the address literally, and this runtime's admin port always"
    )]
    Prohibited { authority: String, addresses: String },
    #[error(
        "{authority} is this runtime's own admin port ({address}), which handlers may not call whatever spec.outbound.allow says: call another service"
    )]
    OwnAdmin { authority: String, address: SocketAddr },
    #[error("{0} is not allowed by spec.outbound.allow")]
    NotAllowed(String),
    #[error("cannot resolve {host}: {source}")]
    Dns {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot connect to {authority}: {source}")]
    Connect {
        authority: String,
        #[source]
        source: std::io::Error,
    },
}

/// A `tower::Service<Uri>` for hyper-util's client: TCP to a checked address.
#[derive(Clone)]
pub struct GuardedConnector {
    policy: Arc<Policy>,
}

impl GuardedConnector {
    pub fn new(policy: Arc<Policy>) -> Self {
        Self { policy }
    }
}

impl tower::Service<Uri> for GuardedConnector {
    type Response = TokioIo<TcpStream>;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let policy = self.policy.clone();
        Box::pin(async move { connect(&policy, &uri).await.map(TokioIo::new) })
    }
}

async fn connect(policy: &Policy, uri: &Uri) -> Result<TcpStream, ConnectError> {
    let destination = Destination::of(uri).ok_or_else(|| ConnectError::NotAllowed(uri.to_string()))?;
    if policy.allows(&destination).is_none() {
        return Err(ConnectError::NotAllowed(destination.authority()));
    }
    let resolved: Vec<SocketAddr> = tokio::net::lookup_host((destination.host.as_str(), destination.port))
        .await
        .map_err(|source| ConnectError::Dns {
            host: destination.host.clone(),
            source,
        })?
        .collect();
    let permitted: Vec<SocketAddr> = resolved
        .iter()
        .copied()
        .filter(|address| policy.may_connect(&destination, *address))
        .collect();
    if permitted.is_empty() {
        return Err(ConnectError::Prohibited {
            authority: destination.authority(),
            addresses: resolved.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        });
    }
    let mut last_error = None;
    for address in permitted {
        match TcpStream::connect(address).await {
            Ok(stream) if comes_back_to_admin(policy, &stream) => {
                return Err(ConnectError::OwnAdmin {
                    authority: destination.authority(),
                    address,
                });
            }
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(error) => last_error = Some(error),
        }
    }
    Err(ConnectError::Connect {
        authority: destination.authority(),
        source: last_error.unwrap_or_else(|| std::io::Error::other("no address to try")),
    })
}

/// Whether `stream` reached this host's admin port on an address the policy could not
/// know before connecting; a socket whose addresses cannot be read is taken to have. The
/// stream is then dropped unused: the admin server sees a connection close unread.
fn comes_back_to_admin(policy: &Policy, stream: &TcpStream) -> bool {
    match (stream.local_addr(), stream.peer_addr()) {
        (Ok(local), Ok(peer)) => policy.reaches_own_admin(local, peer),
        _ => true,
    }
}
