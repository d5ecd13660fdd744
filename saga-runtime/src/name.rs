//! Names that become parts of Redis keys and stream names at run time
//! (tallies, endpoints, consumer groups): the alphabet `#[saga]` and
//! `#[process_manager]` names are held to at compile time, so that no
//! name can alias another's keys.

/// `Err` with what to do unless `name` is 1-200 characters of
/// `A-Z a-z 0-9 - _ .`; `what` names it in the message ("tally name").
pub(crate) fn check(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    match ok {
        true => Ok(()),
        false => Err(format!(
            "{what} `{name}` must be 1-200 characters of `A-Z a-z 0-9 - _ .`"
        )),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_key_safe_alphabet() {
        assert!(super::check("tally name", "batch-2026.11_24").is_ok());
        for bad in ["", "a:b", "a b", "ä", &"x".repeat(201)] {
            let err = super::check("tally name", bad).unwrap_err();
            assert!(err.starts_with("tally name `"), "{err}");
        }
    }
}
