//! Bounded side inputs (a `Create` and a CSV file, read once or again every
//! `refresh_interval`) joined with a stream in fixed windows, run by the real binary on worker
//! and coordinator processes that are killed mid-run: every window sees all of the side inputs'
//! rows, each event of a key they have is emitted once with its row and its window, and a count
//! per window after the Join equals one computed from the generator's own elements; and the
//! side rows a job keeps are restored from a snapshot after an update (a side input read once
//! is not read again; a refreshed one goes on being read).
use arrow::array::AsArray;
use arrow::datatypes::{Int64Type, TimestampMicrosecondType};
use riverbank_datagen::synthetic::{SyntheticOptions, SyntheticStream};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;

/// 2024-01-01T00:00:00Z.
const START_US: i64 = 1_704_067_200_000_000;
const COUNT: u64 = 6_000;

/// The generator's (key, seq, event time in µs) of its first `count` elements over `keys` keys
/// (seed 42, 1,000 a second).
fn generated(keys: u64, count: u64) -> Vec<(String, i64, i64)> {
    let s = SyntheticStream::new(SyntheticOptions {
        rate: 1000.0,
        keys,
        start_us: START_US,
        seed: 42,
        ..SyntheticOptions::default()
    });
    let b = s.batch(0, count as usize);
    let names = b.column(0).as_string::<i32>();
    let seqs = b.column(2).as_primitive::<Int64Type>();
    let times = b.column(3).as_primitive::<TimestampMicrosecondType>();
    (0..b.num_rows())
        .map(|i| (names.value(i).to_string(), seqs.value(i), times.value(i)))
        .collect()
}

/// The generator's (key, seq, one-second window start in µs) of every element.
fn elements() -> Vec<(String, i64, i64)> {
    generated(5, COUNT)
        .into_iter()
        .map(|(k, seq, t)| (k, seq, t - t.rem_euclid(1_000_000)))
        .collect()
}

/// Every committed row under `dir`.
fn rows(dir: &Path) -> Vec<Value> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
        out.extend(
            text.lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap()),
        );
    }
    out
}

/// An RFC 3339 window start as µs since the epoch.
fn micros(s: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(s)
        .unwrap()
        .timestamp_micros()
}

/// Runs job `yaml` (written to `dir`) on 2 workers, small slowed reads so that it is still
/// running when the processes of `roles` are SIGKILLed one after another; it must succeed.
fn run_killing_on_two_workers(dir: &Path, yaml: &str, roles: &[&str]) {
    let file = dir.join("job.yaml");
    std::fs::write(&file, yaml).unwrap();
    common::run_killing(
        common::streaming_run(
            &file.display().to_string(),
            &dir.join("checkpoints"),
            &dir.join("spill"),
        )
        .args(["--shuffle-partitions", "3", "--workers", "2"])
        .args([
            "--max-per-checkpoint",
            "100",
            "--checkpoint-interval",
            "0.3",
        ])
        .args(["--bundle-delay-ms", "30"])
        .env("RIVERBANK_LOG", "warn"),
        roles,
    );
}

#[test]
fn side_inputs_join_a_windowed_stream_exactly_through_kills() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("zones.csv");
    std::fs::write(&csv, "key,zone\nkey-1,north\nkey-3,south\n").unwrap();
    let out = dir.path().join("out");
    let yaml = format!(
        "pipeline:\n  transforms:\n    - type: ReadFromSynthetic\n      name: Events\n      config: {{rate: 1000, keys: 5, partitions: 2, count: {COUNT}, seed: 42, start: \"2024-01-01T00:00:00Z\"}}\n    - type: WindowInto\n      name: Seconds\n      input: Events\n      windowing: {{type: fixed, size: 1s}}\n    - type: Create\n      name: Labels\n      config:\n        elements: [{{key: key-0, label: zero}}, {{key: key-1, label: one}}]\n    - type: ReadFromCsv\n      name: Zones\n      config: {{path: {}}}\n    - type: Join\n      name: Labelled\n      input: {{labels: Labels, e: Seconds}}\n      config: {{type: inner, equalities: key, fields: {{e: {{key: key, seq: seq}}, labels: {{side: label}}}}}}\n    - type: Join\n      name: Zoned\n      input: {{e: Seconds, zones: Zones}}\n      config: {{type: inner, equalities: key, fields: {{e: {{key: key, seq: seq}}, zones: {{side: zone}}}}}}\n    - type: ExtractWindowingInfo\n      name: ZonedWindows\n      input: Zoned\n      config: {{fields: [window_start]}}\n    - type: WriteToJson\n      input: ZonedWindows\n      config: {{path: {}/zoned.jsonl}}\n    - type: Combine\n      name: PerLabel\n      input: Labelled\n      config:\n        group_by: [side]\n        combine: {{n: {{value: seq, fn: count}}}}\n    - type: ExtractWindowingInfo\n      name: CountWindows\n      input: PerLabel\n      config: {{fields: [window_start]}}\n    - type: WriteToJson\n      input: CountWindows\n      config: {{path: {}/counts.jsonl}}\noptions:\n  streaming: true\n",
        csv.display(),
        out.join("zoned").display(),
        out.join("counts").display()
    );
    // A worker, then the coordinator: the launcher restarts each.
    run_killing_on_two_workers(dir.path(), &yaml, &["worker-", "coordinator"]);

    let events = elements();
    // Each event of a zoned key, once, in its own window.
    let zones = BTreeMap::from([("key-1", "north"), ("key-3", "south")]);
    let want: BTreeSet<(String, i64, String, i64)> = events
        .iter()
        .filter_map(|(k, seq, w)| Some((k.clone(), *seq, zones.get(k.as_str())?.to_string(), *w)))
        .collect();
    let zoned = rows(&out.join("zoned"));
    let got: BTreeSet<(String, i64, String, i64)> = zoned
        .iter()
        .map(|r| {
            let s = |f: &str| r[f].as_str().unwrap().to_string();
            (
                s("key"),
                r["seq"].as_i64().unwrap(),
                s("side"),
                micros(r["window_start"].as_str().unwrap()),
            )
        })
        .collect();
    assert_eq!(got.len(), zoned.len(), "an event emitted twice");
    assert!(want.len() > 1000, "{}", want.len());
    assert!(got == want, "the zoned events differ from the generator's");

    // The count per label and window: one row each (the windows fire once), the generator's.
    let labels = BTreeMap::from([("key-0", "zero"), ("key-1", "one")]);
    let mut want: BTreeMap<(String, i64), u64> = BTreeMap::new();
    for (k, _, w) in &events {
        if let Some(label) = labels.get(k.as_str()) {
            *want.entry((label.to_string(), *w)).or_default() += 1;
        }
    }
    let mut got: BTreeMap<(String, i64), u64> = BTreeMap::new();
    for r in rows(&out.join("counts")) {
        let key = (
            r["side"].as_str().unwrap().to_string(),
            micros(r["window_start"].as_str().unwrap()),
        );
        assert!(
            got.insert(key, r["n"].as_u64().unwrap()).is_none(),
            "a window fired twice: {r}"
        );
    }
    assert_eq!(want.len(), 12, "two labels in six one-second windows");
    assert_eq!(got, want);
}

/// The windowed Join's state, side rows included, survives a snapshot and an update (the Join
/// renamed through `--transform-name-mapping`, a step added after it): the updated job reads
/// no side input again, yet the events committed up to the snapshot and those of the updated
/// job are every zoned event once, with its zone and window.
#[test]
fn the_side_rows_of_a_windowed_join_are_restored_from_a_snapshot_after_an_update() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("zones.csv");
    std::fs::write(&csv, "key,zone\nkey-1,north\nkey-3,south\n").unwrap();
    let out = dir.path().join("out");
    // Re-windowed into the global window before the sink, so its files are per checkpoint
    // and those of checkpoints up to the snapshot can be told apart.
    let v1 = format!(
        "pipeline:\n  transforms:\n    - type: ReadFromSynthetic\n      name: Events\n      config: {{rate: 1000, keys: 5, partitions: 2, count: {COUNT}, seed: 42, start: \"2024-01-01T00:00:00Z\"}}\n    - type: WindowInto\n      name: Seconds\n      input: Events\n      windowing: {{type: fixed, size: 1s}}\n    - type: ReadFromCsv\n      name: Zones\n      config: {{path: {}}}\n    - type: Join\n      name: Zoned\n      input: {{e: Seconds, zones: Zones}}\n      config: {{type: inner, equalities: key, fields: {{e: {{key: key, seq: seq}}, zones: {{side: zone}}}}}}\n    - type: ExtractWindowingInfo\n      name: ZonedWindows\n      input: Zoned\n      config: {{fields: [window_start]}}\n    - type: WindowInto\n      name: Flat\n      input: ZonedWindows\n      windowing: {{type: global}}\n    - type: WriteToJson\n      input: Flat\n      config: {{path: {}/zoned.jsonl}}\noptions:\n  streaming: true\n",
        csv.display(),
        out.join("zoned").display()
    );
    // Small, slowed reads: a backlogged stream checkpoints back to back, and the job must
    // still be running when it is killed.
    let (snap, at) = snapshot_of_v1(
        dir.path(),
        &v1,
        &[
            "--max-per-checkpoint",
            "20",
            "--checkpoint-interval",
            "0.3",
            "--bundle-delay-ms",
            "50",
        ],
    );

    // The CSV now says otherwise (same size): the updated job must take the zones from the
    // restored state, not read the file again.
    std::fs::write(&csv, "key,zone\nkey-1,NORTH\nkey-3,SOUTH\n").unwrap();
    run_update(
        dir.path(),
        (&v1, "    - type: ExtractWindowingInfo"),
        &out,
        &snap,
        &["--max-per-checkpoint", "5000"],
    );

    let event = |r: &Value| {
        let s = |f: &str| r[f].as_str().unwrap().to_string();
        (
            s("key"),
            r["seq"].as_i64().unwrap(),
            s("side"),
            micros(r["window_start"].as_str().unwrap()),
        )
    };
    let mut got = BTreeSet::new();
    // (No file if no window fired before the kill.)
    for r in common::rows_committed_by(&out.join("zoned"), at) {
        assert!(got.insert(event(&r)), "an event twice: {r}");
    }
    let before = got.len();
    for r in rows(&dir.path().join("out2/zoned")) {
        assert_eq!(r["v"], 2, "{r}");
        assert!(got.insert(event(&r)), "an event twice: {r}");
    }
    assert!(got.len() > before, "{before} of {}", got.len());
    let zones = BTreeMap::from([("key-1", "north"), ("key-3", "south")]);
    let want: BTreeSet<(String, i64, String, i64)> = elements()
        .into_iter()
        .filter_map(|(k, seq, w)| {
            let zone = zones.get(k.as_str())?.to_string();
            Some((k, seq, zone, w))
        })
        .collect();
    assert!(got == want, "{} events of {}", got.len(), want.len());
}

/// Version 1 of a side-input job (`v1`) run with `args` on 3 shuffle partitions, killed 3.5 s
/// in and snapshotted: the snapshot, and the time its checkpoint was committed.
fn snapshot_of_v1(dir: &Path, v1: &str, args: &[&str]) -> (PathBuf, u64) {
    let file = dir.join("v1.yaml");
    std::fs::write(&file, v1).unwrap();
    let ckpt = dir.join("checkpoints");
    common::snapshot_of_killed_run(
        common::streaming_run(&file.display().to_string(), &ckpt, &dir.join("spill"))
            .args(["--shuffle-partitions", "3"])
            .args(args),
        &ckpt,
        Duration::from_millis(3500),
    )
}

/// Version 2 of a side-input job (`v1`, whose Join is `Zoned`) run to its end from snapshot
/// `snap` (with `args`): the Join renamed `ZonedByKey` through `--transform-name-mapping`, a step
/// `Tagged` (adding `v: 2`) inserted before the step whose lines begin with `before`, and its
/// output under `out` with a 2 appended.
fn run_update(dir: &Path, (v1, before): (&str, &str), out: &Path, snap: &Path, args: &[&str]) {
    let tagged = "    - type: MapToFields\n      name: Tagged\n      input: ZonedByKey\n      config:\n        language: sql\n        append: true\n        fields:\n          v: 2\n";
    let v2 = v1
        .replace("name: Zoned\n", "name: ZonedByKey\n")
        .replace("input: Zoned\n", "input: Tagged\n")
        .replace(before, &format!("{tagged}{before}"))
        .replace(&out.display().to_string(), &format!("{}2", out.display()));
    assert!(v2.contains("name: Tagged"), "{v2}");
    let file2 = dir.join("v2.yaml");
    std::fs::write(&file2, &v2).unwrap();
    let o = common::streaming_run(
        &file2.display().to_string(),
        &dir.join("ck2"),
        &dir.join("spill2"),
    )
    .args(["--shuffle-partitions", "3"])
    .args(args)
    .args(["--from-snapshot", snap.to_str().unwrap()])
    .args(["--transform-name-mapping", r#"{"Zoned": "ZonedByKey"}"#])
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Beside session windows: a `Create` of labels for ten keys joined with a stream of 8,000
/// events in 3-s sessions over 2,000 keys (a key's events about 2 s apart, so each key has several sessions
/// spanning checkpoints), on 2 workers with one SIGKILLed: every event of a labelled key once,
/// with its label and its key's session as the generator's elements make it.
#[test]
fn a_side_input_joins_a_stream_in_session_windows_exactly_through_a_kill() {
    // A Join over sessions runs its query per fired session: few events keep it short.
    const EVENTS: u64 = 8_000;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let labels: Vec<String> = (0..10)
        .map(|i| format!("{{key: key-{i}, label: L{i}}}"))
        .collect();
    let yaml = format!(
        "pipeline:\n  transforms:\n    - type: ReadFromSynthetic\n      name: Events\n      config: {{rate: 1000, keys: 2000, distribution: uniform, partitions: 3, count: {EVENTS}, seed: 42, start: \"2024-01-01T00:00:00Z\"}}\n    - type: WindowInto\n      name: Visits\n      input: Events\n      windowing: {{type: sessions, gap: 3s}}\n    - type: Create\n      name: Labels\n      config:\n        elements: [{}]\n    - type: Join\n      name: Labelled\n      input: {{labels: Labels, e: Visits}}\n      config: {{type: inner, equalities: key, fields: {{e: {{key: key, seq: seq}}, labels: {{side: label}}}}}}\n    - type: ExtractWindowingInfo\n      name: WithSession\n      input: Labelled\n      config: {{fields: [window_start, window_end]}}\n    - type: WindowInto\n      name: Flat\n      input: WithSession\n      windowing: {{type: global}}\n    - type: WriteToJson\n      input: Flat\n      config: {{path: {}/labelled.jsonl}}\noptions:\n  streaming: true\n",
        labels.join(", "),
        out.join("labelled").display()
    );
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, yaml).unwrap();
    common::run_killing(
        common::streaming_run(
            &file.display().to_string(),
            &dir.path().join("checkpoints"),
            &dir.path().join("spill"),
        )
        .args(["--shuffle-partitions", "4", "--workers", "2"])
        .args(["--max-per-checkpoint", "300", "--bundle-delay-ms", "20"])
        .env("RIVERBANK_LOG", "warn"),
        &["worker-"],
    );

    // The generator's sessions of the labelled keys: each key's event times in order, a new
    // session wherever the next one starts at or after the current session's end.
    let mut per_key: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for (k, seq, t) in generated(2000, EVENTS) {
        if k.strip_prefix("key-")
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| n < 10)
        {
            per_key.entry(k).or_default().push((t, seq));
        }
    }
    let gap = 3_000_000;
    let mut want = BTreeSet::new();
    for (k, mut events) in per_key {
        events.sort_unstable();
        let label = format!("L{}", &k[4..]);
        let mut session: Vec<(i64, i64)> = vec![];
        let mut end = i64::MIN;
        let mut close = |session: &mut Vec<(i64, i64)>, end: i64| {
            if let Some(start) = session.first().map(|e| e.0) {
                for (_, seq) in session.drain(..) {
                    want.insert((k.clone(), seq, label.clone(), start, end));
                }
            }
        };
        for (t, seq) in events {
            if t >= end {
                close(&mut session, end);
            }
            end = end.max(t + gap);
            session.push((t, seq));
        }
        close(&mut session, end);
    }
    let rows = rows(&out.join("labelled"));
    let got: BTreeSet<(String, i64, String, i64, i64)> = rows
        .iter()
        .map(|r| {
            let s = |f: &str| r[f].as_str().unwrap().to_string();
            (
                s("key"),
                r["seq"].as_i64().unwrap(),
                s("side"),
                micros(r["window_start"].as_str().unwrap()),
                micros(r["window_end"].as_str().unwrap()),
            )
        })
        .collect();
    assert_eq!(got.len(), rows.len(), "an event emitted twice");
    assert!(want.len() > 20, "{}", want.len());
    assert!(got == want, "{} rows, {} wanted", got.len(), want.len());
}

/// A CSV side input read again every second (`refresh_interval: 1s`, Beam's slowly updating
/// side input) beside a stream paced by the clock, in one-second windows, on 2 workers with one
/// SIGKILLed: the file is rewritten once three windows are committed (key-1's zone changed,
/// key-3 removed, key-2 added), and the job is drained (Ctrl-C) once a window of the new read
/// is committed — not after a fixed count: a loaded machine can hold a restarted worker back
/// until the whole of a short stream is there, and then every window joins the first read.
/// Each window's Join sees one read of it whole, the first read up to some window and the new
/// one from the next on; every event of key-1 (in both reads) that was read is emitted once,
/// key-3's only in windows of the first read and key-2's only in windows of the second.
#[test]
fn a_side_input_read_again_every_interval_replaces_the_last_read_in_the_windows_after_it() {
    // A bound the drain comes long before (60 s of the stream).
    const EVENTS: u64 = 30_000;
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("zones.csv");
    std::fs::write(&csv, "key,zone\nkey-1,north\nkey-3,south\n").unwrap();
    let out = dir.path().join("out");
    // No start: the stream is paced by the clock.
    let yaml = format!(
        "pipeline:\n  transforms:\n    - type: ReadFromSynthetic\n      name: Events\n      config: {{rate: 500, keys: 5, partitions: 2, count: {EVENTS}, seed: 42}}\n    - type: WindowInto\n      name: Seconds\n      input: Events\n      windowing: {{type: fixed, size: 1s}}\n    - type: ReadFromCsv\n      name: Zones\n      config: {{path: {}, refresh_interval: 1s}}\n    - type: Join\n      name: Zoned\n      input: {{e: Seconds, zones: Zones}}\n      config: {{type: inner, equalities: key, fields: {{e: {{key: key, seq: seq}}, zones: {{side: zone}}}}}}\n    - type: ExtractWindowingInfo\n      name: ZonedWindows\n      input: Zoned\n      config: {{fields: [window_start]}}\n    - type: WriteToJson\n      input: ZonedWindows\n      config: {{path: {}/zoned.jsonl}}\noptions:\n  streaming: true\n",
        csv.display(),
        out.join("zoned").display(),
    );
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, yaml).unwrap();
    // Once three windows are committed (the worker's restart may hold them back a while).
    let rewrite = {
        let (csv, committed) = (csv.clone(), out.join("zoned"));
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while std::fs::read_dir(&committed).map_or(0, |d| d.count()) < 3 {
                assert!(std::time::Instant::now() < deadline, "no windows committed");
                std::thread::sleep(Duration::from_millis(50));
            }
            let aside = csv.with_extension("tmp");
            std::fs::write(&aside, "key,zone\nkey-1,east\nkey-2,west\n").unwrap();
            std::fs::rename(&aside, &csv).unwrap();
        })
    };
    let committed = out.join("zoned");
    let second_read_committed = || {
        std::fs::read_dir(&committed).is_ok_and(|d| {
            d.flatten()
                .any(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains("\"east\"")))
        })
    };
    common::run_killing_then_drain(
        common::streaming_run(
            &file.display().to_string(),
            &dir.path().join("checkpoints"),
            &dir.path().join("spill"),
        )
        .args(["--shuffle-partitions", "3", "--workers", "2"])
        .args(["--checkpoint-interval", "0.3"])
        .env("RIVERBANK_LOG", "warn"),
        &["worker-"],
        second_read_committed,
    );
    rewrite.join().unwrap();

    // Each window's zones, and the read they are of.
    let first = BTreeMap::from([("key-1", "north"), ("key-3", "south")]);
    let second = BTreeMap::from([("key-1", "east"), ("key-2", "west")]);
    let rows = rows(&out.join("zoned"));
    let mut read_of: BTreeMap<i64, u8> = BTreeMap::new();
    let mut seen: BTreeSet<(String, i64)> = BTreeSet::new();
    for r in &rows {
        let (key, zone) = (r["key"].as_str().unwrap(), r["side"].as_str().unwrap());
        let read = match (first.get(key), second.get(key)) {
            (Some(z), _) if *z == zone => 1,
            (_, Some(z)) if *z == zone => 2,
            _ => panic!("{key} in zone {zone}: no read of the file has that"),
        };
        let window = micros(r["window_start"].as_str().unwrap());
        let was = *read_of.entry(window).or_insert(read);
        assert_eq!(was, read, "window {window} joined both reads: {rows:?}");
        assert!(
            seen.insert((key.to_string(), r["seq"].as_i64().unwrap())),
            "emitted twice: {r}"
        );
    }
    // The first read up to some window, the second from the next on.
    let reads: Vec<u8> = read_of.values().copied().collect();
    assert!(reads.is_sorted(), "{read_of:?}");
    assert!(reads.contains(&1) && reads.contains(&2), "{read_of:?}");
    // Every event of key-1 (in both reads) up to the last event read of its partition (the
    // generator's seq modulo 2; any key's row shows how far a partition was read), once.
    let read_to = |p: i64| seen.iter().map(|(_, s)| *s).filter(|s| s % 2 == p).max();
    let (to_0, to_1) = (read_to(0).unwrap(), read_to(1).unwrap());
    let key_1: BTreeSet<i64> = generated(5, EVENTS)
        .into_iter()
        .filter(|(k, seq, _)| k == "key-1" && *seq <= if seq % 2 == 0 { to_0 } else { to_1 })
        .map(|(_, seq, _)| seq)
        .collect();
    let got: BTreeSet<i64> = seen
        .iter()
        .filter(|(k, _)| k == "key-1")
        .map(|(_, seq)| *seq)
        .collect();
    assert!(key_1.len() > 100, "{}", key_1.len());
    assert_eq!(got, key_1);
}

/// Where a file read again every `refresh_interval` may not go, refused by `validate` naming
/// the transform: a batch job (it reads once), a Combine (it would count every read), and a
/// Sql whose only input it is (a refreshed read is a side input).
#[test]
fn a_refreshed_read_is_refused_where_its_reads_would_pile_up() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("zones.csv");
    std::fs::write(&csv, "key,zone\nkey-1,north\n").unwrap();
    let out = dir.path().join("out").display().to_string();
    let read = format!(
        "    - type: ReadFromCsv\n      name: Zones\n      config: {{path: {}, refresh_interval: 1m}}\n",
        csv.display()
    );
    let stream = "options:\n  streaming: true\n";
    let cases = [
        (
            format!(
                "pipeline:\n  transforms:\n{read}    - type: WriteToJson\n      input: Zones\n      config: {{path: {out}/x.jsonl}}\n"
            ),
            "Zones",
            "a batch job reads them once",
        ),
        (
            format!(
                "pipeline:\n  transforms:\n{read}    - type: Combine\n      name: PerZone\n      input: Zones\n      config: {{group_by: zone, combine: {{n: {{value: key, fn: count}}}}}}\n    - type: WriteToJson\n      input: PerZone\n      config: {{path: {out}/x.jsonl}}\n{stream}"
            ),
            "PerZone",
            "a Combine would take the rows of every read",
        ),
        (
            format!(
                "pipeline:\n  transforms:\n{read}    - type: Sql\n      name: North\n      input: Zones\n      config: {{query: \"SELECT key FROM PCOLLECTION WHERE zone = 'north'\"}}\n    - type: WriteToJson\n      input: North\n      config: {{path: {out}/x.jsonl}}\n{stream}"
            ),
            "North",
            "a refreshed read is a side input, beside a stream, of a Sql or Join",
        ),
    ];
    for (yaml, name, why) in cases {
        let file = dir.path().join("job.yaml");
        std::fs::write(&file, &yaml).unwrap();
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_riverbank"))
            .arg("validate")
            .arg(&file)
            .output()
            .unwrap();
        let err = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stderr),
            String::from_utf8_lossy(&o.stdout)
        );
        assert!(!o.status.success(), "{yaml}: {err}");
        assert!(err.contains(name) && err.contains(why), "{err}");
    }
}

/// A refreshed side input through a snapshot and an update: the job (a paced stream joined with
/// a CSV read again every second, windows re-windowed globally so files are per checkpoint) is
/// killed and snapshotted, the CSV rewritten, and the updated job (its Join renamed through
/// `--transform-name-mapping`, a step added) started from the snapshot goes on reading the file
/// every second from the job's first start: its last windows join the new rows (its first, if
/// they fire before its first read, the restored ones), those committed up to the snapshot the
/// old ones, and every event of a key in both reads is there once.
#[test]
fn a_refreshed_side_input_goes_on_being_read_after_an_update_from_a_snapshot() {
    const EVENTS: u64 = 4_000;
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("zones.csv");
    std::fs::write(&csv, "key,zone\nkey-1,north\nkey-3,south\n").unwrap();
    let out = dir.path().join("out");
    let v1 = format!(
        "pipeline:\n  transforms:\n    - type: ReadFromSynthetic\n      name: Events\n      config: {{rate: 500, keys: 5, partitions: 2, count: {EVENTS}, seed: 42}}\n    - type: WindowInto\n      name: Seconds\n      input: Events\n      windowing: {{type: fixed, size: 1s}}\n    - type: ReadFromCsv\n      name: Zones\n      config: {{path: {}, refresh_interval: 1s}}\n    - type: Join\n      name: Zoned\n      input: {{e: Seconds, zones: Zones}}\n      config: {{type: inner, equalities: key, fields: {{e: {{key: key, seq: seq}}, zones: {{side: zone}}}}}}\n    - type: WindowInto\n      name: Flat\n      input: Zoned\n      windowing: {{type: global}}\n    - type: WriteToJson\n      input: Flat\n      config: {{path: {}/zoned.jsonl}}\noptions:\n  streaming: true\n",
        csv.display(),
        out.join("zoned").display()
    );
    let (snap, at) = snapshot_of_v1(dir.path(), &v1, &["--checkpoint-interval", "0.3"]);
    std::fs::write(&csv, "key,zone\nkey-1,NORTH\nkey-3,SOUTH\n").unwrap();
    run_update(
        dir.path(),
        (&v1, "    - type: WindowInto\n      name: Flat"),
        &out,
        &snap,
        &["--checkpoint-interval", "0.3"],
    );

    let mut seen: BTreeSet<(String, i64)> = BTreeSet::new();
    let before = common::rows_committed_by(&out.join("zoned"), at);
    for r in &before {
        let zone = r["side"].as_str().unwrap();
        assert!(
            zone == "north" || zone == "south",
            "before the snapshot: {r}"
        );
        assert!(seen.insert((
            r["key"].as_str().unwrap().into(),
            r["seq"].as_i64().unwrap()
        )));
    }
    // Windows the update fired before its first read of the file (due a second after the
    // last read of the job) join the restored rows; every window after, the new ones.
    let after = rows(&dir.path().join("out2/zoned"));
    let new_zone = |r: &Value| matches!(r["side"].as_str(), Some("NORTH" | "SOUTH"));
    let last = after.iter().max_by_key(|r| r["seq"].as_i64()).unwrap();
    assert!(new_zone(last), "the update's last event: {last}");
    for r in &after {
        assert_eq!(r["v"], 2, "{r}");
        assert!(seen.insert((
            r["key"].as_str().unwrap().into(),
            r["seq"].as_i64().unwrap()
        )));
    }
    assert!(
        !before.is_empty() && !after.is_empty(),
        "{} then {}",
        before.len(),
        after.len()
    );
    let want: BTreeSet<(String, i64)> = generated(5, EVENTS)
        .into_iter()
        .filter(|(k, _, _)| k == "key-1" || k == "key-3")
        .map(|(k, seq, _)| (k, seq))
        .collect();
    assert!(seen == want, "{} events of {}", seen.len(), want.len());
}

/// A lookup join in the global window with Beam's default accumulation (discarding) and a
/// repeated count trigger, on 2 workers with one SIGKILLed: the CSV's rows are a side input,
/// kept by every firing (only the stream's rows are discarded), so every event of a key the
/// file has is emitted once with its zone, not only those of the first firing.
#[test]
fn a_discarding_lookup_join_keeps_its_side_input_for_every_firing() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("zones.csv");
    std::fs::write(&csv, "key,zone\nkey-1,north\nkey-3,south\n").unwrap();
    let out = dir.path().join("out");
    let yaml = format!(
        "pipeline:\n  transforms:\n    - type: ReadFromSynthetic\n      name: Events\n      config: {{rate: 1000, keys: 5, partitions: 2, count: {COUNT}, seed: 42, start: \"2024-01-01T00:00:00Z\"}}\n    - type: WindowInto\n      name: Global\n      input: Events\n      windowing: {{type: global, trigger: {{repeatedly: {{after_count: 100}}}}}}\n    - type: ReadFromCsv\n      name: Zones\n      config: {{path: {}}}\n    - type: Join\n      name: Zoned\n      input: {{e: Global, zones: Zones}}\n      config: {{type: inner, equalities: key, fields: {{e: {{key: key, seq: seq}}, zones: {{side: zone}}}}}}\n    - type: WriteToJson\n      input: Zoned\n      config: {{path: {}/zoned.jsonl}}\noptions:\n  streaming: true\n",
        csv.display(),
        out.join("zoned").display()
    );
    run_killing_on_two_workers(dir.path(), &yaml, &["worker-"]);
    let zones = BTreeMap::from([("key-1", "north"), ("key-3", "south")]);
    let want: BTreeSet<(String, i64, String)> = elements()
        .into_iter()
        .filter_map(|(k, seq, _)| Some((k.clone(), seq, zones.get(k.as_str())?.to_string())))
        .collect();
    let rows = rows(&out.join("zoned"));
    let got: BTreeSet<(String, i64, String)> = rows
        .iter()
        .map(|r| {
            let s = |f: &str| r[f].as_str().unwrap().to_string();
            (s("key"), r["seq"].as_i64().unwrap(), s("side"))
        })
        .collect();
    assert_eq!(got.len(), rows.len(), "an event emitted twice");
    assert!(want.len() > 1000, "{}", want.len());
    assert!(got == want, "{} events of {}", got.len(), want.len());
}
