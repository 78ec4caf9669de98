//! The handler-source contract the builder and the operator both check before any
//! compiler runs.

/// The package name of Go source: the first `package` clause outside comments.
pub fn go_package(source: &str) -> Option<&str> {
    let mut in_block_comment = false;
    for line in source.lines() {
        let mut line = line.trim();
        if in_block_comment {
            match line.find("*/") {
                Some(end) => {
                    in_block_comment = false;
                    line = line[end + 2..].trim();
                }
                None => continue,
            }
        }
        if let Some(rest) = line.strip_prefix("/*") {
            match rest.find("*/") {
                Some(end) => line = rest[end + 2..].trim(),
                None => {
                    in_block_comment = true;
                    continue;
                }
            }
        }
        if line.is_empty() || line.starts_with("//") {
            continue;
        }
        return package_name(line.strip_prefix("package")?);
    }
    None
}

/// The identifier of a package clause after its keyword, if the clause is one Go accepts
/// on one line: a space, the name, then nothing but `;` or a comment.
fn package_name(rest: &str) -> Option<&str> {
    if !rest.starts_with(char::is_whitespace) {
        return None; // `packagehandlers` is an identifier, `package` alone names nothing
    }
    let rest = rest.trim_start();
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    let (name, after) = rest.split_at(end);
    let starts_like_identifier = name.starts_with(|c: char| c.is_alphabetic() || c == '_');
    let after = after.trim_start();
    let ends_clause = after.is_empty() || after.starts_with(';') || after.starts_with("//") || after.starts_with("/*");
    (starts_like_identifier && ends_clause).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_package_reads_past_comments() {
        assert_eq!(
            go_package("// Package x\n/* a\nb */\npackage handlers\n"),
            Some("handlers")
        );
        assert_eq!(go_package("package main\nfunc main() {}"), Some("main"));
        assert_eq!(go_package("func Handler() {}"), None);
    }

    /// Found by the `go_source` fuzz target: whatever followed `package` up to a space was
    /// taken as the name, so `package han\0dlers` named package "han\0dlers" and a bare
    /// `package` named "".
    #[test]
    fn the_name_is_a_go_identifier_or_there_is_no_clause() {
        assert_eq!(go_package("package han\0dlers\n"), None);
        assert_eq!(go_package("package\n"), None);
        assert_eq!(go_package("packagehandlers\n"), None);
        assert_eq!(go_package("package 9lives\n"), None);
        assert_eq!(go_package("package handlers{}\n"), None);
        assert_eq!(go_package("package handlers // the handler\n"), Some("handlers"));
        assert_eq!(go_package("package handlers/* the handler */\n"), Some("handlers"));
        assert_eq!(go_package("package\thandlers; import \"net/http\""), Some("handlers"));
        assert_eq!(go_package("package _x\n"), Some("_x"));
        assert_eq!(go_package("package café\n"), Some("café"));
    }
}
