//! The builds of the density run's Functions, published as their build Jobs would.

use super::{CONCURRENT_PUBLISHES, Group, NAMESPACE, function_name, variant_source};
use crate::pool::with_custom_section;
use anyhow::Context;
use wasmless_artifact::Digest;

/// Where the run publishes its builds.
#[derive(Clone, Copy)]
pub(super) enum Storage<'a> {
    /// Chunk ConfigMaps in the run's namespace, which the operator finds by source digest.
    ConfigMaps,
    /// An OCI registry (`host:port`): the Functions say `storage: oci`, and what a build Job
    /// would have told the operator is written on each Function's status ([`Published::revision`]).
    Oci { registry: &'a str },
}

/// One Function's published build.
pub(super) struct Published {
    pub name: String,
    /// The bytes published: module and compiled code.
    pub bytes: usize,
    source_digest: Digest,
    module_digest: Digest,
    code_digest: Digest,
    /// `configmap://...` or `oci://registry/repository@sha256:...`.
    location: String,
}

impl Published {
    /// The revision a build Job's result makes the operator record on the Function's status:
    /// the only record of an OCI build (operator/src/controller/find.rs,
    /// `oci_module_from_status`).
    pub fn revision(&self, created: &str) -> serde_json::Value {
        serde_json::json!({
            "name": format!("{}-1", self.name),
            "sourceDigest": self.source_digest.to_string(),
            "moduleDigest": self.module_digest.to_string(),
            "codeDigest": self.code_digest.to_string(),
            "moduleRef": self.location,
            "created": created,
        })
    }
}

/// Publishes the build of each Function of `group` as its Job would, to `storage`. The size
/// of the native code of one, and each Function's build.
pub(super) async fn publish_group(
    group: &Group,
    wasm: &[u8],
    source: &str,
    builder_version: &str,
    storage: Storage<'_>,
) -> anyhow::Result<(usize, Vec<Published>)> {
    use futures::{StreamExt, TryStreamExt};
    use wasmless_host::precompiled::{compile_native, package};
    let engine = wasmless_host::precompiled::precompile_engine().map_err(|e| anyhow::anyhow!("{e:#}"))?;
    let abi = wasmless_host::abi::detect(wasm)?;
    let cwasm = compile_native(&engine, abi, wasm).map_err(|e| anyhow::anyhow!("{e:#}"))?;
    let engine_hash = wasmless_host::engine::engine_hash(&engine);
    let publishes = (group.first..group.first + group.count).map(|index| {
        let name = function_name(index);
        let variant = with_custom_section(wasm, &name);
        let digest = Digest::of(&variant);
        let source_digest = Digest::of_source(
            group.language,
            builder_version,
            variant_source(source, index).as_bytes(),
        );
        let artifact = package(&engine, abi, &cwasm, digest, false);
        let bytes = variant.len() + artifact.len();
        let code = wasmless_builder::CompiledCode {
            digest: Digest::of(&artifact),
            artifact,
            module_digest: digest,
            engine: engine_hash.clone(),
            target: wasmless_host::engine::PORTABLE_TARGET,
            seconds: 0.0,
            cache: "off",
            cache_problem: None,
            functions: None,
        };
        let built = wasmless_builder::Built {
            wasm: variant,
            digest,
            source_digest,
            cached: false,
            snapshot: None,
            cache: "miss",
            cache_problem: None,
            phases: Default::default(),
        };
        async move {
            use wasmless_builder::publish::Destination;
            let destination = match storage {
                Storage::ConfigMaps => Destination::ConfigMap {
                    namespace: NAMESPACE.into(),
                    function: name.clone(),
                },
                // As the operator names a build Job's (operator/src/objects/builder.rs).
                Storage::Oci { registry } => Destination::Oci {
                    reference: format!("{registry}/{NAMESPACE}/{name}:{}", source_digest.short()),
                },
            };
            let published = wasmless_builder::publish::publish(&destination, &built, Some(&code), &source_digest)
                .await
                .with_context(|| format!("publishing the build of {name}"))?;
            anyhow::Ok(Published {
                bytes,
                source_digest,
                module_digest: digest,
                code_digest: code.digest,
                location: published.location,
                name,
            })
        }
    });
    let published: Vec<Published> = futures::stream::iter(publishes)
        .buffer_unordered(CONCURRENT_PUBLISHES)
        .try_collect()
        .await?;
    Ok((cwasm.len(), published))
}

/// The builder version the operator digests sources with (its `WASMLESS_BUILDER_VERSION`,
/// else its builder image).
pub(super) fn operator_builder_version() -> anyhow::Result<String> {
    let env = super::cluster::operator_env()?;
    let value = |key: &str| {
        env.lines()
            .find_map(|line| line.strip_prefix(&format!("{key}=")))
            .filter(|value| !value.is_empty())
            .map(str::to_string)
    };
    value("WASMLESS_BUILDER_VERSION")
        .or_else(|| value("WASMLESS_BUILDER_IMAGE"))
        .context("the operator's Deployment sets neither WASMLESS_BUILDER_VERSION nor WASMLESS_BUILDER_IMAGE")
}
