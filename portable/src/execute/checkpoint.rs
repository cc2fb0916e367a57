//! A streaming job's checkpoints: the rounds' state between two rounds, written to
//! `<temp_location>/riverbank-checkpoints/<job name>/` (a local directory, or object storage
//! through the host's [`ObjectStorage`]: `store`) at most every `checkpointing_interval`
//! (default 10 s; `--experiments=checkpointing_interval=MS`), as a manifest (`checkpoint.pb`)
//! and content-named parts, so that only what changed is written (`parts`); a run that loads
//! the checkpoint deletes the parts no manifest names (a crash between writes left them). A
//! job submitted
//! again under the same name and temp location (its job server died), or whose runner pod
//! restarted, resumes from the last one: held source residuals, each GroupByKey's windows and
//! panes, each stateful DoFn's state and timers, elements waiting for side windows, the side
//! inputs kept, and the watermarks these give. The side inputs of bounded PCollections
//! (complete after the first round) are kept apart, in `bounded-sides.pb`, written once per
//! run. A checkpoint of another pipeline is refused, naming it, but for the one a job updates
//! in place (a DataflowJob's `--update`), which it takes over under its own ids. A job that
//! ends, is drained or cancelled removes its checkpoint; a failed one keeps it (the pipeline,
//! fixed and submitted again, resumes). A job stopped between two rounds (`RunSettings::stop`)
//! writes a last checkpoint first; an update on the same job server also hands the same state
//! to the replacing job in memory (`Ended::Stopped`).
//!
//! What the user's DoFns wrote after the last checkpoint is written again on resume: their
//! output is at least once, as on Dataflow and Flink for sinks that are not transactional.
//! The format is protobuf messages (prost, no schema file) whose fields are the runner's own
//! bytes.
mod parts;
mod store;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use prost::Message;
use sha2::{Digest, Sha256};

use crate::error::PortableError;
use crate::options;
use crate::plan::Plan;
use crate::update::Ids;
pub(crate) use parts::{Changed, part_of};
use parts::{PartState, Place};
use store::LocalDir;
pub use store::{CheckpointStore, ObjectStorage};

/// The rounds' state between two rounds.
#[derive(Clone, PartialEq, Message)]
pub struct Checkpoint {
    /// The plan's stages and transforms: a checkpoint restores only the pipeline that wrote it.
    #[prost(string, tag = "1")]
    pub fingerprint: String,
    #[prost(uint64, tag = "2")]
    pub round: u64,
    #[prost(message, repeated, tag = "3")]
    pub held: Vec<HeldState>,
    #[prost(message, repeated, tag = "4")]
    pub groups: Vec<GroupState>,
    #[prost(message, repeated, tag = "5")]
    pub keyed: Vec<KeyedState>,
    #[prost(message, repeated, tag = "6")]
    pub waiting: Vec<WaitingState>,
    #[prost(message, repeated, tag = "7")]
    pub sides: Vec<SideState>,
    #[prost(int64, optional, tag = "8")]
    pub sides_forgotten_at: Option<i64>,
    #[prost(uint64, tag = "9")]
    pub fired: u64,
    #[prost(uint64, tag = "10")]
    pub expired: u64,
    /// Wall-clock millis when it was written.
    #[prost(int64, tag = "11")]
    pub written_at: i64,
    /// Written as a manifest: the parts holding its windows and buckets (`parts`).
    #[prost(string, repeated, tag = "12")]
    pub parts: Vec<String>,
}

/// An unbounded source's residual waiting for its round.
#[derive(Clone, PartialEq, Message)]
pub struct HeldState {
    #[prost(uint64, tag = "1")]
    pub stage: u64,
    /// The `DelayedBundleApplication`, encoded.
    #[prost(bytes = "vec", tag = "2")]
    pub residual: Vec<u8>,
    /// Wall-clock millis when it is due.
    #[prost(int64, tag = "3")]
    pub due: i64,
    #[prost(int64, tag = "4")]
    pub watermark: i64,
}

/// A GroupByKey's windows.
#[derive(Clone, PartialEq, Message)]
pub struct GroupState {
    #[prost(uint64, tag = "1")]
    pub stage: u64,
    #[prost(int64, optional, tag = "2")]
    pub watermark: Option<i64>,
    #[prost(uint64, tag = "3")]
    pub late: u64,
    #[prost(message, repeated, tag = "4")]
    pub windows: Vec<WindowState>,
}

/// One key's window: its panes (`riverbank-windowing`'s encoding) and the values it holds.
#[derive(Clone, PartialEq, Message)]
pub struct WindowState {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub window: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    pub panes: Vec<u8>,
    #[prost(uint32, tag = "4")]
    pub count: u32,
    #[prost(bytes = "vec", tag = "5")]
    pub values: Vec<u8>,
    #[prost(int64, tag = "6")]
    pub earliest: i64,
    #[prost(int64, tag = "7")]
    pub latest: i64,
}

/// A stateful stage's buckets, in order.
#[derive(Clone, PartialEq, Message)]
pub struct KeyedState {
    #[prost(uint64, tag = "1")]
    pub stage: u64,
    #[prost(message, repeated, tag = "2")]
    pub buckets: Vec<BucketState>,
}

#[derive(Clone, PartialEq, Message)]
pub struct BucketState {
    #[prost(message, repeated, tag = "1")]
    pub bags: Vec<BagState>,
    #[prost(message, repeated, tag = "2")]
    pub lists: Vec<ListState>,
    #[prost(message, repeated, tag = "3")]
    pub timers: Vec<TimerState>,
}

/// Which user state a bag or ordered list is: its transform, state id, window and key.
#[derive(Clone, PartialEq, Message)]
pub struct StateId {
    #[prost(string, tag = "1")]
    pub transform: String,
    #[prost(string, tag = "2")]
    pub state: String,
    #[prost(bytes = "vec", tag = "3")]
    pub window: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    pub key: Vec<u8>,
}

/// A bag: its elements concatenated, and where each ends.
#[derive(Clone, PartialEq, Message)]
pub struct BagState {
    #[prost(message, optional, tag = "1")]
    pub id: Option<StateId>,
    #[prost(bytes = "vec", tag = "2")]
    pub data: Vec<u8>,
    #[prost(uint64, repeated, tag = "3")]
    pub ends: Vec<u64>,
}

/// An ordered list: each element with its sort key, in order.
#[derive(Clone, PartialEq, Message)]
pub struct ListState {
    #[prost(message, optional, tag = "1")]
    pub id: Option<StateId>,
    #[prost(int64, repeated, tag = "2")]
    pub sort_keys: Vec<i64>,
    #[prost(bytes = "vec", repeated, tag = "3")]
    pub elements: Vec<Vec<u8>>,
}

/// A timer set and not fired: its family, identity, firing time and encoding.
#[derive(Clone, PartialEq, Message)]
pub struct TimerState {
    #[prost(string, tag = "1")]
    pub transform: String,
    #[prost(string, tag = "2")]
    pub family: String,
    #[prost(bytes = "vec", tag = "3")]
    pub identity: Vec<u8>,
    #[prost(int64, tag = "4")]
    pub fire: i64,
    #[prost(bytes = "vec", tag = "5")]
    pub timer: Vec<u8>,
}

/// Main elements of a stage waiting for their side windows.
#[derive(Clone, PartialEq, Message)]
pub struct WaitingState {
    #[prost(uint64, tag = "1")]
    pub stage: u64,
    #[prost(string, tag = "2")]
    pub input: String,
    #[prost(bytes = "vec", tag = "3")]
    pub elements: Vec<u8>,
}

/// A side input kept from round to round.
#[derive(Clone, PartialEq, Message)]
pub struct SideState {
    #[prost(string, tag = "1")]
    pub pcollection: String,
    #[prost(bytes = "vec", tag = "2")]
    pub elements: Vec<u8>,
}

/// Whether a streaming job checkpoints.
pub enum Checkpointing {
    /// No `--temp_location`.
    Off,
    /// One it cannot checkpoint to, and why (said in the job's messages; the job runs).
    Unavailable(String),
    On(Box<Checkpoints>),
}

/// Where and how often a streaming job checkpoints.
pub struct Checkpoints {
    /// `<temp_location>/riverbank-checkpoints/<job name>`.
    store: Arc<dyn CheckpointStore>,
    every: Duration,
    last: Option<Instant>,
    fingerprint: String,
    /// Whether the side inputs of bounded PCollections (complete after the first round, never
    /// changed) are written: once per run, beside the checkpoints, not in each.
    bounded_written: bool,
    /// The pipeline this job updates in place: its checkpoints' fingerprint, and its ids as
    /// this plan has them (what it left is taken over under them).
    replaced: Option<(String, Ids)>,
    /// The parts the last checkpoint written or read names (`parts`): not written again.
    present: HashSet<String>,
    /// The parts of the last checkpoint this process wrote, by place: named again for what
    /// did not change since.
    places: HashMap<Place, String>,
}

/// Checkpoint folders of the jobs running in this process: two jobs must not share one.
static IN_USE: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(Mutex::default);

/// Parts of a checkpoint written at the same time.
const PUTS_AT_ONCE: usize = 8;

/// How often a streaming job checkpoints unless told.
const DEFAULT_EVERY: Duration = Duration::from_secs(10);

const CHECKPOINT: &str = "checkpoint.pb";
/// Where the side inputs of bounded PCollections are kept, once.
const BOUNDED_SIDES: &str = "bounded-sides.pb";

impl Checkpoints {
    /// The checkpoints of a job with these pipeline options, if it asks for them (a
    /// `--temp_location`: a local directory, or a URL `storage` opens). The folder is taken
    /// until the value is dropped: another running job that would share it is refused. A job
    /// that `replaces` another pipeline in place takes over that pipeline's checkpoint, or is
    /// refused saying why it cannot.
    pub(crate) fn of(
        options: &prost_types::Struct,
        job_name: &str,
        plan: &Plan,
        storage: Option<&ObjectStorage>,
        replaces: Option<&Plan>,
    ) -> Result<Checkpointing, PortableError> {
        let Some(temp) = options::text(options, "temp_location") else {
            return Ok(Checkpointing::Off);
        };
        let replaced = match replaces {
            Some(old) => {
                let ids = crate::update::ids(old, plan, options).map_err(|why| {
                    PortableError::Checkpoint(format!(
                        "this pipeline cannot take over the state of the one it updates: {why}"
                    ))
                })?;
                Some((fingerprint(old), ids))
            }
            None => None,
        };
        let folder = format!(
            "{}/riverbank-checkpoints/{}",
            temp.trim_end_matches('/'),
            sanitize(job_name)
        );
        let store: Arc<dyn CheckpointStore> = match folder.strip_prefix("file://") {
            Some(path) => Arc::new(LocalDir(PathBuf::from(path))),
            None if !folder.contains("://") => Arc::new(LocalDir(PathBuf::from(&folder))),
            None => match storage {
                Some(storage) => storage.open(&folder).map_err(|e| {
                    PortableError::Checkpoint(format!("--temp_location {temp}: {e}"))
                })?,
                None => {
                    return Ok(Checkpointing::Unavailable(format!(
                        "not checkpointed: --temp_location {temp} is not a local directory, and this job server opens no object storage"
                    )));
                }
            },
        };
        let shown = store.display("");
        let mut in_use = IN_USE.lock().expect("checkpoint folders");
        if !in_use.insert(shown.clone()) {
            return Err(PortableError::Checkpoint(format!(
                "another running job checkpoints to {shown} (same --job_name and --temp_location)"
            )));
        }
        let every = options::experiment(options, "checkpointing_interval")
            .and_then(|ms| ms.parse::<u64>().ok())
            .map_or(DEFAULT_EVERY, Duration::from_millis);
        Ok(Checkpointing::On(Box::new(Checkpoints {
            store,
            every,
            last: None,
            fingerprint: fingerprint(plan),
            bounded_written: false,
            replaced,
            present: HashSet::new(),
            places: HashMap::new(),
        })))
    }

    /// Where the checkpoint is, as messages show it.
    pub(crate) fn shown(&self) -> String {
        self.store.display(CHECKPOINT)
    }

    /// The last checkpoint (its manifest and parts, with the bounded side inputs), if there is
    /// one of this pipeline (or of the one it updates); an error if there is one of another.
    pub(crate) async fn load(&mut self) -> Result<Option<Checkpoint>, PortableError> {
        let Some(manifest) = self.decode(CHECKPOINT).await? else {
            self.sweep(&HashSet::new()).await;
            return Ok(None);
        };
        self.sweep(&manifest.parts.iter().cloned().collect()).await;
        let mut parts = Vec::with_capacity(manifest.parts.len());
        for name in &manifest.parts {
            let bytes = self
                .store
                .get(name)
                .await
                .map_err(PortableError::Checkpoint)?
                .ok_or_else(|| {
                    PortableError::Checkpoint(format!(
                        "{} names {}, which is missing",
                        self.store.display(CHECKPOINT),
                        self.store.display(name)
                    ))
                })?;
            parts.push(PartState::decode(&bytes[..]).map_err(|e| {
                PortableError::Checkpoint(format!("{}: {e}", self.store.display(name)))
            })?);
        }
        self.present = manifest.parts.iter().cloned().collect();
        let mut checkpoint = self.own(CHECKPOINT, parts::join(manifest, parts))?;
        let sides = self.decode(BOUNDED_SIDES).await?.ok_or_else(|| {
            PortableError::Checkpoint(format!("{} is missing", self.store.display(BOUNDED_SIDES)))
        })?;
        checkpoint
            .sides
            .extend(self.own(BOUNDED_SIDES, sides)?.sides);
        Ok(Some(checkpoint))
    }

    /// Deletes the parts no manifest names: those a run wrote before it died without writing
    /// its manifest, or whose deletion a manifest's write was followed by and did not get to.
    /// Best effort: a folder that cannot be listed keeps them.
    async fn sweep(&self, named: &HashSet<String>) {
        let names = match self.store.list().await {
            Ok(names) => names,
            Err(e) => {
                tracing::warn!("cannot list {}: {e}", self.store.display(""));
                return;
            }
        };
        for name in names {
            if parts::is_part(&name) && !named.contains(&name) {
                self.delete(&name).await;
            }
        }
    }

    /// File `name` of the folder as a checkpoint message, if there is one.
    async fn decode(&self, name: &str) -> Result<Option<Checkpoint>, PortableError> {
        let Some(bytes) = self
            .store
            .get(name)
            .await
            .map_err(PortableError::Checkpoint)?
        else {
            return Ok(None);
        };
        Checkpoint::decode(&bytes[..]).map(Some).map_err(|e| {
            PortableError::Checkpoint(format!(
                "{}: not a checkpoint: {e}",
                self.store.display(name)
            ))
        })
    }

    /// `checkpoint` (read from `name`) if it is this pipeline's, or the pipeline's this one
    /// updates (its state then under this plan's ids); an error if it is another's.
    fn own(&self, name: &str, checkpoint: Checkpoint) -> Result<Checkpoint, PortableError> {
        if checkpoint.fingerprint == self.fingerprint {
            return Ok(checkpoint);
        }
        match &self.replaced {
            Some((old, ids)) if checkpoint.fingerprint == *old => {
                checkpoint.renamed(&|t| ids.transform(t), &|p| ids.pcollection(p))
            }
            _ => Err(PortableError::Checkpoint(format!(
                "{} is the checkpoint of another pipeline under this job name: remove it, or give this job another --job_name",
                self.store.display(name)
            ))),
        }
    }

    /// Whether `loaded` was left by the pipeline this job updates (not yet one of its own).
    pub(crate) fn left_by_replaced(&self, loaded: &Checkpoint) -> bool {
        loaded.fingerprint != self.fingerprint
    }

    /// Whether the next write needs the bounded side inputs (the first of this run).
    pub(crate) fn needs_bounded(&self) -> bool {
        !self.bounded_written
    }

    /// Whether a checkpoint is due (the first, or the interval has passed).
    pub(crate) fn due(&self) -> bool {
        self.last.is_none_or(|t| t.elapsed() >= self.every)
    }

    /// Writes `checkpoint` in place of the last, whole or not at all; `bounded`, the side
    /// inputs of bounded PCollections, first, when [`Self::needs_bounded`] asked for them.
    /// With `changed`, the checkpoint holds only the parts it names, and the last checkpoint
    /// this process wrote stands for the others. The parts encoded, and those named in all.
    pub(crate) async fn write(
        &mut self,
        mut checkpoint: Checkpoint,
        bounded: Option<Vec<SideState>>,
        changed: Option<&Changed>,
    ) -> Result<(usize, usize), PortableError> {
        if let Some(sides) = bounded {
            let sides = Checkpoint {
                fingerprint: self.fingerprint.clone(),
                sides,
                ..Checkpoint::default()
            };
            self.store
                .put(BOUNDED_SIDES, sides.encode_to_vec())
                .await
                .map_err(PortableError::Checkpoint)?;
            self.bounded_written = true;
        }
        checkpoint.fingerprint = self.fingerprint.clone();
        let (mut manifest, parts) = parts::split(checkpoint, changed);
        let encoded = parts.len();
        let mut places: HashMap<Place, String> = self
            .places
            .iter()
            .filter(|(place, _)| changed.is_some_and(|c| c.unchanged(**place)))
            .map(|(place, name)| (*place, name.clone()))
            .collect();
        let mut new = vec![];
        for (place, name, bytes) in parts {
            if !self.present.contains(&name) {
                new.push((name.clone(), bytes));
            }
            places.insert(place, name);
        }
        // New parts go up a few at a time: each is a request to object storage.
        let store = &self.store;
        // (Collected first: a lazy map's closure would make the job's task not `Send`.)
        let puts: Vec<_> = new
            .iter_mut()
            .map(|(name, bytes)| store.put(name, std::mem::take(bytes)))
            .collect();
        futures::stream::iter(puts)
            .buffer_unordered(PUTS_AT_ONCE)
            .try_collect::<Vec<()>>()
            .await
            .map_err(PortableError::Checkpoint)?;
        manifest.parts = places.values().cloned().collect();
        manifest.parts.sort();
        self.store
            .put(CHECKPOINT, manifest.encode_to_vec())
            .await
            .map_err(PortableError::Checkpoint)?;
        self.places = places;
        let named: HashSet<String> = manifest.parts.into_iter().collect();
        // No manifest names them any more.
        for gone in self.present.difference(&named) {
            self.delete(gone).await;
        }
        self.present = named;
        self.last = Some(Instant::now());
        Ok((encoded, self.places.len()))
    }

    /// The job is over: its checkpoint goes (the manifest first, so that a removal cut short
    /// never leaves a manifest without its parts; the bounded side inputs last).
    pub(crate) async fn remove(&self) {
        self.delete(CHECKPOINT).await;
        for part in &self.present {
            self.delete(part).await;
        }
        self.delete(BOUNDED_SIDES).await;
    }

    async fn delete(&self, name: &str) {
        if let Err(e) = self.store.delete(name).await {
            tracing::warn!("cannot remove {}: {e}", self.store.display(name));
        }
    }
}

impl Drop for Checkpoints {
    fn drop(&mut self) {
        IN_USE
            .lock()
            .expect("checkpoint folders")
            .remove(&self.store.display(""));
    }
}

/// The plan's stages, each with its transforms' ids and URNs, hashed: what a checkpoint's
/// state is keyed by (stage indexes, transform and PCollection ids), without the payloads (an
/// SDK may pickle the same function differently each time).
pub(crate) fn fingerprint(plan: &Plan) -> String {
    let same = |id: &str| id.to_string();
    fingerprint_as(plan, &same, &same)
}

/// [`fingerprint`], each transform id of `plan` first turned into `id(it)` and each of its
/// stages' PCollection ids into `pcollection(it)`: the ids they have in the plan it is compared
/// with (an update that renames transforms; the runner names the PCollections it makes after
/// them).
pub(crate) fn fingerprint_as(
    plan: &Plan,
    id: &dyn Fn(&str) -> String,
    pcollection: &dyn Fn(&str) -> String,
) -> String {
    use crate::plan::StageKind;
    let mut h = Sha256::new();
    let mut put = |s: &str, sep: u8| {
        h.update(s.as_bytes());
        h.update([sep]);
    };
    for stage in &plan.stages {
        let transforms: Vec<&String> = match &stage.kind {
            StageKind::Impulse { .. } => vec![],
            StageKind::GroupByKey { transform, .. } | StageKind::Concat { transform, .. } => {
                vec![transform]
            }
            StageKind::Sdk(s) => s.transforms.iter().collect(),
        };
        put("stage", 0);
        for t in transforms {
            put(&id(t), 1);
        }
        for p in stage.kind.inputs().into_iter().chain(stage.kind.outputs()) {
            put(&pcollection(p), 2);
        }
    }
    let mut transforms: Vec<(String, &str)> = plan
        .components
        .transforms
        .iter()
        .map(|(t, pt)| (id(t), pt.spec.as_ref().map_or("", |s| s.urn.as_str())))
        .collect();
    transforms.sort();
    for (t, urn) in transforms {
        put(&t, 3);
        put(urn, 4);
    }
    hex::encode(h.finalize())
}

impl Checkpoint {
    /// The same state under other transform and PCollection ids (an update that renames
    /// transforms): `id` and `pcollection` turn the old plan's into the new plan's.
    pub(crate) fn renamed(
        mut self,
        id: &dyn Fn(&str) -> String,
        pcollection: &dyn Fn(&str) -> String,
    ) -> Result<Checkpoint, PortableError> {
        use crate::fn_api::DelayedBundleApplication;
        for h in &mut self.held {
            let mut residual = DelayedBundleApplication::decode(&h.residual[..])
                .map_err(|e| PortableError::Checkpoint(format!("a held residual: {e}")))?;
            if let Some(a) = residual.application.as_mut() {
                a.transform_id = id(&a.transform_id);
                a.input_id = pcollection(&a.input_id);
            }
            h.residual = residual.encode_to_vec();
        }
        for bucket in self.keyed.iter_mut().flat_map(|k| &mut k.buckets) {
            let states = bucket.bags.iter_mut().map(|b| &mut b.id);
            for s in states
                .chain(bucket.lists.iter_mut().map(|l| &mut l.id))
                .flatten()
            {
                s.transform = id(&s.transform);
            }
            for t in &mut bucket.timers {
                t.transform = id(&t.transform);
            }
        }
        for w in &mut self.waiting {
            w.input = pcollection(&w.input);
        }
        for side in &mut self.sides {
            side.pcollection = pcollection(&side.pcollection);
        }
        Ok(self)
    }
}

/// A job name as a directory name.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' => c,
            _ => '_',
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_name_becomes_one_directory() {
        assert_eq!(sanitize("../my job"), "___my_job");
    }

    /// Checkpoints of a pipeline of `fingerprint` in `store`, taking over those of `replaced`.
    fn in_store(
        store: Arc<dyn CheckpointStore>,
        fingerprint: &str,
        replaced: Option<(String, Ids)>,
    ) -> Checkpoints {
        Checkpoints {
            store,
            every: Duration::from_secs(10),
            last: None,
            fingerprint: fingerprint.into(),
            bounded_written: false,
            replaced,
            present: HashSet::new(),
            places: HashMap::new(),
        }
    }

    /// A folder that counts what is put in it.
    struct Counting(LocalDir, Mutex<Vec<String>>);

    impl CheckpointStore for Counting {
        fn get<'a>(
            &'a self,
            name: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<Option<Vec<u8>>, String>> {
            self.0.get(name)
        }
        fn put<'a>(
            &'a self,
            name: &'a str,
            bytes: Vec<u8>,
        ) -> futures::future::BoxFuture<'a, Result<(), String>> {
            self.1.lock().unwrap().push(name.to_string());
            self.0.put(name, bytes)
        }
        fn delete<'a>(
            &'a self,
            name: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<(), String>> {
            self.0.delete(name)
        }
        fn list(&self) -> futures::future::BoxFuture<'_, Result<Vec<String>, String>> {
            self.0.list()
        }
        fn display(&self, name: &str) -> String {
            self.0.display(name)
        }
    }

    /// Round `count`'s state: a GroupByKey (stage 2) with 40 quiet keys' windows and a hot
    /// key's holding `count`, and a stateful stage (4) whose bucket 3 has a timer at `count`.
    fn hot_key_state(count: u32) -> Checkpoint {
        let window = |key: &str, count: u32| WindowState {
            key: key.as_bytes().to_vec(),
            window: vec![1],
            count,
            ..WindowState::default()
        };
        Checkpoint {
            round: count as u64,
            groups: vec![GroupState {
                stage: 2,
                watermark: Some(5),
                late: 1,
                windows: (0..40)
                    .map(|k| window(&format!("key{k}"), 1))
                    .chain([window("hot", count)])
                    .collect(),
            }],
            keyed: vec![KeyedState {
                stage: 4,
                buckets: (0..16)
                    .map(|b| BucketState {
                        timers: vec![TimerState {
                            transform: "t".into(),
                            fire: if b == 3 { count as i64 } else { 0 },
                            ..TimerState::default()
                        }],
                        ..BucketState::default()
                    })
                    .collect(),
            }],
            ..Checkpoint::default()
        }
    }

    /// A checkpoint of only what changed (the hot key's part of the GroupByKey and bucket 3,
    /// as the rounds save it): those parts are encoded and written, the last checkpoint's
    /// stand for the others, and it reads back whole, equal to the whole state.
    #[tokio::test]
    async fn a_checkpoint_of_what_changed_names_the_last_ones_parts_for_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Counting(LocalDir(dir.path().join("job")), Mutex::default()));
        let mut first = in_store(store.clone(), "a", None);
        first
            .write(hot_key_state(1), Some(vec![]), None)
            .await
            .unwrap();
        store.1.lock().unwrap().clear();
        let hot = part_of(b"hot");
        let mut changed_only = hot_key_state(2);
        changed_only.groups[0]
            .windows
            .retain(|w| part_of(&w.key) == hot);
        for (b, bucket) in changed_only.keyed[0].buckets.iter_mut().enumerate() {
            if b != 3 {
                *bucket = BucketState::default();
            }
        }
        let changed = Changed {
            groups: [(2, [hot].into())].into(),
            keyed: [(4, [3].into())].into(),
        };
        first
            .write(changed_only, None, Some(&changed))
            .await
            .unwrap();
        let written = std::mem::take(&mut *store.1.lock().unwrap());
        let parts = written.iter().filter(|n| n.starts_with("part-")).count();
        assert_eq!(parts, 2, "{written:?}");

        let mut back = in_store(store.clone(), "a", None)
            .load()
            .await
            .unwrap()
            .unwrap();
        back.groups[0].windows.sort_by(|a, b| a.key.cmp(&b.key));
        let mut want = hot_key_state(2);
        want.groups[0].windows.sort_by(|a, b| a.key.cmp(&b.key));
        assert_eq!(back.groups, want.groups);
        assert_eq!(back.keyed, want.keyed);
    }

    /// Checkpoints are incremental: a GroupByKey's windows and a stateful stage's buckets are
    /// parts named by their content, so a checkpoint writes only the parts that changed (and
    /// its manifest), removes those no longer named, and reads back whole; a new run (which
    /// knows the parts from the manifest it read) writes nothing it finds there.
    #[tokio::test]
    async fn a_checkpoint_writes_only_the_parts_that_changed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Counting(LocalDir(dir.path().join("job")), Mutex::default()));
        let open = || in_store(store.clone(), "a", None);
        let state = hot_key_state;
        let puts = || std::mem::take(&mut *store.1.lock().unwrap());
        let mut first = open();
        first.write(state(1), Some(vec![]), None).await.unwrap();
        let parts = |names: &[String]| names.iter().filter(|n| n.starts_with("part-")).count();
        let written = puts();
        assert!(parts(&written) > 2, "{written:?}");
        // The hot key's window and bucket 3's timer changed: two parts, and the manifest.
        first.write(state(2), None, None).await.unwrap();
        let written = puts();
        assert_eq!(parts(&written), 2, "{written:?}");
        assert!(written.contains(&"checkpoint.pb".to_string()));
        let on_disk = std::fs::read_dir(dir.path().join("job")).unwrap().count();
        assert_eq!(
            on_disk,
            first.present.len() + 2,
            "the parts replaced are gone"
        );

        let mut again = open();
        let mut back = again.load().await.unwrap().unwrap();
        back.groups[0].windows.sort_by(|a, b| a.key.cmp(&b.key));
        let mut want = state(2);
        want.groups[0].windows.sort_by(|a, b| a.key.cmp(&b.key));
        assert_eq!(back.groups, want.groups);
        assert_eq!(back.keyed, want.keyed);
        assert_eq!(back.round, 2);
        again.write(back, None, None).await.unwrap();
        assert_eq!(
            parts(&puts()),
            0,
            "nothing changed, nothing written but the manifest"
        );
        again.remove().await;
        assert!(!dir.path().join("job").exists(), "removed whole");
    }

    /// Parts no manifest names (a run died between writing parts and its manifest, or between
    /// the manifest and the deletions) go when the next run loads the checkpoint, or finds none;
    /// the parts named, and files not parts, stay.
    #[tokio::test]
    async fn a_loaded_checkpoint_sweeps_the_parts_no_manifest_names() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join("job");
        let store: Arc<dyn CheckpointStore> = Arc::new(LocalDir(job.clone()));
        let state = Checkpoint {
            round: 3,
            groups: vec![GroupState {
                stage: 1,
                windows: vec![WindowState {
                    key: b"k".to_vec(),
                    window: vec![1],
                    count: 2,
                    ..WindowState::default()
                }],
                ..GroupState::default()
            }],
            ..Checkpoint::default()
        };
        in_store(store.clone(), "a", None)
            .write(state, Some(vec![]), None)
            .await
            .unwrap();
        let orphan = format!("part-{}.pb", "ab".repeat(16));
        std::fs::write(job.join(&orphan), b"left by a run that died").unwrap();
        std::fs::write(job.join("notes.txt"), b"not a part").unwrap();
        let files = || {
            let mut v: Vec<String> = std::fs::read_dir(&job)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert!(files().contains(&orphan));
        let mut next = in_store(store.clone(), "a", None);
        let loaded = next.load().await.unwrap().unwrap();
        assert_eq!(loaded.round, 3);
        let left = files();
        assert!(!left.contains(&orphan), "{left:?}");
        assert!(left.contains(&"notes.txt".to_string()), "{left:?}");
        assert_eq!(
            left.iter().filter(|f| parts::is_part(f)).count(),
            next.present.len(),
            "{left:?}"
        );
        // With no manifest at all, every part goes.
        std::fs::remove_file(job.join(CHECKPOINT)).unwrap();
        assert!(in_store(store, "a", None).load().await.unwrap().is_none());
        assert!(!files().iter().any(|f| parts::is_part(f)), "{:?}", files());
    }

    /// A job updating another in place (a DataflowJob's `--update`) takes over the checkpoint
    /// that pipeline left, its state under the new transform and PCollection ids; its own
    /// checkpoints after that are read as its own; any other pipeline's is refused.
    #[tokio::test]
    async fn an_update_takes_over_the_checkpoint_of_the_pipeline_it_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn CheckpointStore> = Arc::new(LocalDir(dir.path().join("job")));
        let checkpoints =
            |fingerprint: &str, replaced| in_store(store.clone(), fingerprint, replaced);
        let left = Checkpoint {
            round: 12,
            keyed: vec![KeyedState {
                stage: 3,
                buckets: vec![BucketState {
                    timers: vec![TimerState {
                        transform: "old-id".into(),
                        ..TimerState::default()
                    }],
                    ..BucketState::default()
                }],
            }],
            sides: vec![SideState {
                pcollection: "old-pc".into(),
                elements: vec![1],
            }],
            ..Checkpoint::default()
        };
        let mut old = checkpoints("old", None);
        old.write(left, Some(vec![]), None).await.unwrap();
        let ids = || {
            Ids::of(
                [("old-id".to_string(), "new-id".to_string())].into(),
                [("old-pc".to_string(), "new-pc".to_string())].into(),
            )
        };
        let mut new = checkpoints("new", Some(("old".into(), ids())));
        let taken = new.load().await.unwrap().unwrap();
        assert!(new.left_by_replaced(&taken));
        assert_eq!(taken.round, 12);
        assert_eq!(taken.keyed[0].buckets[0].timers[0].transform, "new-id");
        assert_eq!(taken.sides[0].pcollection, "new-pc");
        new.write(taken, Some(vec![]), None).await.unwrap();
        let own = new.load().await.unwrap().unwrap();
        assert!(!new.left_by_replaced(&own));
        assert_eq!(own.keyed[0].buckets[0].timers[0].transform, "new-id");
        let mut stranger = checkpoints("other", Some(("old".into(), ids())));
        let e = stranger.load().await.unwrap_err().to_string();
        assert!(e.contains("another pipeline"), "{e}");
    }

    /// Written whole and read back; a checkpoint of another pipeline is refused, naming it.
    #[tokio::test]
    async fn a_checkpoint_reads_back_only_for_the_pipeline_that_wrote_it() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn CheckpointStore> = Arc::new(LocalDir(dir.path().join("job")));
        let mut mine = in_store(store.clone(), "a", None);
        assert!(mine.load().await.unwrap().is_none());
        assert!(mine.due());
        let saved = Checkpoint {
            round: 7,
            held: vec![HeldState {
                stage: 2,
                residual: vec![1, 2, 3],
                due: 5,
                watermark: -4,
            }],
            ..Checkpoint::default()
        };
        assert!(mine.needs_bounded());
        let side = |p: &str| SideState {
            pcollection: p.into(),
            elements: vec![9],
        };
        mine.write(saved.clone(), Some(vec![side("bounded")]), None)
            .await
            .unwrap();
        assert!(!mine.due(), "the next is due after the interval");
        assert!(!mine.needs_bounded(), "written once");
        let later = Checkpoint {
            round: 8,
            sides: vec![side("unbounded")],
            ..saved.clone()
        };
        mine.write(later, None, None).await.unwrap();
        let back = mine.load().await.unwrap().unwrap();
        assert_eq!((back.round, &back.held), (8, &saved.held));
        let sides: Vec<&str> = back.sides.iter().map(|s| s.pcollection.as_str()).collect();
        assert_eq!(sides, ["unbounded", "bounded"]);
        let mut other = in_store(store, "b", None);
        let e = other.load().await.unwrap_err().to_string();
        assert!(
            e.contains("another pipeline") && e.contains("checkpoint.pb"),
            "{e}"
        );
        mine.remove().await;
        assert!(!dir.path().join("job").exists());
    }
}
