//! Writes the Function CRD: `crdgen [PATH]` (default `crds/function.yaml`), or `crdgen -` to
//! stdout; `crdgen --reference [PATH]` writes the reference page made from its schema instead
//! (default `docs/reference/function.md`).

use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let reference = args.first().is_some_and(|a| a == "--reference");
    if reference {
        args.remove(0);
    }
    let (default, text) = match reference {
        true => (
            "docs/reference/function.md",
            wasmless_operator::crd::reference_markdown(),
        ),
        false => ("crds/function.yaml", wasmless_operator::crd_yaml()),
    };
    let path = args.first().cloned().unwrap_or_else(|| default.into());
    if path == "-" {
        print!("{text}");
        return Ok(());
    }
    if let Some(dir) = std::path::Path::new(&path).parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&path, text).with_context(|| format!("writing {path}"))?;
    eprintln!("wrote {path}");
    Ok(())
}
