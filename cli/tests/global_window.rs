//! Streaming Sql and Join over the global window, run by the real binary on worker and
//! coordinator processes that are killed mid-run: state kept per key in the shards, each firing emitting what
//! changed. Checked against the generators' own elements: every pair of a Join once, every
//! count's last value the generator's count, nothing emitted twice.
use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use riverbank_datagen::synthetic::{SyntheticOptions, SyntheticStream};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

mod common;

/// 2024-01-01T00:00:00Z.
const START_US: i64 = 1_704_067_200_000_000;
const COUNT: u64 = 2_000;
const KEYS: u64 = 100;

/// Two generator streams, each in the global window with a trigger firing at every
/// checkpoint that brings rows; their Join on key, and a running count per key of one.
fn pipeline(dir: &Path) -> String {
    let source = |name: &str, seed: u64| {
        format!(
            "    - type: ReadFromSynthetic\n      name: {name}\n      config: {{rate: 1000, keys: {KEYS}, partitions: 3, count: {COUNT}, seed: {seed}, start: \"2024-01-01T00:00:00Z\"}}\n    - type: WindowInto\n      name: {name}Global\n      input: {name}\n      windowing:\n        type: global\n        trigger: {{repeatedly: {{after_count: 1}}}}\n        accumulation_mode: accumulating\n"
        )
    };
    let out = dir.join("out");
    format!(
        "pipeline:\n  transforms:\n{}{}    - type: Join\n      name: Pairs\n      input: {{a: AGlobal, b: BGlobal}}\n      config:\n        type: inner\n        equalities: key\n        fields:\n          a: {{key: key, a_seq: seq}}\n          b: {{b_seq: seq}}\n    - type: WriteToJson\n      input: Pairs\n      config:\n        path: {}/pairs.jsonl\n    - type: Sql\n      name: Running\n      input: AGlobal\n      config:\n        query: \"SELECT key, COUNT(*) AS n FROM PCOLLECTION GROUP BY key\"\n    - type: WriteToJson\n      input: Running\n      config:\n        path: {}/counts.jsonl\noptions:\n  streaming: true\n",
        source("A", 42),
        source("B", 7),
        out.join("pairs").display(),
        out.join("counts").display()
    )
}

/// The generator's (key, seq) of every element of stream `seed` over `keys` keys.
fn elements(seed: u64, keys: u64) -> Vec<(String, i64)> {
    let s = SyntheticStream::new(SyntheticOptions {
        rate: 1000.0,
        keys,
        start_us: START_US,
        seed,
        ..SyntheticOptions::default()
    });
    let b = s.batch(0, COUNT as usize);
    let keys = b.column(0).as_string::<i32>();
    let seqs = b.column(2).as_primitive::<Int64Type>();
    (0..b.num_rows())
        .map(|i| (keys.value(i).to_string(), seqs.value(i)))
        .collect()
}

/// `riverbank run JOB EXTRA…` on 2 workers, checkpointing at most `per_checkpoint` elements every
/// 0.3 s into `dir`, killing the processes of `roles` one after another (`common::run_killing`).
fn run_killing(job: &str, extra: &[&str], dir: &Path, per_checkpoint: u32, roles: &[&str]) {
    common::run_killing(
        common::streaming_run(job, &dir.join("checkpoints"), &dir.join("spill"))
            .args(extra)
            .args(["--shuffle-partitions", "4", "--workers", "2"])
            .args(["--max-per-checkpoint", &per_checkpoint.to_string()])
            .args(["--checkpoint-interval", "0.3", "--bundle-delay-ms", "30"])
            .env("RIVERBANK_LOG", "warn"),
        roles,
    );
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

#[test]
fn a_join_and_a_count_over_the_global_window_are_exact_through_worker_and_coordinator_kills() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, pipeline(dir.path())).unwrap();
    // A worker, the coordinator, a worker: the launcher restarts each. Small checkpoints, so
    // the job outlasts the three kills (1.5–3.5 s in) however fast a checkpoint runs.
    run_killing(
        &file.display().to_string(),
        &[],
        dir.path(),
        50,
        &["worker-", "coordinator", "worker-"],
    );

    let (a, b) = (elements(42, KEYS), elements(7, KEYS));
    let mut want = BTreeSet::new();
    for (ka, sa) in &a {
        for (kb, sb) in &b {
            if ka == kb {
                want.insert((ka.clone(), *sa, *sb));
            }
        }
    }
    let pairs = rows(&dir.path().join("out/pairs"));
    let mut got = BTreeSet::new();
    for p in &pairs {
        let pair = (
            p["key"].as_str().unwrap().to_string(),
            p["a_seq"].as_i64().unwrap(),
            p["b_seq"].as_i64().unwrap(),
        );
        assert!(got.insert(pair), "a pair emitted twice: {p}");
    }
    assert!(want.len() > 10_000, "{}", want.len());
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the pairs differ from the generators' join");

    // Each count emitted is a new value of its key (none twice), and the last is the total.
    let mut per_key: BTreeMap<String, u64> = BTreeMap::new();
    for (k, _) in &a {
        *per_key.entry(k.clone()).or_default() += 1;
    }
    let mut seen = BTreeSet::new();
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for c in rows(&dir.path().join("out/counts")) {
        let (k, n) = (
            c["key"].as_str().unwrap().to_string(),
            c["n"].as_u64().unwrap(),
        );
        assert!(seen.insert((k.clone(), n)), "a count emitted twice: {c}");
        let top = last.entry(k).or_default();
        *top = (*top).max(n);
    }
    assert_eq!(last, per_key);
}

/// A stream joined in the global window with two bounded side inputs, a `Create` and a CSV
/// file, on 2 workers (each worker lists the file itself): every event of a key the side
/// input has gets its row once, as a batch join of the same elements gives.
#[test]
fn bounded_side_inputs_join_a_stream_in_the_global_window() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("zones.csv");
    std::fs::write(&csv, "key,zone\nkey-1,north\nkey-3,south\nkey-4,east\n").unwrap();
    let out = dir.path().join("out");
    let yaml = format!(
        "pipeline:\n  transforms:\n    - type: ReadFromSynthetic\n      name: Events\n      config: {{rate: 1000, keys: 5, partitions: 2, count: {COUNT}, seed: 42, start: \"2024-01-01T00:00:00Z\"}}\n    - type: WindowInto\n      name: SoFar\n      input: Events\n      windowing: {{type: global, trigger: {{repeatedly: {{after_count: 1}}}}, accumulation_mode: accumulating}}\n    - type: Create\n      name: Labels\n      config:\n        elements: [{{key: key-0, label: zero}}, {{key: key-1, label: one}}]\n    - type: ReadFromCsv\n      name: Zones\n      config: {{path: {}}}\n    - type: Join\n      name: Labelled\n      input: {{labels: Labels, e: SoFar}}\n      config: {{type: inner, equalities: key, fields: {{e: {{key: key, seq: seq}}, labels: {{side: label}}}}}}\n    - type: Join\n      name: Zoned\n      input: {{e: SoFar, zones: Zones}}\n      config: {{type: inner, equalities: key, fields: {{e: {{key: key, seq: seq}}, zones: {{side: zone}}}}}}\n    - type: WriteToJson\n      input: Labelled\n      config: {{path: {}/labelled.jsonl}}\n    - type: WriteToJson\n      input: Zoned\n      config: {{path: {}/zoned.jsonl}}\noptions:\n  streaming: true\n",
        csv.display(),
        out.join("labelled").display(),
        out.join("zoned").display()
    );
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, yaml).unwrap();
    let o = common::streaming_run(
        &file.display().to_string(),
        &dir.path().join("checkpoints"),
        &dir.path().join("spill"),
    )
    .args(["--shuffle-partitions", "3", "--workers", "2"])
    .args([
        "--max-per-checkpoint",
        "200",
        "--checkpoint-interval",
        "0.2",
    ])
    .env("RIVERBANK_LOG", "warn")
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let side = |pairs: &[(&str, &str)]| -> BTreeSet<(String, i64, String)> {
        let side: BTreeMap<&str, &str> = pairs.iter().copied().collect();
        elements(42, 5)
            .into_iter()
            .filter_map(|(k, s)| Some((k.clone(), s, side.get(k.as_str())?.to_string())))
            .collect()
    };
    let got = |sub: &str| -> BTreeSet<(String, i64, String)> {
        let rows = rows(&out.join(sub));
        let set: BTreeSet<_> = rows
            .iter()
            .map(|r| {
                let s = |f: &str| r[f].as_str().unwrap().to_string();
                (s("key"), r["seq"].as_i64().unwrap(), s("side"))
            })
            .collect();
        assert_eq!(set.len(), rows.len(), "a row emitted twice in {sub}");
        set
    };
    let labelled = side(&[("key-0", "zero"), ("key-1", "one")]);
    assert!(!labelled.is_empty());
    assert_eq!(got("labelled"), labelled);
    assert_eq!(
        got("zoned"),
        side(&[("key-1", "north"), ("key-3", "south"), ("key-4", "east")])
    );
}

/// The Join's kept rows survive a snapshot and an update (the Join renamed through
/// `--transform-name-mapping`, a step added after it): the pairs committed up to the snapshot
/// and those of the updated job are the generators' join, each pair once.
#[test]
fn the_state_of_a_global_join_is_restored_from_a_snapshot_after_an_update() {
    let dir = tempfile::tempdir().unwrap();
    let v1 = pipeline(dir.path());
    let file = dir.path().join("v1.yaml");
    std::fs::write(&file, &v1).unwrap();
    let ckpt = dir.path().join("checkpoints");
    let (snap, at) = common::snapshot_of_killed_run(
        common::streaming_run(
            &file.display().to_string(),
            &ckpt,
            &dir.path().join("spill"),
        )
        // Small, slowed reads: a backlogged stream checkpoints back to back, and the job must
        // still be running when it is killed (on a quiet machine 100 per read drained it
        // within 1.5 s).
        .args(["--shuffle-partitions", "4", "--max-per-checkpoint", "20"])
        .args(["--checkpoint-interval", "0.3", "--bundle-delay-ms", "50"]),
        &ckpt,
        Duration::from_millis(1500),
    );
    assert!(
        at >= 1,
        "the snapshot is of a checkpoint that read something"
    );

    let out = dir.path().join("out").display().to_string();
    let v2 = v1
        .replace("name: Pairs", "name: PairsByKey")
        .replace("input: Pairs\n", "input: Tagged\n")
        .replace(
            "    - type: WriteToJson\n      input: Tagged",
            "    - type: MapToFields\n      name: Tagged\n      input: PairsByKey\n      config:\n        language: sql\n        append: true\n        fields:\n          v: 2\n    - type: WriteToJson\n      input: Tagged",
        )
        .replace(&out, &format!("{out}2"));
    assert!(v2.contains("name: Tagged"), "{v2}");
    let file2 = dir.path().join("v2.yaml");
    std::fs::write(&file2, &v2).unwrap();
    let o = common::streaming_run(
        &file2.display().to_string(),
        &dir.path().join("ck2"),
        &dir.path().join("spill2"),
    )
    .args(["--shuffle-partitions", "4", "--max-per-checkpoint", "5000"])
    .args(["--from-snapshot", snap.to_str().unwrap()])
    .args(["--transform-name-mapping", r#"{"Pairs": "PairsByKey"}"#])
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // The first job's pairs of checkpoints up to the snapshot (it may have committed more
    // before it was killed), then every pair of the updated job.
    let mut got = BTreeSet::new();
    for p in common::rows_committed_by(&dir.path().join("out/pairs"), at) {
        let pair = (
            p["key"].as_str().unwrap().to_string(),
            p["a_seq"].as_i64().unwrap(),
            p["b_seq"].as_i64().unwrap(),
        );
        assert!(got.insert(pair), "a pair twice: {p}");
    }
    let before = got.len();
    for p in rows(&dir.path().join("out2/pairs")) {
        assert_eq!(p["v"], 2, "{p}");
        let pair = (
            p["key"].as_str().unwrap().to_string(),
            p["a_seq"].as_i64().unwrap(),
            p["b_seq"].as_i64().unwrap(),
        );
        assert!(got.insert(pair), "a pair twice: {p}");
    }
    assert!(
        before > 0 && got.len() > before,
        "{before} of {}",
        got.len()
    );
    let (a, b) = (elements(42, KEYS), elements(7, KEYS));
    let mut want = BTreeSet::new();
    for (ka, sa) in &a {
        for (kb, sb) in &b {
            if ka == kb {
                want.insert((ka.clone(), *sa, *sb));
            }
        }
    }
    assert!(got == want, "{} pairs, {} wanted", got.len(), want.len());
}

/// Nexmark Q4 as the benchmark runs it (`bench/nexmark/q4.yaml`: a global-window Join of
/// auctions and bids, each auction's highest bid while open per auction, the average of those
/// per category over them), on 2 workers of which one is SIGKILLed, then the coordinator:
/// every category's last average is the one computed from the generator's events, and no
/// checkpoint emits a category twice.
#[test]
fn nexmark_q4s_running_averages_end_at_the_generators_through_kills() {
    use arrow::datatypes::TimestampMicrosecondType;
    use riverbank_datagen::nexmark::{Nexmark, NexmarkKind, NexmarkOptions};
    const EVENTS: u64 = 8_000;
    const RATE: f64 = 10_000.0;
    let dir = tempfile::tempdir().unwrap();
    let job = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/nexmark/q4.yaml");
    let out = dir.path().join("out");
    let vars = serde_json::json!({
        "rate": RATE, "count": EVENTS, "interval": 1,
        "start": ", start: '2024-01-01T00:00:00Z'", "out": out.display().to_string(),
    });
    let vars = ["--jinja-variables", &vars.to_string()];
    run_killing(job, &vars, dir.path(), 400, &["worker-", "coordinator"]);

    // Independently: each auction's highest bid placed between its opening and its expiry.
    let events = Nexmark::new(NexmarkOptions {
        rate: RATE,
        start_us: START_US,
        // ReadFromNexmark's when none is given.
        seed: 42,
    });
    let auctions = events.batch(NexmarkKind::Auction, 0, EVENTS);
    let col = |b: &arrow::array::RecordBatch, name: &str| b.column_by_name(name).unwrap().clone();
    let (ids, categories) = (col(&auctions, "id"), col(&auctions, "category"));
    let (opened, expires) = (col(&auctions, "dateTime"), col(&auctions, "expires"));
    let (ids, categories) = (
        ids.as_primitive::<Int64Type>(),
        categories.as_primitive::<Int64Type>(),
    );
    let opened = opened.as_primitive::<TimestampMicrosecondType>();
    let expires = expires.as_primitive::<TimestampMicrosecondType>();
    let open: BTreeMap<i64, (i64, i64, i64)> = (0..auctions.num_rows())
        .map(|i| {
            let at = (categories.value(i), opened.value(i), expires.value(i));
            (ids.value(i), at)
        })
        .collect();
    let bids = events.batch(NexmarkKind::Bid, 0, EVENTS);
    let (auction, price, placed) = (
        col(&bids, "auction"),
        col(&bids, "price"),
        col(&bids, "dateTime"),
    );
    let (auction, price) = (
        auction.as_primitive::<Int64Type>(),
        price.as_primitive::<Int64Type>(),
    );
    let placed = placed.as_primitive::<TimestampMicrosecondType>();
    let mut finals: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for i in 0..bids.num_rows() {
        let Some(&(category, from, to)) = open.get(&auction.value(i)) else {
            continue;
        };
        if (from..=to).contains(&placed.value(i)) {
            let f = finals.entry(auction.value(i)).or_insert((category, 0));
            f.1 = f.1.max(price.value(i));
        }
    }
    let mut per_category: BTreeMap<i64, (f64, f64)> = BTreeMap::new();
    for (category, price) in finals.values() {
        let s = per_category.entry(*category).or_default();
        *s = (s.0 + *price as f64, s.1 + 1.0);
    }
    assert!(finals.len() > 300, "{} auctions with bids", finals.len());

    // Emitted: at most one row per category per checkpoint; the last is the total's.
    let mut files: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| !n.starts_with('.'))
        .collect();
    files.sort();
    assert!(files.len() > 3, "few firings: {files:?}");
    let mut last: BTreeMap<i64, f64> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for name in &files {
        let checkpoint = name.rsplit_once("-c").unwrap().1[..8].to_string();
        for l in std::fs::read_to_string(out.join(name)).unwrap().lines() {
            let row: Value = serde_json::from_str(l).unwrap();
            let category = row["category"].as_i64().unwrap();
            let twice = !seen.insert((checkpoint.clone(), category));
            assert!(
                !twice,
                "checkpoint {checkpoint} emits category {category} twice"
            );
            last.insert(category, row["average"].as_f64().unwrap());
        }
    }
    assert_eq!(
        last.keys().collect::<Vec<_>>(),
        per_category.keys().collect::<Vec<_>>()
    );
    for (category, (sum, n)) in &per_category {
        let (want, got) = (sum / n, last[category]);
        assert!(
            (want - got).abs() <= 1e-9 * want.abs(),
            "category {category}: {got}, the generator's {want}"
        );
    }
}
