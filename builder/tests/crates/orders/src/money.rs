//! Cents as a decimal amount: a second file of the handler's crate.

pub fn format(cents: u64) -> String {
    format!("{}.{:02}", cents / 100, cents % 100)
}
