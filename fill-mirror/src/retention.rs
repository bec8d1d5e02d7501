//! The retention's reading side and the prune: every cluster's in-use set and the prune's
//! ledger read from the mirror (`sets`), the mirror's inventory (`inventory`) and the decision as
//! a pure function (`plan`), over the mirror's client the watch shares (`mirror_api.rs`). The
//! watch reads the sets' ages from here too, for the stale-set alert; only `fill-mirror prune`
//! deletes.

pub mod ages;
pub mod inventory;
pub mod plan;
pub mod sets;
pub mod unanchor;

/// A duration written `<n>s`, `<n>m`, `<n>h` or `<n>d`, in seconds (a flag's value).
pub fn parse_duration(text: &str) -> Result<i64, String> {
    let unit = match text.chars().last() {
        Some('s') => 1,
        Some('m') => 60,
        Some('h') => 3600,
        Some('d') => 86_400,
        _ => {
            return Err(format!(
                "{text:?}: a number and a unit of s, m, h or d (30d, 1h)"
            ));
        }
    };
    text[..text.len() - 1]
        .parse::<i64>()
        .ok()
        .filter(|n| *n >= 0)
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(|| format!("{text:?}: a number and a unit of s, m, h or d (30d, 1h)"))
}

/// `seconds` in the largest unit that says it exactly, or in which it is at least two (rounded
/// down): `30d`, `1h`, `40d`, `90s`.
pub fn say_duration(seconds: i64) -> String {
    let whole = seconds.abs();
    for (unit, name) in [(86_400, 'd'), (3600, 'h'), (60, 'm')] {
        if (whole >= unit && whole % unit == 0) || whole >= 2 * unit {
            return format!("{}{name}", seconds / unit);
        }
    }
    format!("{seconds}s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_with_their_unit_and_nothing_else() {
        assert_eq!(parse_duration("30d"), Ok(30 * 86_400));
        assert_eq!(parse_duration("1h"), Ok(3600));
        assert_eq!(parse_duration("90s"), Ok(90));
        for bad in ["30", "d", "-1h", "1.5h", "1w", ""] {
            assert!(
                parse_duration(bad)
                    .unwrap_err()
                    .contains(&format!("{bad:?}")),
                "{bad}"
            );
        }
        assert_eq!(say_duration(40 * 86_400 + 5), "40d");
        assert_eq!(say_duration(3 * 3600), "3h");
        assert_eq!(say_duration(3600), "1h");
        assert_eq!(say_duration(61), "61s");
    }
}
