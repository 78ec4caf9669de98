//! The operator's flags reference page is what its `--help` says.

use clap::CommandFactory;

#[test]
fn flags_reference() {
    let page = wasmless_testkit::flags_reference::page(
        wasmless_operator::flags::Args::command(),
        "The operator's flags, each also an environment variable; the Helm chart's values set them (`docs/install.md`), and so does `deploy/operator.yaml`.",
    );
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    wasmless_testkit::flags_reference::check(root, "docs/reference/wasmless-operator.md", &page);
}
