//! Where a job runs once the job service has it. By default the job server runs it itself
//! ([`crate::execute`], on this machine's harnesses); a [`Launcher`] hands it elsewhere instead
//! (on Kubernetes: a `DataflowJob` whose runner pod reads the pipeline from object storage),
//! and tells the job service how it goes so the SDK's client follows it as it would a local run.
use prost::Message;
use tokio::sync::watch;

use crate::error::PortableError;
use crate::job_api::{MetricResults, job_message, job_state};
use crate::runner_api::{ArtifactFilePayload, DockerPayload, Environment, Pipeline};
use crate::urns;

/// A job as Run hands it over: the submitted pipeline with its environments' dependencies
/// replaced by the files staged to this job server (FILE artifacts on its disk).
pub struct Submitted {
    /// The job service's id of the job (what the client follows).
    pub id: String,
    /// The job name the client gave.
    pub name: String,
    pub pipeline: Pipeline,
    pub options: prost_types::Struct,
    /// A streaming job (it reads an unbounded PCollection, or was submitted `--streaming`).
    pub streaming: bool,
}

/// What a launched job reports back to the job service: states and messages, which its state
/// and message streams pass on to the client, and the job's metrics.
pub trait JobEvents: Send + Sync {
    fn state(&self, state: job_state::Enum);
    fn say(&self, importance: job_message::MessageImportance, text: String);
    fn metrics(&self, metrics: MetricResults);
}

/// Runs jobs somewhere other than the job server's process.
#[tonic::async_trait]
pub trait Launcher: Send + Sync + 'static {
    /// Runs `job` to its end, reporting through `events`; `cancel` turns true when the client
    /// cancels, `drain` when it drains a streaming job. Returns the terminal state (Done,
    /// Drained, Updated, Failed or Cancelled); an error fails the job with its message. A job
    /// submitted with `--update` is the launcher's to apply to the job it replaces.
    async fn run(
        &self,
        job: Submitted,
        events: &dyn JobEvents,
        cancel: watch::Receiver<bool>,
        drain: watch::Receiver<bool>,
    ) -> Result<job_state::Enum, PortableError>;
}

/// The container images of the pipeline's DOCKER environments (Beam's SDK images, or the user's
/// `--environment_config` / `--sdk_container_image`), each once, sorted.
pub fn docker_images(pipeline: &Pipeline) -> Result<Vec<String>, PortableError> {
    let mut images = std::collections::BTreeSet::new();
    for (id, environment) in environments(pipeline) {
        if environment.urn != urns::ENV_DOCKER {
            continue;
        }
        let payload = DockerPayload::decode(environment.payload.as_slice()).map_err(|e| {
            PortableError::Malformed(format!("environment '{id}': bad DOCKER payload: {e}"))
        })?;
        images.insert(payload.container_image);
    }
    Ok(images.into_iter().collect())
}

/// Rewrites the path of every FILE artifact among the environments' dependencies with `f`
/// (the job service moves staged files into object storage, the runner pod back onto its disk).
pub fn relocate_files<F>(pipeline: &mut Pipeline, mut f: F) -> Result<(), PortableError>
where
    F: FnMut(&str) -> Result<String, PortableError>,
{
    let Some(components) = pipeline.components.as_mut() else {
        return Ok(());
    };
    for environment in components.environments.values_mut() {
        for artifact in &mut environment.dependencies {
            if artifact.type_urn != urns::ARTIFACT_FILE {
                continue;
            }
            let mut payload = ArtifactFilePayload::decode(artifact.type_payload.as_slice())
                .map_err(|e| PortableError::Artifacts(format!("bad file artifact payload: {e}")))?;
            payload.path = f(&payload.path)?;
            artifact.type_payload = payload.encode_to_vec();
        }
    }
    Ok(())
}

fn environments(pipeline: &Pipeline) -> impl Iterator<Item = (&String, &Environment)> {
    pipeline
        .components
        .iter()
        .flat_map(|c| c.environments.iter())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner_api::{ArtifactInformation, Components};

    fn pipeline(environments: Vec<(&str, Environment)>) -> Pipeline {
        Pipeline {
            components: Some(Components {
                environments: environments
                    .into_iter()
                    .map(|(id, e)| (id.to_string(), e))
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn docker(image: &str) -> Environment {
        Environment {
            urn: urns::ENV_DOCKER.into(),
            payload: DockerPayload {
                container_image: image.into(),
            }
            .encode_to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn docker_environments_name_their_images_once() {
        let p = pipeline(vec![
            ("a", docker("beam:py")),
            ("b", docker("beam:py")),
            ("c", docker("other:1")),
        ]);
        assert_eq!(docker_images(&p).unwrap(), ["beam:py", "other:1"]);
    }

    #[test]
    fn file_artifacts_are_relocated_and_others_kept() {
        let file = |path: &str| ArtifactInformation {
            type_urn: urns::ARTIFACT_FILE.into(),
            type_payload: ArtifactFilePayload {
                path: path.into(),
                sha256: "00".into(),
            }
            .encode_to_vec(),
            ..Default::default()
        };
        let embedded = ArtifactInformation {
            type_urn: urns::ARTIFACT_EMBEDDED.into(),
            type_payload: vec![1, 2, 3],
            ..Default::default()
        };
        let mut p = pipeline(vec![(
            "py",
            Environment {
                dependencies: vec![file("/stage/a.py"), embedded.clone()],
                ..docker("beam:py")
            },
        )]);
        relocate_files(&mut p, |path| Ok(format!("artifacts{path}"))).unwrap();
        let deps = &p.components.unwrap().environments["py"].dependencies;
        let moved = ArtifactFilePayload::decode(deps[0].type_payload.as_slice()).unwrap();
        assert_eq!(moved.path, "artifacts/stage/a.py");
        assert_eq!(moved.sha256, "00");
        assert_eq!(deps[1], embedded);
    }
}
