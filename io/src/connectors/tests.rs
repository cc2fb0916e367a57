//! The formats on records, and both connectors against real brokers (see `testing`).

use std::collections::BTreeMap;

use arrow::array::{Array, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Int64Type};
use riverbank_pipeline::config::{
    ConnectorSinkConfig, ConnectorSourceConfig, Endpoint, RecordFormat, StartAt,
};
use serde_json::json;

use super::testing::Broker;
use super::*;

fn source(format: RecordFormat, timestamp: Option<&str>) -> ConnectorSourceConfig {
    ConnectorSourceConfig {
        endpoint: Endpoint::Kafka {
            topic: "t".into(),
            bootstrap_servers: vec!["unused:9092".into()],
            properties: BTreeMap::new(),
        },
        format,
        start_at: StartAt::Earliest,
        timestamp: timestamp.map(String::from),
    }
}

fn rec(offset: u64, value: &[u8]) -> LogRecord {
    LogRecord {
        offset,
        timestamp_ms: 1_700_000_000_000 + offset as i64,
        key: None,
        value: Some(value.to_vec()),
        headers: vec![],
    }
}

fn avro_schema() -> serde_json::Value {
    json!({"type": "record", "name": "Ride", "fields": [
        {"name": "id", "type": "long"},
        {"name": "zone", "type": ["null", "string"]},
        {"name": "fare", "type": "double"}
    ]})
}

// ------------------------------------------------------------------------------ formats

#[test]
fn raw_and_string_give_one_payload_column_and_bad_utf8_is_a_bad_record() {
    let d = Decoder::new("Read", &source(RecordFormat::Raw, None)).unwrap();
    let out = d.decode(2, &[rec(7, b"\xff\x00"), rec(8, b"ok")]).unwrap();
    assert_eq!(out.batch.num_rows(), 2);
    assert_eq!(out.batch.column(0).as_binary::<i32>().value(0), b"\xff\x00");
    assert_eq!(
        out.event_time_us.values(),
        &[1_700_000_000_007_000, 1_700_000_000_008_000]
    );

    let d = Decoder::new("Read", &source(RecordFormat::String, None)).unwrap();
    let out = d.decode(2, &[rec(7, b"\xff\x00"), rec(8, b"ok")]).unwrap();
    assert_eq!(out.batch.column(0).as_string::<i32>().value(0), "ok");
    assert_eq!(out.offsets, vec![8]);
    assert_eq!(out.bad.len(), 1);
    assert_eq!((out.bad[0].partition, out.bad[0].offset), (2, 7));
    assert!(out.bad[0].message.contains("UTF-8"), "{:?}", out.bad);
}

#[test]
fn json_rows_follow_the_schema_and_bad_records_are_named_by_offset() {
    let schema = json!({"type": "object", "required": ["id"], "properties": {
        "id": {"type": "integer"},
        "at": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "geo": {"type": "object", "properties": {"lat": {"type": "number"}}}
    }});
    let cfg = source(
        RecordFormat::Json {
            schema: Some(schema),
        },
        Some("at"),
    );
    let s = output_schema(&cfg).unwrap();
    assert_eq!(
        s.field_with_name("id").unwrap().data_type(),
        &DataType::Int64
    );
    assert!(!s.field_with_name("id").unwrap().is_nullable());
    assert!(matches!(
        s.field_with_name("geo").unwrap().data_type(),
        DataType::Struct(_)
    ));

    let d = Decoder::new("Read", &cfg).unwrap();
    let records = [
        rec(
            10,
            br#"{"id": 1, "at": "2024-01-01T00:00:01Z", "tags": ["a"], "geo": {"lat": 1.5}}"#,
        ),
        rec(11, b"{not json"),
        rec(12, br#"{"id": "x", "at": "2024-01-01T00:00:02Z"}"#),
        rec(13, br#"{"at": "2024-01-01T00:00:03Z"}"#),
        rec(14, br#"{"id": 4, "at": "yesterday"}"#),
        rec(15, br#"[1, 2]"#),
        rec(
            16,
            br#"{"id": 6, "at": "2024-01-01T00:00:06+01:00", "extra": true}"#,
        ),
    ];
    let out = d.decode(0, &records).unwrap();
    assert_eq!(out.offsets, vec![10, 16]);
    let ids = out.batch.column(0).as_primitive::<Int64Type>();
    assert_eq!(ids.values(), &[1, 6]);
    assert_eq!(
        out.event_time_us.values(),
        &[1_704_067_201_000_000, 1_704_067_206_000_000 - 3_600_000_000]
    );
    let bad: Vec<u64> = out.bad.iter().map(|b| b.offset).collect();
    assert_eq!(bad, vec![11, 12, 13, 14, 15]);
    assert!(
        out.bad
            .iter()
            .all(|b| b.partition == 0 && !b.message.is_empty())
    );
}

#[test]
fn avro_datums_decode_and_round_trip_through_the_encoder() {
    let fmt = RecordFormat::Avro {
        schema: Some(avro_schema()),
    };
    let parsed = apache_avro::Schema::parse(&avro_schema()).unwrap();
    let datum = |id: i64, zone: Option<&str>| {
        use apache_avro::types::Value as A;
        let zone = match zone {
            Some(z) => A::Union(1, Box::new(A::String(z.into()))),
            None => A::Union(0, Box::new(A::Null)),
        };
        let v = A::Record(vec![
            ("id".into(), A::Long(id)),
            ("zone".into(), zone),
            ("fare".into(), A::Double(id as f64 * 2.5)),
        ]);
        apache_avro::to_avro_datum(&parsed, v).unwrap()
    };
    let mut truncated = datum(3, Some("JFK"));
    truncated.truncate(4);
    let mut trailing = datum(4, None);
    trailing.push(0);
    let records = [
        rec(0, &datum(1, Some("JFK"))),
        rec(1, &truncated),
        rec(2, &datum(2, None)),
        rec(3, &trailing),
    ];
    let d = Decoder::new("Read", &source(fmt.clone(), Some("id"))).unwrap();
    let out = d.decode(1, &records).unwrap();
    assert_eq!(out.offsets, vec![0, 2]);
    assert_eq!(
        out.bad.iter().map(|b| b.offset).collect::<Vec<_>>(),
        vec![1, 3]
    );
    let zone = out.batch.column(1).as_string::<i32>();
    assert_eq!((zone.value(0), zone.is_null(1)), ("JFK", true));
    // `timestamp: id`: integers are epoch milliseconds.
    assert_eq!(out.event_time_us.values(), &[1000, 2000]);

    // Encoding the decoded rows gives the same datums back.
    let sink = ConnectorSinkConfig {
        endpoint: source(RecordFormat::Raw, None).endpoint,
        format: fmt,
    };
    let encoded = Encoder::new("Write", &sink)
        .unwrap()
        .encode(&out.batch)
        .unwrap();
    let values: Vec<Vec<u8>> = encoded.into_iter().map(|r| r.value).collect();
    assert_eq!(values, vec![datum(1, Some("JFK")), datum(2, None)]);
}

#[test]
fn the_encoder_writes_json_objects_and_raw_payloads() {
    let batch = RecordBatch::try_from_iter([
        ("id", std::sync::Arc::new(Int64Array::from(vec![1, 2])) as _),
        (
            "name",
            std::sync::Arc::new(StringArray::from(vec![Some("a\nb"), None])) as _,
        ),
    ])
    .unwrap();
    let sink = |format| ConnectorSinkConfig {
        endpoint: source(RecordFormat::Raw, None).endpoint,
        format,
    };
    let json = Encoder::new("W", &sink(RecordFormat::Json { schema: None }))
        .unwrap()
        .encode(&batch)
        .unwrap();
    let rows: Vec<serde_json::Value> = json
        .iter()
        .map(|r| serde_json::from_slice(&r.value).unwrap())
        .collect();
    assert_eq!(
        rows,
        vec![
            json!({"id": 1, "name": "a\nb"}),
            json!({"id": 2, "name": null})
        ]
    );

    // RAW needs the one column, or one called payload.
    let raw = Encoder::new("W", &sink(RecordFormat::Raw)).unwrap();
    let e = raw.encode(&batch).unwrap_err().to_string();
    assert!(e.contains("W") && e.contains("payload"), "{e}");
    let payload = batch.project(&[1]).unwrap();
    let payload = arrow::compute::filter_record_batch(&payload, &vec![true, false].into()).unwrap();
    assert_eq!(raw.encode(&payload).unwrap()[0].value, b"a\nb");
}

#[test]
fn output_schema_is_checked_offline() {
    let no_field = source(
        RecordFormat::Json {
            schema: Some(json!({"type": "object", "properties": {"a": {"type": "integer"}}})),
        },
        Some("b"),
    );
    assert!(output_schema(&no_field).unwrap_err().contains("'b'"));
    let bad_avro = source(
        RecordFormat::Avro {
            schema: Some(
                json!({"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]}),
            ),
        },
        None,
    );
    assert!(output_schema(&bad_avro).unwrap_err().contains("Avro"));
}

// ------------------------------------------------------------------------------ Kafka

fn kafka() -> Broker {
    Broker::kafka().unwrap_or_else(|e| panic!("a Kafka broker is needed: {e}"))
}

fn kafka_endpoint(b: &Broker, topic: &str) -> Endpoint {
    Endpoint::Kafka {
        topic: topic.into(),
        bootstrap_servers: vec![b.addr.clone()],
        properties: BTreeMap::new(),
    }
}

#[tokio::test]
async fn kafka_source_reads_exact_ranges_and_reports_ends_and_lag() {
    let b = kafka();
    kafka::create_topic(&b.addr, "rides", 3).await.unwrap();
    let records: Vec<LogRecord> = (0..25)
        .map(|i| LogRecord {
            offset: 0,
            timestamp_ms: 1_000 + i,
            key: Some(format!("k{i}").into_bytes()),
            value: Some(format!("value-{i:03}").into_bytes()),
            headers: vec![("h".into(), vec![i as u8])],
        })
        .collect();
    let offsets = kafka::produce_raw(&b.addr, "rides", 1, records[..10].to_vec())
        .await
        .unwrap();
    assert_eq!(offsets, (0..10).collect::<Vec<u64>>());
    kafka::produce_raw(&b.addr, "rides", 1, records[10..].to_vec())
        .await
        .unwrap();
    kafka::produce_raw(&b.addr, "rides", 2, records[..3].to_vec())
        .await
        .unwrap();

    let cfg = ConnectorSourceConfig {
        endpoint: kafka_endpoint(&b, "rides"),
        ..source(RecordFormat::String, None)
    };
    let src = Source::open(&cfg).await.unwrap();
    let ends = src.partitions().await.unwrap();
    let ends: Vec<(u32, u64, u64)> = ends
        .iter()
        .map(|e| (e.partition, e.earliest, e.end))
        .collect();
    assert_eq!(ends, vec![(0, 0, 0), (1, 0, 25), (2, 0, 3)]);

    // A range inside one produce batch, across two, and empty.
    let got = src.read(1, 7, 13).await.unwrap();
    assert_eq!(
        got.iter().map(|r| r.offset).collect::<Vec<_>>(),
        (7..13).collect::<Vec<_>>()
    );
    assert_eq!(got[0].value.as_deref(), Some(&b"value-007"[..]));
    assert_eq!(got[0].key.as_deref(), Some(&b"k7"[..]));
    assert_eq!(got[0].timestamp_ms, 1_007);
    assert_eq!(got[0].headers, vec![("h".to_string(), vec![7])]);
    assert!(src.read(1, 5, 5).await.unwrap().is_empty());
    assert_eq!(src.read(1, 0, 25).await.unwrap().len(), 25);
    // The same range again: the same records (a replay is deterministic).
    assert_eq!(src.read(1, 7, 13).await.unwrap(), got);

    // Beyond the end is an error naming topic, partition and range.
    let e = src.read(2, 1, 9).await.unwrap_err().to_string();
    assert!(
        e.contains("rides") && e.contains("partition 2") && e.contains("[1, 9)"),
        "{e}"
    );

    // Lag: in records, and in bytes from the mean record size (here every record is the same
    // size: 9 bytes of value, 2-3 of key, 2 of header).
    let p1 = src.partitions().await.unwrap()[1];
    assert_eq!(p1.lag(20), 5);
    assert!(!p1.bytes_exact);
    let lag_bytes = p1.lag_bytes(20);
    assert!((60..=70).contains(&lag_bytes), "{lag_bytes}");
    assert_eq!(p1.start(StartAt::Latest), 25);
    assert_eq!(p1.start(StartAt::Earliest), 0);

    // Decoding what was read names the partition of a bad record.
    let d = Decoder::new("Read", &cfg).unwrap();
    kafka::produce_raw(&b.addr, "rides", 2, vec![rec(0, b"\xc3\x28")])
        .await
        .unwrap();
    let out = d.decode(2, &src.read(2, 0, 4).await.unwrap()).unwrap();
    assert_eq!(out.batch.num_rows(), 3);
    assert_eq!((out.bad[0].partition, out.bad[0].offset), (2, 3));
}

/// Every record of a topic that this job wrote: (epoch, index, partition, value).
async fn written(src: &Source, job: &str) -> Vec<(u64, u64, u32, Vec<u8>)> {
    let mut out = vec![];
    for p in src.partitions().await.unwrap() {
        for r in src.read(p.partition, p.earliest, p.end).await.unwrap() {
            if let Some((e, i)) = sink_ids::written_by(&r, job) {
                out.push((e, i, p.partition, r.value.unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn out_records(epoch: u64, n: usize) -> Vec<OutRecord> {
    (0..n)
        .map(|i| OutRecord {
            // Some keyed (murmur2 partition), some not (round-robin by position).
            key: (i % 3 == 0).then(|| format!("key-{}", i % 7).into_bytes()),
            value: format!("e{epoch}-r{i}").into_bytes(),
        })
        .collect()
}

#[tokio::test]
async fn kafka_sink_writes_each_epoch_exactly_once_across_retries() {
    let b = kafka();
    kafka::create_topic(&b.addr, "out", 3).await.unwrap();
    let cfg = ConnectorSinkConfig {
        endpoint: kafka_endpoint(&b, "out"),
        format: RecordFormat::Raw,
    };
    let sink = Sink::open(&cfg).await.unwrap();
    let e1 = out_records(1, 20);
    assert_eq!(sink.write_epoch("job-a", 1, &e1).await.unwrap(), 20);
    // The same epoch again (the coordinator retrying a commit it did not see finish).
    assert_eq!(sink.write_epoch("job-a", 1, &e1).await.unwrap(), 0);
    // Epoch 2 half-written by a sink that then crashed; a new sink (no memory of it) retries.
    let e2 = out_records(2, 15);
    assert_eq!(sink.write_epoch("job-a", 2, &e2[..8]).await.unwrap(), 8);
    drop(sink);
    let sink = Sink::open(&cfg).await.unwrap();
    assert_eq!(sink.write_epoch("job-a", 2, &e2).await.unwrap(), 7);
    assert_eq!(sink.write_epoch("job-a", 2, &e2).await.unwrap(), 0);
    // Another job's epoch 2 is not this one's.
    assert_eq!(sink.write_epoch("job-b", 2, &e2[..2]).await.unwrap(), 2);

    let src = Source::open(&ConnectorSourceConfig {
        endpoint: kafka_endpoint(&b, "out"),
        ..source(RecordFormat::Raw, None)
    })
    .await
    .unwrap();
    let got = written(&src, "job-a").await;
    assert_eq!(got.len(), 35, "each record exactly once");
    let mut values: Vec<Vec<u8>> = got.iter().map(|g| g.3.clone()).collect();
    values.sort();
    let mut expected: Vec<Vec<u8>> = e1.iter().chain(&e2).map(|r| r.value.clone()).collect();
    expected.sort();
    assert_eq!(values, expected);
    // Records spread over the partitions; a key always lands in the same one.
    let parts: std::collections::BTreeSet<u32> = got.iter().map(|g| g.2).collect();
    assert_eq!(parts.len(), 3);
}

// ------------------------------------------------------------------------------ NATS

fn nats() -> Broker {
    Broker::nats().unwrap_or_else(|e| panic!("nats-server is needed: {e}"))
}

#[tokio::test]
async fn nats_source_reads_sequence_ranges_of_a_stream() {
    let b = nats();
    nats::create_stream(&b.nats_url(), "RIDES", &["rides.>"], None)
        .await
        .unwrap();
    let payloads = |from: usize, n: usize, p: &str| -> Vec<Vec<u8>> {
        (from..from + n)
            .map(|i| format!("{p}-{i:03}").into_bytes())
            .collect()
    };
    nats::publish_raw(&b.nats_url(), "rides.a", payloads(0, 12, "a"))
        .await
        .unwrap();
    nats::publish_raw(&b.nats_url(), "rides.b", payloads(0, 3, "b"))
        .await
        .unwrap();
    let cfg = ConnectorSourceConfig {
        endpoint: Endpoint::Nats {
            servers: vec![b.nats_url()],
            stream: "RIDES".into(),
            subject: None,
        },
        ..source(RecordFormat::String, None)
    };
    let src = Source::open(&cfg).await.unwrap();
    let ends = src.partitions().await.unwrap();
    assert_eq!(ends.len(), 1);
    assert_eq!((ends[0].earliest, ends[0].end), (1, 16));
    assert!(ends[0].bytes_exact && ends[0].lag_bytes(1) > 15 * 5);
    let got = src.read(0, 4, 14).await.unwrap();
    assert_eq!(
        got.iter().map(|r| r.offset).collect::<Vec<_>>(),
        (4..14).collect::<Vec<_>>()
    );
    assert_eq!(got[0].value.as_deref(), Some(&b"a-003"[..]));
    assert_eq!(src.read(0, 4, 14).await.unwrap(), got);
    assert!(src.read(0, 16, 16).await.unwrap().is_empty());
    let e = src.read(0, 10, 30).await.unwrap_err().to_string();
    assert!(e.contains("RIDES") && e.contains("[10, 30)"), "{e}");

    // A subject filter: the sequences stay the stream's.
    let filtered = Source::open(&ConnectorSourceConfig {
        endpoint: Endpoint::Nats {
            servers: vec![b.nats_url()],
            stream: "RIDES".into(),
            subject: Some("rides.b".into()),
        },
        ..cfg.clone()
    })
    .await
    .unwrap();
    let got = filtered.read(0, 1, 16).await.unwrap();
    assert_eq!(
        got.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![13, 14, 15]
    );
    assert!(filtered.read(0, 1, 13).await.unwrap().is_empty());
}

#[tokio::test]
async fn nats_sink_writes_each_epoch_exactly_once_across_retries() {
    let b = nats();
    // A short de-duplication window that a retry comes after: the tail scan must catch it.
    let window = std::time::Duration::from_millis(200);
    nats::create_stream(&b.nats_url(), "OUT", &["out"], Some(window))
        .await
        .unwrap();
    let endpoint = Endpoint::Nats {
        servers: vec![b.nats_url()],
        stream: "OUT".into(),
        subject: Some("out".into()),
    };
    let cfg = ConnectorSinkConfig {
        endpoint: endpoint.clone(),
        format: RecordFormat::Raw,
    };
    let sink = Sink::open(&cfg).await.unwrap();
    let e1 = out_records(1, 20);
    assert_eq!(sink.write_epoch("job-a", 1, &e1).await.unwrap(), 20);
    assert_eq!(sink.write_epoch("job-a", 1, &e1).await.unwrap(), 0);
    let e2 = out_records(2, 15);
    assert_eq!(sink.write_epoch("job-a", 2, &e2[..8]).await.unwrap(), 8);
    drop(sink);
    tokio::time::sleep(window * 2).await;
    let sink = Sink::open(&cfg).await.unwrap();
    assert_eq!(sink.write_epoch("job-a", 2, &e2).await.unwrap(), 7);
    assert_eq!(sink.write_epoch("job-a", 1, &e1).await.unwrap(), 0);

    let src = Source::open(&ConnectorSourceConfig {
        endpoint,
        ..source(RecordFormat::Raw, None)
    })
    .await
    .unwrap();
    let got = written(&src, "job-a").await;
    let values: Vec<Vec<u8>> = got.iter().map(|g| g.3.clone()).collect();
    let expected: Vec<Vec<u8>> = e1.iter().chain(&e2).map(|r| r.value.clone()).collect();
    assert_eq!(values.len(), 35, "each record exactly once");
    let (mut v, mut x) = (values, expected);
    v.sort();
    x.sort();
    assert_eq!(v, x);
    // In order within the stream: (epoch, index) ascend with the sequence.
    let seq: Vec<(u64, u64)> = src
        .read(0, 1, 36)
        .await
        .unwrap()
        .iter()
        .filter_map(|r| sink_ids::written_by(r, "job-a"))
        .collect();
    let mut sorted = seq.clone();
    sorted.sort();
    assert_eq!(seq, sorted);
}

#[test]
fn lag_never_counts_below_the_earliest_offset() {
    let p = PartitionEnds {
        partition: 0,
        earliest: 100,
        end: 150,
        mean_record_bytes: Some(10.0),
        bytes_exact: true,
    };
    assert_eq!((p.lag(20), p.lag(120), p.lag(200)), (50, 30, 0));
    assert_eq!(p.lag_bytes(120), 300);
}
