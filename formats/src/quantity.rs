//! Quantities as people write them in flags and Function specs: byte sizes the way
//! Kubernetes writes them (`64Mi`) and durations (`250ms`, `10s`).

use std::time::Duration;

/// Parses a byte quantity as Kubernetes writes it: `512`, `64Ki`, `64Mi`, `1Gi`,
/// `100k`, `100M`.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size: write a number with an optional unit, like 64Mi"))?;
    let multiplier: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => return Err(format!("{text:?} has unknown unit {unit:?}: use Ki, Mi, Gi, k, M or G")),
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// Parses a duration: `250ms`, `10s`, `2m`, `1h`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration: write a number with a unit, like 10s or 250ms"))?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return Err(format!("{text:?} has unknown unit {unit:?}: use ms, s, m or h")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("{text:?} is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_kubernetes_units() {
        assert_eq!(parse_bytes("64Mi"), Ok(64 << 20));
        assert_eq!(parse_bytes("1Gi"), Ok(1 << 30));
        assert_eq!(parse_bytes("100k"), Ok(100_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("64MB").unwrap_err().contains("unknown unit"));
        assert!(parse_bytes("lots").unwrap_err().contains("not a size"));
    }

    #[test]
    fn durations_take_common_units() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("10 parsecs").is_err());
    }
}
