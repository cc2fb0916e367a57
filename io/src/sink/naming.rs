//! Final file names and temp names of a sink.
//!
//! Final names are `{prefix}{shard_name_template}{suffix}`; in the template a run
//! of `S` is the zero-padded shard index and a run of `N` the zero-padded shard
//! count, default `-SSSSS-of-NNNNN`. A template without `S` names a single file
//! (so an empty template gives exactly `{prefix}{suffix}`). As in Beam, the path is the
//! prefix and the suffix is `file_name_suffix` (default none): `out/zones.jsonl` →
//! `out/zones.jsonl-00000-of-00001`, so globs written for Beam's files find Riverbank's.

use std::sync::atomic::{AtomicU64, Ordering};

use super::super::IoError;
use super::super::location::{Resolved, TEMP_DIR_PREFIX, resolve};
use super::{DEFAULT_SHARD_TEMPLATE, WriteOptions};

/// How final file names are formed.
#[derive(Clone, Debug)]
pub(super) struct Naming {
    pub prefix: String,
    template: String,
    pub suffix: String,
}

impl Naming {
    pub(super) fn new(opts: &WriteOptions) -> Result<Self, IoError> {
        if opts.path.is_empty() {
            return Err(IoError::SinkOptions {
                location: opts.path.clone(),
                message: "the output path is empty".into(),
            });
        }
        let template = opts
            .shard_name_template
            .clone()
            .unwrap_or_else(|| DEFAULT_SHARD_TEMPLATE.to_string());
        Ok(Naming {
            prefix: opts.path.clone(),
            template,
            suffix: opts.file_name_suffix.clone().unwrap_or_default(),
        })
    }

    fn has_shard_placeholder(&self) -> bool {
        has_shard_placeholder(&self.template)
    }

    pub(super) fn shard_count(
        &self,
        requested: Option<usize>,
        parts: usize,
    ) -> Result<usize, IoError> {
        let requested = requested.filter(|&n| n > 0);
        if !self.has_shard_placeholder() {
            return match requested {
                None | Some(1) => Ok(1),
                Some(n) => Err(IoError::SinkOptions {
                    location: self.prefix.clone(),
                    message: format!(
                        "shard_name_template {:?} has no S placeholder, so only one file can be written, but num_shards is {n}",
                        self.template
                    ),
                }),
            };
        }
        Ok(requested.unwrap_or(parts.max(1)))
    }

    /// Expands runs of `S`/`N` in the template; `digit` renders a run of `width` letters.
    fn expand(&self, mut digit: impl FnMut(char, usize) -> String) -> String {
        let mut out = String::new();
        let chars: Vec<char> = self.template.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if c == 'S' || c == 'N' {
                let run = chars[i..].iter().take_while(|&&x| x == c).count();
                out.push_str(&digit(c, run));
                i += run;
            } else {
                out.push(c);
                i += 1;
            }
        }
        out
    }

    pub(super) fn file_name(&self, shard: usize, shards: usize) -> String {
        let middle = self.expand(|c, width| {
            let value = if c == 'S' { shard } else { shards };
            format!("{value:0width$}")
        });
        format!("{}{middle}{}", self.prefix, self.suffix)
    }

    /// Glob over file names (not paths) matching any shard count, for stale files.
    pub(super) fn stale_name_glob(&self) -> Option<String> {
        if !self.has_shard_placeholder() || self.template.contains('/') || self.suffix.contains('/')
        {
            return None;
        }
        let name_prefix = match self.prefix.rfind('/') {
            Some(i) => &self.prefix[i + 1..],
            None => self.prefix.as_str(),
        };
        let middle = self.expand(|_, width| "?".repeat(width));
        let escaped_middle: String = {
            // Escape everything but the `?` placeholders.
            let mut s = String::new();
            let mut literal = String::new();
            for ch in middle.chars() {
                if ch == '?' {
                    s.push_str(&globset::escape(&literal));
                    literal.clear();
                    s.push('?');
                } else {
                    literal.push(ch);
                }
            }
            s.push_str(&globset::escape(&literal));
            s
        };
        Some(format!(
            "{}{escaped_middle}{}",
            globset::escape(name_prefix),
            globset::escape(&self.suffix)
        ))
    }

    /// The prefix resolved, plus the key of the directory it lives in.
    pub(super) fn dir(&self) -> Result<(Resolved, String), IoError> {
        let resolved = resolve(&self.prefix)?;
        let dir = if self.prefix.ends_with('/') {
            resolved.key.clone()
        } else {
            resolved.parent_key()
        };
        Ok((resolved, dir))
    }

    /// Temp directory for this sink within the job's temp directory.
    pub(super) fn temp_dir_key(&self, job_token: &str) -> Result<(Resolved, String), IoError> {
        let (resolved, dir) = self.dir()?;
        let name_prefix = if self.prefix.ends_with('/') {
            ""
        } else {
            self.prefix.rsplit('/').next().unwrap_or("")
        };
        let sink_name = sanitize(&format!("{name_prefix}{}", self.suffix));
        let sink_name = if sink_name.is_empty() {
            "_".to_string()
        } else {
            sink_name
        };
        let key = join_key(
            &dir,
            &format!("{TEMP_DIR_PREFIX}{}/{sink_name}", sanitize(job_token)),
        );
        Ok((resolved, key))
    }
}

pub(super) fn join_key(dir: &str, rest: &str) -> String {
    if dir.is_empty() {
        rest.to_string()
    } else {
        format!("{dir}/{rest}")
    }
}

/// Keeps names safe for every store: ASCII alphanumerics and `-_.`.
fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Distinguishes retries of the same part so they never overwrite each other.
pub(super) fn unique_tag() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{:x}{:x}{count:x}",
        std::process::id(),
        nanos & 0xffff_ffff_ffff
    )
}

/// Whether a shard name template can name more than one file (it has an `S` run).
pub fn has_shard_placeholder(template: &str) -> bool {
    template.contains('S')
}

#[cfg(test)]
mod tests {
    use super::super::super::FileFormat;
    use super::*;

    fn naming(path: &str, template: Option<&str>, suffix: Option<&str>) -> Naming {
        let mut opts = WriteOptions::new(FileFormat::Csv, path);
        opts.shard_name_template = template.map(str::to_string);
        opts.file_name_suffix = suffix.map(str::to_string);
        Naming::new(&opts).expect("naming")
    }

    #[test]
    fn names_follow_beam() {
        // The path is the prefix, extension and all, as Beam's file sinks take it.
        let n = naming("out/zones.jsonl", None, None);
        assert_eq!(n.file_name(0, 1), "out/zones.jsonl-00000-of-00001");
        assert_eq!(n.file_name(12, 300), "out/zones.jsonl-00012-of-00300");
        assert_eq!(
            naming("out/zones", None, Some(".json")).file_name(1, 2),
            "out/zones-00001-of-00002.json"
        );
        assert_eq!(
            naming("out/zones", None, None).file_name(0, 1),
            "out/zones-00000-of-00001"
        );
        assert_eq!(
            naming("out/zones", None, Some(".csv")).file_name(0, 1),
            "out/zones-00000-of-00001.csv"
        );
        assert_eq!(
            naming("out/z.csv", Some(""), None).file_name(0, 1),
            "out/z.csv"
        );
        assert_eq!(
            naming("out/z", Some("_SS_of_N"), Some(".txt")).file_name(3, 12),
            "out/z_03_of_12.txt"
        );
        assert_eq!(
            naming("out/.csv", None, None).file_name(0, 1),
            "out/.csv-00000-of-00001"
        );
    }

    #[test]
    fn shard_counts() {
        let n = naming("o", None, None);
        assert_eq!(n.shard_count(None, 0).expect("count"), 1);
        assert_eq!(n.shard_count(None, 4).expect("count"), 4);
        assert_eq!(n.shard_count(Some(0), 4).expect("count"), 4);
        assert_eq!(n.shard_count(Some(3), 4).expect("count"), 3);
        let single = naming("o", Some(""), None);
        assert_eq!(single.shard_count(None, 4).expect("count"), 1);
        let err = single.shard_count(Some(2), 4).unwrap_err();
        assert!(
            matches!(&err, IoError::SinkOptions { message, .. } if message.contains("no S placeholder") && message.contains("num_shards is 2")),
            "{err}"
        );
    }

    #[test]
    fn stale_glob() {
        let n = naming("out/x[1]", None, Some(".csv"));
        let glob = n.stale_name_glob().expect("glob");
        let m = globset::Glob::new(&glob).expect("glob").compile_matcher();
        assert!(m.is_match("x[1]-00000-of-00003.csv"));
        assert!(!m.is_match("x[1]-keep.csv"));
        assert!(!m.is_match("x1-00000-of-00003.csv"));
        assert!(
            naming("out/x.csv", Some(""), None)
                .stale_name_glob()
                .is_none()
        );
    }
}
