//! Kafka through rskafka (the wire protocol in pure Rust: no librdkafka). The source reads
//! offset ranges of each partition; the sink writes an epoch exactly once by stamping its
//! records with (job, epoch, index) headers and, on every write, reading the tail of each
//! target partition to skip what an earlier attempt of the same epoch already wrote. rskafka
//! has no transactional producer, so Kafka transactions are not used (whatever the broker
//! supports).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use riverbank_pipeline::config::Endpoint;
use rskafka::BackoffConfig;
use rskafka::client::partition::{Compression, OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record;
use tokio::sync::OnceCell;

use super::sink_ids::{self, TailScan};
use super::{ConnectorError, LogRecord, OutRecord, PartitionEnds};

/// Bytes asked for by one fetch: enough to amortise a round trip, small enough for memory.
const FETCH_BYTES: i32 = 4 * 1024 * 1024;
/// Records a produce request carries at most.
const PRODUCE_BATCH: usize = 1000;
/// Records the sink reads first when it scans a partition's tail backwards (then 2x, 4x …).
const TAIL_CHUNK: u64 = 1000;
/// Records sampled from a partition's tail for the mean record size.
const SAMPLE: u64 = 32;

/// A connection to one topic: the client and a client per partition, made once.
struct Topic {
    name: String,
    client: Client,
    partitions: Vec<u32>,
    clients: Mutex<HashMap<u32, Arc<OnceCell<Arc<PartitionClient>>>>>,
}

impl Topic {
    async fn open(endpoint: &Endpoint) -> Result<Topic, ConnectorError> {
        let Endpoint::Kafka {
            topic,
            bootstrap_servers,
            ..
        } = endpoint
        else {
            return Err(ConnectorError::Config("not a Kafka endpoint".into()));
        };
        let what = format!("Kafka topic {topic}");
        let client = ClientBuilder::new(bootstrap_servers.clone())
            .client_id("riverbank")
            .backoff_config(backoff())
            .build()
            .await
            .map_err(|e| ConnectorError::Connect {
                what: what.clone(),
                servers: bootstrap_servers.join(","),
                message: e.to_string(),
            })?;
        let topics = client
            .list_topics()
            .await
            .map_err(|e| ConnectorError::Broker {
                what: what.clone(),
                message: format!("cannot list topics: {e}"),
            })?;
        let t = topics
            .into_iter()
            .find(|t| t.name == *topic)
            .ok_or_else(|| ConnectorError::Broker {
                what: what.clone(),
                message: "no such topic".into(),
            })?;
        Ok(Topic {
            name: topic.clone(),
            client,
            partitions: t.partitions.iter().map(|p| *p as u32).collect(),
            clients: Mutex::default(),
        })
    }

    fn what(&self) -> String {
        format!("Kafka topic {}", self.name)
    }

    fn err(&self, partition: u32, offset: u64, e: impl std::fmt::Display) -> ConnectorError {
        ConnectorError::Read {
            what: self.what(),
            partition,
            offset,
            message: e.to_string(),
        }
    }

    async fn partition(&self, p: u32) -> Result<Arc<PartitionClient>, ConnectorError> {
        if !self.partitions.contains(&p) {
            return Err(ConnectorError::Broker {
                what: self.what(),
                message: format!("no partition {p} (it has {})", self.partitions.len()),
            });
        }
        let cell = self.clients.lock().unwrap().entry(p).or_default().clone();
        cell.get_or_try_init(|| async {
            self.client
                .partition_client(self.name.clone(), p as i32, UnknownTopicHandling::Error)
                .await
                .map(Arc::new)
                .map_err(|e| self.err(p, 0, format!("no client for the partition: {e}")))
        })
        .await
        .cloned()
    }

    /// (earliest, end) offsets of a partition. The end is the larger of ListOffsets' latest
    /// and a fetch's high watermark: tansu 0.6 answers ListOffsets with the last batch's base
    /// offset + 1, its high watermark is right.
    async fn bounds(&self, p: u32) -> Result<(u64, u64), ConnectorError> {
        let c = self.partition(p).await?;
        let earliest = c
            .get_offset(OffsetAt::Earliest)
            .await
            .map_err(|e| self.err(p, 0, format!("earliest offset: {e}")))?
            .max(0);
        let latest = c
            .get_offset(OffsetAt::Latest)
            .await
            .map_err(|e| self.err(p, 0, format!("end offset: {e}")))?;
        let high = match c.fetch_records(earliest, 1..2, 0).await {
            Ok((_, high)) => high,
            Err(_) => latest,
        };
        Ok((earliest as u64, latest.max(high).max(0) as u64))
    }

    /// The records in `[from, until)`, fetched in batches of up to `FETCH_BYTES`.
    ///
    /// A fetch from an offset inside a record batch should return that batch (the client
    /// drops the records before the offset); tansu 0.6 returns the batches that start at or
    /// after it instead. So when a fetch's first record is past the offset asked for (which
    /// may also be a true gap: compaction, transaction markers), the read steps back (1, 2, 4
    /// … records, down to the earliest offset) until a fetch starts at or before it.
    async fn read(&self, p: u32, from: u64, until: u64) -> Result<Vec<LogRecord>, ConnectorError> {
        let c = self.partition(p).await?;
        let mut out = vec![];
        let mut next = from;
        let mut back = 0u64;
        let mut earliest: Option<u64> = None;
        while next < until {
            let at = next - back.min(next);
            // A step back probes one batch (a fetch returns at least one whole batch); the
            // data asked for is already written, so no waiting for more.
            let max = if back > 0 { 2 } else { FETCH_BYTES };
            let (records, high) = c
                .fetch_records(at as i64, 1..max, 0)
                .await
                .map_err(|e| self.err(p, at, e))?;
            let high = high.max(0) as u64;
            let first = records.first().map(|r| r.offset as u64);
            let last = records.last().map(|r| r.offset as u64);
            if first.is_none() && high <= next {
                let (earliest, end) = self.bounds(p).await?;
                return Err(ConnectorError::OutOfRange {
                    what: self.what(),
                    partition: p,
                    from,
                    until,
                    earliest,
                    end,
                });
            }
            // Nothing at or before `next` came back: step back, unless already at the start.
            if first.is_none_or(|f| f > next) {
                let floor = match earliest {
                    Some(e) => e,
                    None => *earliest.insert(self.bounds(p).await?.0),
                };
                if at > floor {
                    back = (back * 2).max(1).min(next - floor);
                    continue;
                }
                if first.is_none() {
                    return Err(self.err(p, next, "the broker returns no record there"));
                }
            }
            for r in records {
                let offset = r.offset as u64;
                if offset >= next && offset < until {
                    next = offset + 1;
                    out.push(log_record(offset, r.record));
                }
            }
            // A step back that ended before `next`: go on from the record after the last seen
            // (a batch boundary).
            back = match last {
                Some(l) if l < next && l >= at => next - (l + 1),
                _ => 0,
            };
        }
        Ok(out)
    }
}

/// Retries for 30 s at most, then fails (the runtime retries the epoch).
fn backoff() -> BackoffConfig {
    BackoffConfig {
        init_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_secs(2),
        base: 2.,
        deadline: Some(Duration::from_secs(30)),
    }
}

fn log_record(offset: u64, r: Record) -> LogRecord {
    LogRecord {
        offset,
        timestamp_ms: r.timestamp.timestamp_millis(),
        key: r.key,
        value: r.value,
        headers: r.headers.into_iter().collect(),
    }
}

/// The source: offset ranges of a topic's partitions.
pub struct KafkaSource {
    topic: Topic,
    /// (records, bytes) read or sampled per partition, for the mean record size.
    sizes: Mutex<HashMap<u32, (u64, u64)>>,
}

impl KafkaSource {
    pub async fn open(endpoint: &Endpoint) -> Result<KafkaSource, ConnectorError> {
        Ok(KafkaSource {
            topic: Topic::open(endpoint).await?,
            sizes: Mutex::default(),
        })
    }

    /// Each partition's earliest and end offsets, and the mean record size (estimated from
    /// the records read so far, or a sample of the partition's tail).
    pub async fn partitions(&self) -> Result<Vec<PartitionEnds>, ConnectorError> {
        let mut out = vec![];
        for &p in &self.topic.partitions {
            let (earliest, end) = self.topic.bounds(p).await?;
            let known = self.sizes.lock().unwrap().get(&p).copied();
            let (n, bytes) = match known {
                Some(s) => s,
                None if end > earliest => {
                    let sample = self
                        .topic
                        .read(p, end - SAMPLE.min(end - earliest), end)
                        .await?;
                    self.note(p, &sample);
                    self.sizes.lock().unwrap()[&p]
                }
                None => (0, 0),
            };
            out.push(PartitionEnds {
                partition: p,
                earliest,
                end,
                mean_record_bytes: (n > 0).then(|| bytes as f64 / n as f64),
                bytes_exact: false,
            });
        }
        Ok(out)
    }

    /// Exactly the records with offsets in `[from, until)` of `partition`.
    pub async fn read(
        &self,
        partition: u32,
        from: u64,
        until: u64,
    ) -> Result<Vec<LogRecord>, ConnectorError> {
        let records = self.topic.read(partition, from, until).await?;
        self.note(partition, &records);
        Ok(records)
    }

    fn note(&self, p: u32, records: &[LogRecord]) {
        let mut sizes = self.sizes.lock().unwrap();
        let s = sizes.entry(p).or_default();
        s.0 += records.len() as u64;
        s.1 += records.iter().map(LogRecord::size).sum::<u64>();
    }
}

/// The exactly-once sink of a topic.
pub struct KafkaSink {
    topic: Topic,
    /// Per partition, the last epoch this process wrote in full and the end offset after it:
    /// a later epoch's tail scan need not look further back.
    written: Mutex<HashMap<u32, (u64, u64)>>,
}

impl KafkaSink {
    pub async fn open(endpoint: &Endpoint) -> Result<KafkaSink, ConnectorError> {
        Ok(KafkaSink {
            topic: Topic::open(endpoint).await?,
            written: Mutex::default(),
        })
    }

    /// Writes what of epoch `epoch`'s `records` is not in the topic yet. Keyed records go to
    /// Kafka's default partition of their key (murmur2), the others round-robin by position:
    /// the same records always land in the same partitions, so a retry finds them.
    pub async fn write_epoch(
        &self,
        job_id: &str,
        epoch: u64,
        records: &[OutRecord],
    ) -> Result<usize, ConnectorError> {
        let parts = &self.topic.partitions;
        let mut by_partition: BTreeMap<u32, Vec<&OutRecord>> = BTreeMap::new();
        for (i, r) in records.iter().enumerate() {
            let slot = match &r.key {
                Some(k) => (murmur2(k) & 0x7fff_ffff) as usize % parts.len(),
                None => i % parts.len(),
            };
            by_partition.entry(parts[slot]).or_default().push(r);
        }
        let mut wrote = 0;
        for (p, recs) in by_partition {
            wrote += self.write_partition(job_id, epoch, p, &recs).await?;
        }
        Ok(wrote)
    }

    async fn write_partition(
        &self,
        job_id: &str,
        epoch: u64,
        p: u32,
        records: &[&OutRecord],
    ) -> Result<usize, ConnectorError> {
        let werr = |message: String| ConnectorError::Write {
            what: format!("{} partition {p}", self.topic.what()),
            epoch,
            message,
        };
        let (earliest, end) = self.topic.bounds(p).await?;
        let floor = match self.written.lock().unwrap().get(&p) {
            Some(&(e, offset)) if e < epoch => offset.max(earliest),
            _ => earliest,
        };
        // Backwards from the end until an earlier epoch of this job (or the floor).
        let mut scan = TailScan::default();
        let mut cursor = end;
        // Chunks grow as the scan goes back: few reads however far the previous epoch is.
        let mut chunk = TAIL_CHUNK;
        while cursor > floor && !scan.done {
            let from = cursor.saturating_sub(chunk).max(floor);
            chunk = (chunk * 2).min(64 * TAIL_CHUNK);
            let records = self.topic.read(p, from, cursor).await?;
            scan.scan(&records, job_id, epoch);
            cursor = from;
        }
        let missing: Vec<Record> = records
            .iter()
            .enumerate()
            .filter(|(i, _)| !scan.present.contains(&(*i as u64)))
            .map(|(i, r)| Record {
                key: r.key.clone(),
                value: Some(r.value.clone()),
                headers: sink_ids::headers(job_id, epoch, i as u64)
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.into_bytes()))
                    .collect(),
                timestamp: chrono::Utc::now(),
            })
            .collect();
        let n = missing.len();
        let c = self.topic.partition(p).await?;
        let mut last = end;
        let mut batch = vec![];
        for r in missing {
            batch.push(r);
            if batch.len() == PRODUCE_BATCH {
                last = produce(&c, std::mem::take(&mut batch))
                    .await
                    .map_err(&werr)?
                    .unwrap_or(last);
            }
        }
        last = produce(&c, batch).await.map_err(werr)?.unwrap_or(last);
        self.written.lock().unwrap().insert(p, (epoch, last));
        Ok(n)
    }
}

/// Produces `batch`; the offset after it.
async fn produce(c: &PartitionClient, batch: Vec<Record>) -> Result<Option<u64>, String> {
    if batch.is_empty() {
        return Ok(None);
    }
    let offsets = c
        .produce(batch, Compression::NoCompression)
        .await
        .map_err(|e| e.to_string())?;
    Ok(offsets.last().map(|o| *o as u64 + 1))
}

/// Kafka's default partitioner hash (murmur2, seed 0x9747b28c), so that keys land where a Java
/// producer would put them.
fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// Creates a topic (tests and tools; pipelines expect their topics to exist).
pub async fn create_topic(
    bootstrap: &str,
    topic: &str,
    partitions: u32,
) -> Result<(), ConnectorError> {
    let what = format!("Kafka topic {topic}");
    let client = ClientBuilder::new(vec![bootstrap.to_string()])
        .backoff_config(backoff())
        .build()
        .await
        .map_err(|e| ConnectorError::Connect {
            what: what.clone(),
            servers: bootstrap.to_string(),
            message: e.to_string(),
        })?;
    let broker = |e: rskafka::client::error::Error| ConnectorError::Broker {
        what: what.clone(),
        message: e.to_string(),
    };
    client
        .controller_client()
        .map_err(broker)?
        .create_topic(topic, partitions as i32, 1, 5_000)
        .await
        .map_err(broker)
}

/// Produces plain records to one partition (tests and tools): the offsets they got.
pub async fn produce_raw(
    bootstrap: &str,
    topic: &str,
    partition: u32,
    records: Vec<LogRecord>,
) -> Result<Vec<u64>, ConnectorError> {
    let endpoint = Endpoint::Kafka {
        topic: topic.to_string(),
        bootstrap_servers: vec![bootstrap.to_string()],
        properties: Default::default(),
    };
    let t = Topic::open(&endpoint).await?;
    let c = t.partition(partition).await?;
    let records = records
        .into_iter()
        .map(|r| Record {
            key: r.key,
            value: r.value,
            headers: r.headers.into_iter().collect(),
            timestamp: chrono::DateTime::from_timestamp_millis(r.timestamp_ms).unwrap_or_default(),
        })
        .collect();
    let offsets = c
        .produce(records, Compression::NoCompression)
        .await
        .map_err(|e| t.err(partition, 0, e))?;
    Ok(offsets.into_iter().map(|o| o as u64).collect())
}

#[cfg(test)]
mod tests {
    use super::murmur2;

    #[test]
    fn murmur2_matches_kafkas_partitioner() {
        // Kafka's own test vectors (org.apache.kafka.common.utils.UtilsTest#testMurmur2).
        assert_eq!(murmur2(b"21") as i32, -973932308);
        assert_eq!(murmur2(b"foobar") as i32, -790332482);
        assert_eq!(murmur2(b"a-little-bit-long-string") as i32, -985981536);
        assert_eq!(murmur2(b"a-little-bit-longer-string") as i32, -1486304829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") as i32,
            -58897971
        );
        assert_eq!(murmur2(b"abc") as i32, 479470107);
    }
}
