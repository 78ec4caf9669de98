//! Which namespace asks: the name each socket serves.

/// A namespace's name, as Kubernetes allows it (a DNS label): safe as a directory's name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Namespace(String);

impl Namespace {
    pub fn new(name: &str) -> Result<Self, String> {
        let valid = !name.is_empty()
            && name.len() <= 63
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !name.starts_with('-')
            && !name.ends_with('-');
        match valid {
            true => Ok(Self(name.to_string())),
            false => Err(format!(
                "{name:?} is not a namespace's name (lowercase letters, digits and '-', at most 63)"
            )),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
