//! Where the pool's table comes from (`--pool`): a directory of `<name>.json` files,
//! re-read when it changes, or the ConfigMaps a label selector picks, watched through the
//! Kubernetes API (`api:<selector>`). Both hand whole tables to the one apply path,
//! [`Pool::apply`], so a Function behaves the same whichever wrote its entry.

use super::{Pool, api, table};
use crate::ServeError;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The prefix of `--pool` that selects the API.
pub const API_PREFIX: &str = "api:";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableSource {
    Dir(PathBuf),
    /// ConfigMaps of the pool's namespace matching this label selector.
    Api {
        selector: String,
    },
}

impl TableSource {
    /// `--pool`'s value: `api:<label selector>`, else a directory.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.strip_prefix(API_PREFIX) {
            Some(selector) => api::parse_selector(selector).map(|selector| Self::Api { selector }),
            None => Ok(Self::Dir(PathBuf::from(text))),
        }
    }

    /// Applies the first table and then follows the source until the process ends. A
    /// directory is read before this returns (one that cannot be read stops the pool from
    /// starting), then re-read when it changes, every `interval`. The API is connected to
    /// here; its first complete list arrives later, and the pool is not ready until then.
    pub async fn follow(&self, pool: Arc<Pool>, interval: Duration) -> Result<(), ServeError> {
        match self {
            Self::Dir(dir) => {
                pool.apply(table::read(dir)?);
                tracing::info!(functions = pool.len(), table = %dir.display(), "pool table read");
                tokio::spawn(watch_dir(dir.clone(), pool, interval));
            }
            Self::Api { selector } => {
                let watcher = api::ApiTable::connect(selector).await?;
                tokio::spawn(watcher.run(pool));
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for TableSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Dir(dir) => write!(f, "{}", dir.display()),
            Self::Api { selector } => write!(f, "{API_PREFIX}{selector}"),
        }
    }
}

/// Re-reads the directory whenever its fingerprint changes.
async fn watch_dir(dir: PathBuf, pool: Arc<Pool>, interval: Duration) {
    let mut last = table::fingerprint(&dir);
    loop {
        tokio::time::sleep(interval).await;
        let now = table::fingerprint(&dir);
        if now == last {
            continue;
        }
        last = now;
        match table::read(&dir) {
            Ok(table) => pool.apply(table),
            Err(error) => tracing::warn!(%error, "cannot read the pool's table; serving on as before"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_prefix_selects_the_api_and_anything_else_is_a_directory() {
        assert_eq!(
            TableSource::parse("api:wasmless.io/component=pool-entry").unwrap(),
            TableSource::Api {
                selector: "wasmless.io/component=pool-entry".into()
            }
        );
        assert_eq!(
            TableSource::parse("/etc/wasmless/pool").unwrap(),
            TableSource::Dir("/etc/wasmless/pool".into())
        );
        assert!(TableSource::parse("api:").unwrap_err().contains("selector"));
    }
}
