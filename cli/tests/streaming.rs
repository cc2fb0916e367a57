//! Streaming jobs run by the real binary: a keyed windowed count over the synthetic source,
//! checked against an independent count of the generator's elements. A run killed with SIGKILL
//! and started again resumes from its last checkpoint and doubles nothing; Ctrl-C drains every
//! open window; a second Ctrl-C cancels and leaves nothing half-written.
use riverbank_datagen::synthetic::{KeyDistribution, SyntheticOptions, SyntheticStream};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_riverbank");
/// 2024-01-01T00:00:00Z.
const START_US: i64 = 1_704_067_200_000_000;
const WINDOW_US: i64 = 10_000_000;

/// (key, window start) → a number.
type PerWindow = BTreeMap<(String, String), u64>;

/// A keyed count per 10-s window of `count` synthetic elements (all at once when `start` is
/// given, else paced at `rate` from the job's start), with `extra` lines of windowing.
fn pipeline(dir: &Path, rate: u64, count: Option<u64>, start: bool, windowing: &str) -> String {
    let count = count.map_or(String::new(), |c| format!("\n        count: {c}"));
    let start = if start {
        "\n        start: \"2024-01-01T00:00:00Z\""
    } else {
        ""
    };
    let yaml = format!(
        r#"pipeline:
  type: chain
  transforms:
    - type: ReadFromSynthetic
      name: Events
      config:
        rate: {rate}
        keys: 7
        distribution: zipf
        event_time_skew: 3s
        partitions: 3{count}{start}
    - type: WindowInto
      windowing:
        type: fixed
        size: 10s{windowing}
    - type: Combine
      name: CountPerKey
      config:
        group_by: key
        combine:
          events:
            fn: count
    - type: ExtractWindowingInfo
      config:
        fields: [window_start]
    - type: WriteToJson
      config:
        path: {out}/counts.jsonl
options:
  streaming: true
"#,
        out = dir.join("out").display()
    );
    let file = dir.join("job.yaml");
    std::fs::write(&file, yaml).unwrap();
    file.display().to_string()
}

fn command(dir: &Path, file: &str, extra: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(["run", file, "--no-progress", "--checkpoint-dir"])
        .arg(dir.join("checkpoints"))
        .arg("--spill-dir")
        .arg(dir.join("spill"))
        .args(["--shuffle-partitions", "4"])
        .args(extra)
        .env("RIVERBANK_LOG", "warn");
    c
}

fn run(dir: &Path, file: &str, extra: &[&str]) -> Output {
    command(dir, file, extra).output().unwrap()
}

/// Every committed output row: ((key, window start), events), summed over panes, and the
/// number of rows (panes) per key and window.
fn committed(dir: &Path) -> (PerWindow, PerWindow) {
    let (mut sums, mut panes) = (BTreeMap::new(), BTreeMap::new());
    let out = dir.join("out");
    let Ok(entries) = std::fs::read_dir(&out) else {
        return (sums, panes);
    };
    for e in entries {
        let p = e.unwrap().path();
        if !p.is_file() {
            continue;
        }
        for line in std::fs::read_to_string(&p).unwrap().lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            let k = (
                v["key"].as_str().unwrap().to_string(),
                v["window_start"].as_str().unwrap().to_string(),
            );
            *sums.entry(k.clone()).or_default() += v["events"].as_u64().unwrap();
            *panes.entry(k).or_default() += 1;
        }
    }
    (sums, panes)
}

/// The same count computed from the generator directly.
fn expected(count: u64) -> PerWindow {
    let s = SyntheticStream::new(SyntheticOptions {
        rate: 1000.0,
        keys: 7,
        distribution: KeyDistribution::Zipf { exponent: 1.0 },
        event_time_skew_us: 3_000_000,
        start_us: START_US,
        seed: 42,
    });
    let b = s.batch(0, count as usize);
    let keys = b
        .column(0)
        .as_any()
        .downcast_ref::<arrow::array::StringArray>()
        .unwrap();
    let times = b
        .column(3)
        .as_any()
        .downcast_ref::<arrow::array::TimestampMicrosecondArray>()
        .unwrap();
    let mut out = BTreeMap::new();
    for i in 0..b.num_rows() {
        let ws = times.value(i).div_euclid(WINDOW_US) * WINDOW_US;
        let start = chrono::DateTime::from_timestamp_micros(ws)
            .unwrap()
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        *out.entry((keys.value(i).to_string(), start)).or_default() += 1;
    }
    out
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[test]
fn a_finite_stream_counts_every_element_once_per_key_and_window() {
    let dir = tempfile::tempdir().unwrap();
    let file = pipeline(dir.path(), 1000, Some(30_000), true, "");
    let o = run(dir.path(), &file, &["--max-per-checkpoint", "2500"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (sums, panes) = committed(dir.path());
    assert_eq!(sums, expected(30_000));
    // The default trigger without lateness: one pane per key and window.
    assert!(panes.values().all(|n| *n == 1), "{panes:?}");
    // 30,000 elements, 2,500 per partition per checkpoint, 3 partitions: 4 checkpoints of
    // reads, then the drain; each committed its own files.
    let names: Vec<String> = std::fs::read_dir(dir.path().join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert!(
        names.iter().any(|n| n.starts_with("counts-c00000001-")),
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n.starts_with("counts-c00000004-")),
        "{names:?}"
    );
}

#[test]
fn a_killed_run_resumes_from_its_last_checkpoint_and_doubles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = pipeline(dir.path(), 1000, Some(60_000), true, "");
    // Small checkpoints, so that the kill lands between and inside them.
    let args = ["--max-per-checkpoint", "500", "--bundle-delay-ms", "20"];
    for kill_after in [700, 1500] {
        let mut child = command(dir.path(), &file, &args)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(kill_after));
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let o = run(dir.path(), &file, &args);
    assert!(o.status.success(), "{}", stderr(&o));
    let (sums, panes) = committed(dir.path());
    assert_eq!(sums, expected(60_000));
    assert!(
        panes.values().all(|n| *n == 1),
        "a window fired twice: {panes:?}"
    );
    // The checkpoint log says the runs picked up where they were killed.
    let log = std::fs::read_dir(dir.path().join("checkpoints/checkpoints"))
        .unwrap()
        .count();
    assert!(log > 10, "{log} checkpoint log entries");
}

fn interrupt(child: &Child) {
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
}

#[test]
fn ctrl_c_drains_every_open_window_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    // Paced by the wall clock: windows are open when the drain comes.
    let file = pipeline(dir.path(), 2000, None, false, "");
    let child = command(dir.path(), &file, &["--checkpoint-interval", "0.5"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    interrupt(&child);
    let started = Instant::now();
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let read: u64 = err
        .lines()
        .find_map(|l| {
            l.strip_prefix("drained after checkpoint ")?
                .split(": ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no drain line in:\n{err}"));
    assert!(read > 1000, "{err}");
    let (sums, panes) = committed(dir.path());
    // Every element read is in exactly one fired pane: the drain fired the open windows.
    assert_eq!(sums.values().sum::<u64>(), read, "{err}");
    assert!(panes.values().all(|n| *n == 1), "{panes:?}");
}

#[test]
fn a_second_ctrl_c_cancels_and_leaves_no_temporary_files() {
    let dir = tempfile::tempdir().unwrap();
    let file = pipeline(dir.path(), 2000, None, false, "");
    let child = command(
        dir.path(),
        &file,
        &["--checkpoint-interval", "0.3", "--bundle-delay-ms", "300"],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    interrupt(&child);
    std::thread::sleep(Duration::from_millis(100));
    interrupt(&child);
    let o = child.wait_with_output().unwrap();
    assert!(!o.status.success(), "a cancelled job does not exit 0");
    assert!(stderr(&o).contains("cancelled"), "{}", stderr(&o));
    // Only whole checkpoints' files: no temp directory or part is left in the output.
    if let Ok(entries) = std::fs::read_dir(dir.path().join("out")) {
        for e in entries {
            let name = e.unwrap().file_name().to_string_lossy().to_string();
            assert!(name.starts_with("counts-c"), "left behind: {name}");
        }
    }
}

/// Exactly-once on the distributed runtime: a keyed windowed count on `--workers 3`, five
/// SIGKILLs of random workers at random moments and one of the coordinator; the launcher
/// restarts each (as a StatefulSet would). The committed output equals the count of the input,
/// per key and window, exactly. `RIVERBANK_SOAK_SEED` replays a run's kill schedule.
#[test]
fn exactly_once_on_three_workers_through_five_worker_kills_and_a_coordinator_kill() {
    let dir = tempfile::tempdir().unwrap();
    let file = pipeline(dir.path(), 1000, Some(120_000), true, "");
    let seed: u64 = std::env::var("RIVERBANK_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos() as u64
        });
    eprintln!("kill schedule seed: {seed} (RIVERBANK_SOAK_SEED={seed} replays it)");
    let mut rng = seed | 1;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut launcher = command(
        dir.path(),
        &file,
        &[
            "--workers",
            "3",
            "--max-per-checkpoint",
            "1000",
            "--bundle-delay-ms",
            "30",
        ],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let pid = launcher.id();
    std::thread::sleep(Duration::from_millis(1500));
    let mut kills = vec![];
    for k in 0..6 {
        std::thread::sleep(Duration::from_millis(300 + next(700)));
        let procs = common::children_of(pid);
        let pick: Vec<&(i32, String)> = if k == 3 {
            procs.iter().filter(|p| p.1 == "coordinator").collect()
        } else {
            procs
                .iter()
                .filter(|p| p.1.starts_with("worker-"))
                .collect()
        };
        if pick.is_empty() {
            break; // the job is over already
        }
        let (victim, role) = pick[next(pick.len() as u64) as usize];
        common::signal(*victim, libc::SIGKILL);
        kills.push(role.clone());
    }
    let started = Instant::now();
    let o = loop {
        if let Some(status) = launcher.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            launcher
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            break (status, err);
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the job hung after {kills:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(o.0.success(), "after kills {kills:?}:\n{}", o.1);
    assert!(
        kills.len() >= 4,
        "the job ended before the kills: {kills:?}"
    );
    let (sums, panes) = committed(dir.path());
    assert_eq!(sums, expected(120_000), "after kills {kills:?}");
    assert!(
        panes.values().all(|n| *n == 1),
        "a window fired twice after {kills:?}"
    );
}
