//! `--peer PATH`: the peer (apalis-redis, `../shared/peer-apalis`) on the
//! benchmark's own server, right after ours, with its favourable settings
//! (those of its `bench.sh`: 1 ms tick, batch 50, no task locks, no events)
//! at concurrency 4 and 16, three runs each.
//!
//! The peer chains `Step1 -> Step2 -> Step3` jobs: `--jobs N` is N chains,
//! 3 N jobs, and its `steps_per_s` counts jobs, so N chains are the same
//! work as our N tasks of 3 steps. With 8,500 or more chains queued at once
//! none completes (its README, "Limit found"), so a run of more chains is
//! sent as consecutive segments of at most [`SEGMENT`] chains, each on a
//! flushed database, and the run's figures add up their seconds, steps and
//! CPU: the same steps in total as ours, the peer paying its start-up once
//! per segment (a few milliseconds with a 1 ms tick).

use std::process::Command;

use super::{median_of, Throughput};

/// Chains per peer process: below the peer's 8,500-chain limit, within the
/// 7,000 its README says to keep to.
const SEGMENT: u64 = 6_000;

/// The settings its `bench.sh` calls favourable.
const FAVOURABLE: [&str; 5] = ["--wake", "tick:1", "--batch", "50", "--lean"];

/// One peer process's `RESULT` figures.
struct Segment {
    seconds: f64,
    steps: f64,
    redis_cpu_s: f64,
    client_cpu_s: f64,
    redis_calls: f64,
}

/// Runs `chains` chains at `concurrency` in one peer process; `None` (and
/// a line saying why) when it did not finish.
fn segment(peer: &str, port: u16, chains: u64, concurrency: usize) -> Option<Segment> {
    let _ = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "flushdb"])
        .output();
    let url = format!("redis://127.0.0.1:{port}/");
    let out = Command::new(peer)
        .args(["--jobs", &chains.to_string()])
        .args(["--concurrency", &concurrency.to_string()])
        .args(["--redis", &url, "--timeout-s", "60"])
        .args(FAVOURABLE)
        .output()
        .unwrap_or_else(|e| panic!("could not run the peer {peer}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    let result = text.lines().find(|l| l.starts_with("RESULT")).unwrap_or("");
    let field = |name: &str| {
        result
            .split_whitespace()
            .find_map(|f| f.strip_prefix(name))
            .and_then(|v| v.parse::<f64>().ok())
    };
    if !result.contains("finished=true") {
        println!("  peer segment of {chains} chains did not finish: {result:?}");
        return None;
    }
    Some(Segment {
        seconds: field("seconds=")?,
        // Its steps_per_s is 3 x completed chains / seconds.
        steps: 3.0 * field("completed_chains=")?,
        redis_cpu_s: field("redis_cpu_s=")?,
        client_cpu_s: field("client_cpu_s=")?,
        redis_calls: field("redis_calls=")?,
    })
}

/// One run of `tasks` chains, in segments; prints it and returns its
/// figures.
fn one_run(
    peer: &str,
    port: u16,
    tasks: u64,
    concurrency: usize,
    label: &str,
) -> Option<Throughput> {
    let segments = tasks.div_ceil(SEGMENT).max(1);
    let mut total = Segment {
        seconds: 0.0,
        steps: 0.0,
        redis_cpu_s: 0.0,
        client_cpu_s: 0.0,
        redis_calls: 0.0,
    };
    for i in 0..segments {
        // Equal segments, the remainder spread over the first ones.
        let chains = tasks / segments + u64::from(i < tasks % segments);
        let s = segment(peer, port, chains, concurrency)?;
        total.seconds += s.seconds;
        total.steps += s.steps;
        total.redis_cpu_s += s.redis_cpu_s;
        total.client_cpu_s += s.client_cpu_s;
        total.redis_calls += s.redis_calls;
    }
    let t = Throughput {
        steps_per_s: total.steps / total.seconds,
        redis_us_per_step: total.redis_cpu_s * 1e6 / total.steps,
        engine_us_per_step: total.client_cpu_s * 1e6 / total.steps,
    };
    println!(
        "{label}: {:.0} steps/s; Redis CPU {:.1} us/step, client CPU {:.1} us/step ({:.2} Redis calls/step, \
         {segments} segment(s))",
        t.steps_per_s,
        t.redis_us_per_step,
        t.engine_us_per_step,
        total.redis_calls / total.steps,
    );
    Some(t)
}

/// Favourable settings at concurrency 4 and 16, `runs` runs of `tasks`
/// chains each, each run and the medians printed. Returns the better
/// median (by steps per second) and its concurrency.
pub(crate) fn run_peer(
    peer: &str,
    port: u16,
    tasks: u64,
    runs: usize,
) -> Option<(usize, Throughput)> {
    println!(
        "peer apalis-redis, favourable ({}), {tasks} chains x 3 jobs per run \
         (Redis and client CPU include its batched enqueue of Step1; ours exclude the starts):",
        FAVOURABLE.join(" ")
    );
    let mut best: Option<(usize, Throughput)> = None;
    for concurrency in [4usize, 16] {
        let mut all = Vec::new();
        for run in 1..=runs {
            let label = format!("  apalis c={concurrency:<2}, run {run}/{runs}");
            all.extend(one_run(peer, port, tasks, concurrency, &label));
        }
        if all.len() < runs {
            println!("  apalis c={concurrency}: a run failed, no median");
            continue;
        }
        let m = median_of(&all);
        println!(
            "  apalis c={concurrency:<2}, median of {runs}: {:.0} steps/s; Redis CPU {:.1} us/step, client CPU {:.1} us/step",
            m.steps_per_s, m.redis_us_per_step, m.engine_us_per_step
        );
        if best
            .as_ref()
            .is_none_or(|(_, b)| m.steps_per_s > b.steps_per_s)
        {
            best = Some((concurrency, m));
        }
    }
    best
}
