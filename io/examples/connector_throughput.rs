//! Throughput of the Kafka and NATS connectors on local brokers (tansu in memory, nats-server
//! with JetStream on disk): an epoch's commit into an empty log, its retry (the tail scan
//! alone), reading the records back by offset range, and decoding them as JSON.
//!
//! cargo run --release -p riverbank-io --features test-brokers --example connector_throughput [RECORDS]

use std::collections::BTreeMap;
use std::time::Instant;

use riverbank_io::connectors::testing::Broker;
use riverbank_io::connectors::{ConnectorError, Decoder, OutRecord, Sink, Source, kafka, nats};
use riverbank_pipeline::config::{
    ConnectorSinkConfig, ConnectorSourceConfig, Endpoint, RecordFormat, StartAt,
};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), ConnectorError> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let records: Vec<OutRecord> = (0..n)
        .map(|i| OutRecord {
            key: None,
            value: json!({"id": i, "zone": format!("zone-{}", i % 263), "fare": i as f64 * 0.25})
                .to_string()
                .into_bytes(),
        })
        .collect();
    let bytes: usize = records.iter().map(|r| r.value.len()).sum();
    println!("{n} records, {:.1} MB of values", bytes as f64 / 1e6);

    let k = Broker::kafka().map_err(ConnectorError::Config)?;
    kafka::create_topic(&k.addr, "bench", 3).await?;
    let endpoint = Endpoint::Kafka {
        topic: "bench".into(),
        bootstrap_servers: vec![k.addr.clone()],
        properties: BTreeMap::new(),
    };
    run("kafka (tansu, 3 partitions)", endpoint, &records).await?;

    let s = Broker::nats().map_err(ConnectorError::Config)?;
    nats::create_stream(&s.nats_url(), "BENCH", &["bench"], None).await?;
    let endpoint = Endpoint::Nats {
        servers: vec![s.nats_url()],
        stream: "BENCH".into(),
        subject: Some("bench".into()),
    };
    run("nats (JetStream)", endpoint, &records).await
}

async fn run(name: &str, endpoint: Endpoint, records: &[OutRecord]) -> Result<(), ConnectorError> {
    let n = records.len() as f64;
    let rate = |t: Instant| format!("{:>9.0} records/s", n / t.elapsed().as_secs_f64());
    let sink = Sink::open(&ConnectorSinkConfig {
        endpoint: endpoint.clone(),
        format: RecordFormat::Raw,
    })
    .await?;
    let t = Instant::now();
    sink.write_epoch("bench", 1, records).await?;
    println!("{name}: write epoch        {}", rate(t));
    // A fresh sink retrying the epoch: all of it is found by the tail scan, nothing written.
    let sink = Sink::open(&ConnectorSinkConfig {
        endpoint: endpoint.clone(),
        format: RecordFormat::Raw,
    })
    .await?;
    let t = Instant::now();
    let wrote = sink.write_epoch("bench", 1, records).await?;
    println!("{name}: retry (tail scan)  {} ({wrote} written)", rate(t));

    let schema = json!({"type": "object", "properties": {
        "id": {"type": "integer"}, "zone": {"type": "string"}, "fare": {"type": "number"}}});
    let cfg = ConnectorSourceConfig {
        endpoint,
        format: RecordFormat::Json {
            schema: Some(schema),
        },
        start_at: StartAt::Earliest,
        timestamp: None,
    };
    let source = Source::open(&cfg).await?;
    let t = Instant::now();
    let mut read = vec![];
    for p in source.partitions().await? {
        read.push((
            p.partition,
            source.read(p.partition, p.earliest, p.end).await?,
        ));
    }
    println!("{name}: read ranges        {}", rate(t));
    let decoder = Decoder::new("Read", &cfg)?;
    let t = Instant::now();
    let mut rows = 0;
    for (p, recs) in &read {
        for chunk in recs.chunks(8192) {
            rows += decoder.decode(*p, chunk)?.batch.num_rows();
        }
    }
    println!("{name}: decode JSON        {} ({rows} rows)", rate(t));
    Ok(())
}
