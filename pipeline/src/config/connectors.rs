//! Typed configs of the unbounded connectors: Beam YAML's `ReadFromKafka` / `WriteToKafka`
//! (Beam's field names) and Riverbank's `ReadFromNats` / `WriteToNats` (JetStream). The
//! streaming runtime reads them; the batch engine does not run them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::TransformConfig;
use super::fields::{FieldErr, Fields};

/// How each record's bytes are read into (or written from) a row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "format", rename_all = "snake_case")]
pub enum RecordFormat {
    /// One `payload` bytes column: the record's value as is.
    Raw,
    /// One `payload` string column (UTF-8; a value that is not is a bad record).
    String,
    /// One JSON object a record; `schema` is a JSON schema of type object.
    Json { schema: Option<Value> },
    /// One Avro datum a record (binary encoding, no container); `schema` is the Avro schema.
    Avro { schema: Option<Value> },
}

impl RecordFormat {
    pub fn name(&self) -> &'static str {
        match self {
            RecordFormat::Raw => "RAW",
            RecordFormat::String => "STRING",
            RecordFormat::Json { .. } => "JSON",
            RecordFormat::Avro { .. } => "AVRO",
        }
    }
}

/// Where a connector reads or writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "system", rename_all = "snake_case")]
pub enum Endpoint {
    Kafka {
        topic: String,
        /// `host:port` of the brokers to bootstrap from.
        bootstrap_servers: Vec<String>,
        /// `consumer_config` of a source, `producer_config_updates` of a sink (Kafka's names).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        properties: BTreeMap<String, String>,
    },
    Nats {
        /// NATS server URLs (`nats://host:port` or `host:port`).
        servers: Vec<String>,
        /// The JetStream stream: one partition, offsets are its sequence numbers.
        stream: String,
        /// A source's filter subject (optional); the subject a sink publishes to (required).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        subject: Option<String>,
    },
}

/// Where the first epoch starts when there is no checkpoint (Kafka's `auto.offset.reset`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartAt {
    Earliest,
    /// Only records written after the job starts (Kafka's default).
    #[default]
    Latest,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConnectorSourceConfig {
    pub endpoint: Endpoint,
    pub format: RecordFormat,
    pub start_at: StartAt,
    /// A field of the decoded row to take event time from; `None`: the record's timestamp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
}

impl ConnectorSourceConfig {
    /// Always true: these sources never end; the streaming runtime reads them by epochs.
    pub fn is_unbounded(&self) -> bool {
        true
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConnectorSinkConfig {
    pub endpoint: Endpoint,
    pub format: RecordFormat,
}

type Parsed = Result<TransformConfig, FieldErr>;

/// Beam's `ReadFromKafka`.
pub(super) fn read_kafka(p: &Fields) -> Parsed {
    p.only(&[
        "topic",
        "bootstrap_servers",
        "format",
        "schema",
        "consumer_config",
        "auto_offset_reset_config",
        "error_handling",
        "timestamp",
    ])?;
    let properties = string_map(p, "consumer_config")?;
    // Beam takes the reset policy in `consumer_config` or (older) `auto_offset_reset_config`.
    let reset = match p.opt_str("auto_offset_reset_config")? {
        Some(r) => Some(("auto_offset_reset_config", r)),
        None => properties
            .get("auto.offset.reset")
            .map(|r| ("consumer_config", r.clone())),
    };
    let start_at = match reset {
        None => StartAt::Latest,
        Some((_, r)) if r.eq_ignore_ascii_case("earliest") => StartAt::Earliest,
        Some((_, r)) if r.eq_ignore_ascii_case("latest") => StartAt::Latest,
        Some((field, r)) => {
            return Err(p.err(
                field,
                &format!("auto.offset.reset '{r}' is not supported (earliest or latest)"),
            ));
        }
    };
    Ok(TransformConfig::ReadConnector(ConnectorSourceConfig {
        endpoint: Endpoint::Kafka {
            topic: p.req_str("topic")?,
            bootstrap_servers: servers(p, "bootstrap_servers")?,
            properties,
        },
        format: format(p, true)?,
        start_at,
        timestamp: p.opt_str("timestamp")?,
    }))
}

/// Beam's `WriteToKafka`.
pub(super) fn write_kafka(p: &Fields) -> Parsed {
    p.only(&[
        "topic",
        "bootstrap_servers",
        "format",
        "schema",
        "producer_config_updates",
        "error_handling",
    ])?;
    Ok(TransformConfig::WriteConnector(ConnectorSinkConfig {
        endpoint: Endpoint::Kafka {
            topic: p.req_str("topic")?,
            bootstrap_servers: servers(p, "bootstrap_servers")?,
            properties: string_map(p, "producer_config_updates")?,
        },
        format: format(p, false)?,
    }))
}

/// Riverbank's `ReadFromNats` (JetStream).
pub(super) fn read_nats(p: &Fields) -> Parsed {
    p.only(&[
        "servers",
        "stream",
        "subject",
        "format",
        "schema",
        "start_at",
        "error_handling",
        "timestamp",
    ])?;
    let start_at = match p.opt_str("start_at")?.as_deref() {
        None | Some("earliest") => StartAt::Earliest,
        Some("latest") => StartAt::Latest,
        Some(_) => return Err(p.err("start_at", "must be earliest or latest")),
    };
    Ok(TransformConfig::ReadConnector(ConnectorSourceConfig {
        endpoint: Endpoint::Nats {
            servers: servers(p, "servers")?,
            stream: p.req_str("stream")?,
            subject: p.opt_str("subject")?,
        },
        format: format(p, true)?,
        start_at,
        timestamp: p.opt_str("timestamp")?,
    }))
}

/// Riverbank's `WriteToNats` (JetStream).
pub(super) fn write_nats(p: &Fields) -> Parsed {
    p.only(&[
        "servers",
        "stream",
        "subject",
        "format",
        "schema",
        "error_handling",
    ])?;
    Ok(TransformConfig::WriteConnector(ConnectorSinkConfig {
        endpoint: Endpoint::Nats {
            servers: servers(p, "servers")?,
            stream: p.req_str("stream")?,
            subject: Some(p.req_str("subject")?),
        },
        format: format(p, false)?,
    }))
}

/// `format` + `schema`. Reading JSON or Avro needs the schema (the rows' types); writing JSON
/// does not, writing Avro does.
fn format(p: &Fields, reading: bool) -> Result<RecordFormat, FieldErr> {
    let name = p.opt_str("format")?.unwrap_or_else(|| "RAW".into());
    let schema = match p.cfg.get("schema") {
        None | Some(Value::Null) => None,
        // Beam passes Avro (and JSON) schemas as strings holding JSON.
        Some(Value::String(s)) => Some(
            serde_json::from_str::<Value>(s)
                .map_err(|e| p.err("schema", &format!("is not valid JSON: {e}")))?,
        ),
        Some(v @ Value::Object(_)) => Some(v.clone()),
        Some(_) => return Err(p.err("schema", "must be a mapping or a JSON string")),
    };
    let needs_schema =
        |what: &str| p.err("schema", &format!("format {name} needs 'schema' ({what})"));
    let upper = name.to_ascii_uppercase();
    if matches!(upper.as_str(), "RAW" | "BYTES" | "STRING") && schema.is_some() {
        return Err(p.err("schema", &format!("format {name} takes no schema")));
    }
    Ok(match upper.as_str() {
        "RAW" | "BYTES" => RecordFormat::Raw,
        "STRING" => RecordFormat::String,
        "JSON" => {
            if reading && schema.is_none() {
                return Err(needs_schema("a JSON schema of the records"));
            }
            if let Some(s) = &schema
                && s.get("type").and_then(Value::as_str) != Some("object")
            {
                return Err(p.err("schema", "a JSON record schema must have type: object"));
            }
            RecordFormat::Json { schema }
        }
        "AVRO" => {
            let Some(s) = &schema else {
                return Err(needs_schema("an Avro schema"));
            };
            if s.get("type").and_then(Value::as_str) != Some("record") {
                return Err(p.err("schema", "an Avro schema of records must have type: record"));
            }
            RecordFormat::Avro { schema }
        }
        "PROTO" => {
            return Err(p.err(
                "format",
                "PROTO is not supported (RAW, STRING, JSON or AVRO)",
            ));
        }
        _ => return Err(p.err("format", "must be RAW, STRING, JSON or AVRO")),
    })
}

/// A comma-separated string (Kafka's way) or a list of `host:port`.
fn servers(p: &Fields, f: &str) -> Result<Vec<String>, FieldErr> {
    let list: Vec<String> = match p.req(f)? {
        Value::String(s) => s.split(',').map(|x| x.trim().to_string()).collect(),
        Value::Array(a) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(|s| s.trim().to_string())
                    .ok_or_else(|| p.err(f, "must be a list of host:port strings"))
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(p.err(f, "must be a string or a list of host:port")),
    };
    if list.iter().any(String::is_empty) {
        return Err(p.err(f, "has an empty server"));
    }
    Ok(list)
}

/// A mapping of Kafka properties; values may be strings, numbers or booleans.
fn string_map(p: &Fields, f: &str) -> Result<BTreeMap<String, String>, FieldErr> {
    match p.cfg.get(f) {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                Value::Number(_) | Value::Bool(_) => Ok((k.clone(), v.to_string())),
                _ => Err(p.err(&format!("{f}.{k}"), "must be a string, number or boolean")),
            })
            .collect(),
        Some(_) => Err(p.err(f, "must be a mapping of property to value")),
    }
}
