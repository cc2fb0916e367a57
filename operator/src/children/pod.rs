//! The coordinator's and workers' pods: what comes from spec.pods (image, environment,
//! credentials, scheduling, labels), the container (entry point, ports, probes, mounts) and the
//! pod template under the restricted Pod Security Standard.
use super::credentials::credential_volumes;
use super::*;

/// The parts of the coordinator's and workers' pods that come from spec.pods.
pub(super) struct PodParts {
    image: String,
    pull_policy: String,
    env: Vec<EnvVar>,
    volumes: Vec<Volume>,
    mounts: Vec<VolumeMount>,
    spec: crate::crd::PodsSpec,
    service_account: Option<String>,
}

impl PodParts {
    pub(super) fn new(job: &DataflowJob, ctx: &Ctx, plan: &Plan) -> Result<Self, ChildrenError> {
        let spec = job.pods().cloned().unwrap_or_default();
        // A PyTransform is run by Beam's Python SDK, in the coordinator (its output schema)
        // and the workers (its rows): the worker image with apache-beam, unless the job names
        // its own image.
        let image = spec.image.clone().unwrap_or_else(|| {
            if plan.python_sdk_transforms().is_empty() {
                ctx.settings.worker_image.clone()
            } else {
                ctx.settings.beam_worker_image.clone()
            }
        });
        let pull_policy = spec
            .image_pull_policy
            .unwrap_or(ctx.settings.image_pull_policy)
            .as_str()
            .to_string();

        let field = |path: &str| EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut env = vec![
            EnvVar {
                name: "POD_NAME".into(),
                value_from: Some(field("metadata.name")),
                ..Default::default()
            },
            EnvVar {
                name: "POD_NAMESPACE".into(),
                value_from: Some(field("metadata.namespace")),
                ..Default::default()
            },
            EnvVar {
                name: "RIVERBANK_JOB".into(),
                value: Some(ctx.name.clone()),
                ..Default::default()
            },
        ];
        let mut seen: BTreeSet<String> = env.iter().map(|e| e.name.clone()).collect();
        for e in &spec.env {
            // POD_IP: a Beam SDK job's runner advertises its Fn API at it.
            if ["POD_NAME", "POD_NAMESPACE", "POD_IP"].contains(&e.name.as_str())
                || e.name.starts_with("RIVERBANK_")
            {
                return Err(ChildrenError::ReservedEnv(e.name.clone()));
            }
        }
        for c in &spec.credentials {
            if let Some(name) = &c.env {
                if !seen.insert(name.clone()) {
                    return Err(ChildrenError::DuplicateEnv(name.clone()));
                }
                env.push(EnvVar {
                    name: name.clone(),
                    value_from: Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: c.name.clone(),
                            key: c.key.clone(),
                            optional: Some(false),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
            }
        }
        for e in &spec.env {
            if !seen.insert(e.name.clone()) {
                return Err(ChildrenError::DuplicateEnv(e.name.clone()));
            }
            env.push(e.clone());
        }
        let (volumes, mounts) = credential_volumes(&spec.credentials)?;
        let service_account = job.service_account().map(String::from);
        Ok(PodParts {
            image,
            pull_policy,
            env,
            volumes,
            mounts,
            spec,
            service_account,
        })
    }

    pub(super) fn container(
        &self,
        name: &str,
        args: Vec<String>,
        service_port: (&str, i32),
        resources: ResourceRequirements,
        disk: &str,
    ) -> Container {
        let port = |name: &str, port: i32| ContainerPort {
            name: Some(name.into()),
            container_port: port,
            protocol: Some("TCP".into()),
            ..Default::default()
        };
        let probe = |path: &str, period: i32, failures: i32| Probe {
            http_get: Some(HTTPGetAction {
                path: Some(path.into()),
                port: IntOrString::String("health".into()),
                ..Default::default()
            }),
            period_seconds: Some(period),
            timeout_seconds: Some(5),
            failure_threshold: Some(failures),
            ..Default::default()
        };
        let mount = |name: &str, path: &str, read_only: bool| VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            read_only: read_only.then_some(true),
            ..Default::default()
        };
        let mut mounts = vec![
            mount("plan", PLAN_DIR, true),
            mount(disk, DATA_DIR, false),
            mount("tmp", "/tmp", false),
        ];
        mounts.extend(self.mounts.iter().cloned());
        Container {
            name: name.into(),
            image: Some(self.image.clone()),
            image_pull_policy: Some(self.pull_policy.clone()),
            // The image's `riverbank` binary, found on PATH, so custom images need not copy
            // our ENTRYPOINT.
            command: Some(vec!["riverbank".into()]),
            args: Some(args),
            ports: Some(vec![
                port(service_port.0, service_port.1),
                port("health", HEALTH_PORT),
                port("metrics", METRICS_PORT),
            ]),
            env: Some(self.env.clone()),
            resources: Some(resources),
            // Generous startup: opening sources and compiling the plan can take a while.
            startup_probe: Some(probe("/healthz", 5, 60)),
            liveness_probe: Some(probe("/healthz", 10, 6)),
            readiness_probe: Some(probe("/readyz", 5, 3)),
            security_context: Some(restricted()),
            volume_mounts: Some(mounts),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            ..Default::default()
        }
    }

    /// A Beam SDK job's SDK container, an SDK worker pod's only one: the pipeline's SDK image as
    /// Beam's worker pool (`--worker_pool`, port 50000), with the job's environment and
    /// credentials (the user's code reads and writes with them) and the same restricted security
    /// context; its scratch space (`/tmp`, where Beam's boot puts staged files, and `HOME`) is
    /// an emptyDir of its own.
    pub(super) fn sdk_container(
        &self,
        beam: &crate::crd::BeamPipelineSpec,
        resources: ResourceRequirements,
    ) -> Container {
        let mut env = self.env.clone();
        env.push(EnvVar {
            name: "HOME".into(),
            value: Some("/tmp".into()),
            ..Default::default()
        });
        let mut mounts = vec![VolumeMount {
            name: "sdk-tmp".into(),
            mount_path: "/tmp".into(),
            ..Default::default()
        }];
        mounts.extend(self.mounts.iter().cloned());
        Container {
            name: "sdk".into(),
            image: Some(beam.sdk_container_image.clone()),
            image_pull_policy: Some(self.pull_policy.clone()),
            args: Some(
                beam.sdk_container_args
                    .clone()
                    .unwrap_or_else(|| vec!["--worker_pool".into()]),
            ),
            ports: Some(vec![ContainerPort {
                name: Some("sdk-pool".into()),
                container_port: SDK_WORKER_POOL_PORT,
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            env: Some(env),
            resources: Some(resources),
            security_context: Some(restricted()),
            volume_mounts: Some(mounts),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            ..Default::default()
        }
    }

    /// A pod template under the restricted Pod Security Standard.
    pub(super) fn template(
        &self,
        ctx: &Ctx,
        component: &str,
        container: Container,
        plan_hash: &str,
        grace_seconds: i64,
    ) -> PodTemplateSpec {
        // User labels first: the operator's (which the selectors match) win.
        let mut pod_labels = self.spec.labels.clone();
        pod_labels.extend(ctx.labels(Some(component)));
        let mut annotations = self.spec.annotations.clone();
        annotations.insert(labels::PLAN_HASH.into(), plan_hash.into());
        let mut volumes = vec![
            Volume {
                name: "plan".into(),
                config_map: Some(ConfigMapVolumeSource {
                    name: plan_config_map_name(&ctx.name),
                    ..Default::default()
                }),
                ..Default::default()
            },
            Volume {
                name: "tmp".into(),
                empty_dir: Some(EmptyDirVolumeSource {
                    size_limit: Some(Quantity("1Gi".into())),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ];
        volumes.extend(self.volumes.iter().cloned());
        let non_empty = |v: &BTreeMap<String, String>| (!v.is_empty()).then(|| v.clone());
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(pod_labels),
                annotations: Some(annotations),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                containers: vec![container],
                volumes: Some(volumes),
                service_account_name: self.service_account.clone(),
                // The pods never call the Kubernetes API: no token to steal.
                automount_service_account_token: Some(false),
                // No Docker-links-style env vars for every Service in the namespace.
                enable_service_links: Some(false),
                security_context: Some(PodSecurityContext {
                    run_as_non_root: Some(true),
                    run_as_user: Some(RUN_AS),
                    run_as_group: Some(RUN_AS),
                    // The disks are writable by the pod's group; only chown them when needed
                    // (a recursive chown of a large disk would delay every start).
                    fs_group: Some(RUN_AS),
                    fs_group_change_policy: Some("OnRootMismatch".into()),
                    seccomp_profile: Some(SeccompProfile {
                        type_: "RuntimeDefault".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                termination_grace_period_seconds: Some(grace_seconds),
                node_selector: non_empty(&self.spec.node_selector),
                tolerations: (!self.spec.tolerations.is_empty())
                    .then(|| self.spec.tolerations.clone()),
                affinity: self.spec.affinity.clone(),
                image_pull_secrets: (!self.spec.image_pull_secrets.is_empty())
                    .then(|| self.spec.image_pull_secrets.clone()),
                ..Default::default()
            }),
        }
    }
}

/// A container's security context under the restricted Pod Security Standard, read-only root.
fn restricted() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        ..Default::default()
    }
}
