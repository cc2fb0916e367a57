//! Where a streaming job's checkpoints are kept: a folder of named files, on this machine's
//! disk (`LocalDir`) or in object storage, which the runner does not open itself: the binary
//! that hosts it gives an [`ObjectStorage`] (the CLI's, over the same `object_store` clients
//! and credentials as every source and sink), so the runner pod of a DataflowJob and a job
//! server alike checkpoint to `s3://`, `gs://` or `az://`.
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;

/// A folder of named files, each replaced whole or not at all.
pub trait CheckpointStore: Send + Sync {
    /// `name`'s bytes; None when there is no such file.
    fn get<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, String>>;
    /// `bytes` in place of `name`'s, whole or not at all.
    fn put<'a>(&'a self, name: &'a str, bytes: Vec<u8>) -> BoxFuture<'a, Result<(), String>>;
    /// `name` gone (no error when it was not there).
    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), String>>;
    /// The names of the files in the folder (none when there is no folder).
    fn list(&self) -> BoxFuture<'_, Result<Vec<String>, String>>;
    /// How `name` is shown in messages (its URL or path).
    fn display(&self, name: &str) -> String;
}

/// Opens the folder a URL names in object storage (`s3://bucket/a/b`).
#[derive(Clone)]
pub struct ObjectStorage(
    #[allow(clippy::type_complexity)]
    Arc<dyn Fn(&str) -> Result<Arc<dyn CheckpointStore>, String> + Send + Sync>,
);

impl ObjectStorage {
    pub fn new(
        open: impl Fn(&str) -> Result<Arc<dyn CheckpointStore>, String> + Send + Sync + 'static,
    ) -> ObjectStorage {
        ObjectStorage(Arc::new(open))
    }

    pub fn open(&self, url: &str) -> Result<Arc<dyn CheckpointStore>, String> {
        (self.0)(url)
    }
}

impl fmt::Debug for ObjectStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ObjectStorage")
    }
}

/// A directory of this machine: a file is written aside, synced and renamed over the old one.
pub(crate) struct LocalDir(pub PathBuf);

impl LocalDir {
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl CheckpointStore for LocalDir {
    fn get<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Vec<u8>>, String>> {
        let path = self.path(name);
        Box::pin(async move {
            match std::fs::read(&path) {
                Ok(b) => Ok(Some(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(format!("{}: {e}", path.display())),
            }
        })
    }

    fn put<'a>(&'a self, name: &'a str, bytes: Vec<u8>) -> BoxFuture<'a, Result<(), String>> {
        let path = self.path(name);
        Box::pin(async move {
            std::fs::create_dir_all(&self.0).map_err(|e| format!("{}: {e}", self.0.display()))?;
            replace(&path, &bytes)
        })
    }

    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), String>> {
        let path = self.path(name);
        Box::pin(async move {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("{}: {e}", path.display())),
            }
            // The job's directory goes with its last file.
            let _ = std::fs::remove_dir(&self.0);
            Ok(())
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<String>, String>> {
        Box::pin(async move {
            let entries = match std::fs::read_dir(&self.0) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
                Err(e) => return Err(format!("{}: {e}", self.0.display())),
            };
            let mut names = vec![];
            for e in entries {
                let e = e.map_err(|e| format!("{}: {e}", self.0.display()))?;
                names.push(e.file_name().to_string_lossy().into_owned());
            }
            Ok(names)
        })
    }

    fn display(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }
}

/// `bytes` in place of `path`'s, whole or not at all: a temporary file, synced, renamed over it.
fn replace(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    let temp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&temp).map_err(|e| format!("{}: {e}", temp.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_data())
        .map_err(|e| format!("{}: {e}", temp.display()))?;
    std::fs::rename(&temp, path).map_err(|e| format!("{}: {e}", path.display()))
}
