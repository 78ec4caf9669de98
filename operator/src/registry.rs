//! The operator's own calls to the OCI registry of `storage: oci` (distribution's HTTP API
//! v2): deleting the manifests of revisions it no longer keeps, and of Functions that are
//! gone. Anonymous, as the builder and the runtime are by default; plain HTTP to the
//! registries `--oci-plain-http` names, HTTPS (webpki roots) to the rest.
//!
//! What may be deleted is decided in [`stale_tags`], a pure function: only tags of the
//! builder's form (10 hex digits of a source digest) in repositories `<prefix>/<ns>/<fn>`
//! of the namespaces the operator watches, whose manifest is a Wasm artifact, and that no
//! kept revision (or running build) of an existing Function names.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::header::{ACCEPT, HeaderMap};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The manifest types the builder pushes (oci-client writes OCI image manifests).
const MANIFEST_TYPES: &str =
    "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";
/// Repositories asked for per catalog page: distribution's most.
const CATALOG_PAGE: usize = 1000;
/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{0}: not a registry reference by digest (host/repository@sha256:...)")]
    NotByDigest(String),
    #[error("{method} {url}: {message}")]
    Http {
        method: Method,
        url: String,
        message: String,
    },
    #[error(
        "{registry} refuses to delete manifests (405 Method Not Allowed): allow deletes in its configuration (distribution: storage.delete.enabled: true), or {what} stays there"
    )]
    DeletesDisabled { registry: String, what: String },
}

/// A registry reference by digest, split: `host[:port]`, repository, `sha256:...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestRef {
    pub host: String,
    pub repository: String,
    pub digest: String,
}

impl ManifestRef {
    /// `host[:port]/repo/sitory@sha256:...`, with or without `oci://`.
    pub fn parse(reference: &str) -> Result<Self, RegistryError> {
        let bad = || RegistryError::NotByDigest(reference.to_string());
        let text = reference
            .strip_prefix(wasmless_artifact::oci::SCHEME)
            .unwrap_or(reference);
        let (name, digest) = text.split_once('@').ok_or_else(bad)?;
        let (host, repository) = name.split_once('/').ok_or_else(bad)?;
        if host.is_empty() || repository.is_empty() || !digest.starts_with("sha256:") {
            return Err(bad());
        }
        Ok(Self {
            host: host.into(),
            repository: repository.into(),
            digest: digest.into(),
        })
    }
}

/// One tagged manifest of a repository, as the sweep sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tagged {
    pub tag: String,
    pub digest: String,
    /// The manifest's `config.mediaType`: the builder's is the Wasm artifact config.
    pub config_media_type: String,
}

/// The registry client: one per operator.
pub struct Registry {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>,
    plain_http: Vec<String>,
}

impl Registry {
    /// `plain_http`: the operator's `--oci-plain-http` (comma-separated `host:port`).
    pub fn new(plain_http: Option<&str>) -> Self {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .expect("ring supports the default TLS versions")
            .https_or_http()
            .enable_http1()
            .build();
        Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            plain_http: plain_http
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|host| !host.is_empty())
                .map(str::to_string)
                .collect(),
        }
    }

    fn url(&self, host: &str, path: &str) -> String {
        let scheme = if self.plain_http.iter().any(|plain| plain == host) {
            "http"
        } else {
            "https"
        };
        format!("{scheme}://{host}/v2/{path}")
    }

    async fn call(&self, method: Method, url: &str) -> Result<(StatusCode, HeaderMap, Bytes), RegistryError> {
        let failed = |message: String| RegistryError::Http {
            method: method.clone(),
            url: url.to_string(),
            message,
        };
        let request = Request::builder()
            .method(method.clone())
            .uri(url)
            .header(ACCEPT, MANIFEST_TYPES)
            .body(Empty::new())
            .map_err(|error| failed(error.to_string()))?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|error| failed(error.to_string()))?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await.map_err(|error| failed(error.to_string()))?;
            Ok((parts.status, parts.headers, body.to_bytes()))
        };
        tokio::time::timeout(CALL_TIMEOUT, exchange)
            .await
            .map_err(|_| failed(format!("no answer within {} s", CALL_TIMEOUT.as_secs())))?
    }

    /// Deletes the manifest `reference` names (by digest); whether it was there.
    pub async fn delete(&self, reference: &ManifestRef) -> Result<bool, RegistryError> {
        let url = self.url(
            &reference.host,
            &format!("{}/manifests/{}", reference.repository, reference.digest),
        );
        let (status, _, body) = self.call(Method::DELETE, &url).await?;
        match status {
            StatusCode::ACCEPTED | StatusCode::OK => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            StatusCode::METHOD_NOT_ALLOWED => Err(RegistryError::DeletesDisabled {
                registry: reference.host.clone(),
                what: format!("{}@{}", reference.repository, reference.digest),
            }),
            other => Err(RegistryError::Http {
                method: Method::DELETE,
                url,
                message: format!("{other}: {}", String::from_utf8_lossy(&body).trim()),
            }),
        }
    }

    /// Every repository of `host` (its catalog, page after page: distribution gives at most
    /// 1,000 a page, and refuses to be asked for more).
    pub async fn repositories(&self, host: &str) -> Result<Vec<String>, RegistryError> {
        let mut repositories: Vec<String> = Vec::new();
        loop {
            let path = match repositories.last() {
                None => format!("_catalog?n={CATALOG_PAGE}"),
                Some(last) => format!("_catalog?n={CATALOG_PAGE}&last={last}"),
            };
            let page = strings(&self.get_json(&self.url(host, &path)).await?["repositories"]);
            let full = page.len() == CATALOG_PAGE;
            repositories.extend(page);
            if !full {
                return Ok(repositories);
            }
        }
    }

    /// The tags of `repository` with the manifest each names.
    pub async fn tagged(&self, host: &str, repository: &str) -> Result<Vec<Tagged>, RegistryError> {
        let url = self.url(host, &format!("{repository}/tags/list"));
        let tags = match self.get_json(&url).await {
            Ok(body) => strings(&body["tags"]),
            // A repository whose last tag went may answer 404 (distribution does).
            Err(RegistryError::Http { message, .. }) if message.starts_with("404") => Vec::new(),
            Err(error) => return Err(error),
        };
        let mut tagged = Vec::with_capacity(tags.len());
        for tag in tags {
            let url = self.url(host, &format!("{repository}/manifests/{tag}"));
            let (status, headers, body) = self.call(Method::GET, &url).await?;
            if status == StatusCode::NOT_FOUND {
                continue;
            }
            if !status.is_success() {
                return Err(RegistryError::Http {
                    method: Method::GET,
                    url,
                    message: status.to_string(),
                });
            }
            let manifest: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let Some(digest) = headers
                .get("docker-content-digest")
                .and_then(|value| value.to_str().ok())
            else {
                continue;
            };
            tagged.push(Tagged {
                tag,
                digest: digest.to_string(),
                config_media_type: manifest["config"]["mediaType"].as_str().unwrap_or_default().to_string(),
            });
        }
        Ok(tagged)
    }

    async fn get_json(&self, url: &str) -> Result<serde_json::Value, RegistryError> {
        let (status, _, body) = self.call(Method::GET, url).await?;
        if !status.is_success() {
            return Err(RegistryError::Http {
                method: Method::GET,
                url: url.to_string(),
                message: format!("{status}: {}", String::from_utf8_lossy(&body).trim()),
            });
        }
        serde_json::from_slice(&body).map_err(|error| RegistryError::Http {
            method: Method::GET,
            url: url.to_string(),
            message: format!("not JSON: {error}"),
        })
    }
}

fn strings(value: &serde_json::Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|item| item.as_str().map(str::to_string))
        .collect()
}

/// `--oci-registry` (`host[:port][/prefix]`) split into its host and repository prefix.
pub fn split_registry(registry: &str) -> (&str, &str) {
    registry.split_once('/').unwrap_or((registry, ""))
}

/// The Function a repository of the builder's form is for: `[<prefix>/]<ns>/<fn>`.
pub fn function_of(repository: &str, prefix: &str) -> Option<(String, String)> {
    let rest = match prefix {
        "" => repository,
        prefix => repository.strip_prefix(prefix)?.strip_prefix('/')?,
    };
    let (ns, name) = rest.split_once('/')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains('/')).then(|| (ns.to_string(), name.to_string()))
}

/// What the sweep may delete of one repository: the manifests of tags of the builder's
/// form whose manifest is a Wasm artifact and whose source no kept revision (nor the running
/// build) of the Function has; `kept` is `None` for a Function that does not exist.
/// Each digest once, whichever tags name it.
pub fn stale_tags(tagged: &[Tagged], kept: Option<&BTreeSet<String>>) -> Vec<Tagged> {
    let builders = |tag: &str| tag.len() == 10 && tag.bytes().all(|b| b.is_ascii_hexdigit());
    let mut stale: BTreeMap<String, Tagged> = BTreeMap::new();
    for one in tagged {
        let is_wasm = one.config_media_type == wasmless_artifact::oci::CONFIG_MEDIA_TYPE;
        let needed = kept.is_some_and(|kept| kept.contains(&one.tag));
        if builders(&one.tag) && is_wasm && !needed {
            stale.entry(one.digest.clone()).or_insert_with(|| one.clone());
        }
    }
    // A digest another, needed tag names stays (two sources that built the same module).
    stale
        .into_values()
        .filter(|candidate| {
            !tagged
                .iter()
                .any(|other| other.digest == candidate.digest && kept.is_some_and(|kept| kept.contains(&other.tag)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tagged(tag: &str, digest: &str, wasm: bool) -> Tagged {
        Tagged {
            tag: tag.into(),
            digest: digest.into(),
            config_media_type: if wasm {
                wasmless_artifact::oci::CONFIG_MEDIA_TYPE.into()
            } else {
                "application/vnd.oci.image.config.v1+json".into()
            },
        }
    }

    #[test]
    fn a_reference_by_digest_is_split() {
        let parsed = ManifestRef::parse("oci://10.0.0.1:5000/shop/hello@sha256:abc").unwrap();
        assert_eq!(
            (parsed.host.as_str(), parsed.repository.as_str(), parsed.digest.as_str()),
            ("10.0.0.1:5000", "shop/hello", "sha256:abc")
        );
        for bad in [
            "registry/shop/hello:tag",
            "registry@sha256:abc",
            "/shop/hello@sha256:abc",
            "r/x@md5:1",
        ] {
            assert!(ManifestRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn repositories_are_read_as_the_builder_names_them() {
        assert_eq!(function_of("shop/hello", ""), Some(("shop".into(), "hello".into())));
        assert_eq!(
            function_of("wasmless/shop/hello", "wasmless"),
            Some(("shop".into(), "hello".into()))
        );
        assert_eq!(function_of("other/shop/hello", "wasmless"), None);
        assert_eq!(function_of("shop/hello/extra", ""), None);
        assert_eq!(function_of("hello", ""), None);
    }

    #[test]
    fn only_the_builders_wasm_tags_no_kept_revision_needs_are_stale() {
        let kept = BTreeSet::from(["aaaaaaaaaa".to_string()]);
        let tags = [
            tagged("aaaaaaaaaa", "sha256:1", true),
            tagged("bbbbbbbbbb", "sha256:2", true),
            // Someone else's tag or image in the same repository: never touched.
            tagged("latest", "sha256:3", true),
            tagged("cccccccccc", "sha256:4", false),
            // The same module as a kept revision's: stays with it.
            tagged("dddddddddd", "sha256:1", true),
        ];
        let stale: Vec<_> = stale_tags(&tags, Some(&kept)).into_iter().map(|t| t.tag).collect();
        assert_eq!(stale, ["bbbbbbbbbb"]);
        // The Function is gone: every tag of the builder's form goes, each digest once.
        let gone: Vec<_> = stale_tags(&tags, None).into_iter().map(|t| t.digest).collect();
        assert_eq!(gone, ["sha256:1", "sha256:2"]);
    }

    #[test]
    fn plain_http_only_for_the_registries_named() {
        let registry = Registry::new(Some("10.0.0.1:5000, localhost:5000"));
        assert_eq!(
            registry.url("10.0.0.1:5000", "_catalog"),
            "http://10.0.0.1:5000/v2/_catalog"
        );
        assert_eq!(registry.url("ghcr.io", "_catalog"), "https://ghcr.io/v2/_catalog");
    }
}
