//! A submitted Beam SDK job in object storage: what the job service writes under
//! `spec.beamPipeline.location` and the runner pod reads.
//!
//! - `pipeline.pb`: the pipeline proto; its FILE artifacts name files of this folder
//!   (`artifacts/…`, relative), which the runner fetches onto its disk before the SDK harnesses
//!   ask for them;
//! - `options.pb`: the pipeline options (a protobuf `Struct`, as the SDK submitted them);
//! - `artifacts/…`: the files the SDK staged;
//! - `metrics.pb`: the job's metrics (Beam's `MetricResults`), written by the runner at the end.
use anyhow::{Context, Result};
use bytes::Bytes;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use riverbank_io::location::{self, Resolved};

pub const PIPELINE: &str = "pipeline.pb";
pub const OPTIONS: &str = "options.pb";
pub const ARTIFACTS: &str = "artifacts";
pub const METRICS: &str = "metrics.pb";

/// A job's folder.
pub struct Folder {
    root: Resolved,
}

impl Folder {
    pub fn at(location: &str) -> Result<Folder> {
        let root = location::resolve(location.trim_end_matches('/'))
            .with_context(|| format!("the job's location {location}"))?;
        Ok(Folder { root })
    }

    fn path(&self, name: &str) -> Result<Path> {
        let key = if self.root.key.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.root.key)
        };
        Ok(self.root.with_key(key).path()?)
    }

    /// How `name` of this folder is shown.
    pub fn display(&self, name: &str) -> String {
        format!("{}/{name}", self.root.display())
    }

    pub async fn put(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        self.root
            .store
            .put(&self.path(name)?, bytes.into())
            .await
            .with_context(|| format!("writing {}", self.display(name)))?;
        Ok(())
    }

    pub async fn get(&self, name: &str) -> Result<Bytes> {
        let got = self
            .root
            .store
            .get(&self.path(name)?)
            .await
            .with_context(|| format!("reading {}", self.display(name)))?;
        got.bytes()
            .await
            .with_context(|| format!("reading {}", self.display(name)))
    }

    /// `name`'s bytes, or None when it does not exist.
    pub async fn get_if_there(&self, name: &str) -> Result<Option<Bytes>> {
        match self.root.store.get(&self.path(name)?).await {
            Ok(got) => {
                Ok(Some(got.bytes().await.with_context(|| {
                    format!("reading {}", self.display(name))
                })?))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", self.display(name))),
        }
    }
}

/// A staged file's name in the folder: `artifacts/<n>-<its file name>` (`n` keeps two files of
/// the same name apart).
pub fn artifact_name(n: usize, path: &str) -> String {
    let file = std::path::Path::new(path)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| "artifact".into());
    format!("{ARTIFACTS}/{n}-{file}")
}

/// Whether `name` (a FILE artifact's path in `pipeline.pb`) is one of the folder's own: relative,
/// under `artifacts/`, never leaving it.
pub fn is_stored_artifact(name: &str) -> bool {
    name.strip_prefix(ARTIFACTS)
        .and_then(|rest| rest.strip_prefix('/'))
        .is_some_and(|file| !file.is_empty() && !file.contains('/') && file != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifacts_are_named_inside_the_folder_only() {
        assert_eq!(
            artifact_name(3, "/tmp/x/main_session.pickle"),
            "artifacts/3-main_session.pickle"
        );
        assert!(is_stored_artifact(&artifact_name(0, "/a/b.whl")));
        for bad in [
            "/etc/passwd",
            "artifacts/../x",
            "artifacts/",
            "artifacts/a/b",
            "other/a",
        ] {
            assert!(!is_stored_artifact(bad), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_folder_reads_back_what_was_put_and_tells_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let folder = Folder::at(&format!("{}/job-1/", dir.path().display())).unwrap();
        folder.put(PIPELINE, vec![1, 2, 3]).await.unwrap();
        folder
            .put("artifacts/0-a.py", b"x = 1".to_vec())
            .await
            .unwrap();
        assert_eq!(folder.get(PIPELINE).await.unwrap().as_ref(), [1, 2, 3]);
        assert_eq!(
            folder.get("artifacts/0-a.py").await.unwrap().as_ref(),
            b"x = 1"
        );
        assert!(folder.get_if_there(METRICS).await.unwrap().is_none());
        let err = folder.get(OPTIONS).await.unwrap_err();
        assert!(format!("{err:#}").contains("options.pb"), "{err:#}");
    }
}
