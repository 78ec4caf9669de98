//! How a build pod gets its Function's source: small ones through the pod's own
//! annotations (a downward API volume), larger ones from the source ConfigMap.

use super::SOURCE_KEY;
use crate::crd::Function;
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, DownwardAPIVolumeFile, DownwardAPIVolumeSource, KeyToPath, ObjectFieldSelector, Volume,
};
use std::collections::BTreeMap;

/// The pod annotation a source small enough travels in to its build pod, and the prefix of
/// each of its `spec.files`' (`wasmless.io/file.go.mod`).
pub const SOURCE_ANNOTATION: &str = "wasmless.io/source";
const FILE_ANNOTATION_PREFIX: &str = "wasmless.io/file.";
/// The key a file of `spec.files` is kept under in the source ConfigMap (and, after
/// [`FILE_ANNOTATION_PREFIX`], in a build pod's annotations): its name for the handler's
/// source and module files (as it always was, so an existing Function's source ConfigMap is
/// unchanged), `data.` and the name with each `/` written `..` for a file it ships. A key
/// holds no `/`; names hold no `..` and no segment starting with `.`, so no two names share
/// a key, and none is [`SOURCE_KEY`].
pub(super) fn file_key(language: crate::crd::Language, name: &str) -> String {
    let go = wasmless_formats::source::Language::Go;
    if language != crate::crd::Language::Go || go.is_handler_file(name) || go.module_file_names().contains(&name) {
        return name.to_string();
    }
    format!("data.{}", name.replace('/', ".."))
}

/// What the source and its files may add up to in annotations (the API server allows
/// 256 KiB of them per object).
pub(super) const INLINE_SOURCE_BYTES: usize = 128 * 1024;

/// A source small enough (and whose files' names can be annotation names), as the build
/// pod's own annotations and the downward API volume that writes them where the compiler
/// expects them. A ConfigMap volume makes the kubelet read the ConfigMap, which it may do
/// before the API server's node authorizer knows the new pod is on its node: then the read
/// is refused and the mount retried, seconds into every such build (measured: the builder
/// started 3.1 s after its pod was scheduled, 1 s without). The pod's own annotations need
/// no read. Larger sources are mounted from the source ConfigMap.
pub(super) fn inline_source(func: &Function, source_file: &str) -> Option<(BTreeMap<String, String>, Volume)> {
    let source = func.spec.inline_source()?;
    let size = source.len() + func.spec.files.values().map(String::len).sum::<usize>();
    let name_fits = |name: &str| {
        name.len() + FILE_ANNOTATION_PREFIX.len() - "wasmless.io/".len() <= 63
            && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    let key = |name: &str| file_key(func.spec.language, name);
    if size > INLINE_SOURCE_BYTES || !func.spec.files.keys().all(|name| name_fits(&key(name))) {
        return None;
    }
    let annotations: BTreeMap<String, String> = std::iter::once((SOURCE_ANNOTATION.to_string(), source.to_string()))
        .chain(
            func.spec
                .files
                .iter()
                .map(|(name, text)| (format!("{FILE_ANNOTATION_PREFIX}{}", key(name)), text.clone())),
        )
        .collect();
    let item = |annotation: &str, path: &str| DownwardAPIVolumeFile {
        path: path.into(),
        field_ref: Some(ObjectFieldSelector {
            field_path: format!("metadata.annotations['{annotation}']"),
            ..Default::default()
        }),
        ..Default::default()
    };
    let items = std::iter::once(item(SOURCE_ANNOTATION, source_file))
        .chain(
            func.spec
                .files
                .keys()
                .map(|name| item(&format!("{FILE_ANNOTATION_PREFIX}{}", key(name)), name)),
        )
        .collect();
    let volume = Volume {
        name: "source".into(),
        downward_api: Some(DownwardAPIVolumeSource {
            items: Some(items),
            ..Default::default()
        }),
        ..Default::default()
    };
    Some((annotations, volume))
}

/// The source ConfigMap, the source mounted under the file name the compiler expects and
/// each of `spec.files` under its own path (folders made by the kubelet).
pub(super) fn source_volume(configmap: &str, source_file: &str, func: &Function) -> Volume {
    let item = |key: &str, path: &str| KeyToPath {
        key: key.into(),
        path: path.into(),
        ..Default::default()
    };
    let items = std::iter::once(item(SOURCE_KEY, source_file))
        .chain(
            func.spec
                .files
                .keys()
                .map(|name| item(&file_key(func.spec.language, name), name)),
        )
        .collect();
    Volume {
        name: "source".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: configmap.into(),
            items: Some(items),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn function(files: serde_json::Value) -> Function {
        serde_json::from_value(json!({
            "apiVersion": "wasmless.io/v1alpha1",
            "kind": "Function",
            "metadata": {"name": "hello", "namespace": "shop", "uid": "u"},
            "spec": {"language": "go", "source": "package handlers\n", "files": files},
        }))
        .unwrap()
    }

    #[test]
    fn files_in_folders_reach_the_build_at_their_paths_under_keys_without_a_slash() {
        let func = function(json!({
            "go.mod": "module example.com/f\n",
            "countries.csv": "fr\n",
            "templates/index.html": "<p>",
        }));
        let (annotations, volume) = inline_source(&func, "handler.go").unwrap();
        assert_eq!(annotations["wasmless.io/file.go.mod"], "module example.com/f\n");
        assert_eq!(annotations["wasmless.io/file.data.templates..index.html"], "<p>");
        let paths: Vec<String> = volume
            .downward_api
            .unwrap()
            .items
            .unwrap()
            .into_iter()
            .map(|i| i.path)
            .collect();
        assert_eq!(paths, ["handler.go", "countries.csv", "go.mod", "templates/index.html"]);

        let volume = source_volume("hello-source", "handler.go", &func);
        let items: Vec<(String, String)> = volume
            .config_map
            .unwrap()
            .items
            .unwrap()
            .into_iter()
            .map(|i| (i.key, i.path))
            .collect();
        assert_eq!(
            items[1..],
            [
                ("data.countries.csv".to_string(), "countries.csv".to_string()),
                ("go.mod".to_string(), "go.mod".to_string()),
                (
                    "data.templates..index.html".to_string(),
                    "templates/index.html".to_string()
                ),
            ]
        );
        // A file the handler ships may be named `source`: its key is not the source's.
        assert_eq!(file_key(crate::crd::Language::Go, "source"), "data.source");
        assert_eq!(file_key(crate::crd::Language::Go, "routes.go"), "routes.go");
    }
}
