//! Pipelines reading and writing `s3://` through a real S3 server (`s3s-fs`, a file-backed S3
//! implementation) over a real socket, with the real binary. CI installs the server
//! (`cargo install s3s-fs --version 0.14.1 --features binary`); without it the test fails, saying so.
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn server_binary() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let candidates = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([home.join(".cargo/bin")]);
    candidates.map(|d| d.join("s3s-fs")).find(|p| p.is_file())
}

/// The server, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(bin: &Path, root: &Path) -> (Server, u16) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(bin)
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--access-key",
            "riverbank",
            "--secret-key",
            "riverbank-secret",
        ])
        .arg(root)
        .spawn()
        .expect("start s3s-fs");
    let server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "s3s-fs did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    (server, port)
}

fn riverbank(port: u16, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_riverbank"))
        .args(args)
        .env("AWS_ACCESS_KEY_ID", "riverbank")
        .env("AWS_SECRET_ACCESS_KEY", "riverbank-secret")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}"))
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "false")
        .output()
        .unwrap()
}

#[test]
fn pipeline_writes_then_reads_and_aggregates_through_s3() {
    let bin = server_binary().expect(
        "s3s-fs is not installed: dev/setup.sh installs it (cargo install s3s-fs --version 0.14.1 --features binary --locked)",
    );
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("lake")).unwrap();
    let (_server, port) = start(&bin, root.path());
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
    let out = riverbank(port, &["run", "--no-progress", write.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "write failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut shards: Vec<String> = std::fs::read_dir(root.path().join("lake/in"))
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
    let out = riverbank(port, &["run", "--no-progress", read.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "read failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text =
        std::fs::read_to_string(root.path().join("lake/out/totals.jsonl-00000-of-00001")).unwrap();
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
        port,
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
        std::fs::read_to_string(root.path().join("lake/out2/totals.jsonl-00000-of-00001")).unwrap();
    assert_eq!(text2, text, "distributed output differs");
    // No temporary object is left in the bucket (s3s-fs keeps empty directories; S3 has none).
    let leftovers: Vec<_> = walk(&root.path().join("lake"))
        .into_iter()
        .filter(|p| p.is_file() && p.to_string_lossy().contains(".temp-riverbank"))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");

    // A missing object is an error naming the path.
    let missing = work.path().join("missing.yaml");
    std::fs::write(&missing, "pipeline:\n  transforms:\n    - type: ReadFromParquet\n      config: {path: \"s3://lake/nothing/*.parquet\"}\n    - type: LogForTesting\n      input: ReadFromParquet\n").unwrap();
    let out = riverbank(port, &["run", "--no-progress", missing.to_str().unwrap()]);
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
