//! A pooled Function's module and code read from the builder's chunk ConfigMaps through the
//! Kubernetes API (`configmaps:<function>/<source digest>/<chunk count>`), rather than from
//! a ConfigMap volume: the pool serves Functions added after it started, and a volume is
//! fixed when the pod starts.
//!
//! A Function's own pod reads them so too when the operator switches it in place to a
//! revision built after it started (its volumes are fixed then): with its ServiceAccount's
//! token, whose Role may `get` only that Function's chunks.
//!
//! The client is one per process: the pool's (`--pool api:...`), set once it has
//! connected, or else made on the first read from the pod's in-cluster configuration. A
//! source is parsed from a Function's flags in several places (its tenant, the code
//! prefetch) that have no client of their own to pass.

use std::sync::OnceLock;
use wasmless_artifact::{Digest, Part};

/// The scheme of `--module` and `--code` values read through the API.
pub const SCHEME: &str = "configmaps:";

/// The chunk ConfigMaps of one Function's build: the names the builder wrote them under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigMapChunks {
    pub function: String,
    pub source_digest: Digest,
    pub count: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ChunkFetchError {
    #[error(
        "{source_text}: configmaps: sources are read through the Kubernetes API, with the pool's client (--pool api:<selector>) or the pod's ServiceAccount token, and this runtime has neither ({reason})"
    )]
    NoClient { source_text: String, reason: String },
    #[error("{source_text}: cannot read ConfigMap {name} in namespace {namespace}: {error}")]
    Api {
        source_text: String,
        name: String,
        namespace: String,
        // Boxed: kube's error is large, and every load's error carries this one.
        error: Box<kube::Error>,
    },
    #[error("{source_text}: ConfigMap {name} has no binary key {key}")]
    NoKey {
        source_text: String,
        name: String,
        key: &'static str,
    },
}

/// The pool's client and its namespace, where every chunk ConfigMap is read.
struct ChunkApi {
    configmaps: kube::Api<k8s_openapi::api::core::v1::ConfigMap>,
    namespace: String,
}

static API: OnceLock<ChunkApi> = OnceLock::new();

/// Makes `configmaps:` sources readable in this process, from `namespace`. Called once,
/// by the pool in API mode; a second call (or one after [`in_cluster`]) is ignored.
pub fn use_client(client: kube::Client, namespace: &str) {
    let _ = API.set(ChunkApi {
        configmaps: kube::Api::namespaced(client, namespace),
        namespace: namespace.to_string(),
    });
}

/// The process's client: the pool's, else one made now from the pod's in-cluster
/// configuration (its ServiceAccount's token and namespace).
fn in_cluster() -> Result<&'static ChunkApi, String> {
    if let Some(api) = API.get() {
        return Ok(api);
    }
    let config = kube::Config::incluster().map_err(|error| error.to_string())?;
    let namespace = config.default_namespace.clone();
    let client = kube::Client::try_from(config).map_err(|error| error.to_string())?;
    use_client(client, &namespace);
    tracing::info!(namespace = %namespace, "reading configmaps: sources with the pod's ServiceAccount");
    Ok(API.get().expect("a client was just set"))
}

impl ConfigMapChunks {
    /// `<function>/<sha256:hex>/<count>`, the text after `configmaps:`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let usage = "it is not configmaps:<function>/<source digest sha256:hex>/<chunk count>";
        let mut parts = text.split('/');
        let (Some(function), Some(digest), Some(count), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(usage.to_string());
        };
        if function.is_empty() {
            return Err(format!("{usage}: the function name is empty"));
        }
        let source_digest = digest
            .parse::<Digest>()
            .map_err(|error| format!("{usage}: {digest}: {error}"))?;
        let count = count
            .parse::<usize>()
            .ok()
            .filter(|count| *count > 0)
            .ok_or_else(|| format!("{usage}: the chunk count {count:?} is not a number above zero"))?;
        Ok(Self {
            function: function.to_string(),
            source_digest,
            count,
        })
    }

    /// The stored chunks of `part`, in index order, as the builder wrote them.
    pub async fn fetch(&self, part: Part) -> Result<Vec<Vec<u8>>, ChunkFetchError> {
        let source_text = self.to_string();
        let api = in_cluster().map_err(|reason| ChunkFetchError::NoClient {
            source_text: source_text.clone(),
            reason,
        })?;
        let key = part.configmap_key();
        let mut chunks = Vec::with_capacity(self.count);
        for name in part.configmap_names(&self.function, &self.source_digest, self.count) {
            let configmap = api.configmaps.get(&name).await.map_err(|error| ChunkFetchError::Api {
                source_text: source_text.clone(),
                name: name.clone(),
                namespace: api.namespace.clone(),
                error: Box::new(error),
            })?;
            let chunk = configmap
                .binary_data
                .and_then(|mut data| data.remove(key))
                .ok_or_else(|| ChunkFetchError::NoKey {
                    source_text: source_text.clone(),
                    name: name.clone(),
                    key,
                })?;
            chunks.push(chunk.0);
        }
        Ok(chunks)
    }
}

impl std::fmt::Display for ConfigMapChunks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{SCHEME}{}/{}/{}", self.function, self.source_digest, self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_function_source_digest_and_count() {
        let digest = Digest::of(b"source");
        let text = format!("hello/{digest}/3");
        let chunks = ConfigMapChunks::parse(&text).unwrap();
        assert_eq!(chunks.function, "hello");
        assert_eq!(chunks.source_digest, digest);
        assert_eq!(chunks.count, 3);
        assert_eq!(chunks.to_string(), format!("configmaps:{text}"));
        // The names the builder wrote.
        assert_eq!(
            Part::Module.configmap_names(&chunks.function, &chunks.source_digest, chunks.count)[2],
            format!("hello-module-{}-2", digest.short())
        );
    }

    #[test]
    fn says_what_is_wrong_with_a_malformed_source() {
        let digest = Digest::of(b"source");
        for (text, says) in [
            ("hello".to_string(), "configmaps:<function>/"),
            (format!("hello/{digest}"), "configmaps:<function>/"),
            (format!("hello/{digest}/3/4"), "configmaps:<function>/"),
            (format!("/{digest}/3"), "the function name is empty"),
            ("hello/md5:abc/3".to_string(), "md5:abc"),
            (format!("hello/{digest}/0"), "above zero"),
            (format!("hello/{digest}/many"), "\"many\""),
        ] {
            let error = ConfigMapChunks::parse(&text).unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
        }
    }

    #[tokio::test]
    async fn outside_a_pool_and_a_pod_reading_says_there_is_no_client() {
        let chunks = ConfigMapChunks::parse(&format!("hello/{}/1", Digest::of(b"source"))).unwrap();
        let error = chunks.fetch(Part::Module).await.unwrap_err().to_string();
        assert!(error.contains("--pool api:"), "{error}");
        assert!(error.contains("ServiceAccount token"), "{error}");
        assert!(error.contains("configmaps:hello/"), "{error}");
    }
}
