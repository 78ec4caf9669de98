//! The flags reference pages (`docs/reference/<binary>.md`), written from each binary's own
//! `clap` command, so the page says what `--help` says: a test in each crate renders its
//! command with [`page`] and holds the committed page to it with [`check`].

use std::path::Path;

/// What makes [`check`] write the page instead of comparing it.
const WRITE: &str = "WASMLESS_WRITE_REFERENCE";

/// The page for `command`: its long help, then each visible sub-command's, in the order
/// `--help` lists them. Environment variables' values are hidden, so the page does not
/// depend on the shell that rendered it.
pub fn page(command: clap::Command, intro: &str) -> String {
    let mut command = command.mut_args(|arg| arg.hide_env_values(true));
    let name = command.get_name().to_string();
    let mut out = format!(
        "# `{name}`\n\n{intro}\n\nWritten from the binary's own flags by a test (`{WRITE}=1 cargo test --release --workspace flags_reference` rewrites it): what follows is what `{name} --help` prints.\n"
    );
    command.build();
    section(&mut out, &mut command, &name);
    out
}

fn section(out: &mut String, command: &mut clap::Command, path: &str) {
    let help = command.render_long_help().to_string();
    let help: Vec<&str> = help.lines().map(str::trim_end).collect();
    out.push_str(&format!("\n## `{path}`\n\n```text\n{}\n```\n", help.join("\n").trim()));
    for sub in command.get_subcommands_mut() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        let path = format!("{path} {}", sub.get_name());
        section(out, sub, &path);
    }
}

/// Holds the committed `page_path` (relative to the workspace root `root`) to `rendered`,
/// or writes it when `WASMLESS_WRITE_REFERENCE` is set.
pub fn check(root: &Path, page_path: &str, rendered: &str) {
    let path = root.join(page_path);
    if std::env::var_os(WRITE).is_some() {
        std::fs::write(&path, rendered).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == rendered,
        "{page_path} is not what the binary's flags say: run `{WRITE}=1 cargo test --release --workspace flags_reference` and commit the page"
    );
}
