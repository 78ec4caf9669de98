//! `--traffic` (and the routes file it is read again from): the revisions a Function's
//! requests go to, with their shares, tags, modules and digests, checked as they are parsed.
//! A value type of the runtime's flags, apart from `split`, which serves it.

use wasmless_artifact::Digest;

/// One revision of `--traffic`, as the operator writes it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Target {
    pub revision: String,
    pub percent: u8,
    #[serde(default)]
    pub tag: Option<String>,
    /// Where the module is, as `--module` takes it.
    pub module: String,
    pub module_digest: String,
    /// Where its compiled code is, as `--code` takes it, with `codeDigest`.
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub code_digest: Option<String>,
}

/// `--traffic`: the revisions and their shares, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Traffic(pub Vec<Target>);

impl Traffic {
    /// Parses and checks `--traffic`'s JSON list.
    pub fn parse(text: &str) -> Result<Self, String> {
        let targets: Vec<Target> = serde_json::from_str(text).map_err(|error| {
            format!(
                "--traffic is a JSON list of {{\"revision\", \"percent\", \"tag\", \"module\", \"moduleDigest\", \"code\", \"codeDigest\"}}: {error}"
            )
        })?;
        if targets.is_empty() {
            return Err("--traffic names no revision: give at least one".into());
        }
        let total: u32 = targets.iter().map(|target| u32::from(target.percent)).sum();
        if total != 100 {
            return Err(format!(
                "--traffic's percents add up to {total}: they must add up to 100"
            ));
        }
        for (index, target) in targets.iter().enumerate() {
            let earlier = &targets[..index];
            if target.revision.is_empty() {
                return Err("a --traffic target has an empty revision name".into());
            }
            if earlier.iter().any(|other| other.revision == target.revision) {
                return Err(format!("--traffic names revision {} twice", target.revision));
            }
            if let Some(tag) = &target.tag
                && (tag.is_empty() || earlier.iter().any(|other| other.tag.as_ref() == Some(tag)))
            {
                return Err(format!("--traffic's tag {tag:?} is empty or given twice"));
            }
            if target.percent == 0 && target.tag.is_none() {
                return Err(format!(
                    "--traffic's revision {} has neither a share nor a tag: nothing could reach it",
                    target.revision
                ));
            }
            target
                .module_digest
                .parse::<Digest>()
                .map_err(|error| format!("revision {}'s moduleDigest: {error}", target.revision))?;
            match (&target.code, &target.code_digest) {
                (None, None) => {}
                (Some(_), Some(digest)) => {
                    digest
                        .parse::<Digest>()
                        .map_err(|error| format!("revision {}'s codeDigest: {error}", target.revision))?;
                }
                _ => {
                    return Err(format!(
                        "revision {} has one of code and codeDigest: give both or neither",
                        target.revision
                    ));
                }
            }
        }
        Ok(Self(targets))
    }
}
