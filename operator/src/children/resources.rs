//! Resources: the worker pods' requests (spec.pods.resources, or the resource hints cpuCount and
//! minRam over the operator's defaults) and the cores a worker processes with.
use super::*;
use crate::quantity::{cpu_cores, memory_quantity, parse_bytes, quantity};
use riverbank_pipeline::ResourceHints;

/// [`worker_requests`] with the hints of the job's plan, planned here: for callers that have
/// no plan at hand (the reconciler plans once and passes the hints down).
pub fn worker_resources(
    job: &DataflowJob,
    settings: &OperatorSettings,
) -> Result<ResourceRequirements, ChildrenError> {
    let hints = job
        .plan()
        .map(|plan| plan.worker_resource_hints())
        .unwrap_or_default();
    worker_requests(job, settings, &hints)
}

/// spec.pods.resources when set; else the operator's defaults with the resource hints
/// (options.cpuCount, options.minRam) as requests in their place, raised to the largest
/// `resource_hints` of the pipeline's transforms (`hints`: `Plan::worker_resource_hints`;
/// `min_ram`, `cpu_count`: every worker may run any stage, so the largest need is every
/// worker's; `accelerator` is not mapped).
pub fn worker_requests(
    job: &DataflowJob,
    settings: &OperatorSettings,
    hints: &ResourceHints,
) -> Result<ResourceRequirements, ChildrenError> {
    if let Some(r) = job.pods().and_then(|p| p.resources.clone()) {
        return Ok(r);
    }
    let options = &job.spec.options;
    let mut resources = settings.worker_resources.clone();
    let requests = resources.requests.get_or_insert_with(BTreeMap::new);
    if let Some(cpu) = options.cpu_count {
        requests.insert("cpu".into(), Quantity(cpu.to_string()));
    }
    if let Some(ram) = &options.min_ram {
        let q = memory_quantity(ram).ok_or_else(|| ChildrenError::MinRam(ram.clone()))?;
        requests.insert("memory".into(), q);
    }
    raise_to_hints(&mut resources, hints);
    Ok(resources)
}

/// Requests at least what the transforms' resource hints ask (a limit below a raised memory
/// request is raised with it: a request above its limit is refused by the API server).
fn raise_to_hints(resources: &mut ResourceRequirements, hints: &ResourceHints) {
    let cores = |q: &Quantity| match q.0.strip_suffix('m') {
        Some(milli) => milli.parse::<f64>().ok().map(|m| m / 1000.0),
        None => q.0.parse::<f64>().ok(),
    };
    let requests = resources.requests.get_or_insert_with(BTreeMap::new);
    if let Some(cpu) = hints.cpu_count
        && requests
            .get("cpu")
            .and_then(cores)
            .is_none_or(|c| c < cpu as f64)
    {
        requests.insert("cpu".into(), Quantity(cpu.to_string()));
    }
    let bytes = |q: &Quantity| parse_bytes(&q.0);
    if let Some(ram) = hints.min_ram_bytes
        && requests
            .get("memory")
            .and_then(bytes)
            .is_none_or(|b| b < ram)
    {
        let q = quantity(ram);
        requests.insert("memory".into(), q.clone());
        if let Some(limit) = resources.limits.as_mut().and_then(|l| l.get_mut("memory"))
            && bytes(limit).is_some_and(|b| b < ram)
        {
            *limit = q;
        }
    }
}

/// `resources` with the memory vertical autoscaling decided as both request and limit.
pub(super) fn with_memory(
    mut resources: ResourceRequirements,
    memory: &Quantity,
) -> ResourceRequirements {
    for m in [&mut resources.requests, &mut resources.limits] {
        m.get_or_insert_with(BTreeMap::new)
            .insert("memory".into(), memory.clone());
    }
    resources
}

/// options.maxWorkerMemory, checked: a memory size, not below the workers' memory (their
/// limit, else their request) before vertical autoscaling.
pub(super) fn check_max_memory(
    job: &DataflowJob,
    resources: &ResourceRequirements,
) -> Result<(), ChildrenError> {
    let Some(hint) = job.spec.options.max_worker_memory.as_deref() else {
        return Ok(());
    };
    let max = memory_quantity(hint)
        .and_then(|q| parse_bytes(&q.0))
        .ok_or_else(|| ChildrenError::MaxWorkerMemory(hint.to_string()))?;
    let memory =
        |m: &Option<BTreeMap<String, Quantity>>| m.as_ref().and_then(|m| m.get("memory")).cloned();
    let Some(configured) = memory(&resources.limits).or_else(|| memory(&resources.requests)) else {
        return Err(ChildrenError::MaxWorkerMemoryWithoutBase);
    };
    match parse_bytes(&configured.0) {
        Some(base) if base <= max => Ok(()),
        _ => Err(ChildrenError::MaxWorkerMemoryBelowBase {
            max: hint.to_string(),
            base: configured.0,
        }),
    }
}

/// Cores one worker processes with, as `riverbank worker` sizes its work slots: its harness
/// threads when set, else its CPU limit (what the process sees as available parallelism), else
/// its CPU request; at least 1. The autoscaler compares the job's cores with its active keys.
pub fn worker_cores(job: &DataflowJob, settings: &OperatorSettings) -> u32 {
    cores(job, worker_resources(job, settings).ok().as_ref())
}

/// [`worker_cores`] of workers whose configured resources are known ([`worker_requests`]; None
/// when they can't be made).
pub fn cores(job: &DataflowJob, resources: Option<&ResourceRequirements>) -> u32 {
    if let Some(threads) = job.spec.options.number_of_worker_harness_threads {
        return u32::try_from(threads).unwrap_or(1).max(1);
    }
    let Some(resources) = resources else {
        return 1;
    };
    let cpu = |m: &Option<BTreeMap<String, Quantity>>| {
        m.as_ref()
            .and_then(|m| m.get("cpu"))
            .and_then(|q| cpu_cores(&q.0))
    };
    cpu(&resources.limits)
        .or_else(|| cpu(&resources.requests))
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_cores_follow_threads_then_limit_then_request() {
        let settings = OperatorSettings::default();
        let mut job = crate::fixtures::JobBuilder::new("j").build();
        assert_eq!(
            worker_cores(&job, &settings),
            1,
            "the default request, 1 CPU"
        );
        job.spec.options.cpu_count = Some(4);
        assert_eq!(worker_cores(&job, &settings), 4);
        job.spec.pods = Some(crate::crd::PodsSpec {
            resources: Some(ResourceRequirements {
                requests: Some(BTreeMap::from([("cpu".into(), Quantity("500m".into()))])),
                limits: Some(BTreeMap::from([("cpu".into(), Quantity("2.5".into()))])),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(worker_cores(&job, &settings), 3, "the limit, rounded up");
        job.spec.options.number_of_worker_harness_threads = Some(6);
        assert_eq!(worker_cores(&job, &settings), 6);
        assert_eq!(cpu_cores("1500m"), Some(2));
        assert_eq!(cpu_cores("lots"), None);
    }

    #[test]
    fn transform_resource_hints_raise_the_worker_requests() {
        let settings = OperatorSettings::default();
        let job = |hints: serde_json::Value| {
            crate::fixtures::JobBuilder::new("j")
                .pipeline(serde_json::json!({"transforms": [
                    {"type": "Create", "name": "Numbers", "config": {"elements": [{"n": 1}]}},
                    {"type": "WriteToJson", "name": "Out", "input": "Numbers",
                     "config": {"path": "/data/out.jsonl"}, "resource_hints": hints}
                ]}))
                .build()
        };
        let requests = |job: &DataflowJob| {
            worker_resources(job, &settings)
                .unwrap()
                .requests
                .unwrap()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect::<BTreeMap<_, _>>()
        };
        // Above the defaults (1 CPU, 2Gi): raised.
        let big = requests(&job(serde_json::json!({"min_ram": "6GiB", "cpu_count": 3})));
        assert_eq!(big["memory"], "6Gi");
        assert_eq!(big["cpu"], "3");
        // Below them: the defaults stay.
        let small = requests(&job(serde_json::json!({"min_ram": "1GiB", "cpu_count": 1})));
        assert_eq!(small["memory"], "2Gi");
        assert_eq!(small["cpu"], "1");
    }
}
