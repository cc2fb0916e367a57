//! Streaming jobs run by the real binary: a keyed windowed count over the synthetic source,
//! checked against an independent count of the generator's elements. A run killed with SIGKILL
//! and started again resumes from its last checkpoint and doubles nothing; Ctrl-C drains every
//! open window; a second Ctrl-C cancels and leaves nothing half-written.
use arrow::array::AsArray;
use arrow::datatypes::TimestampMicrosecondType;
use common::PerWindow;
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

/// A committed pane: (index, timing, is_last, events).
type Pane = (u64, String, bool, u64);

/// A keyed count per 10-s window of `count` synthetic elements (all at once when `start` is
/// given, else paced at `rate` from the job's start), with `extra` lines of windowing.
fn pipeline(dir: &Path, rate: u64, count: Option<u64>, start: bool, windowing: &str) -> String {
    pipeline_with(dir, rate, count, start, windowing, "")
}

/// As [`pipeline`], with more lines of the source's config.
fn pipeline_with(
    dir: &Path,
    rate: u64,
    count: Option<u64>,
    start: bool,
    windowing: &str,
    source: &str,
) -> String {
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
        partitions: 3{count}{start}{source}
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
        fields: [window_start, pane_info]
    - type: WriteToJson
      config:
        path: {out}/counts.jsonl
options:
  streaming: true
"#,
        out = dir.join("out").display()
    );
    write_job(dir, "job.yaml", &yaml)
}

/// Writes a pipeline into `dir` as `name`; its path, as `run` takes it.
fn write_job(dir: &Path, name: &str, yaml: &str) -> String {
    let file = dir.join(name);
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

/// Every committed pane: (key, window start) → [(pane index, timing, is_last, events)],
/// in pane order.
fn panes(dir: &Path) -> BTreeMap<(String, String), Vec<Pane>> {
    let mut out: BTreeMap<_, Vec<_>> = BTreeMap::new();
    for e in std::fs::read_dir(dir.join("out")).unwrap() {
        for line in std::fs::read_to_string(e.unwrap().path()).unwrap().lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            let p = &v["pane_info"];
            out.entry((
                v["key"].as_str().unwrap().to_string(),
                v["window_start"].as_str().unwrap().to_string(),
            ))
            .or_default()
            .push((
                p["index"].as_u64().unwrap(),
                p["timing"].as_str().unwrap().to_string(),
                p["is_last"].as_bool().unwrap(),
                v["events"].as_u64().unwrap(),
            ));
        }
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// The same count computed from the generator directly.
fn expected(count: u64) -> PerWindow {
    expected_late(count, 0.0, false).0
}

/// The count from the generator with `late_fraction` of the elements 20 s late; without
/// `keep_late`, late elements are left out. Also: how many elements are late.
fn expected_late(count: u64, late_fraction: f64, keep_late: bool) -> (PerWindow, u64) {
    common::generator_counts(synthetic(late_fraction), count, keep_late)
}

/// The generator of [`pipeline`]'s source, with `late_fraction` of its elements 20 s late.
fn synthetic(late_fraction: f64) -> SyntheticOptions {
    SyntheticOptions {
        rate: 1000.0,
        keys: 7,
        distribution: KeyDistribution::Zipf { exponent: 1.0 },
        event_time_skew_us: 3_000_000,
        start_us: START_US,
        seed: 42,
        late_fraction,
        late_by_us: 20_000_000,
    }
}

/// The keys with elements in the window starting at `start` (`…T00:00:10.000Z`).
fn want_keys<'a>(want: &'a PerWindow, start: &str) -> std::collections::BTreeSet<&'a str> {
    want.keys()
        .filter(|(_, ws)| format!("{}.000Z", ws.trim_end_matches('Z')) == start)
        .map(|(k, _)| k.as_str())
        .collect()
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
    // The default trigger without lateness: each 10-s window fired once, at the watermark,
    // as one set of shards named after the window and its only (last) pane.
    let files = window_files(dir.path());
    assert_eq!(
        files.len(),
        sums.keys()
            .map(|k| &k.1)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    );
    for (w, sets) in &files {
        assert_eq!(sets.keys().collect::<Vec<_>>(), ["pane-0-last"], "{w:?}");
    }
}

/// A pane of a few rows is one file, not one per shuffle partition (Beam's runner-determined
/// sharding): 4 shuffle partitions, a few hundred rows per window.
#[test]
fn a_small_pane_is_committed_as_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = pipeline(dir.path(), 1000, Some(30_000), true, "");
    let o = run(dir.path(), &file, &["--max-per-checkpoint", "2500"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (sums, _) = committed(dir.path());
    assert_eq!(sums, expected(30_000));
    let names: Vec<String> = std::fs::read_dir(dir.path().join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(names.len(), window_files(dir.path()).len(), "{names:?}");
    for n in &names {
        assert!(n.ends_with("-00000-of-00001"), "{n}");
    }
}

/// A committed windowed file: `counts.jsonl-{start}-{end}-{pane}-SSSSS-of-NNNNN`, parsed and
/// checked (its shards complete, its rows in its window); (start, end) → pane → rows.
fn window_files(dir: &Path) -> BTreeMap<(String, String), BTreeMap<String, Vec<Value>>> {
    let mut out: BTreeMap<(String, String), BTreeMap<String, Vec<Value>>> = BTreeMap::new();
    let mut shards: BTreeMap<(String, String, String), Vec<(usize, usize)>> = BTreeMap::new();
    for e in std::fs::read_dir(dir.join("out")).unwrap() {
        let e = e.unwrap();
        if !e.path().is_file() {
            continue;
        }
        let name = e.file_name().to_string_lossy().to_string();
        let rest = name
            .strip_prefix("counts.jsonl-")
            .unwrap_or_else(|| panic!("{name}"));
        // ISO instants with milliseconds are 24 characters.
        let (start, end) = (rest[..24].to_string(), rest[25..49].to_string());
        let tail = &rest[50..];
        let (pane, shard) = tail.split_at(tail.len() - "00000-of-00000".len());
        let pane = pane.strip_suffix('-').unwrap().to_string();
        assert!(pane.starts_with("pane-"), "{name}");
        let (i, n) = shard.split_once("-of-").unwrap();
        shards
            .entry((start.clone(), end.clone(), pane.clone()))
            .or_default()
            .push((i.parse().unwrap(), n.parse().unwrap()));
        let rows = out
            .entry((start.clone(), end.clone()))
            .or_default()
            .entry(pane)
            .or_default();
        for line in std::fs::read_to_string(e.path()).unwrap().lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            // The row's window is the file's: `2024-01-01T00:00:10Z` in `…10.000Z`.
            let ws = v["window_start"].as_str().unwrap();
            assert_eq!(
                format!("{}.000Z", ws.trim_end_matches('Z')),
                start,
                "{name}"
            );
            rows.push(v);
        }
    }
    for (set, mut s) in shards {
        s.sort();
        let n = s[0].1;
        assert_eq!(s, (0..n).map(|i| (i, n)).collect::<Vec<_>>(), "{set:?}");
    }
    out
}

/// Rows in the global window keep one set of shards per checkpoint; rows windowed without a
/// grouping get one set per window and pane all the same, each file holding its window's rows.
#[test]
fn unwindowed_rows_commit_per_checkpoint_and_windowed_rows_per_window() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        r#"pipeline:
  transforms:
    - type: ReadFromSynthetic
      name: Events
      config:
        rate: 1000
        keys: 7
        partitions: 3
        count: 3000
        start: "2024-01-01T00:00:00Z"
    - type: WriteToJson
      name: Raw
      input: Events
      config:
        path: {out}/raw/events.jsonl
    - type: WindowInto
      name: Windowed
      input: Events
      windowing:
        type: fixed
        size: 1s
    - type: ExtractWindowingInfo
      name: Info
      input: Windowed
      config:
        fields: [window_start]
    - type: WriteToJson
      name: PerWindow
      input: Info
      config:
        path: {out}/counts.jsonl
options:
  streaming: true
"#,
        out = dir.path().join("out").display()
    );
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, yaml).unwrap();
    let o = run(
        dir.path(),
        &file.display().to_string(),
        &["--max-per-checkpoint", "500"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // 3 partitions × 500 per checkpoint: checkpoints 1 and 2 read everything.
    let mut raw: Vec<String> = std::fs::read_dir(dir.path().join("out/raw"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    raw.sort();
    assert!(
        raw.iter().all(|n| n.starts_with("events.jsonl-c0000000")),
        "{raw:?}"
    );
    assert!(
        raw.iter().any(|n| n.starts_with("events.jsonl-c00000002-")),
        "{raw:?}"
    );
    let seqs = |rows: Vec<Value>| -> Vec<(String, i64)> {
        rows.iter()
            .map(|v| {
                (
                    v["key"].as_str().unwrap().to_string(),
                    v["seq"].as_i64().unwrap(),
                )
            })
            .collect()
    };
    let mut all_raw = vec![];
    for n in &raw {
        let text = std::fs::read_to_string(dir.path().join("out/raw").join(n)).unwrap();
        all_raw.extend(seqs(
            text.lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect(),
        ));
    }
    let mut all_windowed = vec![];
    let files = window_files(dir.path());
    // 3,000 elements at 1,000/s: three 1-s windows (and their skew's neighbours).
    assert!(files.len() >= 3, "{:?}", files.keys().collect::<Vec<_>>());
    for sets in files.into_values() {
        for rows in sets.into_values() {
            all_windowed.extend(seqs(rows));
        }
    }
    all_raw.sort();
    all_windowed.sort();
    assert_eq!(all_raw.len(), 3000);
    assert_eq!(all_windowed, all_raw);
}

/// Old checkpoints' files are collected (`checkpointsRetained: 3`): a run killed and resumed
/// still counts exactly, and afterwards the directory holds the last checkpoints' log entries
/// and only the state files their manifests name, all there.
#[test]
fn old_checkpoint_files_are_collected_and_a_resumed_run_still_counts_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let file = pipeline(dir.path(), 1000, Some(60_000), true, "");
    let yaml = std::fs::read_to_string(&file).unwrap().replace(
        "  streaming: true\n",
        "  streaming: true\n  checkpointsRetained: 3\n",
    );
    std::fs::write(&file, yaml).unwrap();
    let args = ["--max-per-checkpoint", "500", "--bundle-delay-ms", "20"];
    let mut child = command(dir.path(), &file, &args)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Until a collection ran (every 10 checkpoints), then killed.
    let log = dir.path().join("checkpoints/checkpoints");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !log.join("0000000012.done.json").exists() {
        assert!(Instant::now() < deadline, "no 12th checkpoint");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!log.join("0000000001.done.json").exists());
    let o = run(dir.path(), &file, &args);
    assert!(o.status.success(), "{}", stderr(&o));
    let (sums, panes) = committed(dir.path());
    assert_eq!(sums, expected(60_000));
    assert!(panes.values().all(|n| *n == 1), "{panes:?}");
    let done: Vec<u64> = std::fs::read_dir(&log)
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().to_string_lossy().to_string();
            n.strip_suffix(".done.json").map(|i| i.parse().unwrap())
        })
        .collect();
    assert_eq!(done.len(), 3, "{done:?}");
    // Every shard: a few manifests, each naming files that are there; nothing else old.
    let state = dir.path().join("checkpoints/state");
    let mut shards = 0;
    for combine in std::fs::read_dir(&state).unwrap() {
        for shard in std::fs::read_dir(combine.unwrap().path()).unwrap() {
            let shard = shard.unwrap().path();
            shards += 1;
            let names: Vec<String> = std::fs::read_dir(&shard)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
                .collect();
            let manifests: Vec<&String> = names
                .iter()
                .filter(|n| n.starts_with("manifest-"))
                .collect();
            assert!((1..=4).contains(&manifests.len()), "{shard:?}: {names:?}");
            let mut named = std::collections::BTreeSet::new();
            for m in manifests {
                let v: Value =
                    serde_json::from_str(&std::fs::read_to_string(shard.join(m)).unwrap()).unwrap();
                named.insert(full_file(&v));
                for d in v["deltas"].as_array().unwrap() {
                    named.insert(format!("delta-{d}.arrows"));
                }
            }
            for n in &named {
                assert!(names.contains(n), "{shard:?}: {n} missing from {names:?}");
            }
            let data = names.iter().filter(|n| !n.starts_with("manifest-")).count();
            assert_eq!(data, named.len(), "{shard:?}: {names:?}");
        }
    }
    assert!(shards > 0);
}

/// What streaming cannot run is refused by `validate` (and so before a run starts), naming
/// the transform: Sql and Join over the global window with a trigger that would fire only at
/// the drain, and a Sql over session windows with no key to merge its sessions by (in batch
/// too).
/// Writes `yaml` to `file` and runs `riverbank validate` on it, which must fail: its output.
fn validate_refused(file: &Path, yaml: &str) -> String {
    std::fs::write(file, yaml).unwrap();
    let o = Command::new(BIN)
        .arg("validate")
        .arg(file)
        .output()
        .unwrap();
    let err = format!("{}{}", stderr(&o), String::from_utf8_lossy(&o.stdout));
    assert!(!o.status.success(), "{err}");
    err
}

#[test]
fn unwindowed_sql_and_join_and_unkeyed_sql_over_sessions_are_refused_naming_the_transform() {
    let dir = tempfile::tempdir().unwrap();
    let sessions =
        "    - type: WindowInto\n      windowing:\n        type: sessions\n        gap: 5s\n";
    let cases = [
        (
            "    - type: Sql\n      name: TopBids\n      config:\n        query: \"SELECT key, COUNT(*) AS n FROM PCOLLECTION GROUP BY key\"\n".to_string(),
            "TopBids",
            "its input is in the global window with a trigger that fires only when the job drains",
        ),
    ];
    for (step, name, why) in cases {
        let yaml = format!(
            "pipeline:\n  type: chain\n  transforms:\n    - type: ReadFromSynthetic\n      config:\n        rate: 10\n        keys: 3\n{step}    - type: WriteToJson\n      config:\n        path: {}/x.jsonl\noptions:\n  streaming: true\n",
            dir.path().display()
        );
        let err = validate_refused(&dir.path().join("job.yaml"), &yaml);
        assert!(err.contains(name) && err.contains(why), "{err}");
    }
    let out = dir.path().display();
    let whole = [
        // A Sql over sessions in a batch job that does not group one input by plain fields:
        // its sessions have no key to merge by.
        (
            format!(
                "pipeline:\n  type: chain\n  transforms:\n    - type: Create\n      config:\n        elements: [{{key: a}}]\n{sessions}    - type: Sql\n      name: PerSession\n      config:\n        query: \"SELECT key FROM PCOLLECTION\"\n    - type: WriteToJson\n      config:\n        path: {out}/x.jsonl\n"
            ),
            "PerSession",
            "merges sessions per key at its GROUP BY, so it must have exactly one GROUP BY",
        ),
        // An unwindowed Join of two streams is refused as an unwindowed Sql is.
        (
            format!(
                "pipeline:\n  transforms:\n    - type: ReadFromSynthetic\n      name: A\n      config: {{rate: 10, keys: 3}}\n    - type: ReadFromSynthetic\n      name: B\n      config: {{rate: 10, keys: 3}}\n    - type: Join\n      name: Pairs\n      input: {{a: A, b: B}}\n      config:\n        equalities: key\n    - type: WriteToJson\n      input: Pairs\n      config:\n        path: {out}/x.jsonl\noptions:\n  streaming: true\n"
            ),
            "Pairs",
            "Join in a streaming job fires per window",
        ),
    ];
    for (yaml, name, why) in whole {
        let err = validate_refused(&dir.path().join("whole.yaml"), &yaml);
        assert!(err.contains(name) && err.contains(why), "{err}");
    }
}

/// Per-key session counts (gap 3 s) of `count` synthetic elements over 2,000 keys, so that
/// a key's elements come about 2 s apart: each key has several sessions, sessions span
/// checkpoints, and elements up to 3 s out of order bridge sessions already stored.
fn sessions_pipeline(dir: &Path, count: u64, source: &str, windowing: &str) -> String {
    let yaml = format!(
        r#"pipeline:
  type: chain
  transforms:
    - type: ReadFromSynthetic
      config:
        rate: 1000
        keys: 2000
        distribution: uniform
        event_time_skew: 3s
        partitions: 3
        count: {count}
        start: "2024-01-01T00:00:00Z"{source}
    - type: WindowInto
      name: Sessions
      windowing:
        type: sessions
        gap: 3s{windowing}
    - type: Combine
      name: PerSession
      config:
        group_by: key
        combine:
          events:
            fn: count
    - type: ExtractWindowingInfo
      config:
        fields: [window_start, window_end, pane_info]
    # Committed per checkpoint, not as a set of files per session.
    - type: WindowInto
      name: Rewindow
      windowing:
        type: global
    - type: WriteToJson
      config:
        path: {out}/sessions.jsonl
options:
  streaming: true
"#,
        out = dir.join("out").display()
    );
    write_job(dir, "sessions.yaml", &yaml)
}

/// [`sessions_pipeline`] with a Sql counting per session in place of the Combine.
fn sessions_sql_pipeline(dir: &Path, count: u64, source: &str, windowing: &str) -> String {
    let file = sessions_pipeline(dir, count, source, windowing);
    let yaml = std::fs::read_to_string(&file).unwrap().replace(
        "    - type: Combine\n      name: PerSession\n      config:\n        group_by: key\n        combine:\n          events:\n            fn: count\n",
        "    - type: Sql\n      name: PerSession\n      config:\n        query: \"SELECT key, COUNT(*) AS events FROM PCOLLECTION GROUP BY key\"\n",
    ).replace("[window_start, window_end, pane_info]", "[window_start, window_end]");
    assert!(yaml.contains("type: Sql"), "{yaml}");
    std::fs::write(&file, yaml).unwrap();
    file
}

/// Runs `file` on 2 workers (500 elements per read, slowed bundles) and SIGKILLs one of them
/// after 1.5 s; the job must still succeed. Its log.
fn run_killing_a_worker(dir: &Path, file: &str) -> String {
    common::run_killing(
        &mut command(
            dir,
            file,
            &[
                "--workers",
                "2",
                "--max-per-checkpoint",
                "500",
                "--bundle-delay-ms",
                "20",
            ],
        ),
        &["worker-"],
    )
}

/// (key, session start µs, session end µs) → elements.
type PerSession = BTreeMap<(String, i64, i64), u64>;
/// (key, session start µs, session end µs) → the timing of each of its panes.
type SessionTimings = BTreeMap<(String, i64, i64), Vec<String>>;

/// The sessions computed from the generator directly: each key's event times in order, a
/// new session wherever the next element starts at or after the current session's end.
/// `late_fraction` of the elements are 20 s late; without `keep_late` they are left out.
/// Also: how many elements are late.
fn expected_sessions(
    count: u64,
    gap_us: i64,
    late_fraction: f64,
    keep_late: bool,
) -> (PerSession, u64) {
    let s = SyntheticStream::new(SyntheticOptions {
        keys: 2000,
        distribution: KeyDistribution::Uniform,
        ..synthetic(late_fraction)
    });
    let b = s.batch(0, count as usize);
    let keys = b.column(0).as_string::<i32>();
    let times = b.column(3).as_primitive::<TimestampMicrosecondType>();
    let mut per_key: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    let mut late = 0;
    for i in 0..b.num_rows() {
        if s.nominal_us(i as u64) - times.value(i) > 3_000_000 {
            late += 1;
            if !keep_late {
                continue;
            }
        }
        per_key
            .entry(keys.value(i))
            .or_default()
            .push(times.value(i));
    }
    let mut out = PerSession::new();
    for (k, mut ts) in per_key {
        ts.sort_unstable();
        let (mut start, mut end, mut n) = (ts[0], ts[0] + gap_us, 0);
        for t in ts {
            if t >= end {
                out.insert((k.to_string(), start, end), n);
                (start, n) = (t, 0);
            }
            end = end.max(t + gap_us);
            n += 1;
        }
        out.insert((k.to_string(), start, end), n);
    }
    (out, late)
}

/// Output rows whose sessions overlap (a session and the larger ones it grew into) as one
/// session: the outermost bounds and the events of all of them.
fn outermost(rows: &PerSession) -> PerSession {
    let mut out = PerSession::new();
    let mut cur: Option<(String, i64, i64, u64)> = None;
    for ((k, s, e), n) in rows {
        match &mut cur {
            Some((ck, _, ce, cn)) if ck == k && *s < *ce => {
                *ce = (*ce).max(*e);
                *cn += n;
            }
            _ => {
                if let Some((ck, cs, ce, cn)) = cur.take() {
                    out.insert((ck, cs, ce), cn);
                }
                cur = Some((k.clone(), *s, *e, *n));
            }
        }
    }
    if let Some((ck, cs, ce, cn)) = cur {
        out.insert((ck, cs, ce), cn);
    }
    out
}

/// Every committed session row, summed over panes, and the panes' timings per session.
fn committed_sessions(dir: &Path) -> (PerSession, SessionTimings) {
    let micros = |v: &Value| {
        chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap())
            .unwrap()
            .timestamp_micros()
    };
    let (mut sums, mut timings) = (PerSession::new(), BTreeMap::new());
    for e in std::fs::read_dir(dir.join("out")).unwrap() {
        for line in std::fs::read_to_string(e.unwrap().path()).unwrap().lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            let k = (
                v["key"].as_str().unwrap().to_string(),
                micros(&v["window_start"]),
                micros(&v["window_end"]),
            );
            *sums.entry(k.clone()).or_default() += v["events"].as_u64().unwrap();
            if let Some(timing) = v["pane_info"]["timing"].as_str() {
                timings
                    .entry(k)
                    .or_insert_with(Vec::new)
                    .push(timing.to_string());
            }
        }
    }
    (sums, timings)
}

#[test]
fn streaming_session_windows_merge_across_checkpoints_into_the_generators_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let file = sessions_pipeline(dir.path(), 30_000, "", "");
    // 1,000 elements per checkpoint: a 3-s session spans several.
    let o = run(dir.path(), &file, &["--max-per-checkpoint", "1000"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (sums, timings) = committed_sessions(dir.path());
    let (want, _) = expected_sessions(30_000, 3_000_000, 0.0, false);
    assert!(
        want.len() > 6_000,
        "{} sessions: too few to test merging",
        want.len()
    );
    assert_eq!(sums.len(), want.len());
    assert_eq!(sums, want);
    // The default trigger without lateness: one on-time pane per session (no element is
    // behind the watermark, so no session grows after it fired).
    assert!(
        timings.values().all(|t| t == &["ON_TIME"]),
        "{:?}",
        timings.iter().find(|(_, t)| *t != &["ON_TIME"])
    );
}

/// A Sql over session windows in a streaming job: sessions merge per key (its GROUP BY)
/// across checkpoints, on 2 workers through a worker kill, and each fires once at the
/// watermark with the query over its rows: the generator's sessions, each once.
#[test]
fn a_streaming_sql_over_sessions_fires_each_merged_session_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = sessions_sql_pipeline(dir.path(), 20_000, "", "");
    run_killing_a_worker(dir.path(), &file);
    let (sums, _) = committed_sessions(dir.path());
    let (want, _) = expected_sessions(20_000, 3_000_000, 0.0, false);
    assert!(want.len() > 4_000, "{} sessions", want.len());
    assert_eq!(sums, want);
}

/// A streaming job whose sources are bounded (read once, then their watermark is the end of
/// time): a Sql and a Join over sessions give what the batch engine gives for the same
/// elements (`engine/tests/transforms.rs`, `sql_and_join_over_sessions_merge_them_per_key`),
/// the Join's sessions merged across its two inputs by its key.
#[test]
fn a_streaming_join_over_sessions_merges_them_across_its_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let yaml = format!(
        r#"pipeline:
  transforms:
    - type: Create
      name: Clicks
      config:
        elements: [{{user: a, t: 0}}, {{user: a, t: 20}}, {{user: a, t: 100}}, {{user: b, t: 10}}]
    - {{type: AssignTimestamps, name: StampedClicks, input: Clicks, config: {{timestamp: t}}}}
    - {{type: WindowInto, name: ClickSessions, input: StampedClicks, windowing: {{type: sessions, gap: 30s}}}}
    - type: Create
      name: Purchases
      config:
        elements: [{{buyer: a, pt: 45, amount: 5}}, {{buyer: b, pt: 100, amount: 7}}]
    - {{type: AssignTimestamps, name: StampedPurchases, input: Purchases, config: {{timestamp: pt}}}}
    - {{type: WindowInto, name: PurchaseSessions, input: StampedPurchases, windowing: {{type: sessions, gap: 30s}}}}
    - type: Sql
      name: PerUser
      input: ClickSessions
      config: {{query: "SELECT user, COUNT(*) AS n FROM PCOLLECTION GROUP BY user"}}
    - type: Join
      name: Bought
      input: {{clicks: ClickSessions, purchases: PurchaseSessions}}
      config: {{type: inner, equalities: [{{clicks: user, purchases: buyer}}]}}
    - {{type: ExtractWindowingInfo, name: PerUserInfo, input: PerUser, config: {{fields: [window_start, window_end]}}}}
    - {{type: ExtractWindowingInfo, name: BoughtInfo, input: Bought, config: {{fields: [window_start, window_end]}}}}
    - type: MapToFields
      name: PerUserShown
      input: PerUserInfo
      config: {{language: sql, fields: {{user: user, n: n, start: "CAST(EXTRACT(EPOCH FROM window_start) AS BIGINT)", end: "CAST(EXTRACT(EPOCH FROM window_end) AS BIGINT)"}}}}
    - type: MapToFields
      name: BoughtShown
      input: BoughtInfo
      config: {{language: sql, fields: {{user: user, t: t, amount: amount, start: "CAST(EXTRACT(EPOCH FROM window_start) AS BIGINT)", end: "CAST(EXTRACT(EPOCH FROM window_end) AS BIGINT)"}}}}
    - {{type: WindowInto, name: A, input: PerUserShown, windowing: {{type: global}}}}
    - {{type: WindowInto, name: B, input: BoughtShown, windowing: {{type: global}}}}
    - {{type: WriteToJson, input: A, config: {{path: {per_user}}}}}
    - {{type: WriteToJson, input: B, config: {{path: {bought}}}}}
options:
  streaming: true
"#,
        per_user = out.join("per_user/rows.jsonl").display(),
        bought = out.join("bought/rows.jsonl").display(),
    );
    let file = write_job(dir.path(), "sessions_join.yaml", &yaml);
    let o = run(dir.path(), &file, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = |sub: &str| {
        let mut v: Vec<String> = vec![];
        for e in std::fs::read_dir(out.join(sub)).unwrap() {
            let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
            v.extend(text.lines().map(|l| {
                let r: Value = serde_json::from_str(l).unwrap();
                r.to_string()
            }));
        }
        v.sort();
        v
    };
    let want = |v: &[Value]| {
        let mut w: Vec<String> = v.iter().map(Value::to_string).collect();
        w.sort();
        w
    };
    use serde_json::json;
    assert_eq!(
        rows("per_user"),
        want(&[
            json!({"user": "a", "n": 2, "start": 0, "end": 50}),
            json!({"user": "a", "n": 1, "start": 100, "end": 130}),
            json!({"user": "b", "n": 1, "start": 10, "end": 40}),
        ])
    );
    assert_eq!(
        rows("bought"),
        want(&[
            json!({"user": "a", "t": 0, "amount": 5, "start": 0, "end": 75}),
            json!({"user": "a", "t": 20, "amount": 5, "start": 0, "end": 75}),
        ])
    );
}

/// Late elements (20 s behind, 1 %): without allowed lateness each is dropped and counted;
/// with it, each joins (or grows) its key's session and fires a late pane, and the sessions
/// the panes grew into are the generator's sessions of every element.
#[test]
fn late_data_in_streaming_sessions_is_dropped_and_counted_or_grows_the_fired_session() {
    let source = "\n        late_fraction: 0.01\n        late_by: 20s";
    for (lateness, keep) in [("", false), ("\n        allowed_lateness: 60s", true)] {
        let dir = tempfile::tempdir().unwrap();
        let file = sessions_pipeline(dir.path(), 30_000, source, lateness);
        let o = run(dir.path(), &file, &["--max-per-checkpoint", "1000"]);
        let err = stderr(&o);
        assert!(o.status.success(), "{err}");
        let (want, late) = expected_sessions(30_000, 3_000_000, 0.01, keep);
        assert!(late > 100, "{late} late elements");
        let (sums, timings) = committed_sessions(dir.path());
        let dropped = if keep { 0 } else { late };
        assert!(
            err.contains(&format!("{dropped} late elements dropped")),
            "expected {dropped} dropped: {err}"
        );
        let late_panes = timings.values().flatten().filter(|t| *t == "LATE").count();
        if keep {
            // Discarding panes: each element in exactly one of them.
            assert_eq!(outermost(&sums), want);
            assert!(late_panes > 100, "{late_panes} late panes");
        } else {
            assert_eq!(sums, want);
            assert_eq!(late_panes, 0);
        }
    }
}

/// Late elements (20 s behind, 1 %) before a Sql over sessions: without allowed lateness each
/// is dropped and counted; with it, each merges into (or grows) its key's session, which fires
/// again: discarding, each element is in exactly one pane and the sessions the panes grew into
/// are the generator's sessions of every element (on 2 workers, one killed mid-run);
/// accumulating, each of those sessions' last pane counts all of its elements, and every pane
/// is within one of them.
#[test]
fn late_data_before_a_streaming_sql_over_sessions_is_dropped_or_fires_the_grown_session() {
    let source = "\n        late_fraction: 0.01\n        late_by: 20s";
    let cases = [
        ("", false, false),
        ("\n        allowed_lateness: 60s", true, false),
        (
            "\n        allowed_lateness: 60s\n        accumulation_mode: accumulating",
            true,
            true,
        ),
    ];
    for (lateness, keep, accumulating) in cases {
        let dir = tempfile::tempdir().unwrap();
        let file = sessions_sql_pipeline(dir.path(), 20_000, source, lateness);
        let err = if keep && !accumulating {
            // Discarding panes on 2 workers, one SIGKILLed: each element still in one pane.
            run_killing_a_worker(dir.path(), &file)
        } else {
            let o = run(dir.path(), &file, &["--max-per-checkpoint", "1000"]);
            assert!(o.status.success(), "{}", stderr(&o));
            stderr(&o)
        };
        let (want, late) = expected_sessions(20_000, 3_000_000, 0.01, keep);
        assert!(late > 100, "{late} late elements");
        let dropped = if keep { 0 } else { late };
        assert!(
            err.contains(&format!("{dropped} late elements dropped")),
            "expected {dropped} dropped: {err}"
        );
        let (sums, _) = committed_sessions(dir.path());
        if !keep {
            assert_eq!(sums, want);
        } else if !accumulating {
            assert_eq!(outermost(&sums), want);
            assert!(sums.len() > want.len(), "no session fired twice");
        } else {
            assert_each_session_s_largest_pane_counts_it(dir.path(), &want);
        }
    }
}

/// An early trigger before a Sql over sessions (after 2 new rows, repeated until the
/// watermark): sessions fire before the watermark passes them and again as they grow.
/// Discarding, on 2 workers with one SIGKILLed, each element is in exactly one pane and the
/// sessions the panes grew into are the generator's; accumulating, each session's largest
/// pane counts all of its elements and every pane is within one of them.
#[test]
fn an_early_trigger_before_a_streaming_sql_over_sessions_fires_them_as_they_grow() {
    let early = "\n        trigger: {after_watermark: {early: {after_count: 2}}}";
    for accumulating in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mode = if accumulating {
            "\n        accumulation_mode: accumulating"
        } else {
            ""
        };
        let file = sessions_sql_pipeline(dir.path(), 20_000, "", &format!("{early}{mode}"));
        if accumulating {
            let o = run(dir.path(), &file, &["--max-per-checkpoint", "1000"]);
            assert!(o.status.success(), "{}", stderr(&o));
        } else {
            run_killing_a_worker(dir.path(), &file);
        }
        let (want, _) = expected_sessions(20_000, 3_000_000, 0.0, false);
        let (sums, _) = committed_sessions(dir.path());
        if accumulating {
            assert_each_session_s_largest_pane_counts_it(dir.path(), &want);
        } else {
            assert_eq!(outermost(&sums), want);
        }
        assert!(sums.len() > want.len(), "no session fired early");
    }
}

/// Accumulating panes: each of `want`'s sessions has a pane counting all of its elements, and
/// every pane is within one of them.
fn assert_each_session_s_largest_pane_counts_it(dir: &Path, want: &PerSession) {
    // The largest pane of each session (panes of one window are summed by
    // `committed_sessions`, so read the rows again).
    let mut largest = PerSession::new();
    for e in std::fs::read_dir(dir.join("out")).unwrap() {
        for line in std::fs::read_to_string(e.unwrap().path()).unwrap().lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            let at = |f: &str| {
                chrono::DateTime::parse_from_rfc3339(v[f].as_str().unwrap())
                    .unwrap()
                    .timestamp_micros()
            };
            let k = (
                v["key"].as_str().unwrap().to_string(),
                at("window_start"),
                at("window_end"),
            );
            let n = largest.entry(k).or_default();
            *n = (*n).max(v["events"].as_u64().unwrap());
        }
    }
    for ((k, s, e), n) in want {
        assert_eq!(
            largest.get(&(k.clone(), *s, *e)),
            Some(n),
            "session {k} [{s}, {e})"
        );
    }
    for (k, s, e) in largest.keys() {
        assert!(
            want.keys()
                .any(|(wk, ws, we)| wk == k && ws <= s && e <= we),
            "a pane of {k} [{s}, {e}) outside the generator's sessions"
        );
    }
    assert!(largest.len() > want.len(), "no session grew after it fired");
}

/// The count per key of every 10-s window sliding every 2 s, from the generator directly:
/// late elements (see [`expected_late`]) left out unless `keep_late`. Also how many are late.
fn expected_sliding(count: u64, late_fraction: f64, keep_late: bool) -> (PerWindow, u64) {
    const SIZE_US: i64 = 10_000_000;
    const PERIOD_US: i64 = 2_000_000;
    let s = SyntheticStream::new(synthetic(late_fraction));
    let b = s.batch(0, count as usize);
    let (keys, times) = (b.column(0).as_string::<i32>(), b.column(3));
    let times = times.as_primitive::<TimestampMicrosecondType>();
    let (mut out, mut late) = (PerWindow::new(), 0);
    for i in 0..b.num_rows() {
        let t = times.value(i);
        if s.nominal_us(i as u64) - t > 3_000_000 {
            late += 1;
            if !keep_late {
                continue;
            }
        }
        let mut start = t.div_euclid(PERIOD_US) * PERIOD_US;
        while start > t - SIZE_US {
            let ws = chrono::DateTime::from_timestamp_micros(start)
                .unwrap()
                .format("%Y-%m-%dT%H:%M:%SZ")
                .to_string();
            *out.entry((keys.value(i).to_string(), ws)).or_default() += 1;
            start -= PERIOD_US;
        }
    }
    (out, late)
}

/// Sliding windows (10 s every 2 s) counted per key. With the default trigger and no allowed
/// lateness the Combine keeps one 2-s slice per key instead of five windows, and fires a
/// window as the merge of its slices: every window fires once, on time, with every on-time
/// element of it, and each late element (1 %, 20 s behind) is dropped and counted once per
/// window, on 2 workers with one SIGKILLed mid-run; the same with a Filter between the
/// WindowInto and the Combine (the WindowInto then assigns every window, and the Combine's
/// producers cut them to slices). With allowed lateness the windows are kept one by one, and
/// each late element comes in a late pane of each of its windows.
#[test]
fn sliding_windows_fire_once_each_with_every_element_through_a_worker_kill() {
    let source = "\n        late_fraction: 0.01\n        late_by: 20s";
    let filter = "    - type: Filter\n      config: {language: sql, keep: \"key <> ''\"}\n";
    let cases = [
        ("", false, ""),
        ("", false, filter),
        ("\n        allowed_lateness: 60s", true, ""),
    ];
    for (lateness, keep, between) in cases {
        let dir = tempfile::tempdir().unwrap();
        let file = pipeline_with(dir.path(), 1000, Some(20_000), true, lateness, source);
        let yaml = std::fs::read_to_string(&file)
            .unwrap()
            .replace(
                "type: fixed\n        size: 10s",
                "type: sliding\n        size: 10s\n        period: 2s",
            )
            .replace(
                "    - type: Combine\n",
                &format!("{between}    - type: Combine\n"),
            );
        std::fs::write(&file, yaml).unwrap();
        let err = if keep || !between.is_empty() {
            let o = run(dir.path(), &file, &["--max-per-checkpoint", "1000"]);
            assert!(o.status.success(), "{}", stderr(&o));
            stderr(&o)
        } else {
            run_killing_a_worker(dir.path(), &file)
        };
        let (want, late) = expected_sliding(20_000, 0.01, keep);
        assert!(late > 100, "{late} late elements");
        let dropped = if keep { 0 } else { 5 * late };
        assert!(
            err.contains(&format!("{dropped} late elements dropped")),
            "expected {dropped} dropped: {err}"
        );
        let (sums, _) = committed(dir.path());
        assert_eq!(sums, want);
        let timings: Vec<String> = panes(dir.path())
            .into_values()
            .flatten()
            .map(|p| p.1)
            .collect();
        let late_panes = timings.iter().filter(|t| *t == "LATE").count();
        if keep {
            assert!(late_panes > 100, "{late_panes} late panes");
        } else {
            assert_eq!(late_panes, 0);
            assert_eq!(timings.len(), want.len(), "one pane per key and window");
        }
    }
}

/// A keyed count and maximum per 10-s window as a `Sql` over `count` synthetic elements,
/// everything available at once (the job drains at the end).
fn sql_pipeline(dir: &Path, count: u64) -> String {
    let yaml = format!(
        r#"pipeline:
  type: chain
  transforms:
    - type: ReadFromSynthetic
      name: Events
      config:
        rate: 1000
        keys: 7
        distribution: zipf
        event_time_skew: 3s
        partitions: 3
        count: {count}
        start: "2024-01-01T00:00:00Z"
    - type: WindowInto
      windowing:
        type: fixed
        size: 10s
    - type: Sql
      name: PerKey
      config:
        query: "SELECT key, COUNT(*) AS events, MAX(value) AS top FROM PCOLLECTION GROUP BY key"
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
    write_job(dir, "job.yaml", &yaml)
}

/// The largest `value` per key and 10-s window of the first `count` synthetic elements (the
/// default options of `expected`), from the generator directly; late elements left out.
fn expected_max(count: u64) -> PerWindow {
    let s = SyntheticStream::new(synthetic(0.0));
    let b = s.batch(0, count as usize);
    let col = |i: usize| b.column(i).as_any();
    let keys = col(0).downcast_ref::<arrow::array::StringArray>().unwrap();
    let values = col(1).downcast_ref::<arrow::array::Int64Array>().unwrap();
    let times = col(3)
        .downcast_ref::<arrow::array::TimestampMicrosecondArray>()
        .unwrap();
    let mut out = PerWindow::new();
    for i in 0..b.num_rows() {
        if s.nominal_us(i as u64) - times.value(i) > 3_000_000 {
            continue;
        }
        let ws = times.value(i).div_euclid(10_000_000) * 10_000_000;
        let start = chrono::DateTime::from_timestamp_micros(ws)
            .unwrap()
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let top = out.entry((keys.value(i).to_string(), start)).or_default();
        *top = (*top).max(values.value(i) as u64);
    }
    out
}

/// Every committed row's `top`: (key, window start) → top.
fn committed_top(dir: &Path) -> PerWindow {
    let mut out = PerWindow::new();
    for e in std::fs::read_dir(dir.join("out")).unwrap() {
        for line in std::fs::read_to_string(e.unwrap().path()).unwrap().lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            let k = (
                v["key"].as_str().unwrap().to_string(),
                v["window_start"].as_str().unwrap().to_string(),
            );
            assert!(
                out.insert(k, v["top"].as_u64().unwrap()).is_none(),
                "{line}"
            );
        }
    }
    out
}

/// A streaming `Sql` runs once per window when the watermark passes it, over the window's
/// rows from every checkpoint: its output equals the same aggregate computed from the
/// generator, one row per key and window.
#[test]
fn a_streaming_sql_runs_once_per_window_over_all_of_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let file = sql_pipeline(dir.path(), 30_000);
    let o = run(dir.path(), &file, &["--max-per-checkpoint", "2500"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (sums, panes) = committed(dir.path());
    assert_eq!(sums, expected(30_000));
    assert!(panes.values().all(|n| *n == 1), "{panes:?}");
    assert_eq!(committed_top(dir.path()), expected_max(30_000));
    // Each window fired once, as its only (last) pane.
    for (w, sets) in window_files(dir.path()) {
        assert_eq!(sets.keys().collect::<Vec<_>>(), ["pane-0-last"], "{w:?}");
    }
}

/// Runs the per-key Sql pipeline with `transforms` (YAML list items) inserted after its Sql,
/// and checks that they total every window of the Sql once: each window's sum, one pane each.
fn totals_per_window_of_the_sql(transforms: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = sql_pipeline(dir.path(), 30_000);
    let yaml = std::fs::read_to_string(&file).unwrap().replace(
        "    - type: ExtractWindowingInfo",
        &format!("{transforms}    - type: ExtractWindowingInfo"),
    );
    std::fs::write(&file, yaml).unwrap();
    let o = run(dir.path(), &file, &["--max-per-checkpoint", "2500"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut want = PerWindow::new();
    for ((_, w), n) in expected(30_000) {
        *want.entry(("all".to_string(), w)).or_default() += n;
    }
    let (sums, panes) = committed(dir.path());
    assert_eq!(sums, want);
    assert!(panes.values().all(|n| *n == 1), "{panes:?}");
}

/// A streaming Sql after a streaming Sql: the first one's output stays in its windows, so
/// the second runs per window too (each window's total over the per-key counts).
#[test]
fn a_streaming_sql_after_a_sql_runs_per_window_of_the_first() {
    totals_per_window_of_the_sql(
        "    - type: Sql\n      name: PerWindow\n      config:\n        query: \"SELECT 'all' AS key, SUM(events) AS events, COUNT(*) AS keys FROM PCOLLECTION\"\n",
    );
}

/// A streaming Combine after a streaming Sql: the Sql's output keeps its window and
/// timestamp, so the Combine groups per window of the Sql (each window's total).
#[test]
fn a_streaming_combine_after_a_sql_groups_per_window_of_the_sql() {
    totals_per_window_of_the_sql(
        "    - type: MapToFields\n      config:\n        language: sql\n        fields:\n          key: \"'all'\"\n          events: events\n    - type: Combine\n      name: PerWindow\n      config:\n        group_by: key\n        combine:\n          events:\n            fn: sum\n            value: events\n",
    );
}

/// A windowed `Join` of two generator streams (their per-key counts, each a streaming
/// Combine) pairs each key's counts within the same window, as the inner join of the two
/// counts computed from the generators.
#[test]
fn a_streaming_windowed_join_pairs_rows_of_the_same_window() {
    let dir = tempfile::tempdir().unwrap();
    let source = |name: &str, seed: u64| {
        format!(
            "    - type: ReadFromSynthetic\n      name: {name}\n      config: {{rate: 1000, keys: 7, distribution: zipf, event_time_skew: 3s, partitions: 3, count: 20000, seed: {seed}, start: \"2024-01-01T00:00:00Z\"}}\n    - type: WindowInto\n      name: {name}Windows\n      input: {name}\n      windowing: {{type: fixed, size: 10s}}\n    - type: Combine\n      name: {name}Counts\n      input: {name}Windows\n      config:\n        group_by: key\n        combine: {{n: {{fn: count}}}}\n"
        )
    };
    let yaml = format!(
        "pipeline:\n  transforms:\n{}{}    - type: Join\n      name: Pairs\n      input: {{a: ACounts, b: BCounts}}\n      config:\n        type: inner\n        equalities: key\n        fields:\n          a: {{key: key, a_events: n}}\n          b: {{b_events: n}}\n    - type: ExtractWindowingInfo\n      input: Pairs\n      config:\n        fields: [window_start]\n    - type: WriteToJson\n      input: ExtractWindowingInfo\n      config:\n        path: {}/pairs.jsonl\noptions:\n  streaming: true\n",
        source("A", 42),
        source("B", 7),
        dir.path().join("out").display()
    );
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, yaml).unwrap();
    let o = run(
        dir.path(),
        &file.display().to_string(),
        &[
            "--max-per-checkpoint",
            "3000",
            "--checkpoint-interval",
            "0.5",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let counts = |seed: u64| {
        let opts = SyntheticOptions {
            seed,
            ..synthetic(0.0)
        };
        common::generator_counts(opts, 20_000, false).0
    };
    let (a, b) = (counts(42), counts(7));
    assert_ne!(a, b, "the two streams differ");
    let want: BTreeMap<(String, String), (u64, u64)> = a
        .iter()
        .filter_map(|(k, n)| Some((k.clone(), (*n, *b.get(k)?))))
        .collect();
    let mut got = BTreeMap::new();
    for e in std::fs::read_dir(dir.path().join("out")).unwrap() {
        for line in std::fs::read_to_string(e.unwrap().path()).unwrap().lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            let k = (
                v["key"].as_str().unwrap().to_string(),
                v["window_start"].as_str().unwrap().to_string(),
            );
            let pair = (
                v["a_events"].as_u64().unwrap(),
                v["b_events"].as_u64().unwrap(),
            );
            assert!(got.insert(k, pair).is_none(), "a pair twice: {line}");
        }
    }
    assert!(!want.is_empty());
    assert_eq!(got, want);
}

/// Exactly-once for a streaming Sql's state shards on `--workers 2`: a worker SIGKILLed twice
/// mid-run (the launcher restarts it); its shards restore from their checkpoints, and the
/// committed output is the expected one, every window once.
#[test]
fn a_streaming_sql_through_worker_kills_outputs_every_window_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = sql_pipeline(dir.path(), 60_000);
    let launcher = command(
        dir.path(),
        &file,
        &[
            "--workers",
            "2",
            "--max-per-checkpoint",
            "1000",
            "--bundle-delay-ms",
            "60",
        ],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let pid = launcher.id();
    std::thread::sleep(Duration::from_millis(1500));
    let mut kills = 0;
    for _ in 0..2 {
        let procs = common::children_of(pid);
        if let Some((victim, _)) = procs.iter().find(|p| p.1.starts_with("worker-")) {
            common::signal(*victim, libc::SIGKILL);
            kills += 1;
        }
        std::thread::sleep(Duration::from_millis(1200));
    }
    let o = launcher.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(kills, 2, "the job ended before the kills");
    let (sums, panes) = committed(dir.path());
    assert_eq!(sums, expected(60_000));
    assert!(
        panes.values().all(|n| *n == 1),
        "a window fired twice: {panes:?}"
    );
    assert_eq!(committed_top(dir.path()), expected_max(60_000));
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
    // Each window's one pane is one set of shards: a replayed commit overwrote its files.
    for (w, sets) in window_files(dir.path()) {
        assert_eq!(sets.keys().collect::<Vec<_>>(), ["pane-0-last"], "{w:?}");
    }
    // The checkpoint log says the runs picked up where they were killed.
    let log = std::fs::read_dir(dir.path().join("checkpoints/checkpoints"))
        .unwrap()
        .count();
    assert!(log > 10, "{log} checkpoint log entries");
}

/// The log of a job is resumed only by the pipeline that wrote it: a Combine renamed in place
/// (what an update applied without a snapshot would run) is refused at start, saying why,
/// instead of failing later on a state checkpoint that was never taken under the new name.
#[test]
fn a_changed_pipeline_is_refused_on_the_checkpoints_of_another_and_the_original_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let file = pipeline(dir.path(), 1000, Some(60_000), true, "");
    let args = ["--max-per-checkpoint", "500", "--bundle-delay-ms", "20"];
    let mut child = command(dir.path(), &file, &args)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let done = dir.path().join("checkpoints/checkpoints");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_dir(&done).map_or(0, |d| {
        d.flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".done.json"))
            .count()
    }) < 2
    {
        assert!(Instant::now() < deadline, "no checkpoint recorded");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let renamed = std::fs::read_to_string(&file)
        .unwrap()
        .replace("name: CountPerKey", "name: Count");
    let other = write_job(dir.path(), "renamed.yaml", &renamed);
    let o = run(dir.path(), &other, &args);
    assert!(!o.status.success(), "the renamed pipeline ran");
    let err = stderr(&o);
    assert!(
        err.contains("hold the state of 'CountPerKey'") && err.contains("snapshot"),
        "{err}"
    );
    // Nothing was changed: the original pipeline resumes and counts exactly.
    let o = run(dir.path(), &file, &args);
    assert!(o.status.success(), "{}", stderr(&o));
    let (sums, panes) = committed(dir.path());
    assert_eq!(sums, expected(60_000));
    assert!(panes.values().all(|n| *n == 1), "{panes:?}");
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
    // Only committed files: a checkpoint's (`counts.jsonl-c…`) or a fired window's
    // (`counts.jsonl-<start>-…`),
    // each whole; no temp directory or part is left in the output.
    if let Ok(entries) = std::fs::read_dir(dir.path().join("out")) {
        for e in entries {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().to_string();
            let window_file = name.starts_with("counts.jsonl-2") && name.contains("-pane-");
            assert!(
                name.starts_with("counts.jsonl-c") || window_file,
                "left behind: {name}"
            );
            for line in std::fs::read_to_string(e.path()).unwrap().lines() {
                serde_json::from_str::<Value>(line)
                    .unwrap_or_else(|err| panic!("{name} holds a partial row {line:?}: {err}"));
            }
        }
    }
}

/// A launcher that is itself SIGKILLed (no Ctrl-C to drain on) takes its coordinator and workers
/// with it: none of them runs on, orphaned, reading a stream that never ends.
#[test]
fn a_killed_launcher_leaves_no_coordinator_or_worker_running() {
    let dir = tempfile::tempdir().unwrap();
    let file = pipeline(dir.path(), 2000, None, false, "");
    let mut child = command(dir.path(), &file, &["--workers", "2"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let children = loop {
        let procs = common::children_of(child.id());
        if procs.iter().any(|p| p.1 == "coordinator")
            && procs.iter().filter(|p| p.1.starts_with("worker-")).count() == 2
        {
            break procs;
        }
        assert!(
            Instant::now() < deadline,
            "no coordinator and 2 workers: {procs:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // Running a while, so that they are not merely starting.
    std::thread::sleep(Duration::from_secs(1));
    child.kill().unwrap();
    child.wait().unwrap();
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while children.iter().any(|(pid, _)| alive(*pid)) {
        assert!(
            Instant::now() < deadline,
            "running on after their launcher was killed: {:?}",
            children
                .iter()
                .filter(|(pid, _)| alive(*pid))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Exactly-once on the distributed runtime: a keyed windowed count on `--workers 3`, five
/// SIGKILLs of random workers at random moments and one of the coordinator; the launcher
/// restarts each (as a StatefulSet would). The committed output equals the count of the input,
/// per key and window, exactly. `RIVERBANK_SOAK_SEED` replays a run's kill schedule.
#[test]
fn exactly_once_on_three_workers_through_five_worker_kills_and_a_coordinator_kill() {
    let dir = tempfile::tempdir().unwrap();
    let file = pipeline(dir.path(), 1000, Some(180_000), true, "");
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
            "60",
        ],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let pid = launcher.id();
    // Kills start once the job runs, and come 0.3–0.8 s apart: the job takes 10 s or more.
    std::thread::sleep(Duration::from_millis(1000));
    let mut kills = vec![];
    for k in 0..6 {
        std::thread::sleep(Duration::from_millis(300 + next(500)));
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
    assert_eq!(sums, expected(180_000), "after kills {kills:?}");
    assert!(
        panes.values().all(|n| *n == 1),
        "a window fired twice after {kills:?}"
    );
}

/// Early firings by element count, accumulating: a window's panes grow, the on-time pane is the
/// last and holds the whole window (Beam's `AfterWatermark(early=AfterCount(n))`).
#[test]
fn early_count_firings_accumulate_and_the_on_time_pane_holds_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let windowing = "
        trigger:
          after_watermark:
            early:
              after_count: 150
        accumulation_mode: accumulating";
    let file = pipeline(dir.path(), 1000, Some(30_000), true, windowing);
    let o = run(dir.path(), &file, &["--max-per-checkpoint", "400"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let want = expected(30_000);
    let want_windows = want.clone();
    let got = panes(dir.path());
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    let mut early = 0;
    for (k, ps) in &got {
        let last = ps.last().unwrap();
        assert_eq!(last.1, "ON_TIME", "{k:?}: {ps:?}");
        assert!(
            last.2,
            "the on-time pane is the last without lateness: {k:?} {ps:?}"
        );
        assert_eq!(last.3, want[k], "{k:?}: {ps:?}");
        for (i, w) in ps.windows(2).enumerate() {
            assert_eq!(w[0].0 + 1, w[1].0, "pane indexes: {ps:?}");
            assert!(w[0].3 <= w[1].3, "accumulating panes never shrink: {ps:?}");
            assert_eq!(w[0].1, "EARLY", "pane {i} of {k:?}: {ps:?}");
        }
        early += ps.len() - 1;
    }
    assert!(early > 10, "{early} early panes");
    // The files: a window's panes are its checkpoints with output, numbered from 0; only the
    // last (at the watermark) is marked so, and it holds every key's on-time pane.
    for (w, sets) in window_files(dir.path()) {
        let n = sets.len();
        let mut want: Vec<String> = (0..n - 1).map(|i| format!("pane-{i}")).collect();
        want.push(format!("pane-{}-last", n - 1));
        let mut got: Vec<String> = sets.keys().cloned().collect();
        got.sort_by_key(|p| p[5..].split('-').next().unwrap().parse::<u32>().unwrap());
        assert_eq!(got, want, "{w:?}");
        let last = &sets[&want[n - 1]];
        let keys: std::collections::BTreeSet<&str> = want_keys(&want_windows, &w.0);
        assert!(
            last.iter().all(|v| v["pane_info"]["timing"] == "ON_TIME"),
            "{w:?}"
        );
        assert_eq!(
            last.iter()
                .map(|v| v["key"].as_str().unwrap())
                .collect::<std::collections::BTreeSet<_>>(),
            keys,
            "{w:?}"
        );
    }
}

/// `never`: one pane per key and window, when it expires, holding all of it; `or_finally`: a
/// window's panes end with the one in which its `until` trigger fired, and what comes after is
/// dropped and counted (the trigger state machines the SDK runner shares).
#[test]
fn never_fires_once_per_window_and_or_finally_ends_a_windows_panes() {
    let dir = tempfile::tempdir().unwrap();
    let file = pipeline(
        dir.path(),
        1000,
        Some(30_000),
        true,
        "\n        trigger: never",
    );
    let o = run(dir.path(), &file, &["--max-per-checkpoint", "400"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let want = expected(30_000);
    let got = panes(dir.path());
    assert_eq!(got.len(), want.len());
    for (k, ps) in &got {
        assert_eq!(ps.len(), 1, "{k:?}: {ps:?}");
        assert_eq!(
            (ps[0].1.as_str(), ps[0].2, ps[0].3),
            ("ON_TIME", true, want[k])
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let until = "
        trigger:
          or_finally:
            main: {repeatedly: {after_count: 50}}
            until: {after_count: 200}";
    let file = pipeline(dir.path(), 1000, Some(30_000), true, until);
    let o = run(dir.path(), &file, &["--max-per-checkpoint", "400"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let got = panes(dir.path());
    let mut ended = 0;
    let mut dropped = 0;
    for (k, ps) in &got {
        let taken: u64 = ps.iter().map(|p| p.3).sum();
        let last = ps.last().unwrap();
        assert!(taken <= want[k], "{k:?}: {ps:?}");
        if taken >= 200 {
            // The pane that took the 200th element is the last.
            assert!(last.2, "{k:?}: {ps:?}");
            ended += 1;
            dropped += want[k] - taken;
        } else {
            assert_eq!(taken, want[k], "{k:?}: {ps:?}");
        }
        assert!(
            ps[..ps.len() - 1].iter().all(|p| !p.2 && p.3 >= 50),
            "{k:?}: {ps:?}"
        );
    }
    assert!(
        ended > 3 && dropped > 0,
        "{ended} windows ended, {dropped} dropped"
    );
    assert!(
        err.contains(&format!(" {dropped} late elements dropped")),
        "the dropped elements are counted: {err}"
    );
}

/// Late data: dropped and counted without allowed lateness; within it, a late pane per
/// arrival adds it (discarding: panes sum to the window's count).
#[test]
fn late_data_is_dropped_and_counted_or_fires_late_panes_within_the_lateness() {
    let source = "\n        late_fraction: 0.01\n        late_by: 20s";
    for (lateness, keep) in [("", false), ("\n        allowed_lateness: 60s", true)] {
        let dir = tempfile::tempdir().unwrap();
        let file = pipeline_with(dir.path(), 1000, Some(30_000), true, lateness, source);
        let o = run(dir.path(), &file, &["--max-per-checkpoint", "400"]);
        let err = stderr(&o);
        assert!(o.status.success(), "{err}");
        let (want, late) = expected_late(30_000, 0.01, keep);
        assert!(late > 100, "{late} late elements");
        let (sums, _) = committed(dir.path());
        assert_eq!(sums, want, "lateness {lateness:?}");
        let dropped = if keep { 0 } else { late };
        assert!(
            err.contains(&format!("{dropped} late elements dropped")),
            "expected {dropped} dropped: {err}"
        );
        let got = panes(dir.path());
        let late_panes = got.values().flatten().filter(|p| p.1 == "LATE").count();
        if keep {
            assert!(late_panes > 10, "{late_panes} late panes");
        } else {
            assert_eq!(late_panes, 0);
        }
    }
}

/// State larger than memory: 20,000 keys held in an hour's window by a job whose memory is
/// 1 MiB. The state lives in the shards' stores on disk (their cache within the memory), and
/// the counts come out right.
#[test]
fn state_many_times_the_memory_limit_lives_on_disk_and_counts_right() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        r#"pipeline:
  type: chain
  transforms:
    - type: ReadFromSynthetic
      config:
        rate: 1000
        keys: 20000
        partitions: 2
        count: 40000
        start: "2024-01-01T00:00:00Z"
    - type: WindowInto
      windowing:
        type: fixed
        size: 1h
    - type: Combine
      config:
        group_by: key
        combine:
          events:
            fn: count
    - type: WriteToJson
      config:
        path: {}/counts.jsonl
"#,
        dir.path().join("out").display()
    );
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, yaml).unwrap();
    let o = run(
        dir.path(),
        file.to_str().unwrap(),
        &[
            "--memory-mb",
            "1",
            "--max-per-checkpoint",
            "5000",
            "--slots",
            "2",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // Every element counted once, over 20,000 keys.
    let mut keys = 0;
    let mut total = 0;
    for e in std::fs::read_dir(dir.path().join("out")).unwrap() {
        for line in std::fs::read_to_string(e.unwrap().path()).unwrap().lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            total += v["events"].as_u64().unwrap();
            keys += 1;
        }
    }
    assert_eq!(total, 40_000);
    assert!(keys > 17_000, "{keys} keys");
    // The state the shards held before the drain, on disk: more than the 1 MiB. Measured as
    // the files a restore of each checkpoint reads (its full copy and deltas), the biggest.
    let checkpoints = dir.path().join("checkpoints/state");
    let sizes: std::collections::BTreeMap<String, u64> = walk(&checkpoints).into_iter().collect();
    let mut per_checkpoint: std::collections::BTreeMap<u64, u64> = Default::default();
    for (path, _) in sizes.iter().filter(|(p, _)| p.contains("manifest-")) {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let shard = Path::new(path).parent().unwrap();
        let size = |name: String| sizes[&shard.join(name).display().to_string()];
        let mut bytes = size(full_file(&v));
        for d in v["deltas"].as_array().unwrap() {
            bytes += size(format!("delta-{d}.arrows"));
        }
        *per_checkpoint
            .entry(v["checkpoint"].as_u64().unwrap())
            .or_default() += bytes;
    }
    let biggest = per_checkpoint.values().copied().max().unwrap_or(0);
    assert!(
        biggest > 2 << 20,
        "{biggest} bytes of state checkpoints: {per_checkpoint:?}"
    );
}

/// The full copy a shard's manifest is based on: a redb file, or a dump of its entries.
fn full_file(manifest: &Value) -> String {
    match manifest["full_format"].as_str() {
        Some("arrows") => format!("full-{}.arrows", manifest["full"]),
        _ => format!("full-{}.redb", manifest["full"]),
    }
}

/// Every file under `dir`: (path, bytes).
fn walk(dir: &Path) -> Vec<(String, u64)> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push((p.display().to_string(), e.metadata().map_or(0, |m| m.len())));
        }
    }
    out
}

/// Update: a running job is snapshotted, and an updated pipeline (its Combine renamed, a
/// transform added) starts from the snapshot with `transformNameMapping`. The two jobs'
/// outputs together count every element exactly once: the windows open at the snapshot
/// carried their state over. An update whose Combine keeps other state (other fns, or slices
/// of sliding windows for windows) is refused.
#[test]
fn an_updated_pipeline_keeps_the_state_of_a_snapshot_and_an_incompatible_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = pipeline(dir.path(), 1000, Some(60_000), true, "");
    let args = ["--max-per-checkpoint", "500", "--bundle-delay-ms", "20"];
    let mut child = command(dir.path(), &file, &args)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    child.kill().unwrap();
    child.wait().unwrap();
    let ckpt = dir.path().join("checkpoints");
    let o = Command::new(BIN)
        .args([
            "snapshot",
            "--checkpoint-dir",
            ckpt.to_str().unwrap(),
            "--name",
            "v1",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let snap = ckpt.join("snapshots/v1");
    assert!(snap.join("record.json").exists());

    // The update: renamed Combine, one more transform, a new output and checkpoint directory.
    let v1 = std::fs::read_to_string(&file).unwrap();
    let out1 = dir.path().join("out").display().to_string();
    let out2 = dir.path().join("out2").display().to_string();
    let v2 = v1
        .replace("name: CountPerKey", "name: CountByKey")
        .replace(
            "    - type: ExtractWindowingInfo",
            "    - type: MapToFields\n      config:\n        language: sql\n        append: true\n        fields:\n          doubled: events * 2\n    - type: ExtractWindowingInfo",
        )
        .replace(&out1, &out2);
    let file2 = dir.path().join("v2.yaml");
    std::fs::write(&file2, &v2).unwrap();
    let run2 = |yaml: &Path, mapping: &str, ck: &str| {
        Command::new(BIN)
            .args([
                "run",
                yaml.to_str().unwrap(),
                "--no-progress",
                "--shuffle-partitions",
                "4",
            ])
            .args(["--max-per-checkpoint", "5000", "--checkpoint-dir"])
            .arg(dir.path().join(ck))
            .arg("--spill-dir")
            .arg(dir.path().join("spill2"))
            .args(["--from-snapshot", snap.to_str().unwrap()])
            .args(["--transform-name-mapping", mapping])
            .output()
            .unwrap()
    };
    // Incompatible first: the Combine sums where the snapshot counted.
    let v3 = v2.replace("fn: count", "fn: sum\n            value: value");
    let file3 = dir.path().join("v3.yaml");
    std::fs::write(&file3, v3).unwrap();
    let o = run2(&file3, r#"{"CountPerKey": "CountByKey"}"#, "ck3");
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("incompatible") && err.contains("CountByKey"),
        "{err}"
    );
    assert!(
        !dir.path().join("out2").exists(),
        "a refused update wrote output"
    );
    // Windows kept one by one cannot become slices (sliding windows fired once each).
    let v4 = v2.replace(
        "type: fixed\n        size: 10s",
        "type: sliding\n        size: 10s\n        period: 2s",
    );
    let file4 = dir.path().join("v4.yaml");
    std::fs::write(&file4, v4).unwrap();
    let o = run2(&file4, r#"{"CountPerKey": "CountByKey"}"#, "ck4");
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("incompatible") && err.contains("per slice"),
        "{err}"
    );
    assert!(!dir.path().join("out2").exists());

    let o = run2(&file2, r#"{"CountPerKey": "CountByKey"}"#, "ck2");
    assert!(o.status.success(), "{}", stderr(&o));
    let (mut sums, mut panes) = committed(dir.path());
    let out2_dir = tempfile::tempdir().unwrap();
    std::fs::rename(dir.path().join("out2"), out2_dir.path().join("out")).unwrap();
    let (sums2, panes2) = committed(out2_dir.path());
    for (k, v) in sums2 {
        *sums.entry(k).or_default() += v;
    }
    for (k, v) in panes2 {
        *panes.entry(k).or_default() += v;
    }
    // The first job's committed output is that of checkpoints up to the snapshot or after it
    // (it was killed after): only what it committed up to the snapshot is kept here, so
    // remove the files of its checkpoints after the snapshot's.
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(snap.join("record.json")).unwrap()).unwrap();
    let at = record["id"].as_u64().unwrap();
    let (after, _) = committed_after(dir.path(), at);
    for (k, v) in after {
        *sums.get_mut(&k).unwrap() -= v;
    }
    assert_eq!(sums, expected(60_000));
}

/// What the first job committed in checkpoints after `at`: every output file but those its
/// checkpoint records up to `at` list (a killed job may have committed a checkpoint it never
/// recorded).
fn committed_after(dir: &Path, at: u64) -> (PerWindow, PerWindow) {
    let log = dir.join("checkpoints/checkpoints");
    let mut kept = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(&log).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().to_string();
        let Some(id) = name.strip_suffix(".done.json") else {
            continue;
        };
        if id.parse::<u64>().unwrap() > at {
            continue;
        }
        let record: Value =
            serde_json::from_str(&std::fs::read_to_string(log.join(&name)).unwrap()).unwrap();
        for c in record["committed"].as_array().unwrap() {
            for f in c[1].as_array().unwrap() {
                let f = Path::new(f.as_str().unwrap());
                kept.insert(f.file_name().unwrap().to_string_lossy().to_string());
            }
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("out")).unwrap();
    for e in std::fs::read_dir(dir.join("out")).unwrap() {
        let p = e.unwrap().path();
        // The killed job's temporary parts of the checkpoint in flight are not output.
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.is_file() && !kept.contains(&name) {
            std::fs::copy(&p, tmp.path().join("out").join(&name)).unwrap();
        }
    }
    committed(tmp.path())
}

/// `run --workers 1 --autoscale`: a streaming job whose one worker cannot keep up with its
/// source is scaled up on its real backlog (the operator's engine, its clock compressed), its
/// state shards move to the new worker through a checkpoint, the pause is reported, and the
/// drained output still counts every element read exactly once.
#[test]
fn a_backlogged_streaming_job_scales_up_and_still_counts_exactly() {
    // A few checkpoints on two workers after the scale-up, then the drain.
    let lines = autoscaled_until(50, 2, "autoscale: 1 -> 2", &[], Duration::from_secs(4));
    let line = lines
        .iter()
        .find(|l| l.starts_with("drained after checkpoint"))
        .unwrap();
    assert!(line.contains("the last paused the job"), "{line}");
}

/// A streaming job on local workers with the autoscaler, kept busy (every bundle spins a core
/// for `busy_ms`), run until a line of the launcher's matches `until`, then drained; the drain
/// must succeed and count every element read exactly once. Gives the launcher's lines.
fn autoscaled_until(
    keys: u32,
    max_workers: u32,
    until: &str,
    extra: &[&str],
    then_run: Duration,
) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        r#"pipeline:
  type: chain
  transforms:
    - type: ReadFromSynthetic
      config:
        rate: 3000
        keys: {keys}
        partitions: 4
    - type: WindowInto
      windowing:
        type: fixed
        size: 60s
    - type: Combine
      config:
        group_by: key
        combine:
          events:
            fn: count
    - type: ExtractWindowingInfo
      config:
        fields: [window_start, pane_info]
    - type: WriteToJson
      config:
        path: {}/counts.jsonl
options:
  streaming: true
  maxNumWorkers: 4
  checkpointIntervalSec: 1
"#,
        dir.path().join("out").display()
    );
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, yaml).unwrap();
    let max = max_workers.to_string();
    let mut args = vec![
        "--workers",
        "1",
        "--slots",
        "2",
        "--autoscale",
        "--max-workers",
        &max,
        "--autoscale-time-scale",
        "20",
        "--bundle-busy-ms",
        "400",
    ];
    args.extend(extra);
    let mut child = command(dir.path(), file.to_str().unwrap(), &args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut lines: Vec<String> = vec![];
    // Generous: on a busy machine the first decision takes minutes (34 s at moderate load).
    let deadline = Instant::now() + Duration::from_secs(240);
    while !lines.iter().any(|l| l.starts_with(until)) {
        if Instant::now() > deadline {
            interrupt(&child);
            let _ = child.wait();
            panic!("no '{until}' line:\n{}", lines.join("\n"));
        }
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
            lines.push(l);
        }
    }
    std::thread::sleep(then_run);
    interrupt(&child);
    let status = child.wait().unwrap();
    lines.extend(rx.try_iter());
    let err = lines.join("\n");
    assert!(status.success(), "{err}");
    let line = lines
        .iter()
        .find(|l| l.starts_with("drained after checkpoint"))
        .unwrap_or_else(|| panic!("{err}"));
    let read: u64 = line
        .split(": ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let (sums, _) = committed(dir.path());
    assert_eq!(sums.values().sum::<u64>(), read, "{err}");
    lines
}

/// MAX_NUM_WORKERS from a real run: a busy, backlogged streaming job already at its maximum.
#[test]
fn a_busy_job_at_its_maximum_raises_max_num_workers() {
    // Small checkpoints: the worker falls behind the source, and the backlog grows past the
    // two minutes the insight waits for.
    let lines = autoscaled_until(
        50,
        1,
        "insight MAX_NUM_WORKERS",
        &["--max-per-checkpoint", "200"],
        Duration::ZERO,
    );
    let l = lines
        .iter()
        .find(|l| l.starts_with("insight MAX_NUM_WORKERS"))
        .unwrap();
    assert!(l.contains("maxNumWorkers (1)"), "{l}");
}

/// ACTIVE_KEYS from a real run: a backlogged job whose one key cannot use more cores.
#[test]
fn a_backlogged_job_with_one_key_raises_active_keys_instead_of_scaling() {
    let lines = autoscaled_until(1, 2, "insight ACTIVE_KEYS", &[], Duration::ZERO);
    assert!(
        !lines.iter().any(|l| l.starts_with("autoscale: 1 -> 2")),
        "scaled up for one key:\n{}",
        lines.join("\n")
    );
}

/// Each branch of a job waits for its own sources' watermark, not for a slower branch's: a
/// finite source whose events are minutes old fires its windows while another source, two
/// hours behind and read a little per checkpoint, holds its own windows back.
#[test]
fn a_branch_fires_on_its_own_sources_watermark_not_a_slower_branchs() {
    let dir = tempfile::tempdir().unwrap();
    let ago = |secs: i64| {
        (chrono::Utc::now() - chrono::Duration::seconds(secs))
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    };
    let out = dir.path().join("out");
    let branch = |name: &str, source: &str| {
        format!(
            r#"    - type: ReadFromSynthetic
      name: {name}
      config: {{rate: 1000, keys: 3, partitions: 1, {source}}}
    - type: WindowInto
      name: {name}Windows
      input: {name}
      windowing: {{type: fixed, size: 1s}}
    - type: Combine
      name: {name}Count
      input: {name}Windows
      config: {{group_by: key, combine: {{events: {{fn: count}}}}}}
    - type: WriteToJson
      name: {name}Out
      input: {name}Count
      config: {{path: {}/{name}/counts.jsonl}}
"#,
            out.display()
        )
    };
    let yaml = format!(
        "pipeline:\n  transforms:\n{}{}options:\n  streaming: true\n  checkpointIntervalSec: 0.2\n",
        branch("Fast", &format!("count: 3000, start: \"{}\"", ago(600))),
        branch("Slow", &format!("start: \"{}\"", ago(7200))),
    );
    let file = write_job(dir.path(), "job.yaml", &yaml);
    let mut child = command(dir.path(), &file, &["--max-per-checkpoint", "500"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = common::drain_stderr(&mut child);
    // Events the fast branch's committed files count.
    let fast_total = || -> u64 {
        let Ok(d) = std::fs::read_dir(out.join("Fast")) else {
            return 0;
        };
        let mut n = 0;
        for e in d.flatten().filter(|e| e.path().is_file()) {
            for line in std::fs::read_to_string(e.path())
                .unwrap_or_default()
                .lines()
            {
                n += serde_json::from_str::<Value>(line)
                    .map_or(0, |v| v["events"].as_u64().unwrap_or(0));
            }
        }
        n
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while fast_total() < 3000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let fired_while_running = fast_total();
    // Window starts of the files each branch committed so far (`counts.jsonl-{start}-…`).
    let starts = |branch: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(out.join(branch))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().is_file())
                    .map(|e| {
                        e.file_name().to_string_lossy()["counts.jsonl-".len()..][..24].to_string()
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    let (fast, slow) = (starts("Fast"), starts("Slow"));
    // SAFETY: kill(2) on our own child's pid: SIGINT drains the job.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{}", log.join());
    assert_eq!(
        fired_while_running, 3000,
        "every fast event counted once while the slow branch still runs: the fast branch's \
         windows did not wait for the slow branch's watermark"
    );
    // The slow branch fires too, its own (two-hour-old) windows: it was behind every window
    // the fast branch fired.
    assert!(
        slow.last()
            .is_none_or(|s| fast.first().is_some_and(|f| s < f)),
        "{slow:?} {fast:?}"
    );
}
