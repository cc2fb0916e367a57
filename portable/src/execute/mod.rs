//! Runs a [`Plan`]: stages in order, each PCollection that crosses a boundary held as blocks of
//! whole encoded elements. Impulse, GroupByKey and Flatten/Reshuffle run here; SDK stages run
//! as bundles spread over the environment's harnesses, each bundle retried up to
//! [`ATTEMPTS`] times (on another harness when one dies, after starting a new one).
mod bundles;
pub mod checkpoint;
mod descriptor;
mod group;
mod keyed;
mod merge_windows;
mod pending;
pub mod progress;
mod side_windows;
mod spill;
mod streaming;

use std::collections::HashMap;
use std::sync::Arc;

use prost::bytes::Bytes;
use tokio::sync::watch;

use crate::coders::in_the_global_window;
use crate::error::PortableError;
use crate::fnapi::environment::{self, Harnesses};
use crate::fnapi::{FnServer, SideInputStore};
use crate::plan::{Plan, SdkStage, StageKind};
use crate::urns;
use progress::Live;
use spill::{Block, Spill};

/// How long a worker pool that had harnesses has to answer when they are replaced.
pub const REPLACEMENT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long the other places have to start their harnesses once one has.
const START_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a worker pool that failed is left alone.
const POOL_BACKOFF: std::time::Duration = std::time::Duration::from_secs(60);

/// Attempts per bundle before the job fails (Dataflow's batch policy).
pub const ATTEMPTS: usize = 4;
/// Data-plane messages and stored blocks stay under this size (whole elements each).
pub(crate) const BLOCK_BYTES: usize = 4 << 20;

/// What one run needs beside the plan.
pub struct RunSettings {
    pub job_id: String,
    /// As submitted (`--job_name`, else the SDK's default): a streaming job's checkpoints are
    /// kept under it, so that the same job submitted again resumes.
    pub job_name: String,
    /// Harnesses per environment (per worker pool, for a DOCKER environment), unless the
    /// pipeline sets `--sdk_worker_parallelism`.
    pub sdk_workers: usize,
    /// Beam worker pools (`host:port`) that run the pipeline's DOCKER environments' image, each
    /// given its share of the harnesses: on Kubernetes, the SDK containers of the job's worker
    /// pods. Empty: a DOCKER environment is refused. The list may change while the job runs
    /// (the operator scales the SDK worker pods): a pool added gets harnesses at once, which
    /// take bundles of the running stage; one removed is not asked again.
    pub worker_pools: watch::Receiver<Vec<String>>,
    /// How long the worker pools have to answer at first (their pods may be pulling the SDK
    /// image). A pool that does not, or that is gone later (its pod restarting), is done
    /// without while others have harnesses: asked again at the next stage or round, for
    /// [`REPLACEMENT_WAIT`].
    pub pool_wait: std::time::Duration,
    pub pipeline_options: prost_types::Struct,
    /// How often a running stage's progress is asked for and told.
    pub progress_every: std::time::Duration,
    /// Bytes of materialized PCollections held in memory; the rest waits on disk.
    pub memory_budget: usize,
    /// Set to drain a streaming job: its sources stop, its windows fire, it ends as Drained.
    pub drain: watch::Receiver<bool>,
    /// Set to stop a streaming job between two rounds, for its replacement (`--update` on
    /// the same job server) or because its process is stopping (a runner pod's SIGTERM): it
    /// writes a last checkpoint (when it checkpoints) and ends as Stopped, with its state.
    pub stop: watch::Receiver<bool>,
    /// A streaming job's state to start from: the job it replaces handed it over.
    pub resume: Option<Box<checkpoint::Checkpoint>>,
    /// The plan of the pipeline this job updates in place (a DataflowJob's `--update`: the same
    /// job name, so the same checkpoints): a checkpoint of that pipeline is taken over, its
    /// state moved to this plan's transform ids (`--transform_name_mapping`).
    pub replaces: Option<Box<crate::plan::Plan>>,
    /// Opens a `--temp_location` in object storage, for a streaming job's checkpoints (None:
    /// only a local one is checkpointed to).
    pub object_storage: Option<checkpoint::ObjectStorage>,
}

/// How a run that did not fail ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Ended {
    /// Every stage ran to its end (a streaming job's sources ended).
    Done,
    /// A streaming job was drained: its sources stopped where they were, and what they had
    /// read went through, every window fired.
    Drained,
    /// A streaming job stopped between two rounds (`RunSettings::stop`), with its state then.
    Stopped(Box<checkpoint::Checkpoint>),
}

fn impulse() -> Bytes {
    let mut out = Vec::with_capacity(14);
    // One empty byte string (a zero length).
    in_the_global_window(&mut out, &[0]);
    Bytes::from(out)
}

struct Run<'a> {
    plan: &'a Plan,
    server: &'a FnServer,
    settings: &'a RunSettings,
    cancel: watch::Receiver<bool>,
    data: HashMap<String, Vec<Block>>,
    spill: Arc<Spill>,
    harnesses: HashMap<String, Vec<Harnesses>>,
    live: Arc<Live>,
    restarts: usize,
    /// Worker pools that could not start harnesses, and when: not asked again for
    /// [`POOL_BACKOFF`] (each ask of a pool that is gone costs [`REPLACEMENT_WAIT`]).
    failed_pools: HashMap<String, std::time::Instant>,
    /// A streaming run's side inputs, kept from round to round (`data` holds one round's).
    kept_sides: Option<HashMap<String, Vec<Block>>>,
    /// A streaming run's side inputs of bounded PCollections, by stage, indexed once.
    side_stores: HashMap<usize, Arc<SideInputStore>>,
    /// Each SDK stage's data ports, once its descriptor is registered.
    ports: HashMap<usize, Arc<descriptor::Ports>>,
}

/// Runs `plan` to its end; `say` receives progress lines for the job's message stream, and
/// `live` the bundles' metrics as they run and finish.
pub async fn run(
    plan: &Plan,
    server: &FnServer,
    settings: &RunSettings,
    cancel: watch::Receiver<bool>,
    say: &(dyn Fn(String) + Send + Sync),
    live: Arc<Live>,
) -> Result<Ended, PortableError> {
    let mut run = Run {
        plan,
        server,
        settings,
        cancel,
        data: HashMap::new(),
        spill: Arc::new(Spill::new(settings.memory_budget)),
        harnesses: HashMap::new(),
        live,
        restarts: 0,
        failed_pools: HashMap::new(),
        kept_sides: None,
        side_stores: HashMap::new(),
        ports: HashMap::new(),
    };
    let result = match plan.streaming {
        true => run.rounds(say).await,
        false => run.stages(say).await.map(|()| Ended::Done),
    };
    let spilled = run.spill.spilled();
    if spilled > 0 {
        say(format!(
            "spilled {} MiB of materialized data to disk (memory budget {} MiB)",
            spilled.div_ceil(1 << 20),
            settings.memory_budget >> 20
        ));
    }
    // At once: asking a pool whose pod is gone takes a few seconds.
    let stops = run
        .harnesses
        .drain()
        .flat_map(|(_, hs)| hs)
        .map(|h| h.stop());
    futures::future::join_all(stops).await;
    result
}

impl Run<'_> {
    async fn stages(&mut self, say: &(dyn Fn(String) + Send + Sync)) -> Result<(), PortableError> {
        let last_use = self.last_use();
        for (i, stage) in self.plan.stages.iter().enumerate() {
            if *self.cancel.borrow() {
                return Err(PortableError::Cancelled);
            }
            let started = std::time::Instant::now();
            let mut counts = String::new();
            match &stage.kind {
                StageKind::Impulse { output } => self.impulse(output)?,
                StageKind::Concat { inputs, output, .. } => self.concat(inputs, output),
                StageKind::GroupByKey {
                    transform,
                    input,
                    output,
                } => {
                    let blocks = self.data.get(input).cloned().unwrap_or_default();
                    let shape = self.plan.materialized[input].shape.clone();
                    let pcoll = &self.plan.components.pcollections[input];
                    let strategy = self.plan.components.windowing_strategies
                        [&pcoll.windowing_strategy_id]
                        .clone();
                    let name = self.plan.name_of(transform);
                    let sdk_merge = self.sdk_merge(i, &strategy, &name).await?;
                    let spill = self.spill.clone();
                    let grouped = tokio::task::spawn_blocking(move || {
                        let sdk_merge = sdk_merge.as_ref();
                        group::group_by_key_in(&spill, &blocks, &shape, &strategy, &name, sdk_merge)
                    })
                    .await
                    .map_err(|e| PortableError::Harness(format!("grouping task: {e}")))??;
                    self.data.insert(output.clone(), grouped);
                }
                StageKind::Sdk(s) => {
                    let before = self.live.committed();
                    self.sdk_stage(i, &stage.name, s, say, None).await?;
                    let after = self.live.committed();
                    let count = |ps: &[String]| {
                        after.elements_of(ps).saturating_sub(before.elements_of(ps))
                    };
                    counts = format!(
                        ": {} in, {} out",
                        elements(count(&s.inputs)),
                        elements(count(&s.outputs))
                    );
                }
            }
            tracing::debug!(stage = %stage.name, elapsed = ?started.elapsed(), "stage done");
            self.live.stage_done();
            say(format!(
                "stage {i} ({}) done in {:.1} s{counts}",
                stage.name,
                started.elapsed().as_secs_f64()
            ));
            let spill = &self.spill;
            self.data.retain(|p, blocks| {
                let read_later = last_use.get(p).is_some_and(|&last| last > i);
                if !read_later {
                    spill.release(blocks);
                }
                read_later
            });
        }
        Ok(())
    }

    /// Stage `index`'s side inputs, served from memory, whole. A streaming run builds those of
    /// bounded PCollections once (complete in the first round) and keeps them for every round.
    fn side_inputs(
        &mut self,
        index: usize,
        stage: &SdkStage,
    ) -> Result<Option<Arc<SideInputStore>>, PortableError> {
        if stage.side_inputs.is_empty() {
            return Ok(None);
        }
        if let Some(store) = self.side_stores.get(&index) {
            return Ok(Some(store.clone()));
        }
        let mut store = SideInputStore::default();
        let mut ends = true;
        for side in &stage.side_inputs {
            let shape = &self.plan.materialized[&side.pcollection].shape;
            let kept = self.kept_sides.as_ref().unwrap_or(&self.data);
            let blocks = self.spill.load_all(
                kept.get(&side.pcollection)
                    .map(Vec::as_slice)
                    .unwrap_or(&[]),
            )?;
            store.add(
                &side.transform,
                &side.tag,
                shape,
                &blocks,
                side.access == urns::MULTIMAP_SIDE_INPUT,
            )?;
            ends &= !crate::plan::is_unbounded(&self.plan.components, &side.pcollection);
        }
        let store = Arc::new(store);
        if self.kept_sides.is_some() && ends {
            self.side_stores.insert(index, store.clone());
        }
        Ok(Some(store))
    }

    /// Impulse: the one empty element in the global window, as `output`.
    fn impulse(&mut self, output: &str) -> Result<(), PortableError> {
        let block = self.spill.keep(impulse())?;
        self.data.insert(output.to_string(), vec![block]);
        Ok(())
    }

    /// Flatten or Reshuffle: `inputs`' blocks, one after the other, as `output`.
    fn concat(&mut self, inputs: &[String], output: &str) {
        let blocks: Vec<Block> = inputs
            .iter()
            .flat_map(|p| self.data.get(p).cloned().unwrap_or_default())
            .collect();
        self.data.insert(output.to_string(), blocks);
    }

    /// For a GroupByKey (stage `index`) whose windows merge by a WindowFn other than
    /// sessions: the way to ask its environment's harnesses to merge them.
    async fn sdk_merge(
        &mut self,
        index: usize,
        strategy: &crate::runner_api::WindowingStrategy,
        transform: &str,
    ) -> Result<Option<merge_windows::SdkMerge>, PortableError> {
        if !crate::plan::merges_on_sdk(strategy) {
            return Ok(None);
        }
        let harnesses = self.workers_for(&strategy.environment_id).await?;
        let id = format!("{}-stage-{index}-merge-windows", self.settings.job_id);
        merge_windows::SdkMerge::new(
            self.server.workers.clone(),
            &self.server.url,
            &self.plan.components,
            strategy,
            &id,
            harnesses,
            transform,
        )
        .map(Some)
    }

    /// The last stage that reads each PCollection, so its blocks can be freed after.
    fn last_use(&self) -> HashMap<String, usize> {
        let mut last = HashMap::new();
        for (i, stage) in self.plan.stages.iter().enumerate() {
            let mut reads = stage.kind.inputs();
            if let StageKind::Sdk(s) = &stage.kind {
                reads.extend(s.side_inputs.iter().map(|x| &x.pcollection));
            }
            for p in reads {
                last.insert(p.clone(), i);
            }
        }
        last
    }

    /// The live harnesses of `environment`, first starting as many as it lacks (all of them
    /// the first time; after a harness died, its replacement). A DOCKER environment's are
    /// spread over the worker pools, each pool topped up to its share.
    async fn workers_for(&mut self, environment: &str) -> Result<Vec<String>, PortableError> {
        let per_place = self.per_place();
        let env = self
            .plan
            .components
            .environments
            .get(environment)
            .ok_or_else(|| PortableError::Malformed(format!("no environment '{environment}'")))?
            .clone();
        // The first start waits for the pools' pods; later ones (replacements) do not wait
        // long for a pool that is gone, while the others go on.
        let wait = match self.harnesses.contains_key(environment) {
            false => self.settings.pool_wait,
            true => REPLACEMENT_WAIT,
        };
        let pool_urls = self.settings.worker_pools.borrow().clone();
        let pools: Vec<Option<environment::Pool>> =
            if env.urn == urns::ENV_DOCKER && !pool_urls.is_empty() {
                pool_urls
                    .iter()
                    .map(|url| Some(environment::Pool { url, wait }))
                    .collect()
            } else {
                vec![None]
            };
        let is_alive = |id: &String| self.server.workers.get(id).is_some_and(|w| w.is_alive());
        // A pool that failed lately is left alone, unless no harness is left at all.
        let any_alive = self
            .harnesses
            .get(environment)
            .into_iter()
            .flatten()
            .flat_map(|h| h.ids.iter())
            .any(is_alive);
        // Each place's live harnesses, and how many it lacks.
        let mut lacking = Vec::new();
        for pool in pools {
            let here = self
                .harnesses
                .get(environment)
                .into_iter()
                .flatten()
                .filter(|h| pool.is_none_or(|p| h.pool() == Some(p.url)))
                .flat_map(|h| h.ids.iter())
                .filter(|id| is_alive(id))
                .count();
            let resting = any_alive
                && pool.is_some_and(|p| {
                    self.failed_pools
                        .get(p.url)
                        .is_some_and(|at| at.elapsed() < POOL_BACKOFF)
                });
            if here < per_place && !resting {
                let job = format!("{}-{}", self.settings.job_id, self.restarts);
                self.restarts += 1;
                lacking.push((job, pool, per_place - here));
            }
        }
        // Started in every pool at once: each waits for its pod and its harnesses' imports.
        // Once some place has harnesses, the others get START_GRACE more: a pod that is slow
        // (or gone: its harness never dials back) does not hold the job; it is left alone
        // for a while, as a failed one is.
        let (server, options, env) = (self.server, &self.settings.pipeline_options, &env);
        let mut starts: futures::stream::FuturesUnordered<_> = lacking
            .iter()
            .enumerate()
            .map(|(n, (job, pool, count))| async move {
                let started =
                    environment::start(server, job, environment, env, options, *count, *pool).await;
                (n, started)
            })
            .collect();
        let mut results: Vec<Option<Result<Harnesses, PortableError>>> =
            (0..lacking.len()).map(|_| None).collect();
        let mut deadline = any_alive.then(|| tokio::time::Instant::now() + START_GRACE);
        loop {
            use futures::StreamExt;
            let next = match deadline {
                Some(at) => tokio::time::timeout_at(at, starts.next())
                    .await
                    .ok()
                    .flatten(),
                None => starts.next().await,
            };
            let Some((n, started)) = next else { break };
            if started.is_ok() && deadline.is_none() {
                deadline = Some(tokio::time::Instant::now() + START_GRACE);
            }
            results[n] = Some(started);
        }
        drop(starts);
        let mut failed = vec![];
        for (started, (_, pool, _)) in results.into_iter().zip(&lacking) {
            let place = pool.map_or("its own place".to_string(), |p| format!("pool {}", p.url));
            let started = started.unwrap_or_else(|| {
                Err(PortableError::Harness(format!(
                    "not ready {START_GRACE:?} after the others"
                )))
            });
            match started {
                Ok(harnesses) => {
                    tracing::info!(
                        "started {} SDK harnesses of environment {environment} in {place}",
                        harnesses.ids.len()
                    );
                    self.live.started_in(
                        harnesses.pool().unwrap_or(LOCAL_PLACE),
                        self.harness_workers(&harnesses),
                    );
                    self.harnesses
                        .entry(environment.to_string())
                        .or_default()
                        .push(harnesses);
                }
                Err(e) => {
                    if let Some(p) = pool {
                        self.failed_pools
                            .insert(p.url.to_string(), std::time::Instant::now());
                    }
                    failed.push((place, e))
                }
            }
        }
        let alive: Vec<String> = self
            .harnesses
            .get(environment)
            .into_iter()
            .flatten()
            .flat_map(|h| h.ids.iter())
            .filter(|id| self.server.workers.get(id).is_some_and(|w| w.is_alive()))
            .cloned()
            .collect();
        // Without any harness the job cannot go on; with some, it goes on without the places
        // that failed (a pod gone or restarting), which are asked again next time.
        if alive.is_empty() {
            return Err(match failed.is_empty() {
                false => failed.swap_remove(0).1,
                true => PortableError::Harness(format!(
                    "no SDK harness of environment '{environment}' is left"
                )),
            });
        }
        for (place, e) in failed {
            tracing::warn!(
                "going on with {} SDK harnesses without {place}: {e}",
                alive.len()
            );
        }
        Ok(alive)
    }

    /// The bytes and elements of `inputs` (a stage's): elements counted in the blocks held in
    /// memory, and those on disk taken to hold as many per byte (64 bytes each when none is in
    /// memory: a guess, which only scales the autoscaler's figures, not their ratio).
    fn input_size(&self, inputs: &[String]) -> (u64, u64) {
        let (mut bytes, mut counted_bytes, mut counted) = (0u64, 0u64, 0u64);
        for p in inputs {
            let shape = &self.plan.materialized[p].shape;
            for block in self.data.get(p).into_iter().flatten() {
                bytes += block.len() as u64;
                if let Block::Memory(b) = block
                    && let Ok(elements) = shape.split(b)
                {
                    counted_bytes += b.len() as u64;
                    counted += elements.len() as u64;
                }
            }
        }
        let elements = match counted_bytes {
            0 => bytes.div_ceil(64).max(1),
            _ => (counted as f64 * bytes as f64 / counted_bytes as f64).round() as u64,
        };
        (bytes, elements)
    }

    /// Harnesses per place: the pipeline's `--sdk_worker_parallelism`, else the settings'.
    fn per_place(&self) -> usize {
        parallelism(&self.settings.pipeline_options)
            .unwrap_or(self.settings.sdk_workers)
            .max(1)
    }

    fn harness_workers(&self, harnesses: &Harnesses) -> Vec<Arc<crate::fnapi::Worker>> {
        harnesses
            .ids
            .iter()
            .filter_map(|id| self.server.workers.get(id))
            .collect()
    }

    /// Starts this job's share of harnesses of `environment` (`env`) in the worker pool `url`,
    /// added while a stage runs (the `n`th such start of the stage).
    fn start_in_added_pool<'s>(
        &'s self,
        environment: &'s str,
        env: &'s crate::runner_api::Environment,
        url: String,
        n: usize,
    ) -> impl std::future::Future<Output = (String, Result<Harnesses, PortableError>)> + 's {
        let job = format!("{}-joined-{n}", self.settings.job_id);
        let (wait, count) = (self.settings.pool_wait, self.per_place());
        async move {
            let pool = environment::Pool { url: &url, wait };
            let options = &self.settings.pipeline_options;
            let started = environment::start(
                self.server,
                &job,
                environment,
                env,
                options,
                count,
                Some(pool),
            )
            .await;
            (url, started)
        }
    }

    /// Worker pools of the job's list that `environment` (a DOCKER one) has no harness in,
    /// leaving out `busy` (being started, or started during this round).
    fn pools_without_harnesses(&self, environment: &str, busy: &[String]) -> Vec<String> {
        let docker = self
            .plan
            .components
            .environments
            .get(environment)
            .is_some_and(|e| e.urn == urns::ENV_DOCKER);
        if !docker {
            return Vec::new();
        }
        let is_alive = |id: &String| self.server.workers.get(id).is_some_and(|w| w.is_alive());
        let served: Vec<&str> = self
            .harnesses
            .get(environment)
            .into_iter()
            .flatten()
            .filter(|h| h.ids.iter().any(is_alive))
            .filter_map(|h| h.pool())
            .collect();
        self.settings
            .worker_pools
            .borrow()
            .iter()
            .filter(|url| !served.contains(&url.as_str()) && !busy.contains(url))
            .cloned()
            .collect()
    }

    /// Runs an SDK stage's bundles on its inputs' blocks; residuals its bundles hand back are
    /// run in the same stage. In a streaming round (`round`), also the residuals due again,
    /// and those an unbounded source hands back are returned to wait for their delay.
    async fn sdk_stage(
        &mut self,
        index: usize,
        name: &str,
        stage: &SdkStage,
        say: &(dyn Fn(String) + Send + Sync),
        round: Option<streaming::StageRound>,
    ) -> Result<Vec<crate::fn_api::DelayedBundleApplication>, PortableError> {
        let streaming::StageRound {
            resume,
            hold,
            keyed: rounds,
        } = round.unwrap_or_default();
        let descriptor_id = format!("{}-stage-{index}", self.settings.job_id);
        // Built and registered once: a streaming run comes back to the stage every round.
        let ports = match self.ports.get(&index) {
            Some(ports) => ports.clone(),
            None => {
                let (descriptor, ports) =
                    descriptor::build(self.plan, stage, &descriptor_id, &self.server.url);
                self.server.workers.register_descriptor(descriptor);
                let ports = Arc::new(ports);
                self.ports.insert(index, ports.clone());
                ports
            }
        };

        let store = self.side_inputs(index, stage)?;

        let mut workers = self.workers_for(&stage.environment).await?;
        let mut transient: Vec<Block> = Vec::new();
        let inputs: Vec<(bundles::Bundle, Option<usize>)> = match stage.inputs.as_slice() {
            [only] if rounds.is_some() => {
                // A streaming round: a bundle per bucket of keys with elements or timers due.
                let rounds = rounds.as_ref().expect("matched");
                let blocks = self.data.get(only).map(Vec::as_slice).unwrap_or(&[]);
                let shape = &self.plan.materialized[only].shape;
                let not_kv = || {
                    PortableError::unsupported(
                        name,
                        "a stateful DoFn needs windowed key-value pairs as its input",
                    )
                };
                let cut = group::by_key_into(&self.spill, blocks, shape, keyed::BUCKETS, not_kv)?;
                transient.extend(cut.iter().flatten().cloned());
                let due = rounds.due();
                cut.into_iter()
                    .enumerate()
                    .filter(|(b, blocks)| !blocks.is_empty() || due[*b])
                    .map(|(b, blocks)| (vec![(ports.inputs[only].clone(), blocks)], Some(b)))
                    .collect()
            }
            [only] if stage.keyed.is_some() => {
                let blocks = self.data.get(only).map(Vec::as_slice).unwrap_or(&[]);
                let shape = &self.plan.materialized[only].shape;
                let buckets = workers.len() * 4;
                let cut = bundles::by_key(&self.spill, blocks, shape, buckets, name)?;
                // Given back once the stage is done with them.
                transient.extend(cut.iter().flatten().cloned());
                let mut keyed: Vec<bundles::Bundle> = cut
                    .into_iter()
                    .map(|b| vec![(ports.inputs[only].clone(), b)])
                    .collect();
                if keyed.is_empty() {
                    keyed.push(vec![(ports.inputs[only].clone(), Vec::new())]);
                }
                keyed.into_iter().map(|b| (b, None)).collect()
            }
            [only] => {
                let blocks = self.data.get(only).map(Vec::as_slice).unwrap_or(&[]);
                let shape = &self.plan.materialized[only].shape;
                bundles::cut(blocks, shape, workers.len(), self.spill.budget())?
                    .into_iter()
                    .map(|b| (vec![(ports.inputs[only].clone(), b)], None))
                    .collect()
            }
            many => vec![(
                many.iter()
                    .map(|p| {
                        (
                            ports.inputs[p].clone(),
                            self.data.get(p).cloned().unwrap_or_default(),
                        )
                    })
                    .collect(),
                None,
            )],
        };
        let sinks: Vec<String> = ports.outputs.values().cloned().collect();
        let shape = match stage.inputs.as_slice() {
            [only] => Some(self.plan.materialized[only].shape.clone()),
            _ => None,
        };
        let mut inputs = inputs;
        if hold {
            // A streaming source's round: no bundle for an input that brought nothing.
            // (A stateful stage's bucket may come for its timers alone.)
            inputs.retain(|(b, bucket)| {
                bucket.is_some() || b.iter().any(|(_, blocks)| !blocks.is_empty())
            });
        }
        let mut work = bundles::Work::new(
            inputs,
            &self.plan.components,
            &stage.transforms,
            &ports.inputs,
            shape,
            stage.keyed.clone(),
            rounds,
        );
        let mut splits = 0;
        let stage_name = name.to_string();
        for residual in resume {
            work.push_residual(residual, &stage_name)?;
        }
        let mut held = Vec::new();
        let started = std::time::Instant::now();
        let read_before = self.live.committed().elements_of(&stage.inputs);
        let (input_bytes, input_elements) = self.input_size(&stage.inputs);
        self.live.stage_started(progress::StageInput {
            pcollections: stage.inputs.clone(),
            bytes: input_bytes,
            elements: input_elements,
            read_before,
            bundles: Box::new(work.bundles_view()),
        });
        let _ended = StageEnded(self.live.clone());
        let mut pools = self.settings.worker_pools.clone();
        let env = self
            .plan
            .components
            .environments
            .get(&stage.environment)
            .cloned()
            .unwrap_or_default();
        let mut joins = 0usize;
        loop {
            // Harnesses started in pools added while the round runs: they join it, and are
            // the job's once it ends.
            let mut joined: Vec<Harnesses> = Vec::new();
            // The round's future is dropped before `work` and `workers` are touched again.
            let round = {
                let every = self.settings.progress_every;
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                let (join_tx, mut join_rx) = tokio::sync::mpsc::unbounded_channel();
                let mut starting = futures::stream::FuturesUnordered::new();
                let mut busy: Vec<String> = Vec::new();
                pools.mark_unchanged();
                let running = work.run(
                    self.server.workers.clone(),
                    &workers,
                    &mut join_rx,
                    &descriptor_id,
                    &sinks,
                    store.clone(),
                    &self.cancel,
                    &self.live,
                    &self.spill,
                );
                tokio::pin!(running);
                loop {
                    use futures::StreamExt;
                    tokio::select! {
                        round = &mut running => break round,
                        Ok(()) = pools.changed() => {
                            for url in self.pools_without_harnesses(&stage.environment, &busy) {
                                busy.push(url.clone());
                                joins += 1;
                                starting.push(self.start_in_added_pool(&stage.environment, &env, url, joins));
                            }
                        }
                        Some((url, started)) = starting.next(), if !starting.is_empty() => match started {
                            Ok(harnesses) => {
                                tracing::info!(stage = %stage_name, "{} SDK harnesses started in the added pool {url} join the stage", harnesses.ids.len());
                                self.live.started_in(&url, self.harness_workers(&harnesses));
                                for id in &harnesses.ids {
                                    let _ = join_tx.send(id.clone());
                                }
                                joined.push(harnesses);
                            }
                            Err(e) => {
                                tracing::warn!(stage = %stage_name, "the added pool {url} started no harness: {e}");
                                busy.retain(|b| *b != url);
                            }
                        },
                        _ = tick.tick() => {
                            // The bundles' own tasks go on while the harnesses answer.
                            self.live.poll(&self.server.workers).await;
                            let read = self.live.attempted().elements_of(&stage.inputs).saturating_sub(read_before);
                            say(format!(
                                "stage {index} ({stage_name}): {} in after {:.0} s, {} bundles running",
                                elements(read),
                                started.elapsed().as_secs_f64(),
                                self.live.running()
                            ));
                        }
                    }
                }
            };
            self.harnesses
                .entry(stage.environment.clone())
                .or_default()
                .extend(joined);
            splits += round.splits;
            if let Some(message) = round.fatal {
                return Err(PortableError::Bundle {
                    stage: stage_name,
                    attempts: ATTEMPTS,
                    message,
                });
            }
            for output in round.outputs {
                for (sink, blocks) in output.outputs {
                    if let Some((p, _)) = ports.outputs.iter().find(|(_, t)| **t == sink) {
                        self.data.entry(p.clone()).or_default().extend(blocks);
                    }
                }
                for residual in output.residuals {
                    match hold {
                        true => held.push(residual),
                        false => work.push_residual(residual, &stage_name)?,
                    }
                }
            }
            if work.is_done() {
                if splits > 0 {
                    say(format!(
                        "stage {index} ({stage_name}): {splits} running bundles split for idle harnesses"
                    ));
                }
                self.spill.release(&transient);
                return Ok(held);
            }
            if *self.cancel.borrow() {
                return Err(PortableError::Cancelled);
            }
            // Bundles are left: residuals the harnesses handed back, or bundles of harnesses that
            // died (replaced here) to run again.
            tracing::debug!(stage = %stage_name, "bundles left; another round");
            workers = self.workers_for(&stage.environment).await?;
        }
    }
}

/// The place of harnesses started without a worker pool (PROCESS, EXTERNAL): this machine.
const LOCAL_PLACE: &str = "local";

/// Tells [`Live`] that the SDK stage ended, however it ended.
struct StageEnded(Arc<Live>);

impl Drop for StageEnded {
    fn drop(&mut self) {
        self.0.stage_ended();
    }
}

/// `1 element`, `1,234 elements`.
fn elements(n: u64) -> String {
    let s = if n == 1 { "" } else { "s" };
    format!("{} element{s}", thousands(n))
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `--sdk_worker_parallelism` from the pipeline's options, when the user set it.
fn parallelism(options: &prost_types::Struct) -> Option<usize> {
    use prost_types::value::Kind;
    match crate::options::value(options, "sdk_worker_parallelism")? {
        Kind::NumberValue(n) if *n >= 1.0 => Some(*n as usize),
        Kind::StringValue(s) => s.parse().ok().filter(|n| *n >= 1),
        _ => None,
    }
}
