//! A submitted Beam SDK job in object storage: what the job service writes under
//! `spec.beamPipeline.location` and the runner pod reads.
//!
//! - `pipeline.pb`: the pipeline proto; its FILE artifacts name files of this folder
//!   (`artifacts/…`, relative), which the runner fetches onto its disk before the SDK harnesses
//!   ask for them;
//! - `options.pb`: the pipeline options (a protobuf `Struct`, as the SDK submitted them);
//! - `artifacts/…`: the files the SDK staged;
//! - `metrics.pb`: the job's metrics (Beam's `MetricResults`), written by the runner at the end;
//! - `replaces/pipeline.pb`, `replaces/options.pb`: for a streaming job submitted with
//!   `--update`, the pipeline it updates in place (its DataflowJob's previous folder's), whose
//!   checkpoint the runner takes over.
//!
//! A folder of object storage is also where a streaming SDK job's checkpoints go
//! ([`object_storage`]: what the runner and the job server give `riverbank-portable`).
use std::sync::Arc;

use anyhow::{Context, Result};
use bytes::Bytes;
use futures::future::BoxFuture;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use riverbank_io::location::{self, Resolved};
use riverbank_portable::execute::checkpoint::{CheckpointStore, ObjectStorage};

pub const PIPELINE: &str = "pipeline.pb";
pub const OPTIONS: &str = "options.pb";
pub const ARTIFACTS: &str = "artifacts";
pub const METRICS: &str = "metrics.pb";
pub const REPLACED_PIPELINE: &str = "replaces/pipeline.pb";
pub const REPLACED_OPTIONS: &str = "replaces/options.pb";

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

    /// `name` gone; no error when it was not there.
    pub async fn delete(&self, name: &str) -> Result<()> {
        match self.root.store.delete(&self.path(name)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("removing {}", self.display(name))),
        }
    }

    /// The names of the objects directly in the folder.
    pub async fn list(&self) -> Result<Vec<String>> {
        let prefix = (!self.root.key.is_empty())
            .then(|| self.root.path())
            .transpose()?;
        let listed = self
            .root
            .store
            .list_with_delimiter(prefix.as_ref())
            .await
            .with_context(|| format!("listing {}", self.display("")))?;
        Ok(listed
            .objects
            .iter()
            .filter_map(|o| o.location.filename().map(str::to_string))
            .collect())
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

/// Folders of object storage by URL, opened as every source and sink opens them (same
/// clients, endpoints and credentials): where streaming SDK jobs checkpoint.
pub fn object_storage() -> ObjectStorage {
    ObjectStorage::new(|url| {
        let folder = Folder::at(url).map_err(|e| format!("{e:#}"))?;
        Ok(Arc::new(folder) as Arc<dyn CheckpointStore>)
    })
}

impl CheckpointStore for Folder {
    fn get<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, String>> {
        Box::pin(async move {
            let got = self
                .get_if_there(name)
                .await
                .map_err(|e| format!("{e:#}"))?;
            Ok(got.map(|b| b.to_vec()))
        })
    }

    fn put<'a>(&'a self, name: &'a str, bytes: Vec<u8>) -> BoxFuture<'a, Result<(), String>> {
        // An object is replaced whole by one PUT.
        Box::pin(async move {
            Folder::put(self, name, bytes)
                .await
                .map_err(|e| format!("{e:#}"))
        })
    }

    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            Folder::delete(self, name)
                .await
                .map_err(|e| format!("{e:#}"))
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<String>, String>> {
        Box::pin(async move { Folder::list(self).await.map_err(|e| format!("{e:#}")) })
    }

    fn display(&self, name: &str) -> String {
        Folder::display(self, name)
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
        folder.delete(PIPELINE).await.unwrap();
        folder.delete(PIPELINE).await.unwrap();
        assert!(folder.get_if_there(PIPELINE).await.unwrap().is_none());
        let err = folder.get(OPTIONS).await.unwrap_err();
        assert!(format!("{err:#}").contains("options.pb"), "{err:#}");
    }
}
