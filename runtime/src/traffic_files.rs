//! The `--traffic-file`s a dedicated runtime follows, and which of them serves. The
//! operator gives its pods two: the pod's own `wasmless.io/routes` annotation (a downward
//! API file, rewritten to switch that pod in place within a few hundred milliseconds) and
//! its Function's `<fn>-routes` ConfigMap (which a pod started after a switch reads, so a
//! rollback or a split's new shares need no new pod template). Each holds
//! `{"generation": n, "routes": [...]}`, or a bare list (generation 0, as older operators
//! wrote it), or nothing (a pod never switched). The highest generation serves; on a tie the
//! first file, the pod's own, whose locations the operator wrote for what that pod mounts.

use std::path::PathBuf;

/// The routes list that serves, and the generation it came with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chosen {
    pub generation: u64,
    /// `--traffic`'s JSON list, as [`crate::traffic::Traffic::parse`] takes it.
    pub routes: String,
    /// The file it was read from, for the log.
    pub file: PathBuf,
}

impl Chosen {
    /// An empty list: the pods of a new Function, started while its first build runs.
    pub fn names_no_revision(&self) -> bool {
        serde_json::from_str::<Vec<serde_json::Value>>(&self.routes).is_ok_and(|list| list.is_empty())
    }
}

/// What one file says: nothing (empty), or a generation and its routes list.
fn read_document(text: &str) -> Result<Option<(u64, String)>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let value: serde_json::Value = serde_json::from_str(text).map_err(|error| {
        format!("is neither a JSON list of revisions nor {{\"generation\": n, \"routes\": [...]}}: {error}")
    })?;
    match value {
        serde_json::Value::Array(_) => Ok(Some((0, text.to_string()))),
        serde_json::Value::Object(mut document) => {
            let generation = document
                .get("generation")
                .and_then(serde_json::Value::as_u64)
                .ok_or("has no \"generation\" number")?;
            match document.remove("routes") {
                Some(routes @ serde_json::Value::Array(_)) => Ok(Some((generation, routes.to_string()))),
                _ => Err("has no \"routes\" list".into()),
            }
        }
        _ => Err("is neither a JSON list of revisions nor {\"generation\": n, \"routes\": [...]}".into()),
    }
}

/// The routes that serve among `files` (each path with its text): the highest generation,
/// the earliest file on a tie. A file that says nothing is passed over; one that cannot be
/// read as routes is passed over too, and reported, so a broken one never hides a good one.
pub fn choose(files: &[(PathBuf, String)]) -> (Option<Chosen>, Vec<String>) {
    let mut chosen: Option<Chosen> = None;
    let mut problems = Vec::new();
    for (file, text) in files {
        match read_document(text) {
            Ok(Some((generation, routes))) => {
                if chosen.as_ref().is_none_or(|best| generation > best.generation) {
                    chosen = Some(Chosen {
                        generation,
                        routes,
                        file: file.clone(),
                    });
                }
            }
            Ok(None) => {}
            Err(problem) => problems.push(format!("{} {problem}", file.display())),
        }
    }
    (chosen, problems)
}

/// Reads every file in `files`: `Err` names the first that cannot be read.
pub async fn read_all(files: &[PathBuf]) -> Result<Vec<(PathBuf, String)>, (PathBuf, std::io::Error)> {
    let mut read = Vec::with_capacity(files.len());
    for file in files {
        let bytes = tokio::fs::read(file).await.map_err(|error| (file.clone(), error))?;
        read.push((file.clone(), String::from_utf8_lossy(&bytes).into_owned()));
    }
    Ok(read)
}

/// `a.json, b.json`, for the log.
pub fn describe(files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|file| file.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(texts: &[&str]) -> Vec<(PathBuf, String)> {
        texts
            .iter()
            .enumerate()
            .map(|(index, text)| (PathBuf::from(format!("/f{index}")), text.to_string()))
            .collect()
    }

    #[test]
    fn the_higher_generation_serves_whichever_file_it_is_in() {
        let (chosen, problems) = choose(&files(&[
            r#"{"generation": 3, "routes": [{"revision": "a-1"}]}"#,
            r#"{"generation": 4, "routes": [{"revision": "a-2"}]}"#,
        ]));
        let chosen = chosen.unwrap();
        assert_eq!((chosen.generation, chosen.file), (4, PathBuf::from("/f1")));
        assert!(chosen.routes.contains("a-2"));
        assert!(problems.is_empty());
    }

    #[test]
    fn on_a_tie_the_pods_own_file_serves() {
        let (chosen, _) = choose(&files(&[
            r#"{"generation": 4, "routes": [{"revision": "mounted"}]}"#,
            r#"{"generation": 4, "routes": [{"revision": "through-the-api"}]}"#,
        ]));
        assert!(chosen.unwrap().routes.contains("mounted"));
    }

    #[test]
    fn an_empty_file_is_passed_over_and_a_bare_list_is_generation_zero() {
        let (chosen, problems) = choose(&files(&["", r#"[{"revision": "old"}]"#]));
        let chosen = chosen.unwrap();
        assert_eq!(chosen.generation, 0);
        assert_eq!(chosen.routes, r#"[{"revision": "old"}]"#);
        assert!(problems.is_empty());
        assert_eq!(choose(&files(&["", " \n"])).0, None);
    }

    #[test]
    fn a_broken_file_is_reported_and_does_not_hide_a_good_one() {
        let (chosen, problems) = choose(&files(&[r#"{"routes": []}"#, r#"{"generation": 1, "routes": []}"#]));
        assert_eq!(chosen.unwrap().routes, "[]");
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].contains("/f0") && problems[0].contains("generation"),
            "{problems:?}"
        );
        let (_, problems) = choose(&files(&["{\"generation\": 1, \"routes\": ", "7"]));
        assert_eq!(problems.len(), 2, "{problems:?}");
    }
}
