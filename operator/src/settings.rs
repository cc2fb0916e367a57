//! What the cluster administrator configures once for all jobs (the operator's Helm values).
//! A leaf: the children, vertical autoscaling and the reconciler read it.
use crate::crd::ImagePullPolicy;
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// What the cluster administrator configures once for all jobs (Helm values of the operator).
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorSettings {
    /// Image of the job pods when spec.pods.image is not set.
    pub worker_image: String,
    /// Image of the job pods of a pipeline with a `PyTransform` when spec.pods.image is not set:
    /// the worker image with Beam's Python SDK (`RIVERBANK_BEAM_PYTHON` naming its Python).
    pub beam_worker_image: String,
    /// Pull policy when spec.pods.imagePullPolicy is not set.
    pub image_pull_policy: ImagePullPolicy,
    /// The cluster's DNS domain, for the coordinator's address.
    pub cluster_domain: String,
    /// Size of the coordinator's disk (its progress log).
    pub coordinator_disk: Quantity,
    /// Resources of the coordinator container.
    pub coordinator_resources: ResourceRequirements,
    /// Worker resources when neither spec.pods.resources nor resource hints say otherwise.
    pub worker_resources: ResourceRequirements,
    /// Worker disk size when options.diskSizeGb is not set (None: Dataflow's 250/400 GB).
    pub default_disk_size_gb: Option<i32>,
}

impl Default for OperatorSettings {
    fn default() -> Self {
        OperatorSettings {
            worker_image: format!("riverbank/worker:{}", env!("CARGO_PKG_VERSION")),
            beam_worker_image: format!("riverbank/worker-beam:{}", env!("CARGO_PKG_VERSION")),
            image_pull_policy: ImagePullPolicy::IfNotPresent,
            cluster_domain: "cluster.local".into(),
            coordinator_disk: Quantity("1Gi".into()),
            coordinator_resources: requests(&[("cpu", "250m"), ("memory", "512Mi")]),
            worker_resources: requests(&[("cpu", "1"), ("memory", "2Gi")]),
            default_disk_size_gb: None,
        }
    }
}

fn requests(pairs: &[(&str, &str)]) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect(),
        ),
        ..Default::default()
    }
}
