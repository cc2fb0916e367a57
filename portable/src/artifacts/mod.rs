//! Artifacts: the files an SDK submits beside its pipeline (`--files_to_stage`, extra packages,
//! requirements, a pickled main session, jars), which its harnesses need before they run code.
//!
//! [`staging`]: Beam's reverse retrieval. The client opens `ReverseArtifactRetrievalService` with
//! the token Prepare gave it; the job server asks it to resolve each environment's dependencies
//! and to send each of them, and keeps them as files in the job's directory of an
//! [`ArtifactStore`]. Run then gives the harnesses those files instead of paths on the
//! submitter's machine. [`retrieval`]: the Fn API server's side, from which a harness (Beam's
//! container boot) fetches its environment's dependencies, and only those. A PROCESS harness
//! gets them in its `staged` directory before it starts ([`materialize`]), as boot would have
//! put them there, and the packages among them installed ([`install`]).
pub mod install;
pub mod retrieval;
pub mod staging;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use prost::Message;
use tokio::sync::watch;

use crate::error::PortableError;
use crate::runner_api::{
    ArtifactFilePayload, ArtifactInformation, ArtifactStagingToRolePayload, EmbeddedFilePayload,
};
use crate::urns;

/// Each environment's dependencies, by environment id.
pub type Dependencies = BTreeMap<String, Vec<ArtifactInformation>>;

/// How long Run waits for a staging stream still open (the client stages before it runs, so
/// this is only reached by a client that stalls mid-staging).
const STAGING_WAIT: Duration = Duration::from_secs(600);

#[derive(Debug, Clone)]
enum Staging {
    /// Prepared; the client has not opened the staging stream.
    Waiting,
    Running,
    Done(Result<Dependencies, String>),
}

struct Entry {
    submitted: Dependencies,
    state: watch::Sender<Staging>,
}

/// The job server's staged artifacts: a directory per job under its root.
pub struct ArtifactStore {
    root: PathBuf,
    jobs: Mutex<HashMap<String, Entry>>,
    /// Held when the root is a directory of our own, removed with the store.
    _owned: Option<tempfile::TempDir>,
}

impl ArtifactStore {
    /// A store under `root`, or under a temporary directory of its own.
    pub fn new(root: Option<PathBuf>) -> Result<ArtifactStore, PortableError> {
        let (root, owned) = match root {
            Some(root) => {
                std::fs::create_dir_all(&root).map_err(|e| {
                    PortableError::Artifacts(format!("cannot create {}: {e}", root.display()))
                })?;
                (root, None)
            }
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("riverbank-artifacts-")
                    .tempdir()
                    .map_err(|e| {
                        PortableError::Artifacts(format!("no temporary directory: {e}"))
                    })?;
                (dir.path().to_path_buf(), Some(dir))
            }
        };
        Ok(ArtifactStore {
            root,
            jobs: Mutex::default(),
            _owned: owned,
        })
    }

    fn dir(&self, token: &str) -> PathBuf {
        self.root.join(token)
    }

    /// Expects a staging stream for `token` (a preparation id) offering `submitted`.
    pub fn register(&self, token: &str, submitted: Dependencies) {
        self.jobs.lock().expect("artifacts").insert(
            token.to_string(),
            Entry {
                submitted,
                state: watch::channel(Staging::Waiting).0,
            },
        );
    }

    /// Starts staging `token`: what it offers, and the directory its files go to. Once only.
    fn begin(&self, token: &str) -> Result<(Dependencies, PathBuf), String> {
        let jobs = self.jobs.lock().expect("artifacts");
        let entry = jobs
            .get(token)
            .ok_or_else(|| format!("no job was prepared with staging token '{token}'"))?;
        if !matches!(*entry.state.borrow(), Staging::Waiting) {
            return Err(format!("the artifacts of '{token}' were already staged"));
        }
        entry.state.send_replace(Staging::Running);
        Ok((entry.submitted.clone(), self.dir(token)))
    }

    fn finish(&self, token: &str, result: Result<Dependencies, String>) {
        if let Some(entry) = self.jobs.lock().expect("artifacts").get(token) {
            entry.state.send_replace(Staging::Done(result));
        }
    }

    /// The dependencies Run gives the job's harnesses: the staged files once the client has
    /// staged them (waiting while it still is), or `None` when it never opened the staging
    /// stream (the dependencies stay as submitted: paths the submitter's machine has).
    pub async fn resolved(&self, token: &str) -> Result<Option<Dependencies>, PortableError> {
        let mut state = match self.jobs.lock().expect("artifacts").get(token) {
            Some(entry) => entry.state.subscribe(),
            None => return Ok(None),
        };
        let waited = tokio::time::timeout(
            STAGING_WAIT,
            state.wait_for(|s| !matches!(s, Staging::Running)),
        )
        .await;
        let staging = match waited {
            Ok(Ok(s)) => s.clone(),
            Ok(Err(_)) => return Ok(None),
            Err(_) => {
                return Err(PortableError::Artifacts(format!(
                    "the client did not finish staging its artifacts within {STAGING_WAIT:?}"
                )));
            }
        };
        match staging {
            Staging::Waiting | Staging::Running => Ok(None),
            Staging::Done(Ok(deps)) => Ok(Some(deps)),
            Staging::Done(Err(e)) => Err(PortableError::Artifacts(format!("staging failed: {e}"))),
        }
    }

    /// Forgets `token`'s artifacts and removes its files.
    pub fn discard(&self, token: &str) {
        self.jobs.lock().expect("artifacts").remove(token);
        let dir = self.dir(token);
        if dir.exists()
            && let Err(e) = std::fs::remove_dir_all(&dir)
        {
            tracing::warn!("cannot remove staged artifacts {}: {e}", dir.display());
        }
    }
}

/// The name an artifact is staged under (`staging_to` role), as a bare file name: a staged
/// name cannot reach outside the directory it is written to.
pub fn staged_name(artifact: &ArtifactInformation) -> Option<String> {
    if artifact.role_urn != urns::ARTIFACT_ROLE_STAGING_TO {
        return None;
    }
    let role = ArtifactStagingToRolePayload::decode(artifact.role_payload.as_slice()).ok()?;
    Path::new(&role.staged_name)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
}

/// A file artifact at `path` with the same role as `like`.
pub(crate) fn file_artifact(
    path: &Path,
    sha256: String,
    like: &ArtifactInformation,
) -> ArtifactInformation {
    ArtifactInformation {
        type_urn: urns::ARTIFACT_FILE.into(),
        type_payload: ArtifactFilePayload {
            path: path.display().to_string(),
            sha256,
        }
        .encode_to_vec(),
        role_urn: like.role_urn.clone(),
        role_payload: like.role_payload.clone(),
    }
}

/// Where an artifact's bytes are on this machine.
pub(crate) enum Content {
    File(PathBuf),
    Embedded(Vec<u8>),
}

pub(crate) fn content(artifact: &ArtifactInformation) -> Result<Content, String> {
    match artifact.type_urn.as_str() {
        urns::ARTIFACT_FILE => ArtifactFilePayload::decode(artifact.type_payload.as_slice())
            .map(|p| Content::File(PathBuf::from(p.path)))
            .map_err(|e| format!("bad file artifact payload: {e}")),
        urns::ARTIFACT_EMBEDDED => EmbeddedFilePayload::decode(artifact.type_payload.as_slice())
            .map(|p| Content::Embedded(p.data))
            .map_err(|e| format!("bad embedded artifact payload: {e}")),
        other => Err(format!(
            "an artifact of type '{other}' (Riverbank's harnesses take files and embedded data)"
        )),
    }
}

/// Writes `dependencies` into `dir` under their staged names, as Beam's boot does before it
/// starts the SDK (Python's `sdk_worker_main` puts `dir` on `sys.path` and loads a pickled main
/// session from it). An artifact without a staged name is not a file to put there.
pub fn materialize(dependencies: &[ArtifactInformation], dir: &Path) -> Result<(), PortableError> {
    let failed = |name: &str, e: String| {
        PortableError::Artifacts(format!("cannot stage '{name}' in {}: {e}", dir.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| failed("", e.to_string()))?;
    for artifact in dependencies {
        let Some(name) = staged_name(artifact) else {
            continue;
        };
        let to = dir.join(&name);
        match content(artifact).map_err(|e| failed(&name, e))? {
            Content::File(from) => std::fs::copy(&from, &to)
                .map(drop)
                .map_err(|e| failed(&name, format!("{}: {e}", from.display())))?,
            Content::Embedded(data) => {
                std::fs::write(&to, data).map_err(|e| failed(&name, e.to_string()))?
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(name: &str, content: &[u8]) -> ArtifactInformation {
        ArtifactInformation {
            type_urn: urns::ARTIFACT_EMBEDDED.into(),
            type_payload: EmbeddedFilePayload {
                data: content.to_vec(),
            }
            .encode_to_vec(),
            role_urn: urns::ARTIFACT_ROLE_STAGING_TO.into(),
            role_payload: ArtifactStagingToRolePayload {
                staged_name: name.into(),
            }
            .encode_to_vec(),
        }
    }

    #[test]
    fn materialized_artifacts_keep_their_staged_names_inside_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let staged_dir = dir.path().join("staged");
        let file = dir.path().join("source.py");
        std::fs::write(&file, "x = 1\n").unwrap();
        let from_file = file_artifact(&file, String::new(), &staged("helper.py", b""));
        let deps = vec![
            from_file,
            staged("../../escape.txt", b"inside"),
            staged("pickled_main_session", b"session"),
        ];
        materialize(&deps, &staged_dir).unwrap();
        let read = |n: &str| std::fs::read_to_string(staged_dir.join(n)).unwrap();
        assert_eq!(read("helper.py"), "x = 1\n");
        assert_eq!(read("escape.txt"), "inside");
        assert_eq!(read("pickled_main_session"), "session");
        assert!(!dir.path().join("escape.txt").exists());
    }

    #[test]
    fn an_artifact_riverbank_cannot_read_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut url = staged("req.txt", b"");
        url.type_urn = "beam:artifact:type:url:v1".into();
        let err = materialize(&[url], dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("'req.txt'") && err.contains("beam:artifact:type:url:v1"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn run_waits_for_staging_and_takes_the_staged_files_or_the_submitted_ones() {
        let store = ArtifactStore::new(None).unwrap();
        store.register("never-staged", Dependencies::new());
        assert!(store.resolved("never-staged").await.unwrap().is_none());

        let submitted = Dependencies::from([("py".to_string(), vec![staged("a", b"1")])]);
        store.register("job", submitted.clone());
        let (offered, dir) = store.begin("job").unwrap();
        assert_eq!(offered, submitted);
        assert!(store.begin("job").is_err(), "a job stages once");
        let staged_deps = Dependencies::from([("py".to_string(), vec![staged("b", b"2")])]);
        // Run asks while the stream is still staging: it waits for the end.
        let (waited, ()) = tokio::join!(store.resolved("job"), async {
            tokio::task::yield_now().await;
            store.finish("job", Ok(staged_deps.clone()));
        });
        assert_eq!(waited.unwrap(), Some(staged_deps));

        std::fs::create_dir_all(&dir).unwrap();
        store.discard("job");
        assert!(!dir.exists());
        store.register("bad", Dependencies::new());
        store.begin("bad").unwrap();
        store.finish("bad", Err("the client went away".into()));
        let err = store.resolved("bad").await.unwrap_err().to_string();
        assert!(err.contains("the client went away"), "{err}");
    }
}
