//! `spec.outbound`: the HTTP calls a handler may make, the credentials the host adds, and
//! what the schema's patterns cannot check.

use super::*;

/// A destination handlers may call: `scheme://host[:port]`, the host a name, `*.` and a
/// name (any name under it), `*` (any host), an IPv4 address or a bracketed IPv6 one.
const OUTBOUND_ALLOW_PATTERN: &str = r"^https?://(\*|(\*\.)?[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?$";
/// One destination, no wildcard: a credential goes to the hosts its owner named, no others.
const OUTBOUND_URL_PATTERN: &str = r"^https?://([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?$";
/// An HTTP header name: a token (RFC 9110, section 5.6.2).
const HEADER_NAME_PATTERN: &str = r"^[-!#$%&'*+.^_`|~0-9A-Za-z]+$";

/// The HTTP calls a handler may make; without it, none. Everything not allowed is refused.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.headers) || self.headers.all(h, h.url in self.allow)")
    .message("every outbound.headers[].url must be one of outbound.allow, written the same way"))]
pub struct Outbound {
    /// Destinations: `scheme://host[:port]`, where host may be `*.example.com` (any name
    /// under it), `*` (any host), or an IP address. Without a port, the scheme's.
    #[schemars(length(min = 1, max = 64), inner(length(max = 512), regex(pattern = OUTBOUND_ALLOW_PATTERN)))]
    pub allow: Vec<String>,
    /// Longest time of one call, always within the request's own `limits.timeout`.
    #[serde(default = "default_outbound_timeout")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 32))]
    pub timeout: String,
    /// Largest response body a call reads.
    #[serde(default = "default_max_response_body")]
    #[schemars(regex(pattern = QUANTITY_PATTERN), length(max = 32))]
    pub max_response_body: String,
    /// Outbound calls in flight at once in one pod, over all its requests.
    #[serde(default = "default_max_outbound_concurrency")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_concurrency: i32,
    /// Headers the runtime adds to calls to one destination, their values from Secrets:
    /// the handler never sees them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub headers: Vec<OutboundHeader>,
    /// Certificate authorities HTTPS calls trust besides Mozilla's roots, such as a
    /// cluster's internal CA: PEM certificates in a key of a ConfigMap. A change to it rolls
    /// the pods; a missing one is a condition on the Function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<CaBundle>,
}

/// Where the PEM certificates of `outbound.caBundle` are.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaBundle {
    pub config_map_key_ref: ConfigMapKeyRef,
}

/// One key of a ConfigMap, in the Function's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ConfigMapKeyRef {
    #[schemars(length(min = 1, max = 253), regex(pattern = OBJECT_NAME_PATTERN))]
    pub name: String,
    #[schemars(length(min = 1, max = 253), regex(pattern = DATA_KEY_PATTERN))]
    pub key: String,
}

/// A header the runtime adds to every call to `url`, its value read from a Secret. Over
/// https only, unless `allowInsecure` says otherwise: the value is a credential, and plain
/// http hands it to anyone on the network path.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!self.url.startsWith('http://') || (has(self.allowInsecure) && self.allowInsecure)")
    .message(INSECURE_HEADER_MESSAGE))]
pub struct OutboundHeader {
    /// The destination, one of `allow` as written there, without a wildcard.
    #[schemars(length(max = 512), regex(pattern = OUTBOUND_URL_PATTERN))]
    pub url: String,
    /// The header's name, such as `Authorization`.
    #[schemars(length(min = 1, max = 256), regex(pattern = HEADER_NAME_PATTERN))]
    pub name: String,
    pub value_from: SecretValueSource,
    /// Send the header to an `http://` url too, its value in clear on the network: only
    /// where the path is trusted (a mesh that encrypts between pods, a sidecar on the
    /// node). Without it, a header for an `http://` url is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_insecure: Option<bool>,
}

const INSECURE_HEADER_MESSAGE: &str = "an outbound.headers[] url is http://, where the header's value would travel in clear: use https, or set allowInsecure: true on that header if the network path is trusted";

impl OutboundHeader {
    /// Whether this header would go over plain http without its entry saying so.
    fn is_insecure(&self) -> bool {
        self.url.starts_with("http://") && self.allow_insecure != Some(true)
    }
}

/// A value from a Secret: a header has no value when the Secret is missing, so it is not optional.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretValueSource {
    pub secret_key_ref: SecretKeyRef,
}

/// One key of a Secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct SecretKeyRef {
    #[schemars(length(min = 1, max = 253), regex(pattern = OBJECT_NAME_PATTERN))]
    pub name: String,
    #[schemars(length(min = 1, max = 253), regex(pattern = DATA_KEY_PATTERN))]
    pub key: String,
}

fn default_outbound_timeout() -> String {
    "5s".into()
}
fn default_max_response_body() -> String {
    "10Mi".into()
}
fn default_max_outbound_concurrency() -> i32 {
    64
}

impl Outbound {
    /// What the schema's patterns let through: a port past 65535, one header given twice
    /// for one destination (which of the two values would be sent?), and a header for
    /// plain http without `allowInsecure`.
    pub(super) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let urls = self.allow.iter().chain(self.headers.iter().map(|h| &h.url));
        for url in urls {
            if let Some(port) = port_of(url)
                && port.parse::<u16>().is_err()
            {
                problems.push(format!("outbound URL {url} has port {port}, past 65535"));
            }
        }
        // The CRD refuses these on a write; one stored before that rule existed is
        // refused here, so its pods keep the Deployment they have.
        problems.extend(
            self.headers
                .iter()
                .filter(|header| header.is_insecure())
                .map(|header| format!("{}: {INSECURE_HEADER_MESSAGE}", header.url)),
        );
        for (index, header) in self.headers.iter().enumerate() {
            let repeated = self.headers[..index]
                .iter()
                .any(|h| h.url == header.url && h.name.eq_ignore_ascii_case(&header.name));
            if repeated {
                problems.push(format!(
                    "outbound.headers names {} for {} twice: give each header one value",
                    header.name, header.url
                ));
            }
        }
        problems
    }
}

/// The port written in `scheme://host[:port]`, if any (an IPv6 host is bracketed).
fn port_of(url: &str) -> Option<&str> {
    let authority = url.split_once("://").map_or(url, |(_, rest)| rest);
    let after_host = match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once(']')?.1,
        None => authority.find(':').map_or("", |at| &authority[at..]),
    };
    after_host.strip_prefix(':')
}
