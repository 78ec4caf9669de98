//! What the schema cannot check, reported on status (`InvalidSpec`) and by `wasmless deploy`.

use super::*;

impl FunctionSpec {
    /// The inline source, from `source` or Goless's `function`.
    pub fn inline_source(&self) -> Option<&str> {
        self.source.as_deref().or(self.function.as_deref())
    }

    /// What is wrong with this spec that the schema did not (or could not) refuse, in
    /// words for status. Empty when the spec can be built.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.language == Language::Unknown {
            problems.push("language is not one of go, rust, wat, wasm".to_string());
        }
        let sources = [self.source.is_some(), self.function.is_some(), self.module.is_some()];
        if sources.iter().filter(|set| **set).count() != 1 {
            problems.push("exactly one of source, function (the Goless field) or module must be set".to_string());
        }
        if let Some(source) = self.inline_source() {
            if source.trim().is_empty() {
                problems.push("source is empty".to_string());
            } else if source.len() > MAX_SOURCE_BYTES {
                problems.push(format!(
                    "source is {} bytes, over the {MAX_SOURCE_BYTES}-byte limit",
                    source.len()
                ));
            } else if self.language == Language::Go {
                match wasmless_artifact::go_package(source) {
                    Some("handlers") => {}
                    Some(other) => problems.push(format!(
                        "Go source must be `package handlers` (the Goless convention; Wasmless generates main), not `package {other}`"
                    )),
                    None => problems.push("Go source has no package clause; write `package handlers`".to_string()),
                }
            }
            if self.language == Language::Wasm {
                problems.push("language wasm takes a prebuilt module (spec.module), not inline source".to_string());
            }
            problems.extend(self.files_problems(source));
        }
        if let Some(module) = &self.module
            && self.language != Language::Wasm
        {
            problems.push(format!(
                "module {} is prebuilt: set language: wasm (it is {})",
                module.image,
                self.language.as_str()
            ));
        }
        if !(1..=65535).contains(&self.server_port) {
            problems.push(format!("serverPort {} is not a port (1-65535)", self.server_port));
        }
        if self.server_port == i32::from(wasmless_artifact::ports::ADMIN) {
            // The Service carries both ports, and the API server refuses two of one number.
            problems.push(format!(
                "serverPort {} is the Service's metrics port (the runtime's admin port): choose another, such as 8080",
                self.server_port
            ));
        }
        if self.limits.isolation == Isolation::Unknown {
            problems.push("limits.isolation is not one of request, shared".to_string());
        }
        if self.replicas < 0 {
            problems.push(format!("replicas {} is negative", self.replicas));
        }
        if let Some(outbound) = &self.outbound {
            problems.extend(outbound.problems());
        }
        problems
    }
}

impl FunctionSpec {
    /// What is wrong with `files` beside the inline `source`: names, the total size, and
    /// what the builder would refuse of them anyway.
    fn files_problems(&self, source: &str) -> Vec<String> {
        use wasmless_formats::source::{self as formats, Language as SourceLanguage, SourceError};
        let mut problems = Vec::new();
        if self.files.is_empty() {
            return problems;
        }
        let language = match self.language {
            Language::Go => SourceLanguage::Go,
            Language::Rust => SourceLanguage::Rust,
            Language::Wat => SourceLanguage::Wat,
            Language::Wasm | Language::Unknown => return problems,
        };
        if self.files.len() > formats::MAX_FILES {
            problems.push(format!(
                "files holds {} files, over the limit of {}: leave out what the handler does not need (wasmless deploy reads .wasmlessignore)",
                self.files.len(),
                formats::MAX_FILES
            ));
        }
        for name in self.files.keys() {
            if name == self.language.source_file_name() {
                problems.push(format!(
                    "files has {name}, the name the source itself is built as: give that file another name"
                ));
            } else if let Some(problem) = formats::file_name_problem(language, name) {
                problems.push(format!("files: {problem}"));
            }
        }
        let names = self.files.keys().map(String::as_str);
        if let Some(problem) = formats::case_clash(names.chain([self.language.source_file_name()])) {
            problems.push(format!("files: {problem}"));
        }
        let total = source.len() + self.files.values().map(String::len).sum::<usize>();
        if total > MAX_SOURCE_BYTES {
            let mut largest: Vec<(&String, usize)> = self.files.iter().map(|(name, text)| (name, text.len())).collect();
            largest.sort_by_key(|file| std::cmp::Reverse(file.1));
            let named: Vec<String> = largest
                .iter()
                .take(3)
                .map(|(name, size)| format!("{name} ({size} bytes)"))
                .collect();
            problems.push(format!(
                "source and files are {total} bytes together, over the {MAX_SOURCE_BYTES}-byte limit (the largest files: {}): leave out what the handler does not need, or build the module yourself and use language wasm",
                named.join(", ")
            ));
        }
        if self.files.contains_key("go.sum") && !self.files.contains_key("go.mod") {
            problems.push(SourceError::GoSumWithoutGoMod.to_string());
        }
        if self.files.contains_key("Cargo.lock") && !self.files.contains_key("Cargo.toml") {
            problems.push(SourceError::CargoLockWithoutCargoToml.to_string());
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(files: serde_json::Value) -> FunctionSpec {
        serde_json::from_value(json!({"language": "go", "source": "package handlers\n", "files": files})).unwrap()
    }

    #[test]
    fn files_beside_a_go_handler_may_be_in_folders_and_say_what_to_do_when_wrong() {
        let ok = spec(json!({"countries.csv": "fr\n", "templates/index.html": "<p>", "go.mod": "module f\n"}));
        assert_eq!(ok.problems(), Vec::<String>::new());
        for (name, said) in [
            ("../x.csv", ".. segment"),
            ("/etc/passwd", "absolute path"),
            ("a//b.csv", "empty segment"),
            ("templates/.secret", "starts with '.'"),
            ("handler.go", "the name the source itself is built as"),
            ("wasmless_main/main.go", "the builder writes its own code"),
        ] {
            let problems = spec(json!({ name: "x" })).problems();
            assert!(problems.iter().any(|p| p.contains(said)), "{name}: {problems:?}");
        }
        let half = "x".repeat(MAX_SOURCE_BYTES / 2);
        let problems = spec(json!({"a.csv": half, "b.csv": half})).problems();
        assert!(
            problems
                .iter()
                .any(|p| p.contains("over the") && p.contains("a.csv (") && p.contains("leave out")),
            "{problems:?}"
        );
        let many: serde_json::Map<String, serde_json::Value> =
            (0..=64).map(|i| (format!("data/{i}.txt"), json!("x"))).collect();
        let problems = spec(serde_json::Value::Object(many)).problems();
        assert!(
            problems.iter().any(|p| p.contains("over the limit of 64")),
            "{problems:?}"
        );
    }

    #[test]
    fn a_rust_handler_ships_no_data_files_yet_and_says_how_instead() {
        let rust: FunctionSpec =
            serde_json::from_value(json!({"language": "rust", "source": "x", "files": {"data.csv": "1"}})).unwrap();
        assert!(rust.problems().iter().any(|p| p.contains("include_str!")));
    }
}
