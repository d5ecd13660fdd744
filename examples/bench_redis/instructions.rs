//! Engine instructions per step (`--instructions`, and in the default run
//! when `valgrind` is on PATH). Hardware counters are not available in
//! every VM (`perf stat -e instructions`: "not supported"), so this binary
//! is run again under `valgrind --tool=callgrind` for one small
//! `--only 4x16` run. Counting starts when the tasks have all been started
//! ([`bench_steady_start`]: `--zero-before`) and stops when the last one
//! finished ([`bench_steady_end`]: `--dump-before`), so the figure is what
//! the workers (all threads of this process) executed per step in the
//! steady state, the starts excluded; Redis is another process, not
//! counted. Instruction counts do not depend on the machine's load, unlike
//! the CPU times, so they compare across runs and commits.

use std::hint::black_box;
use std::path::Path;
use std::process::Command;

/// Tasks of the callgrind run: 6,000 steps, about 8 s under callgrind.
pub(crate) const TASKS: u64 = 2_000;

/// Called once all tasks are started: callgrind zeroes its counts here.
/// Not inlined, and unlike [`bench_steady_end`], so that neither inlining
/// nor function merging removes the symbol callgrind looks for.
#[inline(never)]
pub(crate) fn bench_steady_start(tasks: u64) -> u64 {
    black_box(tasks).wrapping_add(0x5eed)
}

/// Called once every task finished: callgrind dumps its counts here.
#[inline(never)]
pub(crate) fn bench_steady_end(steps: u64) -> u64 {
    black_box(steps).rotate_left(7) ^ 0x3e
}

/// Whether `valgrind` can be run.
pub(crate) fn valgrind_on_path() -> bool {
    Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs this binary under callgrind for `tasks` tasks with `--only 4x16`
/// (plus `extra` arguments, such as `--durability`), and returns the
/// instructions counted between the two markers per step.
pub(crate) fn per_step(tasks: u64, extra: &[String]) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = std::env::temp_dir().join(format!("bench_redis_callgrind.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let out = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!(
            "--callgrind-out-file={}",
            dir.join("cg.out").display()
        ))
        .arg("--zero-before=*bench_steady_start*")
        .arg("--dump-before=*bench_steady_end*")
        .arg(&exe)
        .args([&tasks.to_string(), "--only", "4x16", "--runs", "1"])
        .args(extra)
        .output()
        .map_err(|e| format!("could not run valgrind: {e}"))?;
    let result = dumped(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!("callgrind run failed: {}", stderr.trim()));
    }
    Ok(result? as f64 / (tasks * 3) as f64)
}

/// The instruction count of the dump `--dump-before` wrote (the one whose
/// trigger names the marker, not the one at program exit): its `totals:`
/// line, the sum of the costs in the file. (Its `summary:` line is not
/// reset by `--zero-before`: it still counts the starts.)
fn dumped(dir: &Path) -> Result<u64, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| e.to_string())?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        // The header ends before the first cost line; function names come
        // after it.
        let trigger = text.lines().take_while(|l| !l.starts_with("fl=")).any(|l| {
            l.starts_with("desc: Trigger: --dump-before") && l.contains("bench_steady_end")
        });
        let totals = text
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("totals:"))
            .and_then(|n| n.trim().parse::<u64>().ok());
        if trigger {
            found.extend(totals);
        }
    }
    match found[..] {
        [count] => Ok(count),
        _ => Err(format!(
            "expected one callgrind dump at bench_steady_end, found {}",
            found.len()
        )),
    }
}
