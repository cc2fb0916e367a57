//! Pipelines reading and writing `s3://` through a real S3 server (`s3s-fs`, a file-backed S3
//! implementation) over a real socket, with the real binary. CI installs the server
//! (`cargo install s3s-fs --version 0.14.1 --features binary`); without it the test fails, saying so.
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::S3;

fn riverbank(s3: &S3, args: &[&str]) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_riverbank"));
    c.args(args);
    s3.env(&mut c);
    c.output().unwrap()
}

#[test]
fn pipeline_writes_then_reads_and_aggregates_through_s3() {
    let s3 = S3::start(&["lake"]);
    let root = s3.root();
    let work = tempfile::tempdir().unwrap();

    // Write Parquet into the bucket in two shards...
    let write = work.path().join("write.yaml");
    std::fs::write(
        &write,
        r#"
pipeline:
  transforms:
    - type: Create
      config:
        elements: [{k: a, v: 1}, {k: b, v: 2}, {k: a, v: 3}, {k: c, v: 4}, {k: b, v: 5}]
    - type: WriteToParquet
      input: Create
      config: {path: "s3://lake/in/rows.parquet", num_shards: 2}
"#,
    )
    .unwrap();
    let out = riverbank(&s3, &["run", "--no-progress", write.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "write failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut shards: Vec<String> = std::fs::read_dir(root.join("lake/in"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("rows.parquet-"))
        .collect();
    shards.sort();
    assert_eq!(
        shards,
        ["rows.parquet-00000-of-00002", "rows.parquet-00001-of-00002"]
    );

    // ...then read them back with a glob, combine, and write JSON lines to the bucket.
    let read = work.path().join("read.yaml");
    std::fs::write(
        &read,
        r#"
pipeline:
  transforms:
    - type: ReadFromParquet
      config: {path: "s3://lake/in/rows.parquet-*"}
    - type: Combine
      input: ReadFromParquet
      config: {group_by: [k], combine: {total: {fn: sum, value: v}}}
    - type: WriteToJson
      input: Combine
      config: {path: "s3://lake/out/totals.jsonl", num_shards: 1}
"#,
    )
    .unwrap();
    let out = riverbank(&s3, &["run", "--no-progress", read.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "read failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(root.join("lake/out/totals.jsonl-00000-of-00001")).unwrap();
    let mut rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    rows.sort_by_key(|r| r["k"].as_str().unwrap().to_string());
    assert_eq!(
        rows,
        vec![
            serde_json::json!({"k": "a", "total": 4}),
            serde_json::json!({"k": "b", "total": 7}),
            serde_json::json!({"k": "c", "total": 4})
        ]
    );
    // The same on a coordinator and two worker processes: workers read the bucket and write
    // temp parts there; the coordinator commits them. Byte-identical to the in-process run.
    let read2 = work.path().join("read2.yaml");
    std::fs::write(
        &read2,
        std::fs::read_to_string(&read)
            .unwrap()
            .replace("s3://lake/out/", "s3://lake/out2/"),
    )
    .unwrap();
    let out = riverbank(
        &s3,
        &[
            "run",
            "--no-progress",
            "--workers",
            "2",
            read2.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "distributed read failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text2 =
        std::fs::read_to_string(root.join("lake/out2/totals.jsonl-00000-of-00001")).unwrap();
    assert_eq!(text2, text, "distributed output differs");
    // No temporary object is left in the bucket (s3s-fs keeps empty directories; S3 has none).
    let leftovers: Vec<_> = walk(&root.join("lake"))
        .into_iter()
        .filter(|p| p.is_file() && p.to_string_lossy().contains(".temp-riverbank"))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");

    // A missing object is an error naming the path.
    let missing = work.path().join("missing.yaml");
    std::fs::write(&missing, "pipeline:\n  transforms:\n    - type: ReadFromParquet\n      config: {path: \"s3://lake/nothing/*.parquet\"}\n    - type: LogForTesting\n      input: ReadFromParquet\n").unwrap();
    let out = riverbank(&s3, &["run", "--no-progress", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("s3://lake/nothing/*.parquet"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.push(p.clone());
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
