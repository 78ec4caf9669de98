//! The routes a Function's pods serve from: `--traffic`'s JSON list, which is also the pods'
//! routes annotation, and the split as people read it.

use super::*;

/// `--traffic`'s JSON list (and [`ROUTES_ANNOTATION`]'s) for `shares`, each read from its
/// directory under [`REVISIONS_DIR`] or its OCI artifact.
pub fn routes_json(shares: &[Share]) -> String {
    routes_json_reading(shares, |_| true, "").expect("every revision mounted")
}

/// [`routes_json`] for a pod that has only the revisions `mounted` says under
/// [`REVISIONS_DIR`]: a revision in ConfigMaps it has not is read through the API
/// (`configmaps:<function>/<source digest>/<count>`) where `function` is given (the pod
/// runs as its chunk reader), else the pod cannot serve it (`None`).
pub fn routes_json_reading(shares: &[Share], mounted: impl Fn(&str) -> bool, function: &str) -> Option<String> {
    let mut targets = Vec::with_capacity(shares.len());
    for share in shares {
        let code = share.module.code.as_ref();
        let (module, code_location) = match &share.module.location {
            ModuleLocation::ConfigMaps { .. } if mounted(&share.revision) => {
                let dir = format!("{REVISIONS_DIR}/{}", share.revision);
                (dir.clone(), dir)
            }
            ModuleLocation::ConfigMaps { .. } if function.is_empty() => return None,
            ModuleLocation::ConfigMaps { count } => {
                let digest = &share.module.source_digest;
                let code_chunks = code.map_or(0, |code| code.chunks);
                (
                    format!("configmaps:{function}/{digest}/{count}"),
                    format!("configmaps:{function}/{digest}/{code_chunks}"),
                )
            }
            ModuleLocation::Oci { reference } => {
                let location = format!("{}{reference}", wasmless_artifact::oci::SCHEME);
                (location.clone(), location)
            }
        };
        targets.push(serde_json::json!({
            "revision": share.revision,
            "percent": share.percent,
            "tag": share.tag,
            "module": module,
            "moduleDigest": share.module.digest.to_string(),
            "code": code.map(|_| code_location),
            "codeDigest": code.map(|code| code.digest.to_string()),
        }));
    }
    Some(serde_json::Value::from(targets).to_string())
}

/// `hello-1 90%, hello-2 10% (canary)`: a split for people, in the pods' annotation and
/// the Function's status.
pub fn traffic_summary(shares: &[Share]) -> String {
    shares
        .iter()
        .map(|share| match &share.tag {
            Some(tag) => format!("{} {}% ({tag})", share.revision, share.percent),
            None => format!("{} {}%", share.revision, share.percent),
        })
        .collect::<Vec<_>>()
        .join(", ")
}
