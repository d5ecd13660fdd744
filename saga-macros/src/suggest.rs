//! "Did you mean" suggestions for misspelled keys, values and step names.

/// The candidate closest to `input`, if one is close enough to be a likely
/// typo. Jaro-Winkler favours a shared prefix, which is how method and key
/// names are usually misspelled (`upload_to_s3` / `uplod_to_s3`).
pub fn closest<'a, I>(input: &str, candidates: I) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    let mut best: Option<(f64, &'a str)> = None;
    for candidate in candidates {
        let score = strsim::jaro_winkler(input, candidate);
        if score > 0.8 && best.is_none_or(|(b, _)| score > b) {
            best = Some((score, candidate));
        }
    }
    best.map(|(_, c)| c)
}

/// `"; did you mean `x`?"` or nothing, ready to append to a message.
pub fn did_you_mean<'a, I>(input: &str, candidates: I) -> String
where
    I: IntoIterator<Item = &'a str>,
{
    match closest(input, candidates) {
        Some(c) => format!("; did you mean `{c}`?"),
        None => String::new(),
    }
}

/// `"{prefix}; did you mean `x`? expected one of a, b, c"`, or without the
/// question when nothing is close.
pub fn unknown(prefix: &str, input: &str, candidates: &[&str]) -> String {
    let list = candidates.join(", ");
    match closest(input, candidates.iter().copied()) {
        Some(c) => format!("{prefix}; did you mean `{c}`? expected one of {list}"),
        None => format!("{prefix}; expected one of {list}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        let values = ["exponential", "linear", "constant"];
        assert_eq!(closest("exponentail", values), Some("exponential"));
        assert_eq!(closest("liner", values), Some("linear"));
        assert_eq!(closest("banana", values), None);
        assert_eq!(
            did_you_mean("uplod_to_s3", ["upload_to_s3", "capture_payment"]),
            "; did you mean `upload_to_s3`?"
        );
        assert_eq!(did_you_mean("zzz", ["upload_to_s3"]), "");
        assert_eq!(
            unknown("unknown backoff `exponentail`", "exponentail", &values),
            "unknown backoff `exponentail`; did you mean `exponential`? \
             expected one of exponential, linear, constant"
        );
        assert_eq!(
            unknown("unknown backoff `x`", "x", &values),
            "unknown backoff `x`; expected one of exponential, linear, constant"
        );
    }
}
