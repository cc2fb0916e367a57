//! Turning location strings into an object store plus a key, and expanding globs.
//!
//! Accepted forms:
//! - local paths, relative (to the current directory) or absolute, and `file:///abs/path`;
//! - `s3://bucket/key` (also `s3a://`), `gs://bucket/key`, `az://container/key`,
//!   `abfs[s]://container@account.dfs.core.windows.net/key`: stores are built from
//!   the environment only (`AmazonS3Builder::from_env()` etc., so `AWS_ENDPOINT_URL`,
//!   `AWS_ALLOW_HTTP`, `AWS_REGION`, ... are honoured, which is how a local S3 server
//!   such as s3s-fs is reached);
//! - `memory://name/key`: a process-wide in-memory store per name, for tests.
//!
//! Stores are cached per (scheme, bucket) so connection pools and credentials are reused.
//!
//! Locations handed back to callers (split locations, committed files) keep the
//! user's style: a relative input gives relative outputs, a URL gives URLs, so
//! messages name files the way the pipeline author wrote them.
//!
//! Reading a path: a glob (`*`, `?`, `**`, `[..]`, `{a,b}`) lists the longest literal
//! directory prefix and filters with globset (`*` does not cross `/`); a plain file
//! is read as is; a plain directory reads every file below it except hidden ones
//! (any path component starting with `.` or `_`, e.g. `_SUCCESS` or sink temp dirs).
//! Globs never descend into `.temp-riverbank-*` sink temp directories. Results are
//! sorted by location, and an empty result is an error naming the path.

use std::collections::HashMap;
use std::path::{Component, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};

use futures::TryStreamExt;
use globset::{GlobBuilder, GlobMatcher};
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

use super::IoError;

/// Name prefix of sink temp directories; readers never look inside them.
pub(crate) const TEMP_DIR_PREFIX: &str = ".temp-riverbank-";

/// A file found when expanding a read path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocatedFile {
    /// The file, in the caller's style (relative path, absolute path or URL).
    pub location: String,
    /// Size in bytes.
    pub size: u64,
    /// When the file was last written.
    pub last_modified: chrono::DateTime<chrono::Utc>,
}

/// Lists the files a read path refers to (glob, file or directory), sorted.
pub async fn list_files(location: &str) -> Result<Vec<LocatedFile>, IoError> {
    let (resolved, metas) = expand(location).await?;
    Ok(metas
        .iter()
        .map(|m| LocatedFile {
            location: resolved.display_path(&m.location),
            size: m.size,
            last_modified: m.last_modified,
        })
        .collect())
}

/// The files a pattern matches (Beam's `MatchAll`, `FileSystems.match`): as `list_files`, but
/// matching nothing is an empty list; `has_wildcard` says whether the pattern was a glob.
pub async fn match_files(pattern: &str) -> Result<(Vec<LocatedFile>, bool), IoError> {
    let wildcard = has_glob(pattern);
    match list_files(pattern).await {
        Err(IoError::NoMatch { .. }) => Ok((vec![], wildcard)),
        other => Ok((other?, wildcard)),
    }
}

/// Where a resolved location lives, which decides how keys are printed back.
#[derive(Clone, Debug)]
pub enum Origin {
    /// Local filesystem. `cwd` is the key of the current directory when the user
    /// wrote a relative path, so we can print paths relative again.
    Local { cwd: Option<String> },
    /// An object store; `base` is e.g. `s3://bucket`.
    Remote { base: String },
}

/// A location resolved to a store and a normalised key (no leading `/`; may still
/// contain glob characters).
#[derive(Clone, Debug)]
pub struct Resolved {
    pub store: Arc<dyn ObjectStore>,
    pub key: String,
    pub origin: Origin,
}

impl Resolved {
    /// The key as an object_store path (errors on control characters).
    pub fn path(&self) -> Result<Path, IoError> {
        key_to_path(&self.key, &self.display_key(&self.key))
    }

    /// Same store, another key.
    pub fn with_key(&self, key: String) -> Resolved {
        Resolved {
            store: Arc::clone(&self.store),
            key,
            origin: self.origin.clone(),
        }
    }

    /// How a key of this store is shown to users (and re-resolved later).
    pub fn display_key(&self, key: &str) -> String {
        match &self.origin {
            Origin::Local { cwd: Some(cwd) } => {
                if cwd.is_empty() {
                    key.to_string()
                } else if let Some(rest) = key
                    .strip_prefix(cwd.as_str())
                    .and_then(|r| r.strip_prefix('/'))
                {
                    rest.to_string()
                } else {
                    format!("/{key}")
                }
            }
            Origin::Local { cwd: None } => format!("/{key}"),
            Origin::Remote { base } => format!("{base}/{key}"),
        }
    }

    pub fn display_path(&self, path: &Path) -> String {
        self.display_key(path.as_ref())
    }

    pub fn display(&self) -> String {
        self.display_key(&self.key)
    }

    pub fn is_local(&self) -> bool {
        matches!(self.origin, Origin::Local { .. })
    }

    /// The filesystem path of a key (only meaningful for local locations).
    pub fn local_path(&self, key: &str) -> PathBuf {
        PathBuf::from(format!("/{key}"))
    }

    /// Key of the directory holding this key ("" for the root).
    pub fn parent_key(&self) -> String {
        match self.key.rsplit_once('/') {
            Some((dir, _)) => dir.to_string(),
            None => String::new(),
        }
    }
}

pub(crate) fn key_to_path(key: &str, shown: &str) -> Result<Path, IoError> {
    Path::parse(key).map_err(|e| IoError::InvalidLocation {
        location: shown.to_string(),
        message: e.to_string(),
    })
}

/// Resolves a location string to a store and key. Builds (or reuses) the store.
pub fn resolve(location: &str) -> Result<Resolved, IoError> {
    let invalid = |message: String| IoError::InvalidLocation {
        location: location.to_string(),
        message,
    };
    if location.is_empty() {
        return Err(invalid("empty path".into()));
    }
    let Some((scheme, rest)) = split_scheme(location) else {
        return resolve_local(location, location);
    };
    let scheme = scheme.to_ascii_lowercase();
    if scheme == "file" {
        let rest = rest.strip_prefix("localhost").unwrap_or(rest);
        if !rest.starts_with('/') {
            return Err(invalid(
                "file:// URLs must hold an absolute path (file:///...)".into(),
            ));
        }
        return resolve_local(rest, location);
    }
    let canonical_scheme = match scheme.as_str() {
        "s3" | "s3a" => "s3",
        "gs" => "gs",
        "az" | "azure" | "adl" | "abfs" | "abfss" => scheme.as_str(),
        "memory" => "memory",
        other => {
            return Err(invalid(format!(
                "unsupported scheme {other}:// (use a local path, file://, s3://, gs://, az://, abfs:// or memory://)"
            )));
        }
    };
    let (authority, key) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty() {
        return Err(invalid("missing bucket/container name".into()));
    }
    let key = normalize_remote_key(key).map_err(invalid)?;
    let base = format!("{scheme}://{authority}");
    let store = cached_store(canonical_scheme, authority, &base).map_err(invalid)?;
    Ok(Resolved {
        store,
        key,
        origin: Origin::Remote { base },
    })
}

/// Splits `scheme://rest` when the text before `://` looks like a URL scheme.
fn split_scheme(location: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = location.split_once("://")?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    let valid = first.is_ascii_alphabetic()
        && scheme.len() >= 2
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then_some((scheme, rest))
}

fn resolve_local(path: &str, shown: &str) -> Result<Resolved, IoError> {
    let invalid = |message: String| IoError::InvalidLocation {
        location: shown.to_string(),
        message,
    };
    let p = std::path::Path::new(path);
    let (absolute, relative) = if p.is_absolute() {
        (p.to_path_buf(), false)
    } else {
        let cwd = std::env::current_dir()
            .map_err(|e| invalid(format!("cannot read current directory: {e}")))?;
        (cwd.join(p), true)
    };
    let key = normalize_fs_path(&absolute).map_err(invalid)?;
    let cwd = if relative {
        let cwd = std::env::current_dir()
            .map_err(|e| invalid(format!("cannot read current directory: {e}")))?;
        Some(normalize_fs_path(&cwd).map_err(invalid)?)
    } else {
        None
    };
    Ok(Resolved {
        store: local_store(),
        key,
        origin: Origin::Local { cwd },
    })
}

/// Lexically normalises an absolute filesystem path into a key (`.`/`..` resolved).
fn normalize_fs_path(path: &std::path::Path) -> Result<String, String> {
    let mut segments: Vec<&str> = Vec::new();
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                segments.pop();
            }
            Component::Normal(s) => {
                segments.push(
                    s.to_str()
                        .ok_or_else(|| format!("path {path:?} is not UTF-8"))?,
                );
            }
            Component::Prefix(_) => return Err("Windows path prefixes are not supported".into()),
        }
    }
    Ok(segments.join("/"))
}

fn normalize_remote_key(key: &str) -> Result<String, String> {
    let mut segments = Vec::new();
    for segment in key.split('/') {
        match segment {
            "" => {}
            "." | ".." => {
                return Err(format!(
                    "'{segment}' path segments are not allowed in object store keys"
                ));
            }
            s => segments.push(s),
        }
    }
    Ok(segments.join("/"))
}

fn local_store() -> Arc<dyn ObjectStore> {
    static LOCAL: LazyLock<Arc<dyn ObjectStore>> =
        LazyLock::new(|| Arc::new(LocalFileSystem::new()));
    Arc::clone(&LOCAL)
}

fn cached_store(scheme: &str, authority: &str, base: &str) -> Result<Arc<dyn ObjectStore>, String> {
    static STORES: LazyLock<Mutex<HashMap<String, Arc<dyn ObjectStore>>>> =
        LazyLock::new(Default::default);
    let cache_key = format!("{scheme}://{authority}");
    let mut stores = STORES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(store) = stores.get(&cache_key) {
        return Ok(Arc::clone(store));
    }
    let store: Arc<dyn ObjectStore> = match scheme {
        "s3" => Arc::new(
            AmazonS3Builder::from_env()
                .with_url(format!("s3://{authority}"))
                .build()
                .map_err(|e| e.to_string())?,
        ),
        "gs" => Arc::new(
            GoogleCloudStorageBuilder::from_env()
                .with_url(format!("gs://{authority}"))
                .build()
                .map_err(|e| e.to_string())?,
        ),
        "memory" => Arc::new(InMemory::new()),
        _ => Arc::new(
            MicrosoftAzureBuilder::from_env()
                .with_url(base)
                .build()
                .map_err(|e| e.to_string())?,
        ),
    };
    stores.insert(cache_key, Arc::clone(&store));
    Ok(store)
}

fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '[', '{'])
}

fn compile_glob(pattern: &str, shown: &str) -> Result<GlobMatcher, IoError> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| IoError::InvalidLocation {
            location: shown.to_string(),
            message: format!("bad glob: {e}"),
        })
}

/// The part of `key` below `base` ("" base means the whole key).
fn relative_to<'a>(key: &'a str, base: &str) -> &'a str {
    if base.is_empty() {
        key
    } else {
        key.strip_prefix(base)
            .and_then(|r| r.strip_prefix('/'))
            .unwrap_or(key)
    }
}

/// Expands a read location into the sorted list of objects it names.
pub(crate) async fn expand(location: &str) -> Result<(Resolved, Vec<ObjectMeta>), IoError> {
    let resolved = resolve(location)?;
    let shown = location.to_string();
    let mut files = if has_glob(&resolved.key) {
        expand_glob(&resolved, &shown).await?
    } else {
        expand_plain(&resolved, &shown).await?
    };
    if files.is_empty() {
        return Err(IoError::NoMatch { location: shown });
    }
    files.sort_by(|a, b| a.location.as_ref().cmp(b.location.as_ref()));
    files.dedup_by(|a, b| a.location == b.location);
    Ok((resolved, files))
}

async fn expand_glob(resolved: &Resolved, shown: &str) -> Result<Vec<ObjectMeta>, IoError> {
    let segments: Vec<&str> = resolved.key.split('/').collect();
    let first_glob = segments.iter().position(|s| has_glob(s)).unwrap_or(0);
    let base = segments[..first_glob].join("/");
    let full = compile_glob(&resolved.key, shown)?;
    let store = &resolved.store;
    let pattern_segments = &segments[first_glob..];
    let in_temp = |key: &str| {
        relative_to(key, &base)
            .split('/')
            .any(|c| c.starts_with(TEMP_DIR_PREFIX))
    };

    let mut files = Vec::new();
    if pattern_segments.iter().any(|s| s.contains("**")) {
        // Unbounded depth: one recursive listing of the literal prefix.
        let prefix = key_to_path(&base, shown)?;
        let listed: Vec<ObjectMeta> = store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| IoError::store("list", shown, e))?;
        files.extend(
            listed
                .into_iter()
                .filter(|m| full.is_match(m.location.as_ref()) && !in_temp(m.location.as_ref())),
        );
    } else {
        // Fixed depth: walk level by level so `data/*.csv` never lists below `data/`.
        let mut dirs = vec![key_to_path(&base, shown)?];
        for (depth, segment) in pattern_segments.iter().enumerate() {
            let last = depth + 1 == pattern_segments.len();
            let matcher = compile_glob(segment, shown)?;
            let mut next = Vec::new();
            for dir in &dirs {
                let listing = match store.list_with_delimiter(Some(dir)).await {
                    Ok(listing) => listing,
                    Err(object_store::Error::NotFound { .. }) => continue,
                    Err(e) => return Err(IoError::store("list", shown, e)),
                };
                if last {
                    files.extend(listing.objects.into_iter().filter(|m| {
                        m.location.filename().is_some_and(|f| matcher.is_match(f))
                            && full.is_match(m.location.as_ref())
                    }));
                } else {
                    next.extend(listing.common_prefixes.into_iter().filter(|p| {
                        p.filename()
                            .is_some_and(|f| matcher.is_match(f) && !f.starts_with(TEMP_DIR_PREFIX))
                    }));
                }
            }
            next.sort();
            dirs = next;
        }
    }
    Ok(files)
}

async fn expand_plain(resolved: &Resolved, shown: &str) -> Result<Vec<ObjectMeta>, IoError> {
    let store = &resolved.store;
    let path = resolved.path()?;
    let is_dir = if resolved.is_local() {
        match tokio::fs::metadata(resolved.local_path(&resolved.key)).await {
            Ok(meta) => meta.is_dir(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(IoError::local("stat", shown, e)),
        }
    } else if resolved.key.is_empty() {
        true
    } else {
        match store.head(&path).await {
            Ok(meta) => return Ok(vec![meta]),
            Err(object_store::Error::NotFound { .. }) => true,
            Err(e) => return Err(IoError::store("stat", shown, e)),
        }
    };
    if !is_dir {
        let meta = store
            .head(&path)
            .await
            .map_err(|e| IoError::store("stat", shown, e))?;
        return Ok(vec![meta]);
    }
    // A directory (or object-store prefix): every non-hidden file below it.
    let listed: Vec<ObjectMeta> = store
        .list(Some(&path))
        .try_collect()
        .await
        .map_err(|e| IoError::store("list", shown, e))?;
    let base = resolved.key.as_str();
    Ok(listed
        .into_iter()
        .filter(|m| {
            relative_to(m.location.as_ref(), base)
                .split('/')
                .all(|c| !c.starts_with('.') && !c.starts_with('_'))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(dir: &std::path::Path, rel: &str, contents: &str) {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, contents).expect("write");
    }

    fn names(files: &[LocatedFile], dir: &std::path::Path) -> Vec<String> {
        let root = format!("{}/", dir.display());
        files
            .iter()
            .map(|f| {
                f.location
                    .strip_prefix(&root)
                    .unwrap_or(&f.location)
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn normalises_local_paths() {
        let r = resolve("/a/./b/../c.csv").expect("resolve");
        assert_eq!(r.key, "a/c.csv");
        assert_eq!(r.display(), "/a/c.csv");
        let r = resolve("file:///x/y.parquet").expect("resolve");
        assert_eq!(r.key, "x/y.parquet");
        let r = resolve("rel/dir/f.txt").expect("resolve");
        assert_eq!(r.display(), "rel/dir/f.txt");
        assert!(r.is_local());
    }

    #[test]
    fn parses_urls() {
        let r = resolve("memory://bucket/trips//2024-*.parquet").expect("resolve");
        assert_eq!(r.key, "trips/2024-*.parquet");
        assert_eq!(r.display(), "memory://bucket/trips/2024-*.parquet");
        let err = resolve("ftp://x/y").expect_err("unsupported");
        assert!(err.to_string().contains("ftp://x/y"), "{err}");
        let err = resolve("s3:///key").expect_err("no bucket");
        assert!(
            err.to_string().contains("missing bucket/container name"),
            "{err}"
        );
        // Building an S3 store talks to no one; credentials are looked up lazily.
        let r = resolve("s3://my-bucket/trips/*.parquet").expect("s3");
        assert_eq!(r.key, "trips/*.parquet");
        assert_eq!(
            r.display_key("trips/a.parquet"),
            "s3://my-bucket/trips/a.parquet"
        );
        let again = resolve("s3://my-bucket/other").expect("s3");
        assert!(
            Arc::ptr_eq(&r.store, &again.store),
            "stores are cached per bucket"
        );
    }

    #[tokio::test]
    async fn expands_globs_sorted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        for f in [
            "data/b.parquet",
            "data/a.parquet",
            "data/c.csv",
            "data/sub/d.parquet",
            "data/sub/deep/e.parquet",
        ] {
            touch(d, f, "x");
        }
        touch(d, "data/.temp-riverbank-job/part-00000.parquet", "x");
        let base = d.display();

        let files = list_files(&format!("{base}/data/*.parquet"))
            .await
            .expect("glob");
        assert_eq!(names(&files, d), ["data/a.parquet", "data/b.parquet"]);

        let files = list_files(&format!("{base}/data/**/*.parquet"))
            .await
            .expect("glob");
        assert_eq!(
            names(&files, d),
            [
                "data/a.parquet",
                "data/b.parquet",
                "data/sub/d.parquet",
                "data/sub/deep/e.parquet"
            ]
        );

        let files = list_files(&format!("{base}/data/*/*.parquet"))
            .await
            .expect("glob");
        assert_eq!(names(&files, d), ["data/sub/d.parquet"]);

        let files = list_files(&format!("{base}/data/[ab].parquet"))
            .await
            .expect("glob");
        assert_eq!(names(&files, d), ["data/a.parquet", "data/b.parquet"]);

        let files = list_files(&format!("{base}/data/?.csv"))
            .await
            .expect("glob");
        assert_eq!(names(&files, d), ["data/c.csv"]);
        assert_eq!(files[0].size, 1);

        let err = list_files(&format!("{base}/data/*.json"))
            .await
            .expect_err("no match");
        assert_eq!(
            err.to_string(),
            format!("no files match {base}/data/*.json")
        );
    }

    #[tokio::test]
    async fn plain_files_and_directories() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        touch(d, "out/part-1.csv", "x");
        touch(d, "out/part-0.csv", "x");
        touch(d, "out/_SUCCESS", "");
        touch(d, "out/.temp-riverbank-x/p.csv", "x");
        let base = d.display();

        let files = list_files(&format!("{base}/out/part-1.csv"))
            .await
            .expect("file");
        assert_eq!(names(&files, d), ["out/part-1.csv"]);

        let files = list_files(&format!("{base}/out")).await.expect("dir");
        assert_eq!(names(&files, d), ["out/part-0.csv", "out/part-1.csv"]);

        let err = list_files(&format!("{base}/missing.csv"))
            .await
            .expect_err("missing");
        assert!(err.to_string().contains("missing.csv"), "{err}");

        std::fs::create_dir_all(d.join("empty")).expect("mkdir");
        let err = list_files(&format!("{base}/empty"))
            .await
            .expect_err("empty dir");
        assert!(matches!(err, IoError::NoMatch { .. }), "{err}");
    }

    #[tokio::test]
    async fn memory_store_globs() {
        let r = resolve("memory://globs/x").expect("resolve");
        for key in [
            "t/2024-01.parquet",
            "t/2024-02.parquet",
            "t/2023-12.parquet",
            "t/x/2024-03.parquet",
        ] {
            r.store
                .put(&Path::from(key), b"abc".to_vec().into())
                .await
                .expect("put");
        }
        let files = list_files("memory://globs/t/2024-*.parquet")
            .await
            .expect("glob");
        let locs: Vec<_> = files.iter().map(|f| f.location.as_str()).collect();
        assert_eq!(
            locs,
            [
                "memory://globs/t/2024-01.parquet",
                "memory://globs/t/2024-02.parquet"
            ]
        );
        let files = list_files("memory://globs/t").await.expect("prefix");
        assert_eq!(files.len(), 4);
    }
}
