//! The builds of the density run's Functions, published as their build Jobs would.

use super::{CONCURRENT_PUBLISHES, Group, NAMESPACE, function_name, variant_source};
use crate::pool::with_custom_section;
use anyhow::Context;
use wasmless_artifact::Digest;

/// Publishes the build of each Function of `group` as its Job would. The size of the
/// native code of one, and the bytes published in all.
pub(super) async fn publish_group(
    group: &Group,
    wasm: &[u8],
    source: &str,
    builder_version: &str,
) -> anyhow::Result<(usize, usize)> {
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
            let destination = wasmless_builder::publish::Destination::ConfigMap {
                namespace: NAMESPACE.into(),
                function: name.clone(),
            };
            wasmless_builder::publish::publish(&destination, &built, Some(&code), &source_digest)
                .await
                .with_context(|| format!("publishing the build of {name}"))?;
            anyhow::Ok(bytes)
        }
    });
    let sizes: Vec<usize> = futures::stream::iter(publishes)
        .buffer_unordered(CONCURRENT_PUBLISHES)
        .try_collect()
        .await?;
    Ok((cwasm.len(), sizes.iter().sum()))
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
