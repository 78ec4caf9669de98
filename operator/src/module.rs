//! The module a Function serves (with its compiled code), and the pod-template annotations
//! that record it in both directions: written on the runtime Deployment, read back from it
//! to keep serving that module while a build runs or after one failed.

use std::collections::BTreeMap;
use wasmless_artifact::{Digest, annotations};

/// Pod template annotation: how many chunk ConfigMaps the module has (ConfigMap storage).
pub const CHUNK_COUNT_ANNOTATION: &str = annotations::CHUNK_COUNT;
/// Pod template annotation: the source digest the module was built from.
pub const SOURCE_DIGEST_ANNOTATION: &str = "wasmless.io/source-digest";
/// Pod template annotation: the OCI reference of the module (OCI storage).
pub const MODULE_REF_ANNOTATION: &str = "wasmless.io/module-ref";
/// Pod template annotation: how many chunk ConfigMaps the compiled code has.
pub const CODE_CHUNK_COUNT_ANNOTATION: &str = "wasmless.io/code-chunk-count";
/// Every annotation [`Module::write_pod_annotations`] may write: what a pod switched to
/// another revision in place has rewritten (or removed).
pub const POD_ANNOTATIONS: [&str; 7] = [
    annotations::CODE_DIGEST,
    CODE_CHUNK_COUNT_ANNOTATION,
    annotations::MODULE_DIGEST,
    SOURCE_DIGEST_ANNOTATION,
    annotations::MODULE_SIZE,
    CHUNK_COUNT_ANNOTATION,
    MODULE_REF_ANNOTATION,
];

/// A built module and where the runtime finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    pub digest: Digest,
    pub size: Option<u64>,
    /// The source it was built from (names the chunk ConfigMaps).
    pub source_digest: Digest,
    pub location: ModuleLocation,
    /// The builder's compiled code, stored beside the module: absent for a prebuilt module
    /// and for builds made before there was any (their pods compile the module).
    pub code: Option<Code>,
}

/// Compiled code, pinned by the digest of the stored artifact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Code {
    pub digest: Digest,
    /// Its chunk ConfigMaps `<fn>-code-<10 hex of source digest>-<i>`, when the module is
    /// stored in ConfigMaps (for OCI, the code is a layer of the module's artifact).
    pub chunks: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModuleLocation {
    /// `count` chunk ConfigMaps `<fn>-module-<10 hex of source digest>-<i>`.
    ConfigMaps { count: usize },
    /// An OCI reference the runtime pulls (`registry/repo@sha256:...`, without `oci://`).
    Oci { reference: String },
}

impl Module {
    /// What status.moduleRef says about it.
    pub fn reference(&self, function: &str) -> String {
        match &self.location {
            ModuleLocation::ConfigMaps { count } => format!(
                "configmap://{}-module-{}-{{0..{}}}",
                function,
                self.source_digest.short(),
                count.saturating_sub(1)
            ),
            ModuleLocation::Oci { reference } => format!("{}{reference}", wasmless_artifact::oci::SCHEME),
        }
    }

    /// Records this module in a pod template's annotations, for [`Module::from_pod_annotations`].
    pub fn write_pod_annotations(&self, annotations: &mut BTreeMap<String, String>) {
        let mut set = |key: &str, value: String| {
            annotations.insert(key.into(), value);
        };
        if let Some(code) = &self.code {
            set(annotations::CODE_DIGEST, code.digest.to_string());
            if code.chunks > 0 {
                set(CODE_CHUNK_COUNT_ANNOTATION, code.chunks.to_string());
            }
        }
        set(annotations::MODULE_DIGEST, self.digest.to_string());
        set(SOURCE_DIGEST_ANNOTATION, self.source_digest.to_string());
        if let Some(size) = self.size {
            set(annotations::MODULE_SIZE, size.to_string());
        }
        match &self.location {
            ModuleLocation::ConfigMaps { count } => set(CHUNK_COUNT_ANNOTATION, count.to_string()),
            ModuleLocation::Oci { reference } => set(MODULE_REF_ANNOTATION, reference.clone()),
        }
    }

    /// The module a pod template's annotations record, as [`Module::write_pod_annotations`]
    /// wrote them; `None` when they do not name one whole.
    pub fn from_pod_annotations(annotations: &BTreeMap<String, String>) -> Option<Module> {
        let location = match annotations.get(MODULE_REF_ANNOTATION) {
            Some(reference) => ModuleLocation::Oci {
                reference: reference.clone(),
            },
            None => ModuleLocation::ConfigMaps {
                count: annotations.get(CHUNK_COUNT_ANNOTATION)?.parse().ok()?,
            },
        };
        Some(Module {
            digest: annotations.get(annotations::MODULE_DIGEST)?.parse().ok()?,
            size: annotations.get(annotations::MODULE_SIZE).and_then(|s| s.parse().ok()),
            source_digest: annotations.get(SOURCE_DIGEST_ANNOTATION)?.parse().ok()?,
            location,
            code: annotations
                .get(annotations::CODE_DIGEST)
                .and_then(|d| d.parse().ok())
                .map(|digest| Code {
                    digest,
                    chunks: annotations
                        .get(CODE_CHUNK_COUNT_ANNOTATION)
                        .and_then(|c| c.parse().ok())
                        .unwrap_or(0),
                }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_annotations_read_back_the_module_they_record() {
        let digest = |text: &str| Digest::of(text.as_bytes());
        let modules = [
            Module {
                digest: digest("m"),
                size: Some(12),
                source_digest: digest("s"),
                location: ModuleLocation::ConfigMaps { count: 3 },
                code: Some(Code {
                    digest: digest("c"),
                    chunks: 2,
                }),
            },
            Module {
                digest: digest("m"),
                size: None,
                source_digest: digest("m"),
                location: ModuleLocation::Oci {
                    reference: format!("registry.local/fns/hello@{}", digest("manifest")),
                },
                code: Some(Code {
                    digest: digest("c"),
                    chunks: 0,
                }),
            },
            Module {
                digest: digest("m"),
                size: Some(1),
                source_digest: digest("s"),
                location: ModuleLocation::ConfigMaps { count: 1 },
                code: None,
            },
        ];
        for module in modules {
            let mut annotations = BTreeMap::from([("prometheus.io/scrape".to_string(), "true".to_string())]);
            module.write_pod_annotations(&mut annotations);
            assert_eq!(Module::from_pod_annotations(&annotations), Some(module));
        }
        assert_eq!(Module::from_pod_annotations(&BTreeMap::new()), None);
    }
}
