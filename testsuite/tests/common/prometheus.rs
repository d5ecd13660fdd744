//! Reading the Prometheus text format (what `saga_runtime::metrics`
//! renders) in tests.

/// The value of the series named `name` whose labels include `labels`
/// (in any order; other labels are allowed). `None` if there is none;
/// panics if several match.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (series_name, series_labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if series_name != name {
            continue;
        }
        let pairs: Vec<(&str, &str)> = series_labels
            .split(',')
            .filter(|p| !p.is_empty())
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k, v.trim_matches('"')))
            .collect();
        if labels.iter().all(|l| pairs.contains(l)) {
            assert!(found.is_none(), "several series match {name} {labels:?}");
            found = Some(value.parse().expect("a number"));
        }
    }
    found
}
