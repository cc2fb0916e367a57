//! Unbounded sources, read by partition and offset. A checkpoint gives each partition a range
//! `[from, until)` of offsets; reading a range is deterministic, so a replay after a failure
//! reads the same elements again. Each source also says how far its partitions reach now (the
//! backlog) and what event-time watermark a partition promises once read up to an offset.
//!
//! The generators (`ReadFromSynthetic`, `ReadFromNexmark`) spread their sequence numbers over
//! the partitions round-robin (`seq = offset × partitions + partition`) and make elements
//! available at their nominal time, so a source paced by the wall clock has a real backlog.
use crate::connectors::{self, Decoder};
use arrow::array::{ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{Schema, SchemaRef, TimestampMicrosecondType};
use riverbank_datagen::nexmark::{Nexmark, NexmarkKind, NexmarkOptions, strided_events};
use riverbank_datagen::synthetic::{
    KeyDistribution, SyntheticOptions, SyntheticStream, synthetic_schema,
};
use riverbank_elements::columns::{TS, ts_field};
use riverbank_pipeline::config::{
    ConnectorSourceConfig, KeyDistributionConfig, StartAt, StreamSourceConfig,
};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

/// What a streaming job's source is: a generator, a Kafka/NATS connector, or a bounded
/// collection read once beside them (a side input).
#[derive(Debug, Clone)]
pub enum StreamSpec {
    Generator(StreamSourceConfig),
    Connector(ConnectorSourceConfig),
    Bounded(Arc<Bounded>),
}

/// A refreshed read's tries after the first: 4 in all, as a failing bundle's (0.2, 0.4, 0.8 s
/// apart).
const REFRESH_RETRIES: backon::ExponentialBuilder = backon::ExponentialBuilder::new()
    .with_min_delay(std::time::Duration::from_millis(200))
    .with_max_times(3);

/// A bounded collection in a streaming job (`Create`, a file read), read once as a stream
/// that then ends: its partitions finish, and once read their watermark is the end of time, so
/// it never holds back the unbounded sources beside it. Its rows carry no event time (the
/// minimum, as a bounded source's in Beam).
///
/// A file read with a `refresh_interval` is read again every interval instead (Beam's slowly
/// updating side input): one partition whose offset `k` is the read due `k` intervals after the
/// job's start, each listing the files anew and reading them whole. It never finishes; its
/// watermark is the end of time once the first read is done. A checkpoint that is behind reads
/// only the last read due (the files as they are now), and the Sql and Join that take it
/// replace the rows of the read before with it.
#[derive(Debug)]
pub enum Bounded {
    /// `Create`'s rows: one partition, an offset per row.
    Rows(RecordBatch),
    /// A file read's planned splits: a partition per split, one offset (the whole split). A
    /// worker's copy has no splits (its plan came without them): it lists the files again, as
    /// the coordinator did, with the same `split_bytes`.
    Files {
        options: crate::ReadOptions,
        source: crate::SourcePlan,
        split_bytes: u64,
        /// Read again this often (microseconds).
        refresh_us: Option<i64>,
    },
}

impl Bounded {
    pub fn partitions(&self) -> u32 {
        match self {
            Bounded::Rows(_)
            | Bounded::Files {
                refresh_us: Some(_),
                ..
            } => 1,
            Bounded::Files { source, .. } => source.splits.len().max(1) as u32,
        }
    }

    /// How often it is read again, if it is.
    pub fn refresh_us(&self) -> Option<i64> {
        match self {
            Bounded::Files { refresh_us, .. } => *refresh_us,
            Bounded::Rows(_) => None,
        }
    }

    /// A refreshed read's offsets at `now_us`: the reads due since the job's start.
    fn reads_due(refresh_us: i64, start_us: i64, now_us: i64) -> u64 {
        1 + (now_us.saturating_sub(start_us).max(0) / refresh_us.max(1)) as u64
    }

    /// The offsets partition `p` has, all there from the start: a row each, or its split (none
    /// when no file has data: the one partition is empty, and its watermark the end of time).
    /// The coordinator's view: a worker's copy knows no splits.
    fn end(&self, p: u32) -> u64 {
        match self {
            Bounded::Rows(b) => b.num_rows() as u64,
            Bounded::Files { source, .. } => u64::from((p as usize) < source.splits.len()),
        }
    }

    fn ends(&self, start_us: i64, now_us: i64) -> Vec<PartitionEnds> {
        if let Some(refresh) = self.refresh_us() {
            return vec![PartitionEnds {
                partition: 0,
                earliest: 0,
                end: Bounded::reads_due(refresh, start_us, now_us),
                bytes_per_element: match self {
                    Bounded::Files { source, .. } => {
                        source.splits.iter().map(|s| s.estimated_bytes as f64).sum()
                    }
                    Bounded::Rows(_) => 0.0,
                },
                elements_per_offset: 1.0,
                finished: false,
            }];
        }
        (0..self.partitions())
            .map(|p| PartitionEnds {
                partition: p,
                earliest: 0,
                end: self.end(p),
                bytes_per_element: match self {
                    Bounded::Rows(b) => {
                        b.get_array_memory_size() as f64 / b.num_rows().max(1) as f64
                    }
                    Bounded::Files { source, .. } => source
                        .splits
                        .get(p as usize)
                        .map_or(0.0, |s| s.estimated_bytes as f64),
                },
                elements_per_offset: 1.0,
                finished: true,
            })
            .collect()
    }

    /// Offsets `[from, until)` of partition `p`, and the end of time once it is all read.
    async fn read(
        &self,
        name: &str,
        p: u32,
        from: u64,
        until: u64,
    ) -> Result<(Vec<RecordBatch>, Option<i64>), SourceError> {
        if self.refresh_us().is_some() {
            return self.read_again(name, from, until).await;
        }
        // What a read may ask: a worker reads the split it is given, planned or not here.
        let end = match self {
            Bounded::Rows(b) => b.num_rows() as u64,
            Bounded::Files { .. } => 1,
        };
        let until = until.min(end);
        let watermark = (until >= end).then_some(END_OF_TIME);
        if from >= until {
            return Ok((vec![], watermark));
        }
        let batches = match self {
            Bounded::Rows(b) => vec![b.slice(from as usize, (until - from) as usize)],
            Bounded::Files {
                options,
                source,
                split_bytes,
                ..
            } => {
                use futures::TryStreamExt;
                let err = |e: crate::IoError| SourceError::new(name, e.to_string());
                let listed;
                let splits = match source.splits.is_empty() {
                    true => {
                        listed = crate::plan_source(options, *split_bytes)
                            .await
                            .map_err(err)?;
                        &listed.splits
                    }
                    false => &source.splits,
                };
                let split = splits.get(p as usize).ok_or_else(|| {
                    SourceError::new(name, format!("the input has no split {p} any more"))
                })?;
                crate::read_split(options, source.schema.clone(), split)
                    .await
                    .map_err(err)?
                    .try_collect()
                    .await
                    .map_err(err)?
            }
        };
        Ok((batches, watermark))
    }

    /// Reads `[from, until)` of a refreshed read: its files as they are now, listed anew and
    /// read whole, once however many reads came due (the last one stands for them all).
    async fn read_again(
        &self,
        name: &str,
        from: u64,
        until: u64,
    ) -> Result<(Vec<RecordBatch>, Option<i64>), SourceError> {
        use futures::TryStreamExt;
        let watermark = Some(if until >= 1 { END_OF_TIME } else { i64::MIN });
        let Bounded::Files {
            options,
            source,
            split_bytes,
            ..
        } = self
        else {
            return Ok((vec![], watermark));
        };
        if from >= until {
            return Ok((vec![], watermark));
        }
        use backon::Retryable;
        let read_all = || async {
            let listed = crate::plan_source(options, *split_bytes).await?;
            let mut batches = vec![];
            for split in &listed.splits {
                let read: Vec<RecordBatch> =
                    crate::read_split(options, source.schema.clone(), split)
                        .await?
                        .try_collect()
                        .await?;
                batches.extend(read);
            }
            Ok::<_, crate::IoError>(batches)
        };
        // A refresh that fails for a passing reason (the file replaced as it was listed) is
        // tried again before it fails the job; a bad record or schema fails it at once.
        let batches = read_all
            .retry(REFRESH_RETRIES)
            .when(crate::IoError::is_transient)
            .notify(|e, after| {
                tracing::warn!(transform = name, "reading again in {after:?}: {e}");
            })
            .await
            .map_err(|e| SourceError::new(name, e.to_string()))?;
        Ok((batches, watermark))
    }
}

/// A source that cannot be opened or read, or a record that does not decode: named by its
/// transform (the engine reports it as that transform's failure).
#[derive(Debug, thiserror::Error)]
#[error("transform '{transform}' failed: {message}")]
pub struct SourceError {
    pub transform: String,
    pub message: String,
    /// The offending record, where there is one.
    pub record: Option<String>,
}

impl SourceError {
    pub fn new(transform: &str, message: impl Into<String>) -> Self {
        SourceError {
            transform: transform.to_string(),
            message: message.into(),
            record: None,
        }
    }
}

/// The watermark of a partition that has no more data: Beam's end of time.
pub const END_OF_TIME: i64 = i64::MAX;

/// Offsets of one partition: the first still there and the next to be written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PartitionEnds {
    pub partition: u32,
    pub earliest: u64,
    pub end: u64,
    /// Mean bytes per element, for a backlog in bytes.
    pub bytes_per_element: f64,
    /// Mean elements per offset: 1 but where offsets are sparser than elements (a Nexmark
    /// reader of one kind reads event numbers, and a person is 1 event in 50), so a
    /// checkpoint's cap and a backlog count elements, not offsets.
    pub elements_per_offset: f64,
    /// The partition holds no more than `end` elements, ever (a finite stream).
    pub finished: bool,
}

impl From<connectors::PartitionEnds> for PartitionEnds {
    fn from(p: connectors::PartitionEnds) -> Self {
        PartitionEnds {
            partition: p.partition,
            earliest: p.earliest,
            end: p.end,
            bytes_per_element: p.mean_record_bytes.unwrap_or(0.0),
            elements_per_offset: 1.0,
            finished: false,
        }
    }
}

/// An unbounded source bound to its job: the generators, with their start time fixed, or a
/// Kafka/NATS connector.
#[derive(Clone)]
pub enum StreamSource {
    Connector(Arc<ConnectorSource>),
    Synthetic {
        stream: Arc<SyntheticStream>,
        partitions: u32,
        count: Option<u64>,
    },
    Nexmark {
        events: Arc<Nexmark>,
        kind: NexmarkKind,
        /// The kind's columns made, by index in its schema (the pipeline's projection).
        columns: Vec<usize>,
        rate: f64,
        partitions: u32,
        count: Option<u64>,
    },
    Bounded {
        name: String,
        rows: Arc<Bounded>,
        /// The job's first start: a refreshed read's reads are due from it.
        start_us: i64,
    },
}

/// A Kafka or NATS source: its config, its decoder, and its connection (opened once per
/// process, on first use, and shared by every item that reads it).
pub struct ConnectorSource {
    name: String,
    cfg: ConnectorSourceConfig,
    decoder: Decoder,
}

/// Connections by endpoint, for the life of the process: a checkpoint's items reuse them.
static CONNECTIONS: LazyLock<tokio::sync::Mutex<HashMap<String, Arc<connectors::Source>>>> =
    LazyLock::new(Default::default);

impl ConnectorSource {
    async fn connection(&self) -> Result<Arc<connectors::Source>, SourceError> {
        let key = serde_json::to_string(&self.cfg.endpoint).unwrap_or_default();
        let mut open = CONNECTIONS.lock().await;
        if let Some(c) = open.get(&key) {
            return Ok(c.clone());
        }
        let c = Arc::new(
            connectors::Source::open(&self.cfg)
                .await
                .map_err(|e| self.err(e))?,
        );
        open.insert(key, c.clone());
        Ok(c)
    }

    fn err(&self, e: impl std::fmt::Display) -> SourceError {
        SourceError::new(&self.name, e.to_string())
    }
}

/// A Nexmark reader's kind (parsing refused any other name).
fn nexmark_kind(kind: &str) -> NexmarkKind {
    NexmarkKind::parse(kind).unwrap_or(NexmarkKind::Bid)
}

/// The columns a Nexmark reader makes, by index in its kind's schema: those its config names
/// (pushdown's projection) and `dateTime`, its event time; all when it names none.
fn nexmark_columns(cfg: &StreamSourceConfig) -> Vec<usize> {
    let StreamSourceConfig::Nexmark { kind, columns, .. } = cfg else {
        return vec![];
    };
    let schema = nexmark_kind(kind).schema();
    (0..schema.fields().len())
        .filter(|&i| {
            let name = schema.field(i).name();
            columns
                .as_ref()
                .is_none_or(|c| name == "dateTime" || c.contains(name))
        })
        .collect()
}

impl StreamSource {
    /// Binds a source; `default_start_us` (the job's first start, kept in its checkpoint log)
    /// is a generator's element 0's nominal time when the config gives none.
    pub fn of(
        spec: &StreamSpec,
        name: &str,
        default_start_us: i64,
    ) -> Result<StreamSource, SourceError> {
        match spec {
            StreamSpec::Generator(cfg) => Ok(StreamSource::new(cfg, default_start_us)),
            StreamSpec::Bounded(rows) => Ok(StreamSource::Bounded {
                name: name.to_string(),
                rows: rows.clone(),
                start_us: default_start_us,
            }),
            StreamSpec::Connector(cfg) => Ok(StreamSource::Connector(Arc::new(ConnectorSource {
                name: name.to_string(),
                decoder: Decoder::new(name, cfg)
                    .map_err(|e| SourceError::new(name, e.to_string()))?,
                cfg: cfg.clone(),
            }))),
        }
    }

    /// Every partition's offsets now (a connector asks its broker).
    pub async fn ends_now(&self, now_us: i64) -> Result<Vec<PartitionEnds>, SourceError> {
        match self {
            StreamSource::Connector(c) => Ok(c
                .connection()
                .await?
                .partitions()
                .await
                .map_err(|e| c.err(e))?
                .into_iter()
                .map(PartitionEnds::from)
                .collect()),
            _ => Ok(self.ends(now_us)),
        }
    }

    /// Where a job without a checkpoint starts reading a partition.
    pub fn initial_offset(&self, e: &PartitionEnds) -> u64 {
        match self {
            StreamSource::Connector(c) => match c.cfg.start_at {
                StartAt::Earliest => e.earliest,
                StartAt::Latest => e.end,
            },
            _ => 0,
        }
    }

    /// A partition's watermark before anything was read from it: a generator's is known; a
    /// log's is the beginning of time until its records say more.
    pub fn initial_watermark(&self, partition: u32) -> i64 {
        match self {
            StreamSource::Connector(_) => i64::MIN,
            _ => self.watermark(partition, 0),
        }
    }

    /// Offsets `[from, until)` of `partition` as batches with the hidden event time, and the
    /// watermark the partition promises after them (a log: its latest event time read).
    /// Records that do not decode stop the job, named, unless `bad` collects them (the
    /// source's `error_handling` output).
    pub async fn read_range(
        &self,
        partition: u32,
        from: u64,
        until: u64,
        batch: usize,
        bad: Option<&mut Vec<connectors::format::BadRecord>>,
    ) -> Result<(Vec<RecordBatch>, Option<i64>), SourceError> {
        if let StreamSource::Bounded { name, rows, .. } = self {
            return rows.read(name, partition, from, until).await;
        }
        let StreamSource::Connector(c) = self else {
            return Ok((
                self.read(partition, from, until, batch),
                Some(self.watermark(partition, until)),
            ));
        };
        let records = c
            .connection()
            .await?
            .read(partition, from, until)
            .await
            .map_err(|e| c.err(e))?;
        let decoded = c
            .decoder
            .decode(partition, &records)
            .map_err(|e| c.err(e))?;
        if let Some(out) = bad {
            out.extend(decoded.bad.iter().cloned());
        } else if let Some(bad) = decoded.bad.first() {
            // Nothing is dropped silently: a record that does not decode stops the job, named.
            return Err(SourceError {
                transform: c.name.clone(),
                message: format!(
                    "partition {} offset {}: {}",
                    bad.partition, bad.offset, bad.message
                ),
                record: bad
                    .value
                    .as_ref()
                    .map(|v| String::from_utf8_lossy(v).chars().take(200).collect()),
            });
        }
        let times = decoded.event_time_us.values().to_vec();
        let watermark = times.iter().copied().max();
        let ts: ArrayRef =
            Arc::new(arrow::array::TimestampMicrosecondArray::from(times).with_timezone("UTC"));
        let b = decoded.batch;
        let mut fields: Vec<_> = b
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(ts_field(TS));
        let mut cols = b.columns().to_vec();
        cols.push(ts);
        let b = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).map_err(|e| c.err(e))?;
        Ok((
            (b.num_rows() > 0).then_some(b).into_iter().collect(),
            watermark,
        ))
    }

    /// Binds a generator config; `default_start_us` is element 0's nominal time when the
    /// config gives none.
    pub fn new(cfg: &StreamSourceConfig, default_start_us: i64) -> StreamSource {
        match cfg {
            StreamSourceConfig::Synthetic {
                rate,
                keys,
                distribution,
                skew_us,
                partitions,
                count,
                start_us,
                seed,
                late_fraction,
                late_by_us,
                rate_steps,
            } => StreamSource::Synthetic {
                stream: Arc::new(
                    SyntheticStream::new(SyntheticOptions {
                        rate: *rate,
                        keys: *keys,
                        distribution: match distribution {
                            KeyDistributionConfig::Uniform => KeyDistribution::Uniform,
                            KeyDistributionConfig::Zipf { exponent } => KeyDistribution::Zipf {
                                exponent: *exponent,
                            },
                            KeyDistributionConfig::HotKey { fraction } => KeyDistribution::HotKey {
                                fraction: *fraction,
                            },
                        },
                        event_time_skew_us: *skew_us,
                        start_us: start_us.unwrap_or(default_start_us),
                        seed: *seed,
                        late_fraction: *late_fraction,
                        late_by_us: *late_by_us,
                    })
                    .with_rate_steps(rate_steps),
                ),
                partitions: (*partitions).max(1),
                count: *count,
            },
            StreamSourceConfig::Nexmark {
                kind,
                rate,
                partitions,
                count,
                start_us,
                seed,
                ..
            } => StreamSource::Nexmark {
                columns: nexmark_columns(cfg),
                events: Arc::new(Nexmark::new(NexmarkOptions {
                    rate: *rate,
                    start_us: start_us.unwrap_or(default_start_us),
                    seed: *seed,
                })),
                kind: nexmark_kind(kind),
                rate: *rate,
                partitions: (*partitions).max(1),
                count: *count,
            },
        }
    }

    /// The user-visible schema (no hidden columns).
    pub fn user_schema(cfg: &StreamSourceConfig) -> SchemaRef {
        match cfg {
            StreamSourceConfig::Synthetic { .. } => synthetic_schema(),
            StreamSourceConfig::Nexmark { kind, .. } => Arc::new(
                nexmark_kind(kind)
                    .schema()
                    .project(&nexmark_columns(cfg))
                    .expect("columns of the kind"),
            ),
        }
    }

    /// The schema of the batches `read` yields: the user's columns and the event time.
    pub fn schema(cfg: &StreamSourceConfig) -> SchemaRef {
        let user = StreamSource::user_schema(cfg);
        let mut fields: Vec<_> = user.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(ts_field(TS));
        Arc::new(Schema::new(fields))
    }

    pub fn partitions(&self) -> u32 {
        match self {
            StreamSource::Synthetic { partitions, .. }
            | StreamSource::Nexmark { partitions, .. } => *partitions,
            StreamSource::Bounded { rows, .. } => rows.partitions(),
            // A log's partitions are the broker's (see `ends_now`).
            StreamSource::Connector(_) => 1,
        }
    }

    /// A file read with a `refresh_interval`: read again and again, it never ends.
    pub fn refreshes(&self) -> bool {
        matches!(self, StreamSource::Bounded { rows, .. } if rows.refresh_us().is_some())
    }

    fn count(&self) -> Option<u64> {
        match self {
            StreamSource::Synthetic { count, .. } | StreamSource::Nexmark { count, .. } => *count,
            StreamSource::Connector(_) | StreamSource::Bounded { .. } => None,
        }
    }

    /// Elements (all partitions) whose nominal time is at or before `now_us`.
    fn available(&self, now_us: i64) -> u64 {
        let (start, rate) = match self {
            StreamSource::Synthetic { stream, .. } => {
                let n = stream.available_at(now_us);
                return self.count().map_or(n, |c| n.min(c));
            }
            StreamSource::Nexmark { events, rate, .. } => (events.time_us(0), *rate),
            StreamSource::Connector(_) | StreamSource::Bounded { .. } => return 0,
        };
        let n = if now_us < start {
            0
        } else {
            ((now_us - start) as f64 * rate / 1e6).floor() as u64 + 1
        };
        self.count().map_or(n, |c| n.min(c))
    }

    /// How many of the first `n` elements fall in `partition`.
    fn share(&self, n: u64, partition: u32) -> u64 {
        let p = u64::from(self.partitions());
        let q = u64::from(partition);
        if n <= q { 0 } else { (n - q).div_ceil(p) }
    }

    /// Every partition's offsets as of wall time `now_us`.
    pub fn ends(&self, now_us: i64) -> Vec<PartitionEnds> {
        let n = self.available(now_us);
        let bytes = match self {
            StreamSource::Synthetic { .. } => 40.0,
            StreamSource::Nexmark { .. } => 120.0,
            StreamSource::Bounded { rows, start_us, .. } => return rows.ends(*start_us, now_us),
            StreamSource::Connector(_) => return vec![],
        };
        (0..self.partitions())
            .map(|p| PartitionEnds {
                partition: p,
                earliest: 0,
                end: self.share(n, p),
                bytes_per_element: bytes,
                elements_per_offset: self.elements_per_offset(),
                finished: self
                    .count()
                    .is_some_and(|c| self.share(n, p) == self.share(c, p)),
            })
            .collect()
    }

    fn seq(&self, partition: u32, offset: u64) -> u64 {
        offset * u64::from(self.partitions()) + u64::from(partition)
    }

    /// The watermark `partition` promises once every offset before `next` was read. A
    /// counted stream's last read promises the time of the element that would come next, not
    /// the end of time: the checkpoint after it (the drain, once every partition is read)
    /// moves the watermark to the end, so the last elements are committed as any others are,
    /// without waiting for every open window to fire (as a bounded source in Flink finishes
    /// before its final watermark's timers run).
    pub fn watermark(&self, partition: u32, next: u64) -> i64 {
        let seq = self.seq(partition, next);
        match self {
            StreamSource::Synthetic { stream, .. } => stream.watermark_us(seq),
            StreamSource::Nexmark { events, .. } => events.time_us(seq),
            StreamSource::Bounded { rows, .. } if rows.refresh_us().is_some() => match next {
                0 => i64::MIN,
                _ => END_OF_TIME,
            },
            StreamSource::Bounded { rows, .. } if next >= rows.end(partition) => END_OF_TIME,
            StreamSource::Connector(_) | StreamSource::Bounded { .. } => i64::MIN,
        }
    }

    /// A generator's elements per offset: a Nexmark reader of one kind reads every event
    /// number and keeps its kind's.
    fn elements_per_offset(&self) -> f64 {
        match self {
            StreamSource::Nexmark { kind, .. } => kind.share(),
            _ => 1.0,
        }
    }

    /// Offsets `[from, until)` of `partition`, in batches of about `batch` elements, with the
    /// event time as the hidden timestamp column.
    pub fn read(&self, partition: u32, from: u64, until: u64, batch: usize) -> Vec<RecordBatch> {
        let mut out = vec![];
        let mut at = from;
        // Offsets per batch: more where they are sparse, so batches are not a fiftieth full.
        let step = ((batch.max(1) as f64 / self.elements_per_offset()).ceil() as u64).max(1);
        while at < until {
            let next = (at + step).min(until);
            let (b, time_col) = match self {
                StreamSource::Synthetic { stream, .. } => {
                    let seqs = (at..next).map(|o| self.seq(partition, o));
                    (stream.batch_of(seqs), "event_time")
                }
                // The same sequence numbers as `seq`, only those of the reader's kind.
                StreamSource::Nexmark {
                    events,
                    kind,
                    columns,
                    partitions,
                    ..
                } => {
                    let of_kind = strided_events(
                        *kind,
                        u64::from(*partitions),
                        u64::from(partition),
                        at,
                        next,
                    );
                    (events.columns_of_kind(*kind, &of_kind, columns), "dateTime")
                }
                StreamSource::Connector(_) | StreamSource::Bounded { .. } => return vec![],
            };
            at = next;
            if b.num_rows() > 0 {
                out.push(with_event_time(b, time_col));
            }
        }
        out
    }
}

/// Adds the hidden timestamp column, a copy of the element's event-time column.
fn with_event_time(b: RecordBatch, column: &str) -> RecordBatch {
    let schema = b.schema();
    let ts: ArrayRef = match schema.index_of(column) {
        Ok(i) => b.column(i).clone(),
        Err(_) => unreachable!("generator schemas have their event-time column"),
    };
    debug_assert!(ts.as_primitive_opt::<TimestampMicrosecondType>().is_some());
    let mut fields: Vec<_> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(ts_field(TS));
    let mut cols = b.columns().to_vec();
    cols.push(ts);
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).expect("one more column")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn synthetic(count: Option<u64>) -> StreamSource {
        StreamSource::new(
            &StreamSourceConfig::Synthetic {
                rate: 1000.0,
                keys: 10,
                distribution: KeyDistributionConfig::Uniform,
                skew_us: 0,
                partitions: 3,
                count,
                start_us: Some(0),
                seed: 1,
                late_fraction: 0.0,
                late_by_us: 0,
                rate_steps: vec![],
            },
            0,
        )
    }

    #[test]
    fn partitions_share_the_sequence_and_read_deterministically() {
        let s = synthetic(None);
        // At t = 10 ms, elements 0..=10 exist: 11 elements over 3 partitions.
        let ends: Vec<u64> = s.ends(10_000).iter().map(|e| e.end).collect();
        assert_eq!(ends, vec![4, 4, 3]);
        let a = s.read(1, 0, 4, 3);
        assert_eq!(a.iter().map(|b| b.num_rows()).sum::<usize>(), 4);
        let seqs: Vec<i64> = a
            .iter()
            .flat_map(|b| {
                b.column(2)
                    .as_primitive::<arrow::datatypes::Int64Type>()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(seqs, vec![1, 4, 7, 10]);
        assert_eq!(s.read(1, 0, 4, 100), s.read(1, 0, 4, 100));
        // Watermark after reading offsets 0..4 of partition 1: nominal time of seq 13.
        assert_eq!(s.watermark(1, 4), 13_000);
    }

    /// A reader of one Nexmark kind reads event numbers, of which a person is 1 in 50: its
    /// ends say so, and its batches hold about as many people as asked, not a fiftieth.
    #[test]
    fn a_nexmark_reader_of_people_counts_and_batches_people_not_event_numbers() {
        let people = StreamSource::new(
            &StreamSourceConfig::Nexmark {
                kind: "person".into(),
                rate: 1000.0,
                partitions: 1,
                count: Some(100_000),
                start_us: Some(0),
                seed: 1,
                columns: None,
            },
            0,
        );
        let ends = people.ends(i64::MAX / 2);
        assert_eq!(ends[0].end, 100_000);
        assert_eq!(ends[0].elements_per_offset, 1.0 / 50.0);
        let batches = people.read(0, 0, 100_000, 500);
        let rows: Vec<usize> = batches.iter().map(|b| b.num_rows()).collect();
        assert_eq!(rows.iter().sum::<usize>(), 2_000);
        assert_eq!(rows, vec![500; 4]);
    }

    /// A bounded side input: finished from the start, its watermark the end of time once read
    /// (at once when it is empty), its rows by offset.
    #[tokio::test]
    async fn a_bounded_source_is_read_once_and_then_holds_nothing_back() {
        use arrow::array::Int64Array;
        let rows = |n: i64| {
            let schema = Arc::new(Schema::new(vec![arrow::datatypes::Field::new(
                "x",
                arrow::datatypes::DataType::Int64,
                false,
            )]));
            let b =
                RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(0..n))]);
            StreamSource::of(
                &StreamSpec::Bounded(Arc::new(Bounded::Rows(b.unwrap()))),
                "Side",
                0,
            )
            .unwrap()
        };
        let s = rows(5);
        let ends = s.ends_now(0).await.unwrap();
        assert_eq!((ends.len(), ends[0].end, ends[0].finished), (1, 5, true));
        assert_eq!(s.initial_watermark(0), i64::MIN);
        let (first, w) = s.read_range(0, 0, 3, 100, None).await.unwrap();
        assert_eq!((first[0].num_rows(), w), (3, None));
        let (rest, w) = s.read_range(0, 3, 5, 100, None).await.unwrap();
        assert_eq!((rest[0].num_rows(), w), (2, Some(END_OF_TIME)));
        assert_eq!(s.watermark(0, 5), END_OF_TIME);
        let empty = rows(0);
        assert_eq!(empty.ends_now(0).await.unwrap()[0].end, 0);
        assert_eq!(empty.initial_watermark(0), END_OF_TIME);
    }

    #[test]
    fn a_counted_stream_finishes_without_promising_the_end_of_time() {
        let s = synthetic(Some(7));
        let ends = s.ends(1_000_000_000);
        assert_eq!(ends.iter().map(|e| e.end).sum::<u64>(), 7);
        assert!(ends.iter().all(|e| e.finished));
        // The drain that follows the last read moves the watermark to the end of time.
        let last = s.watermark(0, ends[0].end);
        assert!(last < END_OF_TIME);
        assert!(s.watermark(0, 0) < last);
    }

    /// A refreshed read of `path`'s CSV files (`k` as text).
    fn refreshed(path: &str) -> Bounded {
        let schema = Arc::new(arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new("k", arrow::datatypes::DataType::Utf8, true),
        ]));
        Bounded::Files {
            options: crate::ReadOptions::new(crate::FileFormat::Csv, path),
            source: crate::SourcePlan {
                schema,
                splits: vec![],
            },
            split_bytes: 0,
            refresh_us: Some(1_000_000),
        }
    }

    #[tokio::test]
    async fn a_refresh_whose_file_is_not_there_yet_reads_it_once_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("side.csv");
        let source = refreshed(&format!("{}/*.csv", dir.path().display()));
        // Replaced while listed: no file for a moment, then the new one.
        let writer = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            std::fs::write(file, "k\na\nb\n").unwrap();
        });
        let (batches, _) = source.read("side", 0, 1, 2).await.unwrap();
        writer.await.unwrap();
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        assert_eq!(rows, 2);
    }

    #[tokio::test]
    async fn a_refresh_that_keeps_failing_fails_naming_its_transform() {
        let dir = tempfile::tempdir().unwrap();
        let source = refreshed(&format!("{}/*.csv", dir.path().display()));
        let e = source.read("lookup", 0, 1, 2).await.unwrap_err();
        assert_eq!(e.transform, "lookup");
        assert!(e.message.contains("no files match"), "{e}");
    }
}
