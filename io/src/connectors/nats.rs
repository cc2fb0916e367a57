//! NATS JetStream through async-nats. A stream is one partition (0) whose offsets are the
//! stream's sequence numbers; a range is read with an ephemeral pull consumer starting at its
//! first sequence (no acks, nothing left behind on the server after its inactivity timeout).
//! The sink publishes each record with a `Nats-Msg-Id` of (job, epoch, index), which
//! JetStream de-duplicates within the stream's window (2 minutes by default), and, because a
//! retry may come after the window, first scans the stream's tail for the epoch's records, as
//! the Kafka sink does.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer, stream::Stream};
use futures::StreamExt;
use riverbank_pipeline::config::Endpoint;

use super::sink_ids::{self, TailScan};
use super::{ConnectorError, LogRecord, OutRecord, PartitionEnds};

/// Messages asked for by one pull.
const FETCH: usize = 1000;
/// Messages the sink reads first when it scans the tail backwards (then 2x, 4x …).
const TAIL_CHUNK: u64 = 1000;

struct Conn {
    stream: Stream,
    name: String,
    subject: Option<String>,
    js: jetstream::Context,
}

impl Conn {
    async fn open(endpoint: &Endpoint) -> Result<Conn, ConnectorError> {
        let Endpoint::Nats {
            servers,
            stream,
            subject,
        } = endpoint
        else {
            return Err(ConnectorError::Config("not a NATS endpoint".into()));
        };
        let what = format!("NATS stream {stream}");
        let client = async_nats::ConnectOptions::new()
            .name("riverbank")
            .connection_timeout(Duration::from_secs(10))
            .connect(servers.join(","))
            .await
            .map_err(|e| ConnectorError::Connect {
                what: what.clone(),
                servers: servers.join(","),
                message: e.to_string(),
            })?;
        let js = jetstream::new(client);
        let s = js
            .get_stream(stream)
            .await
            .map_err(|e| ConnectorError::Broker {
                what,
                message: e.to_string(),
            })?;
        Ok(Conn {
            stream: s,
            name: stream.clone(),
            subject: subject.clone(),
            js,
        })
    }

    fn what(&self) -> String {
        format!("NATS stream {}", self.name)
    }

    fn err(&self, offset: u64, e: impl std::fmt::Display) -> ConnectorError {
        ConnectorError::Read {
            what: self.what(),
            partition: 0,
            offset,
            message: e.to_string(),
        }
    }

    /// (first sequence, next sequence, messages, bytes).
    async fn state(&self) -> Result<(u64, u64, u64, u64), ConnectorError> {
        let info = self.stream.get_info().await.map_err(|e| self.err(0, e))?;
        let s = info.state;
        // An empty stream reports first = last + 1.
        Ok((
            s.first_sequence.max(1),
            s.last_sequence + 1,
            s.messages,
            s.bytes,
        ))
    }

    /// The messages (of `subject`, if set) with sequences in `[from, until)`.
    async fn read(
        &self,
        subject: Option<&str>,
        from: u64,
        until: u64,
    ) -> Result<Vec<LogRecord>, ConnectorError> {
        let (first, end, _, _) = self.state().await?;
        if until > end || from > until {
            return Err(ConnectorError::OutOfRange {
                what: self.what(),
                partition: 0,
                from,
                until,
                earliest: first,
                end,
            });
        }
        let mut out = vec![];
        if from >= until {
            return Ok(out);
        }
        let consumer = self
            .stream
            .create_consumer(consumer::pull::Config {
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: from.max(1),
                },
                ack_policy: consumer::AckPolicy::None,
                filter_subject: subject.unwrap_or_default().to_string(),
                inactive_threshold: Duration::from_secs(60),
                ..Default::default()
            })
            .await
            .map_err(|e| self.err(from, format!("cannot create a consumer: {e}")))?;
        'pull: loop {
            let mut batch = consumer
                .fetch()
                .max_messages(FETCH)
                .messages()
                .await
                .map_err(|e| self.err(from, e))?;
            let mut got = 0;
            while let Some(m) = batch.next().await {
                let m = m.map_err(|e| self.err(from, e))?;
                got += 1;
                let info = m.info().map_err(|e| self.err(from, e))?;
                let (seq, pending) = (info.stream_sequence, info.pending);
                let ts = (info.published.unix_timestamp_nanos() / 1_000_000) as i64;
                if seq >= until {
                    break 'pull;
                }
                out.push(log_record(seq, ts, &m.message));
                // Nothing after this one (yet): the range is complete, as `until <= end`.
                if pending == 0 || seq + 1 == until {
                    break 'pull;
                }
            }
            if got == 0 {
                break;
            }
        }
        let _ = self
            .stream
            .delete_consumer(consumer.cached_info().name.as_str())
            .await;
        Ok(out)
    }
}

fn log_record(seq: u64, timestamp_ms: i64, m: &async_nats::Message) -> LogRecord {
    let mut headers = vec![];
    if let Some(h) = &m.headers {
        for (k, vs) in h.iter() {
            for v in vs {
                headers.push((k.to_string(), v.as_str().as_bytes().to_vec()));
            }
        }
        headers.sort();
    }
    LogRecord {
        offset: seq,
        timestamp_ms,
        key: None,
        value: Some(m.payload.to_vec()),
        headers,
    }
}

/// The source: one partition, the stream's sequence numbers.
pub struct NatsSource {
    conn: Conn,
}

impl NatsSource {
    pub async fn open(endpoint: &Endpoint) -> Result<NatsSource, ConnectorError> {
        Ok(NatsSource {
            conn: Conn::open(endpoint).await?,
        })
    }

    /// Partition 0: the stream's first and next sequence; the mean message size is exact
    /// (the stream's bytes over its messages).
    pub async fn partitions(&self) -> Result<Vec<PartitionEnds>, ConnectorError> {
        let (earliest, end, messages, bytes) = self.conn.state().await?;
        Ok(vec![PartitionEnds {
            partition: 0,
            earliest,
            end,
            mean_record_bytes: (messages > 0).then(|| bytes as f64 / messages as f64),
            bytes_exact: true,
        }])
    }

    /// Exactly the messages with sequences in `[from, until)` (of the source's subject).
    pub async fn read(
        &self,
        partition: u32,
        from: u64,
        until: u64,
    ) -> Result<Vec<LogRecord>, ConnectorError> {
        if partition != 0 {
            return Err(self.conn.err(from, format!("no partition {partition}")));
        }
        self.conn
            .read(self.conn.subject.as_deref(), from, until)
            .await
    }
}

/// The exactly-once sink: publishes to the endpoint's subject.
pub struct NatsSink {
    conn: Conn,
    subject: String,
    /// The last epoch this process wrote in full and the next sequence after it.
    written: Mutex<Option<(u64, u64)>>,
}

impl NatsSink {
    pub async fn open(endpoint: &Endpoint) -> Result<NatsSink, ConnectorError> {
        let conn = Conn::open(endpoint).await?;
        let subject = conn
            .subject
            .clone()
            .ok_or_else(|| ConnectorError::Config("WriteToNats needs a subject".into()))?;
        Ok(NatsSink {
            conn,
            subject,
            written: Mutex::default(),
        })
    }

    pub async fn write_epoch(
        &self,
        job_id: &str,
        epoch: u64,
        records: &[OutRecord],
    ) -> Result<usize, ConnectorError> {
        let werr = |message: String| ConnectorError::Write {
            what: self.conn.what(),
            epoch,
            message,
        };
        let (first, end, _, _) = self.conn.state().await?;
        let floor = match *self.written.lock().unwrap() {
            Some((e, next)) if e < epoch => next.max(first),
            _ => first,
        };
        let mut scan = TailScan::default();
        let mut cursor = end;
        // Chunks grow as the scan goes back: few reads however far the previous epoch is.
        let mut chunk = TAIL_CHUNK;
        while cursor > floor && !scan.done {
            let from = cursor.saturating_sub(chunk).max(floor);
            chunk = (chunk * 2).min(64 * TAIL_CHUNK);
            let records = self.conn.read(Some(&self.subject), from, cursor).await?;
            scan.scan(&records, job_id, epoch);
            cursor = from;
        }
        let present: &BTreeSet<u64> = &scan.present;
        let mut acks = vec![];
        let mut wrote = 0;
        for (i, r) in records.iter().enumerate() {
            if present.contains(&(i as u64)) {
                continue;
            }
            let mut h = HeaderMap::new();
            for (k, v) in sink_ids::headers(job_id, epoch, i as u64) {
                h.insert(k, v.as_str());
            }
            h.insert("Nats-Msg-Id", format!("{job_id}:{epoch}:{i}").as_str());
            let ack = self
                .conn
                .js
                .publish_with_headers(self.subject.clone(), h, r.value.clone().into())
                .await
                .map_err(|e| werr(e.to_string()))?;
            acks.push(ack);
            // Bound the acks in flight.
            if acks.len() >= FETCH {
                wrote += settle(std::mem::take(&mut acks)).await.map_err(&werr)?;
            }
        }
        wrote += settle(acks).await.map_err(&werr)?;
        let (_, next, _, _) = self.conn.state().await?;
        *self.written.lock().unwrap() = Some((epoch, next));
        Ok(wrote)
    }
}

/// Waits for publish acks; how many were new messages (not de-duplicated).
async fn settle(acks: Vec<jetstream::context::PublishAckFuture>) -> Result<usize, String> {
    let mut n = 0;
    for a in acks {
        let ack = a.await.map_err(|e| e.to_string())?;
        if !ack.duplicate {
            n += 1;
        }
    }
    Ok(n)
}

/// Creates a stream over `subjects` (tests and tools; pipelines expect their streams), with
/// JetStream's de-duplication window (2 minutes when `None`).
pub async fn create_stream(
    server: &str,
    stream: &str,
    subjects: &[&str],
    duplicate_window: Option<Duration>,
) -> Result<(), ConnectorError> {
    let what = format!("NATS stream {stream}");
    let client = async_nats::connect(server)
        .await
        .map_err(|e| ConnectorError::Connect {
            what: what.clone(),
            servers: server.to_string(),
            message: e.to_string(),
        })?;
    jetstream::new(client)
        .create_stream(jetstream::stream::Config {
            name: stream.to_string(),
            subjects: subjects.iter().map(|s| s.to_string()).collect(),
            duplicate_window: duplicate_window.unwrap_or(Duration::from_secs(120)),
            ..Default::default()
        })
        .await
        .map_err(|e| ConnectorError::Broker {
            what,
            message: e.to_string(),
        })?;
    Ok(())
}

/// Publishes plain messages (tests and tools): their sequence numbers.
pub async fn publish_raw(
    server: &str,
    subject: &str,
    payloads: Vec<Vec<u8>>,
) -> Result<Vec<u64>, ConnectorError> {
    let what = format!("NATS subject {subject}");
    let err = |message: String| ConnectorError::Broker {
        what: what.clone(),
        message,
    };
    let client = async_nats::connect(server)
        .await
        .map_err(|e| err(e.to_string()))?;
    let js = jetstream::new(client);
    let mut out = vec![];
    for p in payloads {
        let ack = js
            .publish(subject.to_string(), p.into())
            .await
            .map_err(|e| err(e.to_string()))?
            .await
            .map_err(|e| err(e.to_string()))?;
        out.push(ack.sequence);
    }
    Ok(out)
}
