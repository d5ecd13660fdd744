//! The peers' `RESULT` lines (`../shared/peer-*`), read the same way by
//! every benchmark that runs a peer beside ours (`bench_postgres`,
//! `bench_sqlite`).

/// One `RESULT` line of a peer's run.
pub struct PeerResult {
    /// The line after `RESULT `, as the peer printed it.
    pub fields: String,
    /// Its `steps_per_s` (0 when it has none).
    pub steps_per_s: f64,
    /// Whether the run finished in its time (`finished=false` otherwise):
    /// an unfinished run's figure is no figure.
    pub finished: bool,
}

/// The `RESULT` lines of a peer's standard output.
pub fn results(stdout: &[u8]) -> Vec<PeerResult> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|line| line.strip_prefix("RESULT "))
        .map(|fields| PeerResult {
            steps_per_s: fields
                .split_whitespace()
                .find_map(|f| f.strip_prefix("steps_per_s="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0),
            finished: !fields.contains("finished=false"),
            fields: fields.to_owned(),
        })
        .collect()
}
