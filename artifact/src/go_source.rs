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
        let name = line.strip_prefix("package")?.trim_start();
        return name.split(|c: char| c.is_whitespace() || c == ';' || c == '/').next();
    }
    None
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
}
