//! From a Beam pipeline proto to stages: combiners the SDK left whole are lifted ([`lift`]),
//! the leaf transforms are validated ([`leaves`]),
//! splittable DoFns expanded ([`sdf`]) and greedily fused ([`fuse`]) as Beam's portable runners
//! do: never across a GroupByKey or a side input's producer, and every PCollection that crosses
//! a stage boundary is materialized under a coder the runner can walk.
mod display;
mod fuse;
mod leaves;
mod lift;
mod sdf;
mod unbounded;
pub(crate) use unbounded::{fixed_windows, triggering_of};

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::coders::{self, Shape};
use crate::error::PortableError;
use crate::runner_api::{Components, Pipeline};
use crate::urns;

/// A pipeline ready to run: its (rewritten) components and its stages in execution order.
#[derive(Debug, Clone)]
pub struct Plan {
    pub components: Components,
    pub stages: Vec<Stage>,
    /// Every PCollection that crosses a stage boundary: how its elements are encoded there.
    pub materialized: BTreeMap<String, Materialized>,
    /// An unbounded PCollection: the job runs as a streaming job, in rounds
    /// (`execute::streaming`), until its sources end or it is drained or cancelled.
    pub streaming: bool,
}

#[derive(Debug, Clone)]
pub struct Materialized {
    /// `windowed_value(element coder, window coder)`, with unknown coders length-prefixed.
    pub wire_coder: String,
    pub shape: Shape,
}

#[derive(Debug, Clone)]
pub struct Stage {
    pub name: String,
    pub kind: StageKind,
}

#[derive(Debug, Clone)]
pub enum StageKind {
    /// The one empty element in the global window that starts every root.
    Impulse { output: String },
    GroupByKey {
        transform: String,
        input: String,
        output: String,
    },
    /// Flatten, and Reshuffle: the runner concatenates its inputs (their coders agree).
    Concat {
        transform: String,
        inputs: Vec<String>,
        output: String,
    },
    /// Fused transforms run as bundles on an SDK harness.
    Sdk(SdkStage),
}

impl StageKind {
    /// The PCollections the stage reads as its main input (not its side inputs).
    pub fn inputs(&self) -> Vec<&String> {
        match self {
            StageKind::Impulse { .. } => vec![],
            StageKind::GroupByKey { input, .. } => vec![input],
            StageKind::Concat { inputs, .. } => inputs.iter().collect(),
            StageKind::Sdk(s) => s.inputs.iter().collect(),
        }
    }

    /// The PCollections the stage writes.
    pub fn outputs(&self) -> Vec<&String> {
        match self {
            StageKind::Impulse { output }
            | StageKind::GroupByKey { output, .. }
            | StageKind::Concat { output, .. } => vec![output],
            StageKind::Sdk(s) => s.outputs.iter().collect(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct SdkStage {
    pub environment: String,
    /// Transform ids in the order they were fused.
    pub transforms: Vec<String>,
    /// Materialized PCollections read over the data plane; one input may be split in bundles.
    pub inputs: Vec<String>,
    pub side_inputs: Vec<SideInput>,
    /// Materialized PCollections written over the data plane.
    pub outputs: Vec<String>,
    /// Set when the stage starts with a stateful DoFn: its input is cut into bundles by key,
    /// and its state and timers live for the bundle (a streaming run keeps them from round to
    /// round).
    pub keyed: Option<Keyed>,
}

/// A stateful DoFn's timer families: (transform id, family id) with their timers' shape, and
/// those of them in processing time; and its bag-backed states whose elements the runner can
/// walk: (transform id, state id, element shape), so their reads are paged between elements.
#[derive(Debug, Clone, Default)]
pub struct Keyed {
    pub timer_families: Vec<(String, String, Shape)>,
    pub processing_time: Vec<(String, String)>,
    pub bags: Vec<(String, String, Shape)>,
}

/// A side input as the SDK asks for it over the State API: the consuming transform, its local
/// tag, and the PCollection behind it.
#[derive(Debug, Clone)]
pub struct SideInput {
    pub transform: String,
    pub tag: String,
    pub pcollection: String,
    pub access: String,
}

impl Plan {
    /// Plans `pipeline`, or says which transform Riverbank cannot run and why.
    pub fn new(pipeline: &Pipeline) -> Result<Plan, PortableError> {
        let mut components = pipeline.components.clone().unwrap_or_default();
        lift::combiners(&mut components)?;
        let leaves = leaves::collect(&components, &pipeline.root_transform_ids)?;
        let leaves = sdf::expand(&mut components, leaves)?;
        let leaves = leaves::topological(&components, leaves)?;
        let (stages, boundary) = fuse::fuse(&components, &leaves)?;
        let mut materialized = BTreeMap::new();
        for pcoll in boundary {
            let wire = wire_coder(&mut components, &pcoll)?;
            materialized.insert(pcoll, wire);
        }
        let mut stages = stages;
        for stage in &mut stages {
            if let StageKind::Sdk(s) = &mut stage.kind
                && let Some(keyed) = &mut s.keyed
            {
                (keyed.timer_families, keyed.processing_time) =
                    timer_families(&mut components, &s.transforms[0])?;
                keyed.bags = bag_shapes(&components, &s.transforms[0])?;
            }
        }
        let streaming = unbounded::is_streaming(&components);
        let mut plan = Plan {
            components,
            stages,
            materialized,
            streaming,
        };
        plan.check_concats();
        if plan.streaming {
            unbounded::check(&plan)?;
        }
        Ok(plan)
    }

    /// The plan of `pipeline` as submitted with `options`: a streaming job when it reads an
    /// unbounded PCollection or sets `--streaming`.
    pub fn with_options(
        pipeline: &Pipeline,
        options: &prost_types::Struct,
    ) -> Result<Plan, PortableError> {
        let mut plan = Plan::new(pipeline)?;
        if crate::options::flag(options, "streaming") && !plan.streaming {
            plan.stream()?;
        }
        Ok(plan)
    }

    /// Runs the pipeline as a streaming job though all its PCollections are bounded (the
    /// pipeline's `--streaming` option), as Dataflow and Flink do; or says what a streaming
    /// run refuses.
    pub fn stream(&mut self) -> Result<(), PortableError> {
        self.streaming = true;
        unbounded::check(self)
    }

    /// Transform `id`'s name as the user wrote it.
    pub fn name_of(&self, id: &str) -> String {
        self.components
            .transforms
            .get(id)
            .map(|t| t.unique_name.clone())
            .unwrap_or_else(|| id.to_string())
    }

    /// A runner-side Flatten or Reshuffle concatenates bytes: only right when every input is
    /// encoded as its output is. Otherwise it runs on the SDK harness, which re-encodes.
    fn check_concats(&mut self) {
        for stage in &mut self.stages {
            let StageKind::Concat {
                transform,
                inputs,
                output,
            } = &stage.kind
            else {
                continue;
            };
            let out = coder_key(&self.components, &self.materialized[output].wire_coder);
            let same = inputs
                .iter()
                .all(|i| coder_key(&self.components, &self.materialized[i].wire_coder) == out);
            if same {
                continue;
            }
            let env = self
                .components
                .environments
                .keys()
                .min()
                .cloned()
                .unwrap_or_default();
            let mut inputs = inputs.clone();
            inputs.sort();
            inputs.dedup();
            stage.kind = StageKind::Sdk(SdkStage {
                environment: env,
                transforms: vec![transform.clone()],
                inputs,
                side_inputs: Vec::new(),
                outputs: vec![output.clone()],
                keyed: None,
            });
        }
    }
}

/// Rewrites `pcoll`'s coder for the runner (unknown coders length-prefixed) and returns the
/// windowed-value coder its elements travel in.
fn wire_coder(components: &mut Components, pcoll: &str) -> Result<Materialized, PortableError> {
    let p = components
        .pcollections
        .get(pcoll)
        .cloned()
        .ok_or_else(|| PortableError::Malformed(format!("no PCollection '{pcoll}'")))?;
    let element = coders::length_prefix_unknown(components, &p.coder_id)?;
    let window_coder = components
        .windowing_strategies
        .get(&p.windowing_strategy_id)
        .map(|w| w.window_coder_id.clone())
        .ok_or_else(|| {
            PortableError::Malformed(format!("PCollection '{pcoll}' has no windowing strategy"))
        })?;
    let window_coder = coders::length_prefix_unknown(components, &window_coder)?;
    if let Some(p) = components.pcollections.get_mut(pcoll) {
        p.coder_id = element.clone();
    }
    let wire = coders::add_coder(
        components,
        &format!("{pcoll}_wire"),
        urns::WINDOWED_VALUE,
        vec![element, window_coder],
    );
    let shape = Shape::of(&components.coders, &wire)?;
    Ok(Materialized {
        wire_coder: wire,
        shape,
    })
}

/// Rewrites stateful transform `id`'s timer family coders so the runner can read the timers
/// (unknown key coders length-prefixed), and returns its families with their shapes, and
/// those in processing time.
#[allow(clippy::type_complexity)]
fn timer_families(
    components: &mut Components,
    id: &str,
) -> Result<(Vec<(String, String, Shape)>, Vec<(String, String)>), PortableError> {
    use crate::runner_api::time_domain;
    use prost::Message;
    let mut payload = leaves::par_do_payload(&components.transforms[id])?;
    let mut out = Vec::new();
    let mut processing = Vec::new();
    let mut families: Vec<String> = payload.timer_family_specs.keys().cloned().collect();
    families.sort();
    for family in families {
        let spec = payload.timer_family_specs.get_mut(&family).expect("listed");
        spec.timer_family_coder_id =
            coders::length_prefix_unknown(components, &spec.timer_family_coder_id)?;
        let shape = Shape::of(&components.coders, &spec.timer_family_coder_id)?;
        if spec.time_domain == time_domain::Enum::ProcessingTime as i32 {
            processing.push((id.to_string(), family.clone()));
        }
        out.push((id.to_string(), family, shape));
    }
    if let Some(t) = components.transforms.get_mut(id)
        && let Some(spec) = t.spec.as_mut()
    {
        spec.payload = payload.encode_to_vec();
    }
    Ok((out, processing))
}

/// The bag-backed states (bags, values, combining values) of stateful transform `id` whose
/// element coder the runner can walk. Their coders are not rewritten: an SDK encodes state with
/// its DoFn's own coder, not the pipeline's, so the runner only reads what it can parse.
fn bag_shapes(
    components: &Components,
    id: &str,
) -> Result<Vec<(String, String, Shape)>, PortableError> {
    use crate::runner_api::state_spec::Spec;
    let payload = leaves::par_do_payload(&components.transforms[id])?;
    let mut out = Vec::new();
    for (state, spec) in &payload.state_specs {
        let coder = match &spec.spec {
            Some(Spec::BagSpec(b)) => &b.element_coder_id,
            Some(Spec::ReadModifyWriteSpec(v)) => &v.coder_id,
            Some(Spec::CombiningSpec(c)) => &c.accumulator_coder_id,
            _ => continue,
        };
        if let Ok(shape) = Shape::of(&components.coders, coder) {
            out.push((id.to_string(), state.clone(), shape));
        }
    }
    Ok(out)
}

/// A coder's structure as text, to compare coders under different ids.
/// Whether `strategy`'s windows merge by a WindowFn the runner does not merge itself (any but
/// sessions), so that its GroupByKeys ask the SDK to merge them.
/// Whether `pcollection` is unbounded (the SDK marks an unbounded splittable DoFn's output
/// and everything downstream).
pub(crate) fn is_unbounded(components: &Components, pcollection: &str) -> bool {
    components
        .pcollections
        .get(pcollection)
        .is_some_and(|p| p.is_bounded == crate::runner_api::is_bounded::Enum::Unbounded as i32)
}

/// The windowing strategy of `pcollection`.
pub(crate) fn strategy_of<'c>(
    components: &'c Components,
    pcollection: &str,
) -> Option<&'c crate::runner_api::WindowingStrategy> {
    let id = &components
        .pcollections
        .get(pcollection)?
        .windowing_strategy_id;
    components.windowing_strategies.get(id)
}

pub(crate) fn merges_on_sdk(strategy: &crate::runner_api::WindowingStrategy) -> bool {
    let sessions = strategy
        .window_fn
        .as_ref()
        .is_some_and(|f| f.urn == urns::SESSION_WINDOWS);
    !sessions && strategy.merge_status == crate::runner_api::merge_status::Enum::NeedsMerge as i32
}

pub(crate) fn coder_key(components: &Components, id: &str) -> String {
    match components.coders.get(id) {
        None => id.to_string(),
        Some(c) => {
            let spec = c
                .spec
                .as_ref()
                .map(|s| format!("{}:{:?}", s.urn, s.payload))
                .unwrap_or_default();
            let parts: Vec<String> = c
                .component_coder_ids
                .iter()
                .map(|p| coder_key(components, p))
                .collect();
            format!("{spec}({})", parts.join(","))
        }
    }
}

impl fmt::Display for Plan {
    /// The stages as `riverbank plan` shows a YAML plan: one line each, then what it runs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let label = |p: &String| -> String {
            self.components
                .pcollections
                .get(p)
                .map(|c| c.unique_name.clone())
                .unwrap_or_else(|| p.clone())
        };
        if self.streaming {
            writeln!(
                f,
                "streaming (an unbounded PCollection): the stages run in rounds until the sources end or the job is drained"
            )?;
        }
        for (i, stage) in self.stages.iter().enumerate() {
            match &stage.kind {
                StageKind::Impulse { output } => {
                    writeln!(f, "stage {i}: Impulse -> {}", label(output))?
                }
                StageKind::GroupByKey { input, output, .. } => writeln!(
                    f,
                    "stage {i}: GroupByKey {} ({} -> {})",
                    stage.name,
                    label(input),
                    label(output)
                )?,
                StageKind::Concat { inputs, output, .. } => {
                    let ins: Vec<String> = inputs.iter().map(label).collect();
                    writeln!(
                        f,
                        "stage {i}: Flatten {} ({} -> {})",
                        stage.name,
                        ins.join(" + "),
                        label(output)
                    )?
                }
                StageKind::Sdk(s) => {
                    let ins: Vec<String> = s.inputs.iter().map(label).collect();
                    let outs: Vec<String> = s.outputs.iter().map(label).collect();
                    let sides: Vec<String> = s
                        .side_inputs
                        .iter()
                        .map(|x| label(&x.pcollection))
                        .collect();
                    write!(
                        f,
                        "stage {i}: SDK harness, {} fused transforms ({} -> {}",
                        s.transforms.len(),
                        ins.join(" + "),
                        outs.join(", ")
                    )?;
                    if !sides.is_empty() {
                        write!(f, "; side inputs {}", sides.join(", "))?;
                    }
                    writeln!(f, ")")?;
                    for t in &s.transforms {
                        writeln!(f, "    {}", self.name_of(t))?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Which local input tags of transform `id` are side inputs (a ParDo's `side_inputs`).
pub(crate) fn side_input_tags(
    components: &Components,
    id: &str,
) -> Result<HashMap<String, String>, PortableError> {
    let t = &components.transforms[id];
    let spec = t.spec.as_ref();
    let urn = spec.map(|s| s.urn.as_str()).unwrap_or("");
    if ![
        urns::PAR_DO,
        urns::PAIR_WITH_RESTRICTION,
        urns::SPLIT_AND_SIZE_RESTRICTIONS,
        urns::PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS,
    ]
    .contains(&urn)
    {
        return Ok(HashMap::new());
    }
    let payload = leaves::par_do_payload(t)?;
    Ok(payload
        .side_inputs
        .into_iter()
        .map(|(tag, spec)| {
            let access = spec.access_pattern.map(|a| a.urn).unwrap_or_default();
            (tag, access)
        })
        .collect())
}
