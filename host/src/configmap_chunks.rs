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

use futures::{StreamExt, TryStreamExt};
use std::sync::OnceLock;
use wasmless_artifact::{Digest, MAX_CHUNK_BYTES, MAX_CODE_BYTES, MAX_MODULE_BYTES, Part, annotations};

/// The scheme of `--module` and `--code` values read through the API.
pub const SCHEME: &str = "configmaps:";

/// The most chunks a build can store for one part: the larger of its size limits (the
/// code's 1 GiB over the module's 256 MiB), with 1/64 more for a stream that did not
/// compress, in chunks of 900 KiB (1184). A count is read from an entry or a routes file,
/// and names are made for each before anything is fetched: a count past this is refused
/// rather than allocated.
pub const MAX_CHUNKS: usize = {
    let largest = if MAX_CODE_BYTES > MAX_MODULE_BYTES {
        MAX_CODE_BYTES
    } else {
        MAX_MODULE_BYTES
    };
    (largest + largest / 64).div_ceil(MAX_CHUNK_BYTES as u64) as usize
};
// Every chunk of the largest code artifact a build may store fits under the bound.
const _: () = assert!(MAX_CHUNKS >= (MAX_CODE_BYTES as usize).div_ceil(MAX_CHUNK_BYTES));

/// Chunk GETs one fetch keeps in flight: enough to overlap the API server's round trips.
/// Per fetch: a pool whose N Functions load at once (N first requests) has up to 4N GETs
/// in flight where it had N. Its loads ahead of requests go one at a time.
const CHUNK_GETS_IN_FLIGHT: usize = 4;

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
    #[error(
        "{source_text}: ConfigMap {name} says it is chunk {says} of the build, where this source reads chunk {index} of {count}: the chunks were written by something else than this build, or the source names the wrong count; rebuild the Function"
    )]
    Mismatch {
        source_text: String,
        name: String,
        says: String,
        index: usize,
        count: usize,
    },
    #[error(
        "{source_text}: {count} chunks is over the {MAX_CHUNKS} any build stores; the source is not one the operator wrote"
    )]
    TooManyChunks { source_text: String, count: usize },
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
        if count > MAX_CHUNKS {
            return Err(format!(
                "{usage}: the chunk count {count} is over the {MAX_CHUNKS} any build stores"
            ));
        }
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
        // The fields are public: a count made without `parse` is bounded here too.
        if self.count > MAX_CHUNKS {
            return Err(ChunkFetchError::TooManyChunks {
                source_text,
                count: self.count,
            });
        }
        let key = part.configmap_key();
        let names = part.configmap_names(&self.function, &self.source_digest, self.count);
        // A few GETs in flight at once, answered in index order: one at a time, a Go
        // Function's 7 chunks waited on 7 round trips through the API server and etcd, the
        // most of its first request from zero. The first failure in order stops the rest.
        let gets = names.into_iter().enumerate().map(|(index, name)| {
            let source_text = source_text.clone();
            async move {
                let configmap = api.configmaps.get(&name).await.map_err(|error| ChunkFetchError::Api {
                    source_text: source_text.clone(),
                    name: name.clone(),
                    namespace: api.namespace.clone(),
                    error: Box::new(error),
                })?;
                self.check_place(&configmap, &name, index)?;
                configmap
                    .binary_data
                    .and_then(|mut data| data.remove(key))
                    .map(|chunk| chunk.0)
                    .ok_or(ChunkFetchError::NoKey { source_text, name, key })
            }
        });
        futures::stream::iter(gets)
            .buffered(CHUNK_GETS_IN_FLIGHT)
            .try_collect()
            .await
    }

    /// A chunk annotated with its place (the builder writes its index and the count on each)
    /// must be at the place this source reads it: a count that differs means another set of
    /// chunks. Digests are checked after the chunks are joined; this says what went wrong
    /// before that, and no GET starts after it (those in flight are dropped).
    fn check_place(
        &self,
        configmap: &k8s_openapi::api::core::v1::ConfigMap,
        name: &str,
        index: usize,
    ) -> Result<(), ChunkFetchError> {
        let annotations = configmap.metadata.annotations.as_ref();
        let annotation = |key: &str| annotations.and_then(|annotations| annotations.get(key));
        let (says_index, says_count) = (
            annotation(annotations::CHUNK_INDEX),
            annotation(annotations::CHUNK_COUNT),
        );
        let agrees =
            |says: Option<&String>, expected: usize| says.is_none_or(|says| says.trim() == expected.to_string());
        if agrees(says_index, index) && agrees(says_count, self.count) {
            return Ok(());
        }
        let shown = |says: Option<&String>| says.map_or("?".to_string(), |says| says.trim().to_string());
        Err(ChunkFetchError::Mismatch {
            source_text: self.to_string(),
            name: name.to_string(),
            says: format!("{} of {}", shown(says_index), shown(says_count)),
            index,
            count: self.count,
        })
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

    #[test]
    fn a_chunk_count_past_what_any_build_stores_is_refused_before_anything_is_allocated() {
        let digest = Digest::of(b"source");
        ConfigMapChunks::parse(&format!("hello/{digest}/{MAX_CHUNKS}")).unwrap();
        for count in [MAX_CHUNKS + 1, usize::MAX] {
            let error = ConfigMapChunks::parse(&format!("hello/{digest}/{count}")).unwrap_err();
            assert!(error.contains(&format!("over the {MAX_CHUNKS}")), "{error}");
        }
    }

    #[test]
    fn a_chunk_annotated_with_another_place_is_an_error_naming_both() {
        let chunks = ConfigMapChunks::parse(&format!("hello/{}/2", Digest::of(b"source"))).unwrap();
        let annotated = |index: &str, count: &str| -> k8s_openapi::api::core::v1::ConfigMap {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "chunk", "annotations": {
                annotations::CHUNK_INDEX: index, annotations::CHUNK_COUNT: count,
            }}}))
            .unwrap()
        };
        chunks.check_place(&annotated("1", "2"), "chunk", 1).unwrap();
        chunks
            .check_place(&k8s_openapi::api::core::v1::ConfigMap::default(), "chunk", 1)
            .unwrap();
        for (index, count) in [("1", "3"), ("0", "2"), ("1", "99999999999999999999")] {
            let error = chunks
                .check_place(&annotated(index, count), "chunk", 1)
                .unwrap_err()
                .to_string();
            assert!(error.contains(&format!("chunk {index} of {count}")), "{error}");
            assert!(error.contains("chunk 1 of 2"), "{error}");
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
