//! Writes the Function CRD: `crdgen [PATH]` (default `crds/function.yaml`), or `crdgen -` to stdout.

use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).unwrap_or_else(|| "crds/function.yaml".into());
    let yaml = wasmless_operator::crd_yaml();
    if path == "-" {
        print!("{yaml}");
        return Ok(());
    }
    if let Some(dir) = std::path::Path::new(&path).parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&path, yaml).with_context(|| format!("writing {path}"))?;
    eprintln!("wrote {path}");
    Ok(())
}
