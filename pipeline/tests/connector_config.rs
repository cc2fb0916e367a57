//! The unbounded connectors' configs: Beam's ReadFromKafka / WriteToKafka names, Riverbank's
//! ReadFromNats / WriteToNats, and errors naming transform and field.
use riverbank_pipeline::config::{Endpoint, RecordFormat, StartAt, TransformConfig};
use riverbank_pipeline::load_plan;
use serde_json::{Map, json};

fn load(yaml: &str) -> Result<riverbank_pipeline::Plan, String> {
    load_plan(yaml, &Map::new(), "t").map_err(|e| e.to_string())
}

fn config(yaml: &str, name: &str) -> TransformConfig {
    let p = load(yaml).unwrap_or_else(|e| panic!("{e}"));
    p.graph.get(name).unwrap().config.clone()
}

const KAFKA_TO_NATS: &str = r#"
pipeline:
  type: chain
  transforms:
    - type: ReadFromKafka
      name: Read
      config:
        topic: rides
        bootstrap_servers: "k1:9092, k2:9092"
        format: JSON
        schema: {type: object, properties: {id: {type: integer}, at: {type: string}}, required: [id]}
        consumer_config: {auto.offset.reset: earliest, max.poll.records: 500}
        timestamp: at
    - type: WriteToNats
      name: Write
      config:
        servers: [nats://n1:4222]
        stream: OUT
        subject: out.rides
        format: AVRO
        schema: '{"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]}'
"#;

#[test]
fn kafka_source_and_nats_sink_parse_with_beams_names() {
    let TransformConfig::ReadConnector(src) = config(KAFKA_TO_NATS, "Read") else {
        panic!("not a connector source")
    };
    assert!(src.is_unbounded());
    assert_eq!(src.start_at, StartAt::Earliest);
    assert_eq!(src.timestamp.as_deref(), Some("at"));
    let Endpoint::Kafka {
        topic,
        bootstrap_servers,
        properties,
    } = &src.endpoint
    else {
        panic!("not Kafka")
    };
    assert_eq!(topic, "rides");
    assert_eq!(bootstrap_servers, &["k1:9092", "k2:9092"]);
    assert_eq!(properties["max.poll.records"], "500");
    assert!(
        matches!(&src.format, RecordFormat::Json { schema: Some(s) } if s["required"] == json!(["id"]))
    );

    let TransformConfig::WriteConnector(sink) = config(KAFKA_TO_NATS, "Write") else {
        panic!("not a connector sink")
    };
    assert_eq!(
        sink.endpoint,
        Endpoint::Nats {
            servers: vec!["nats://n1:4222".into()],
            stream: "OUT".into(),
            subject: Some("out.rides".into()),
        }
    );
    // Beam passes the Avro schema as a JSON string: it is parsed here.
    assert!(matches!(&sink.format, RecordFormat::Avro { schema: Some(s) } if s["name"] == "R"));
}

#[test]
fn kafka_defaults_to_latest_and_raw_and_takes_producer_config() {
    let yaml = r#"
pipeline:
  transforms:
    - type: ReadFromKafka
      name: Read
      config: {topic: t, bootstrap_servers: "k:9092"}
    - type: WriteToKafka
      name: Write
      input: Read
      config: {topic: u, bootstrap_servers: [k:9092], producer_config_updates: {linger.ms: 5}}
"#;
    let TransformConfig::ReadConnector(src) = config(yaml, "Read") else {
        panic!()
    };
    assert_eq!(src.start_at, StartAt::Latest);
    assert_eq!(src.format, RecordFormat::Raw);
    let TransformConfig::WriteConnector(sink) = config(yaml, "Write") else {
        panic!()
    };
    assert!(
        matches!(sink.endpoint, Endpoint::Kafka { ref properties, .. } if properties["linger.ms"] == "5")
    );
}

#[test]
fn error_handling_is_taken_by_the_kafka_source() {
    let yaml = r#"
pipeline:
  transforms:
    - type: ReadFromKafka
      name: Read
      config:
        topic: t
        bootstrap_servers: k:9092
        format: STRING
        error_handling: {output: bad}
    - type: WriteToKafka
      name: Good
      input: Read
      config: {topic: good, bootstrap_servers: k:9092}
    - type: WriteToKafka
      name: Bad
      input: Read.bad
      config: {topic: dlq, bootstrap_servers: k:9092, format: JSON}
"#;
    let p = load(yaml).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        p.graph.get("Read").unwrap().error_output.as_deref(),
        Some("bad")
    );
}

#[test]
fn bad_configs_name_the_transform_and_field() {
    let cases = [
        (
            "type: ReadFromKafka\n      config: {bootstrap_servers: k:9092}",
            "topic",
            "is required",
        ),
        (
            "type: ReadFromKafka\n      config: {topic: t, bootstrap_servers: k:9092, format: JSON}",
            "schema",
            "needs 'schema'",
        ),
        (
            "type: ReadFromKafka\n      config: {topic: t, bootstrap_servers: k:9092, format: XML}",
            "format",
            "RAW, STRING, JSON or AVRO",
        ),
        (
            "type: ReadFromKafka\n      config: {topic: t, bootstrap_servers: k:9092, consumer_config: {auto.offset.reset: none}}",
            "consumer_config",
            "earliest or latest",
        ),
        (
            "type: ReadFromKafka\n      config: {topic: t, bootstrap_servers: k:9092, format: AVRO, schema: '{\"type\": \"int\"}'}",
            "schema",
            "type: record",
        ),
        (
            "type: ReadFromKafka\n      config: {topic: t, bootstrap_servers: k:9092, group_id: g}",
            "group_id",
            "unknown config field",
        ),
        (
            "type: WriteToNats\n      config: {servers: n:4222, stream: S}",
            "subject",
            "is required",
        ),
        (
            "type: ReadFromNats\n      config: {servers: n:4222, stream: S, format: RAW, schema: {type: object}}",
            "schema",
            "takes no schema",
        ),
    ];
    for (transform, field, msg) in cases {
        let yaml = format!("pipeline:\n  transforms:\n    - name: X\n      {transform}\n");
        let e = load(&yaml).expect_err(&yaml);
        assert!(
            e.contains("X") && e.contains(field) && e.contains(msg),
            "{transform}: {e}"
        );
    }
}
