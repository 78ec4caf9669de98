//! Why an outbound call failed, as the guest is told it (an errno and a message that says
//! what to do) and as its metric's `status` label counts it.

use super::connect::ConnectError;

/// Why a call failed. The guest is told the kind ([`OutboundError::errno`]) and the text.
#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    #[error(
        "wasmless: the call to {0} was denied: it is not in this Function's spec.outbound.allow (runtime flag --outbound-allow); add its scheme://host:port there"
    )]
    Denied(String),
    #[error("wasmless: the call to {authority} was refused: {why}")]
    Prohibited { authority: String, why: String },
    #[error("wasmless: the call to {0} timed out (spec.outbound.timeout, or the request's own timeout)")]
    Timeout(String),
    #[error("wasmless: {0}")]
    Dns(String),
    #[error("wasmless: {0}")]
    Connect(String),
    #[error("wasmless: TLS with {authority} failed: {why}")]
    Tls { authority: String, why: String },
    #[error("wasmless: the response from {authority} is over spec.outbound.maxResponseBody ({limit} bytes)")]
    TooLarge { authority: String, limit: u64 },
    #[error(
        "wasmless: the call to {authority} waited {waited_ms} ms for one of the {limit} outbound calls this Function may make at once (spec.outbound.maxConcurrency, runtime flag --outbound-max-concurrency) and timed out; close response bodies when done, or raise the limit"
    )]
    Limit {
        authority: String,
        limit: u32,
        waited_ms: u128,
    },
    #[error("wasmless: the outbound request is malformed: {0}")]
    BadRequest(String),
    #[error("wasmless: the call to {authority} failed: {why}")]
    Failed { authority: String, why: String },
    /// The request's own deadline passed while the call waited: the request ends (504).
    #[error("the request's timeout passed during an outbound call")]
    RequestTimeout,
    /// In a pool: the request's share of the pool's memory has no room for the next piece
    /// of the call's body.
    #[error(
        "wasmless: the call was abandoned: the pool has no memory left for its request body now (--pool-request-memory, or this Function's share of it, is held by requests in flight); retry later, or send the body in smaller pieces"
    )]
    PoolMemory,
}

impl OutboundError {
    /// The number the `wasmless` imports return; sdk/go/outbound maps each to a Go error.
    pub fn errno(&self) -> u32 {
        match self {
            Self::Denied(_) | Self::Prohibited { .. } => 1,
            Self::Timeout(_) | Self::RequestTimeout => 2,
            Self::Dns(_) => 3,
            Self::Connect(_) => 4,
            Self::Tls { .. } => 5,
            Self::TooLarge { .. } => 6,
            Self::Limit { .. } => 7,
            Self::BadRequest(_) => 9,
            Self::Failed { .. } => 10,
            Self::PoolMemory => 13,
        }
    }

    /// The `status` label: `denied` for what the policy refused, `error` for the rest.
    pub(super) fn status_label(&self) -> &'static str {
        match self {
            Self::Denied(_) | Self::Prohibited { .. } => "denied",
            _ => "error",
        }
    }
}

/// Which kind of failure a client error is, by what it was caused by.
pub(super) fn classify(authority: &str, error: &hyper_util::client::legacy::Error) -> OutboundError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if let Some(connect) = current.downcast_ref::<ConnectError>() {
            return match connect {
                ConnectError::Prohibited { .. } | ConnectError::OwnAdmin { .. } | ConnectError::NotAllowed(_) => {
                    OutboundError::Prohibited {
                        authority: authority.to_string(),
                        why: connect.to_string(),
                    }
                }
                ConnectError::Dns { .. } => OutboundError::Dns(connect.to_string()),
                ConnectError::Connect { .. } => OutboundError::Connect(connect.to_string()),
            };
        }
        if let Some(tls) = rustls_error(current) {
            return OutboundError::Tls {
                authority: authority.to_string(),
                why: tls_reason(authority, tls),
            };
        }
        source = current.source();
    }
    let why = error_chain(error);
    if why.contains("certificate") || why.contains("tls") || why.contains("TLS") {
        return OutboundError::Tls {
            authority: authority.to_string(),
            why,
        };
    }
    OutboundError::Failed {
        authority: authority.to_string(),
        why,
    }
}

/// rustls' error, where `error` is one or holds one inside io::Errors (the TLS stream
/// wraps it in one, and hyper-rustls that in another; io::Error's source() skips both).
fn rustls_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut current = error;
    loop {
        if let Some(tls) = current.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        current = current.downcast_ref::<std::io::Error>()?.get_ref()?;
    }
}

/// What a TLS failure means for the one who can fix it.
fn tls_reason(authority: &str, error: &rustls::Error) -> String {
    use rustls::CertificateError;
    match error {
        rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer
            | CertificateError::BadSignature
            | CertificateError::UnhandledCriticalExtension,
        ) => format!(
            "the certificate of {authority} is not trusted: no certificate authority this runtime trusts signed it (Mozilla's roots, and those of spec.outbound.caBundle, runtime flag --outbound-ca); for a cluster's internal CA, add its certificate there ({error})"
        ),
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => {
            format!("the certificate of {authority} is not valid for that name ({error})")
        }
        rustls::Error::InvalidCertificate(CertificateError::Expired | CertificateError::ExpiredContext { .. }) => {
            format!("the certificate of {authority} has expired ({error})")
        }
        other => other.to_string(),
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(current) = source {
        text.push_str(": ");
        text.push_str(&current.to_string());
        source = current.source();
    }
    text
}
