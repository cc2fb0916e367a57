//! Streaming from and to real brokers started by the tests: a keyed count per event-time
//! window read from a 3-partition Kafka topic (tansu) and written to another topic, exactly
//! once — in process, and on three workers through five worker kills and a coordinator kill
//! (the launcher restarts each, as a StatefulSet would); and the same from and to NATS
//! JetStream streams (nats-server).
use riverbank_io::connectors::{LogRecord, Source, kafka, testing::Broker};
use riverbank_pipeline::config::{ConnectorSourceConfig, Endpoint, RecordFormat, StartAt};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_riverbank");
/// 2024-01-01T00:00:00Z, in milliseconds.
const START_MS: i64 = 1_704_067_200_000;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `n` JSON events over 3 partitions, keyed `k0`..`k6`, 10 ms of event time apart; the
/// expected count per (key, 10-s window start in ms).
fn produce(broker: &str, n: u64) -> BTreeMap<(String, i64), u64> {
    let expected = common::produce_keyed_events(broker, "events", 3, "amount", START_MS, n);
    rt().block_on(async { kafka::create_topic(broker, "counts", 1).await.unwrap() });
    expected
}

fn pipeline(dir: &Path, broker: &str) -> String {
    let yaml = format!(
        r#"pipeline:
  type: chain
  transforms:
    - type: ReadFromKafka
      config:
        topic: events
        bootstrap_servers: {broker}
        format: JSON
        schema: '{{"type": "object", "properties": {{"key": {{"type": "string"}}, "amount": {{"type": "integer"}}}}, "required": ["key", "amount"]}}'
        consumer_config:
          auto.offset.reset: earliest
    - type: WindowInto
      windowing:
        type: fixed
        size: 10s
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
    - type: WriteToKafka
      config:
        topic: counts
        bootstrap_servers: {broker}
        format: JSON
options:
  streaming: true
  checkpointIntervalSec: 0.5
"#
    );
    let file = dir.join("job.yaml");
    std::fs::write(&file, yaml).unwrap();
    file.display().to_string()
}

/// Every record of topic `counts`: (key, window start in ms) → [events], one per pane.
fn output(broker: &str) -> BTreeMap<(String, i64), Vec<u64>> {
    output_of(Endpoint::Kafka {
        topic: "counts".into(),
        bootstrap_servers: vec![broker.to_string()],
        properties: Default::default(),
    })
}

/// Every record of `endpoint`, read as the counts JSON the pipelines write.
fn output_of(endpoint: Endpoint) -> BTreeMap<(String, i64), Vec<u64>> {
    let cfg = ConnectorSourceConfig {
        endpoint,
        format: RecordFormat::Raw,
        start_at: StartAt::Earliest,
        timestamp: None,
    };
    rt().block_on(async {
        let source = Source::open(&cfg).await.unwrap();
        let mut out: BTreeMap<_, Vec<u64>> = BTreeMap::new();
        for p in source.partitions().await.unwrap() {
            for r in source.read(p.partition, p.earliest, p.end).await.unwrap() {
                let v: Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
                let ws = chrono::DateTime::parse_from_rfc3339(v["window_start"].as_str().unwrap())
                    .unwrap()
                    .timestamp_millis();
                out.entry((v["key"].as_str().unwrap().to_string(), ws))
                    .or_default()
                    .push(v["events"].as_u64().unwrap());
            }
        }
        out
    })
}

/// The offsets the job's last recorded checkpoint reached, summed.
fn read_so_far(checkpoints: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(checkpoints.join("checkpoints")) else {
        return 0;
    };
    let last = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".done.json"))
        .max();
    let Some(last) = last else { return 0 };
    let Ok(text) = std::fs::read_to_string(checkpoints.join("checkpoints").join(last)) else {
        return 0;
    };
    let v: Value = serde_json::from_str(&text).unwrap_or_default();
    v["offsets"]
        .as_array()
        .map_or(0, |a| a.iter().map(|o| o[2].as_u64().unwrap_or(0)).sum())
}

/// Runs the job until it has read `n` records, killing processes meanwhile when `kills`, then
/// drains it.
fn run_to(dir: &Path, file: &str, n: u64, extra: &[&str], kills: bool) -> String {
    let ck = dir.join("ck");
    let mut child = Command::new(BIN)
        .args(["run", file, "--no-progress", "--shuffle-partitions", "6"])
        .arg("--checkpoint-dir")
        .arg(&ck)
        .arg("--spill-dir")
        .arg(dir.join("spill"))
        .args(extra)
        .current_dir(dir)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read as it comes: unread, the pipe filled and stalled the job when kills made it log more.
    let log = common::drain_stderr(&mut child);
    let pid = child.id();
    let started = Instant::now();
    let mut kills_done = vec![];
    let mut seed = started.elapsed().as_nanos() as u64 | 1;
    while read_so_far(&ck) < n {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "read {} of {n}; kills {kills_done:?}; the job's log ends:\n{}",
            read_so_far(&ck),
            log.tail(4000)
        );
        if let Ok(Some(s)) = child.try_wait() {
            panic!("the job ended early ({s}):\n{}", log.tail(4000));
        }
        std::thread::sleep(Duration::from_millis(400));
        if kills && kills_done.len() < 6 && started.elapsed() > Duration::from_secs(2) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let procs = common::children_of(pid);
            let pick: Vec<_> = if kills_done.len() == 3 {
                procs.iter().filter(|p| p.1 == "coordinator").collect()
            } else {
                procs
                    .iter()
                    .filter(|p| p.1.starts_with("worker-"))
                    .collect()
            };
            if !pick.is_empty() {
                let (victim, role) = pick[(seed % pick.len() as u64) as usize];
                common::signal(*victim, libc::SIGKILL);
                kills_done.push(role.clone());
            }
        }
    }
    // Everything is read: drain (every window fires) and wait for the end.
    common::signal(pid as i32, libc::SIGINT);
    let status = child.wait().unwrap();
    let err = log.join();
    assert!(status.success(), "kills {kills_done:?}:\n{err}");
    if kills {
        assert!(kills_done.len() >= 5, "{kills_done:?}");
    }
    err
}

fn check(broker: &str, expected: &BTreeMap<(String, i64), u64>, err: &str) {
    let got = output(broker);
    let sums: BTreeMap<(String, i64), u64> = got
        .iter()
        .map(|(k, v)| (k.clone(), v.iter().sum()))
        .collect();
    assert_eq!(&sums, expected, "{err}");
    assert!(
        got.values().all(|v| v.len() == 1),
        "a window was written twice: {:?}",
        got.iter().filter(|(_, v)| v.len() > 1).collect::<Vec<_>>()
    );
}

#[test]
fn a_windowed_count_from_kafka_to_kafka_is_exact() {
    let broker = Broker::kafka().expect("tansu (installed by dev/setup.sh)");
    let dir = tempfile::tempdir().unwrap();
    let expected = produce(&broker.addr, 6_000);
    let file = pipeline(dir.path(), &broker.addr);
    let err = run_to(
        dir.path(),
        &file,
        6_000,
        &["--max-per-checkpoint", "700"],
        false,
    );
    check(&broker.addr, &expected, &err);
}

/// The issue's exactly-once scenario: Kafka in and out, `--workers 3`, five SIGKILLs of
/// random workers at random moments and one of the coordinator.
#[test]
fn exactly_once_from_kafka_on_three_workers_through_kills() {
    let broker = Broker::kafka().expect("tansu (installed by dev/setup.sh)");
    let dir = tempfile::tempdir().unwrap();
    let expected = produce(&broker.addr, 30_000);
    let file = pipeline(dir.path(), &broker.addr);
    let err = run_to(
        dir.path(),
        &file,
        30_000,
        &[
            "--workers",
            "3",
            "--max-per-checkpoint",
            "400",
            "--bundle-delay-ms",
            "30",
        ],
        true,
    );
    check(&broker.addr, &expected, &err);
}

/// `error_handling` on ReadFromKafka: records that do not decode go to the error output (here
/// a file sink), each once with its partition and offset, and the job goes on counting the
/// rest exactly.
#[test]
fn records_that_do_not_decode_go_to_the_error_output_of_read_from_kafka() {
    let broker = Broker::kafka().expect("tansu (installed by dev/setup.sh)");
    let dir = tempfile::tempdir().unwrap();
    let expected = produce(&broker.addr, 3_000);
    // After the 1,000 good records of partition 0: three that are not JSON.
    let bad: Vec<&[u8]> = vec![b"not json", b"{\"key\": ", b"[1, 2"];
    rt().block_on(async {
        let records = bad
            .iter()
            .map(|v| LogRecord {
                offset: 0,
                timestamp_ms: START_MS + 30_000,
                key: None,
                value: Some(v.to_vec()),
                headers: vec![],
            })
            .collect();
        kafka::produce_raw(&broker.addr, "events", 0, records)
            .await
            .unwrap();
    });
    let yaml = std::fs::read_to_string(pipeline(dir.path(), &broker.addr))
        .unwrap()
        .replace("  type: chain\n", "")
        .replace(
            "        consumer_config:\n          auto.offset.reset: earliest\n",
            "        consumer_config:\n          auto.offset.reset: earliest\n        error_handling:\n          output: bad\n      name: Read\n",
        )
        .replace(
            "    - type: WindowInto\n",
            "    - type: WindowInto\n      input: Read\n      name: Windowed\n",
        )
        .replace(
            "    - type: Combine\n      name: CountPerKey\n",
            "    - type: Combine\n      name: CountPerKey\n      input: Windowed\n",
        )
        .replace(
            "    - type: ExtractWindowingInfo\n",
            "    - type: ExtractWindowingInfo\n      name: Info\n      input: CountPerKey\n",
        )
        .replace(
            "    - type: WriteToKafka\n",
            &format!(
                "    - type: WriteToJson\n      input: Read.bad\n      config:\n        path: {}/bad/records.jsonl\n    - type: WriteToKafka\n      input: Info\n",
                dir.path().display()
            ),
        );
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, yaml).unwrap();
    let err = run_to(
        dir.path(),
        file.to_str().unwrap(),
        3_003,
        &["--max-per-checkpoint", "400"],
        false,
    );
    check(&broker.addr, &expected, &err);
    let mut rows = vec![];
    for e in std::fs::read_dir(dir.path().join("bad")).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            for line in std::fs::read_to_string(&p).unwrap().lines() {
                let v: Value = serde_json::from_str(line).unwrap();
                assert!(!v["msg"].as_str().unwrap().is_empty(), "{v}");
                rows.push((
                    v["element"]["partition"].as_i64().unwrap(),
                    v["element"]["offset"].as_i64().unwrap(),
                    v["element"]["value"].as_str().unwrap().to_string(),
                ));
            }
        }
    }
    rows.sort();
    let want: Vec<(i64, i64, String)> = bad
        .iter()
        .enumerate()
        .map(|(i, v)| (0, 1000 + i as i64, String::from_utf8_lossy(v).to_string()))
        .collect();
    assert_eq!(rows, want, "{err}");
}

/// The same count from and to NATS JetStream streams (nats-server, started by the test), event
/// time from a field of the messages.
#[test]
fn a_windowed_count_from_nats_to_nats_is_exact() {
    use riverbank_io::connectors::nats;
    let broker = Broker::nats().expect("nats-server (installed by dev/setup.sh)");
    let url = broker.nats_url();
    let mut expected: BTreeMap<(String, i64), u64> = BTreeMap::new();
    let mut payloads = vec![];
    for i in 0..3_000u64 {
        let key = format!("k{}", i % 5);
        let ts = START_MS + i as i64 * 10;
        *expected.entry((key.clone(), ts - ts % 10_000)).or_default() += 1;
        payloads.push(json!({"key": key, "ts": ts}).to_string().into_bytes());
    }
    rt().block_on(async {
        nats::create_stream(&url, "events", &["events"], None)
            .await
            .unwrap();
        nats::create_stream(&url, "counts", &["counts"], None)
            .await
            .unwrap();
        for chunk in payloads.chunks(500) {
            nats::publish_raw(&url, "events", chunk.to_vec())
                .await
                .unwrap();
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        r#"pipeline:
  type: chain
  transforms:
    - type: ReadFromNats
      config:
        servers: {url}
        stream: events
        format: JSON
        schema: '{{"type": "object", "properties": {{"key": {{"type": "string"}}, "ts": {{"type": "integer"}}}}, "required": ["key", "ts"]}}'
        timestamp: ts
    - type: WindowInto
      windowing:
        type: fixed
        size: 10s
    - type: Combine
      config:
        group_by: key
        combine:
          events:
            fn: count
    - type: ExtractWindowingInfo
      config:
        fields: [window_start]
    - type: WriteToNats
      config:
        servers: {url}
        stream: counts
        subject: counts
        format: JSON
options:
  streaming: true
  checkpointIntervalSec: 0.5
"#
    );
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, yaml).unwrap();
    let err = run_to(
        dir.path(),
        file.to_str().unwrap(),
        3_000,
        &["--max-per-checkpoint", "700"],
        false,
    );
    let got = output_of(Endpoint::Nats {
        servers: vec![url.clone()],
        stream: "counts".into(),
        subject: None,
    });
    let sums: BTreeMap<(String, i64), u64> = got
        .iter()
        .map(|(k, v)| (k.clone(), v.iter().sum()))
        .collect();
    assert_eq!(sums, expected, "{err}");
    assert!(got.values().all(|v| v.len() == 1), "{got:?}");
}
