//! Where a handler may send requests: the Function's allow-list (`--outbound-allow`), the
//! addresses no name may lead to unless an entry names them literally (server-side
//! request forgery: the cloud's metadata service, the node's loopback), and this
//! runtime's admin port, which no entry opens.

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
    /// port on an address of its own never (see [`Policy::reaches_own_admin`] for the
    /// addresses only the connection tells).
    pub fn may_connect(&self, destination: &Destination, address: SocketAddr) -> bool {
        let ip = canonical(address.ip());
        let own = ip.is_loopback() || ip.is_unspecified() || self.pod_ip.map(canonical) == Some(ip);
        if own && address.port() == self.admin_port {
            // No entry opens it: in a pool, `/pool` and `/metrics` there describe every
            // neighbour, and no handler needs its own runtime's metrics.
            return false;
        }
        let names_literally = |pattern: &Pattern| match &pattern.host {
            Host::Address(listed) => canonical(*listed) == ip,
            Host::Name(name) => name == "localhost" && ip.is_loopback(),
            Host::Subdomains(_) | Host::Any => false,
        };
        let literal = self
            .allow
            .iter()
            .any(|pattern| pattern.matches(destination) && names_literally(pattern));
        literal || !is_blocked(ip)
    }

    /// Whether an open connection, from `local` to `peer`, came back into this host on the
    /// admin port. A connection to an address of this host leaves from that same address,
    /// so this catches every address the host has (a pool is not told its pod's IP, a pod
    /// may have more than one), whatever the admin port is bound to, without listing the
    /// host's interfaces.
    pub fn reaches_own_admin(&self, local: SocketAddr, peer: SocketAddr) -> bool {
        peer.port() == self.admin_port && canonical(local.ip()) == canonical(peer.ip())
    }
}

/// An IPv6 address that stands for an IPv4 one as that IPv4 address: IPv4-mapped
/// (`::ffff:a.b.c.d`), and the well-known NAT64 prefix (`64:ff9b::a.b.c.d`, RFC 6052),
/// which a translator on the path turns back into the IPv4 address, so it reaches what
/// the IPv4 address reaches.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) if v6.segments()[..6] == NAT64_WELL_KNOWN => {
            IpAddr::V4(Ipv4Addr::from((u128::from(v6) & 0xffff_ffff) as u32))
        }
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The first 96 bits of `64:ff9b::/96`.
const NAT64_WELL_KNOWN: [u16; 6] = [0x64, 0xff9b, 0, 0, 0, 0];
/// The first 48 bits of `64:ff9b:1::/48` (RFC 8215), NAT64 for a network's own use.
const NAT64_LOCAL_USE: [u16; 3] = [0x64, 0xff9b, 1];

/// The instance metadata services clouds serve credentials on, beyond link-local:
/// Alibaba's, and Azure's WireServer (168.63.129.16, which hands VM extensions their
/// settings and certificates).
const METADATA_V4: [Ipv4Addr; 2] = [Ipv4Addr::new(100, 100, 100, 200), Ipv4Addr::new(168, 63, 129, 16)];
/// AWS's instance metadata service over IPv6 (`fd00:ec2::254`) and the EKS Pod Identity
/// agent's (`fd00:ec2::23`), which hands out the node's pods' AWS credentials.
const METADATA_V6: [Ipv6Addr; 2] = [
    Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254),
    Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23),
];

/// Addresses a name must not lead a handler to: this node itself (loopback, unspecified,
/// `0.0.0.0/8`), link-local (169.254.169.254 and every cloud's metadata service),
/// multicast and broadcast, and IPv6 forms of those: an IPv4 address embedded in IPv6
/// (mapped, NAT64) is judged as that IPv4 address. Private ranges are not among them:
/// in-cluster Services live there, and the allow-list already says which names may be
/// called.
pub fn is_blocked(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => is_blocked_v4(v4),
        IpAddr::V6(v6) => is_blocked_v6(v6),
    }
}

fn is_blocked_v4(v4: Ipv4Addr) -> bool {
    // 0.0.0.0/8 is "this network": Linux connects 0.0.0.0 to this host.
    v4.octets()[0] == 0
        || v4.is_loopback()
        || v4.is_link_local()
        || v4.is_multicast()
        || v4.is_broadcast()
        || METADATA_V4.contains(&v4)
}

fn is_blocked_v6(v6: Ipv6Addr) -> bool {
    let segments = v6.segments();
    v6.is_unspecified()
        || v6.is_loopback()
        || v6.is_multicast()
        || (segments[0] & 0xffc0) == 0xfe80
        // `::/96`, IPv4-compatible (deprecated by RFC 4291): no destination a handler
        // needs, and a stack that still honours it reaches the IPv4 address behind it.
        || segments[..6] == [0; 6]
        // Where a local-use translator puts the IPv4 address is the network's choice,
        // so what an address here reaches cannot be read from it: an entry naming the
        // address literally opens one.
        || segments[..3] == NAT64_LOCAL_USE
        || METADATA_V6.contains(&v6)
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
    }

    #[test]
    fn no_entry_opens_the_admin_port_on_an_address_of_this_host() {
        for entry in ["http://127.0.0.1:*", "http://127.0.0.1:9090", "http://10.244.0.9:9090"] {
            let policy = policy(&[entry, "http://localhost:9090", "http://[::ffff:127.0.0.1]:9090"]);
            for (url, address) in [
                ("http://127.0.0.1:9090/", "127.0.0.1:9090"),
                ("http://localhost:9090/", "[::1]:9090"),
                ("http://[::ffff:127.0.0.1]:9090/", "[::ffff:127.0.0.1]:9090"),
            ] {
                let destination = Destination::of(&url.parse().unwrap()).unwrap();
                let address = address.parse().unwrap();
                assert!(!policy.may_connect(&destination, address), "{entry}: {url}");
            }
            let destination = Destination::of(&"http://10.244.0.9:9090/".parse().unwrap()).unwrap();
            assert!(
                !policy.may_connect(&destination, "10.244.0.9:9090".parse().unwrap()),
                "{entry}"
            );
        }
        // A pool is not told its pod's IP: the connection itself says it came back home.
        let pool = Policy::new(vec![Pattern::parse("http://*:*").unwrap()], 9090, None);
        let at = |text: &str| text.parse::<SocketAddr>().unwrap();
        assert!(pool.reaches_own_admin(at("10.244.0.9:40000"), at("10.244.0.9:9090")));
        assert!(pool.reaches_own_admin(at("[fd00::9]:40000"), at("[fd00::9]:9090")));
        assert!(pool.reaches_own_admin(at("10.244.0.9:40000"), at("[::ffff:10.244.0.9]:9090")));
        assert!(!pool.reaches_own_admin(at("10.244.0.9:40000"), at("10.244.0.7:9090")));
        assert!(!pool.reaches_own_admin(at("10.244.0.9:40000"), at("10.244.0.9:8080")));
    }

    #[test]
    fn every_range_that_leads_back_to_the_node_or_a_metadata_service_is_blocked() {
        for address in [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.2",
            "169.254.169.254",
            "168.63.129.16",
            "100.100.100.200",
            "255.255.255.255",
            "::",
            "::1",
            // IPv4-compatible, whatever it embeds.
            "::a9fe:a9fe",
            "::a00:1",
            "::808:808",
            // IPv4-mapped: the IPv4 list.
            "::ffff:169.254.169.254",
            "::ffff:168.63.129.16",
            "::ffff:0.1.2.3",
            // NAT64, well-known: the IPv4 list.
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::7f00:1",
            "64:ff9b::a83f:8110",
            "64:ff9b::",
            // NAT64, local use: all of it.
            "64:ff9b:1::a9fe:a9fe",
            "64:ff9b:1:ffff::808:808",
            "fe80::1",
            "ff02::1",
            "fd00:ec2::254",
            "fd00:ec2::23",
        ] {
            assert!(is_blocked(address.parse().unwrap()), "{address} should be blocked");
        }
        for address in [
            "10.96.0.12",
            "8.8.8.8",
            "1.0.0.1",
            "::ffff:10.96.0.12",
            "64:ff9b::808:808",
            "64:ff9b::a00:1",
            "fd00::1",
            "fd00:ec2::2",
            "2001:db8::1",
        ] {
            assert!(!is_blocked(address.parse().unwrap()), "{address} should not be blocked");
        }
        // An entry naming an address literally still opens it, in any of its forms.
        let policy = policy(&["http://[64:ff9b::a9fe:a9fe]"]);
        assert!(may_connect(
            &policy,
            "http://[64:ff9b::a9fe:a9fe]/",
            "[64:ff9b::a9fe:a9fe]:80"
        ));
        assert!(!may_connect(
            &self::policy(&["http://*"]),
            "http://x.example/",
            "[64:ff9b::a9fe:a9fe]:80"
        ));
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
