//! The outbound flags as the runtime reads them: the allow-list, the limits, the headers
//! the host adds from Secrets, and the certificate authorities trusted besides Mozilla's.

use super::policy;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

/// What the flags say about outbound calls.
#[derive(Debug, Clone)]
pub struct OutboundConfig {
    pub allow: Vec<String>,
    pub timeout: Duration,
    pub max_response_body: u64,
    pub max_concurrency: u32,
    /// `(url pattern, header name, value)`: the value read from the environment variable
    /// `--outbound-header` named, never from anything a guest can see.
    pub headers: Vec<(String, String, String)>,
    pub admin_port: u16,
    pub pod_ip: Option<IpAddr>,
    /// Certificate authorities trusted besides Mozilla's roots (`--outbound-ca`).
    pub extra_roots: Vec<CertificateDer<'static>>,
}

/// Why the outbound flags cannot be used; the runtime does not start.
#[derive(Debug, thiserror::Error)]
pub enum OutboundConfigError {
    #[error(transparent)]
    Pattern(#[from] policy::BadPattern),
    #[error("--outbound-header for {url}: {name:?} is not a header name")]
    HeaderName { url: String, name: String },
    #[error("--outbound-header for {url}: the value of {name} is not a header value (a line break?)")]
    HeaderValue { url: String, name: String },
    #[error(
        "--outbound-header {0:?}: write \"<url> <Header-Name> <ENV_VAR> [allow-insecure]\", the value in that environment variable"
    )]
    HeaderSyntax(String),
    #[error(
        "--outbound-header for {url}: {name} would travel in clear over plain http; use an https:// URL, or, on a network path you trust, add allow-insecure as a fourth field (spec.outbound.headers[].allowInsecure: true)"
    )]
    HeaderInsecure { url: String, name: String },
    #[error("--outbound-header for {url}: the environment variable {variable} holding the value of {name} is not set")]
    HeaderMissing {
        url: String,
        name: String,
        variable: String,
    },
    #[error(
        "--outbound-ca {path}: {why}; give a file of PEM certificates (-----BEGIN CERTIFICATE-----), the CAs outbound calls should trust besides Mozilla's roots"
    )]
    Ca { path: String, why: String },
}

/// The certificates of a `--outbound-ca` file: PEM, at least one, each one rustls can
/// use as a trust anchor. Anything else stops the runtime at start, not at a first call.
pub fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, OutboundConfigError> {
    let error = |why: String| OutboundConfigError::Ca {
        path: path.display().to_string(),
        why,
    };
    let text = std::fs::read(path).map_err(|e| error(format!("cannot read it: {e}")))?;
    let certificates = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error(format!("it is not PEM: {e}")))?;
    if certificates.is_empty() {
        return Err(error("it holds no PEM certificate".into()));
    }
    let mut store = rustls::RootCertStore::empty();
    for (index, certificate) in certificates.iter().enumerate() {
        store.add(certificate.clone()).map_err(|e| {
            error(format!(
                "certificate {} is not one a CA can be read from: {e}",
                index + 1
            ))
        })?;
    }
    Ok(certificates)
}

/// The fourth field of `--outbound-header` that lets a header go over plain http.
pub const ALLOW_INSECURE: &str = "allow-insecure";

/// `"<url> <Header-Name> <ENV_VAR> [allow-insecure]"` with the value taken from the
/// environment. A header for an `http://` URL is refused without `allow-insecure`: its
/// value is a credential, and plain http hands it to anyone on the path. Refused here,
/// where every flag and pool entry is read, no header for http gets into an [`Outbound`]
/// without the opt-in.
pub fn parse_injected_header(
    text: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<(String, String, String), OutboundConfigError> {
    let fields: Vec<&str> = text.split_whitespace().collect();
    let (url, name, variable, allow_insecure) = match fields[..] {
        [url, name, variable] => (url, name, variable, false),
        [url, name, variable, ALLOW_INSECURE] => (url, name, variable, true),
        _ => return Err(OutboundConfigError::HeaderSyntax(text.to_string())),
    };
    if !allow_insecure && is_plain_http(url) {
        return Err(OutboundConfigError::HeaderInsecure {
            url: url.into(),
            name: name.into(),
        });
    }
    let value = lookup(variable).ok_or_else(|| OutboundConfigError::HeaderMissing {
        url: url.into(),
        name: name.into(),
        variable: variable.into(),
    })?;
    Ok((url.into(), name.into(), value))
}

fn is_plain_http(url: &str) -> bool {
    url.get(..7)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<(String, String, String), OutboundConfigError> {
        parse_injected_header(text, |variable| (variable == "TOKEN").then(|| "Bearer x".to_string()))
    }

    #[test]
    fn a_credential_header_goes_over_plain_http_only_when_the_entry_says_so() {
        let https = parse("https://api.example.com Authorization TOKEN").unwrap();
        assert_eq!(
            https,
            (
                "https://api.example.com".into(),
                "Authorization".into(),
                "Bearer x".into()
            )
        );
        for text in ["http://b:8080 Authorization TOKEN", "HTTP://b:8080 Authorization TOKEN"] {
            let error = parse(text).unwrap_err();
            assert!(
                matches!(error, OutboundConfigError::HeaderInsecure { .. }),
                "{text}: {error}"
            );
            assert!(error.to_string().contains("allowInsecure"), "{error}");
        }
        let opted = parse("http://b:8080 Authorization TOKEN allow-insecure").unwrap();
        assert_eq!(opted.0, "http://b:8080");
        let error = parse("http://b:8080 Authorization TOKEN yes").unwrap_err();
        assert!(error.to_string().contains("[allow-insecure]"), "{error}");
    }
}
