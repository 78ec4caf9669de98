//! Where a handler may send requests: the Function's allow-list (`--outbound-allow`), and
//! the addresses no name may lead to unless an entry names them literally (server-side
//! request forgery: the cloud's metadata service, the node's loopback, this runtime's
//! admin port).

use http::Uri;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Why an allow-list entry cannot be one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "--outbound-allow {pattern:?}: {why} (write scheme://host[:port], e.g. https://api.example.com, http://orders:8080, https://*.example.com, http://10.0.0.7:*)"
)]
pub struct BadPattern {
    pub pattern: String,
    pub why: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Scheme {
    Http,
    Https,
}

impl Scheme {
    fn default_port(&self) -> u16 {
        match self {
            Self::Http => 80,
            Self::Https => 443,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    /// One name, as written (lower case, no trailing dot).
    Name(String),
    /// `*.example.com`: any name ending in `.example.com`, not `example.com` itself.
    Subdomains(String),
    /// `*`: any name or address (still not the blocked ones).
    Any,
    /// An address written literally: reachable even in a blocked range.
    Address(IpAddr),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Port {
    /// None written: the scheme's own.
    Default,
    Exactly(u16),
    Any,
}

/// One allow-list entry: `scheme://host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    text: String,
    scheme: Scheme,
    host: Host,
    port: Port,
}

impl Pattern {
    pub fn parse(text: &str) -> Result<Self, BadPattern> {
        let bad = |why: &str| BadPattern {
            pattern: text.to_string(),
            why: why.to_string(),
        };
        let (scheme, rest) = text.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            _ => return Err(bad("the scheme must be http or https")),
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#', '@']) {
            return Err(bad("an entry names a destination, not a path, query or user"));
        }
        let (host, port) = split_host_port(authority).ok_or_else(|| bad("the port must be a number or *"))?;
        let port = match port {
            None => Port::Default,
            Some("*") => Port::Any,
            Some(port) => Port::Exactly(port.parse().map_err(|_| bad("the port must be a number or *"))?),
        };
        let host = host.to_ascii_lowercase();
        let host = if host == "*" {
            Host::Any
        } else if let Some(domain) = host.strip_prefix("*.").map(|domain| domain.trim_end_matches('.')) {
            if !is_dns_name(domain) {
                return Err(bad("the host must be a DNS name or an IP address"));
            }
            Host::Subdomains(domain.to_string())
        } else if let Some(address) = parse_address(&host) {
            Host::Address(address)
        } else if is_dns_name(host.trim_end_matches('.')) {
            Host::Name(host.trim_end_matches('.').to_string())
        } else {
            return Err(bad("the host must be a DNS name or an IP address"));
        };
        Ok(Self {
            text: text.to_string(),
            scheme,
            host,
            port,
        })
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether a request to `scheme://host:port` is one this entry allows.
    pub fn matches(&self, destination: &Destination) -> bool {
        let scheme = match destination.scheme {
            Scheme::Http => self.scheme == Scheme::Http,
            Scheme::Https => self.scheme == Scheme::Https,
        };
        let port = match self.port {
            Port::Default => destination.port == self.scheme.default_port(),
            Port::Exactly(port) => destination.port == port,
            Port::Any => true,
        };
        let host = match &self.host {
            Host::Any => true,
            Host::Name(name) => destination.address.is_none() && destination.host == *name,
            Host::Subdomains(domain) => {
                destination.address.is_none()
                    && destination
                        .host
                        .strip_suffix(domain.as_str())
                        .is_some_and(|label| label.len() > 1 && label.ends_with('.'))
            }
            Host::Address(address) => destination.address == Some(*address),
        };
        scheme && port && host
    }
}

/// `host[:port]`, with `[v6]` brackets taken off.
fn split_host_port(authority: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after {
            "" => Some((host, None)),
            _ => Some((host, Some(after.strip_prefix(':')?))),
        };
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Some((host, Some(port))),
        None => Some((authority, None)),
    }
}

fn parse_address(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[').trim_end_matches(']').parse().ok()
}

fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// Where one request goes, read from its URL.
#[derive(Debug, Clone)]
pub struct Destination {
    scheme: Scheme,
    /// Lower case, no trailing dot, no brackets.
    pub host: String,
    pub port: u16,
    /// The host, when it is an address rather than a name.
    address: Option<IpAddr>,
}

impl Destination {
    pub fn of(uri: &Uri) -> Option<Self> {
        let scheme = match uri.scheme_str()? {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            _ => return None,
        };
        let host = uri.host()?.trim_end_matches('.').to_ascii_lowercase();
        let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
        let port = uri.port_u16().unwrap_or(scheme.default_port());
        let address = parse_address(&host);
        Some(Self {
            scheme,
            host,
            port,
            address,
        })
    }

    /// `host:port`, as the log and error messages name it.
    pub fn authority(&self) -> String {
        match self.address {
            Some(IpAddr::V6(_)) => format!("[{}]:{}", self.host, self.port),
            _ => format!("{}:{}", self.host, self.port),
        }
    }
}

/// The allow-list, and what this runtime must not be made to call.
#[derive(Debug, Clone)]
pub struct Policy {
    allow: Vec<Pattern>,
    admin_port: u16,
    pod_ip: Option<IpAddr>,
}

/// The entry that lets a request out.
#[derive(Debug, Clone, Copy)]
pub struct Allowed<'a> {
    pattern: &'a Pattern,
}

impl Allowed<'_> {
    /// The `host` label of the outbound metrics: the host itself for an entry that names
    /// one, the entry's pattern for a wildcard (so a handler cannot mint series).
    pub fn host_label(&self, destination: &Destination) -> String {
        match &self.pattern.host {
            Host::Name(_) | Host::Address(_) => destination.host.clone(),
            Host::Subdomains(domain) => format!("*.{domain}"),
            Host::Any => "*".to_string(),
        }
    }
}

impl Policy {
    pub fn new(allow: Vec<Pattern>, admin_port: u16, pod_ip: Option<IpAddr>) -> Self {
        Self {
            allow,
            admin_port,
            pod_ip,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.allow.is_empty()
    }

    pub fn patterns(&self) -> impl Iterator<Item = &Pattern> {
        self.allow.iter()
    }

    /// The first entry that allows `destination`, if any does.
    pub fn allows(&self, destination: &Destination) -> Option<Allowed<'_>> {
        self.allow
            .iter()
            .find(|pattern| pattern.matches(destination))
            .map(|pattern| Allowed { pattern })
    }

    /// Whether a connection to `address` may be opened for a request to `destination`:
    /// addresses in a blocked range only when an entry that allows the destination names
    /// that address (or `localhost`, for loopback) literally, and this runtime's admin
    /// port only when such an entry names address and port.
    pub fn may_connect(&self, destination: &Destination, address: SocketAddr) -> bool {
        let ip = canonical(address.ip());
        let names_literally = |pattern: &&Pattern| match &pattern.host {
            Host::Address(listed) => canonical(*listed) == ip,
            Host::Name(name) => name == "localhost" && ip.is_loopback(),
            Host::Subdomains(_) | Host::Any => false,
        };
        let mut literal = self
            .allow
            .iter()
            .filter(|pattern| pattern.matches(destination))
            .filter(names_literally);
        let own = ip.is_loopback() || ip.is_unspecified() || self.pod_ip.map(canonical) == Some(ip);
        if own && address.port() == self.admin_port {
            return literal.any(|pattern| pattern.port == Port::Exactly(self.admin_port));
        }
        literal.next().is_some() || !is_blocked(ip)
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The instance metadata services clouds serve credentials on, beyond link-local.
const METADATA_V4: [Ipv4Addr; 1] = [Ipv4Addr::new(100, 100, 100, 200)];
const METADATA_V6: [Ipv6Addr; 1] = [Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)];

/// Addresses a name must not lead a handler to: this node itself (loopback,
/// unspecified), link-local (169.254.169.254 and every cloud's metadata service),
/// multicast and broadcast. Private ranges are not among them: in-cluster Services live
/// there, and the allow-list already says which names may be called.
pub fn is_blocked(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => {
            v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_multicast()
                || v4.is_broadcast()
                || METADATA_V4.contains(&v4)
        }
        IpAddr::V6(v6) => {
            v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || (v6.segments()[0] & 0xffc0) == 0xfe80
                || METADATA_V6.contains(&v6)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(patterns: &[&str]) -> Policy {
        let allow = patterns.iter().map(|p| Pattern::parse(p).unwrap()).collect();
        Policy::new(allow, 9090, Some("10.244.0.9".parse().unwrap()))
    }

    fn allowed(policy: &Policy, url: &str) -> bool {
        policy
            .allows(&Destination::of(&url.parse().unwrap()).unwrap())
            .is_some()
    }

    #[test]
    fn entries_match_scheme_host_and_port() {
        let policy = policy(&[
            "https://api.example.com",
            "http://b.default.svc.cluster.local:8080",
            "https://*.example.org",
            "http://10.0.0.7:*",
            "http://[fd00::1]:8080/",
        ]);
        for url in [
            "https://api.example.com/v1",
            "https://API.example.com.:443/",
            "http://b.default.svc.cluster.local:8080/x",
            "https://a.example.org/",
            "https://a.b.example.org/",
            "http://10.0.0.7:1234/",
            "http://[fd00::1]:8080/",
        ] {
            assert!(allowed(&policy, url), "{url} should be allowed");
        }
        for url in [
            "http://api.example.com/",
            "https://api.example.com:8443/",
            "https://evil.com/?api.example.com",
            "https://api.example.com.evil.com/",
            "http://b.default.svc.cluster.local/",
            "https://example.org/",
            "https://xexample.org/",
            "https://10.0.0.7/",
            "http://10.0.0.8:1234/",
        ] {
            assert!(!allowed(&policy, url), "{url} should be denied");
        }
    }

    #[test]
    fn bad_entries_say_what_to_write() {
        for (pattern, why) in [
            ("api.example.com", "no scheme"),
            ("ftp://h", "http or https"),
            ("https://h/path", "not a path"),
            ("https://h:port", "number"),
            ("https://a b", "DNS name"),
            ("https://*.", "DNS name"),
        ] {
            let error = Pattern::parse(pattern).unwrap_err();
            assert!(error.to_string().contains(why), "{error}");
            assert!(error.to_string().contains("scheme://host[:port]"), "{error}");
        }
    }

    fn may_connect(policy: &Policy, url: &str, address: &str) -> bool {
        let destination = Destination::of(&url.parse().unwrap()).unwrap();
        assert!(policy.allows(&destination).is_some(), "allowed by the list");
        policy.may_connect(&destination, address.parse().unwrap())
    }

    #[test]
    fn names_never_lead_to_metadata_loopback_or_the_admin_port() {
        let policy = policy(&["http://*:*", "http://127.0.0.1:8081", "http://localhost:9000"]);
        assert!(may_connect(&policy, "http://orders:8080/", "10.96.0.12:8080"));
        for address in [
            "169.254.169.254:80",
            "127.0.0.1:80",
            "[::ffff:169.254.169.254]:80",
            "[fd00:ec2::254]:80",
            "[::1]:80",
            "0.0.0.0:80",
            "10.244.0.9:9090",
        ] {
            assert!(
                !may_connect(&policy, "http://rebinding.example.com/", address),
                "{address}"
            );
        }
        // Listed literally: a test upstream on loopback, a sidecar on localhost.
        assert!(may_connect(&policy, "http://127.0.0.1:8081/", "127.0.0.1:8081"));
        assert!(may_connect(&policy, "http://localhost:9000/", "[::1]:9000"));
        // The admin port, even on an address listed, needs the port listed too.
        let policy = self::policy(&["http://127.0.0.1:*"]);
        assert!(!may_connect(&policy, "http://127.0.0.1:9090/", "127.0.0.1:9090"));
        let policy = self::policy(&["http://127.0.0.1:9090"]);
        assert!(may_connect(&policy, "http://127.0.0.1:9090/", "127.0.0.1:9090"));
    }

    #[test]
    fn wildcard_entries_label_metrics_with_the_pattern() {
        let policy = policy(&["https://*.example.com", "http://orders:8080"]);
        let label = |url: &str| {
            let destination = Destination::of(&url.parse().unwrap()).unwrap();
            policy.allows(&destination).unwrap().host_label(&destination)
        };
        assert_eq!(label("https://random-123.example.com/"), "*.example.com");
        assert_eq!(label("http://orders:8080/"), "orders");
    }
}
