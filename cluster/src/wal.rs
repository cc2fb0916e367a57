//! The coordinator's write-ahead log: one JSON event per line, written before the coordinator
//! answers the request that caused it (a killed coordinator process loses nothing written:
//! it is in the kernel). It is synced to disk before anything outside the log depends on it —
//! the sinks' commit — and for the job's own transitions, not for every item report: a
//! machine that crashes loses at most the reports since the last sync, and those items run
//! again (the log is sequential, so a report that survives has every event before it).
//! Replayed on start, it gives back the job's progress; a torn last line (a crash mid-write)
//! is ignored.
use riverbank_engine::tracker::Event;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

pub struct Wal {
    path: PathBuf,
    file: File,
}

impl Wal {
    /// Opens (creating) the log under `dir` and returns the events already in it.
    pub fn open(dir: &Path) -> std::io::Result<(Wal, Vec<Event>)> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("coordinator.wal");
        let mut events = vec![];
        let mut good_len = 0u64;
        if let Ok(f) = File::open(&path) {
            let mut reader = BufReader::new(f);
            let mut line = String::new();
            loop {
                line.clear();
                let n = reader.read_line(&mut line)?;
                if n == 0 || !line.ends_with('\n') {
                    break;
                }
                match serde_json::from_str::<Event>(line.trim_end()) {
                    Ok(e) => {
                        events.push(e);
                        good_len += n as u64;
                    }
                    Err(e) => {
                        tracing::warn!(path = %path.display(), "ignoring the log from a bad line on: {e}");
                        break;
                    }
                }
            }
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        // Drop a torn tail so new events follow the last whole one.
        file.set_len(good_len)?;
        let mut wal = Wal { path, file };
        use std::io::Seek;
        wal.file.seek(std::io::SeekFrom::End(0))?;
        Ok((wal, events))
    }

    /// Appends `events`; synced at once unless they are only item progress (completions,
    /// splits, invalidations, coalesced partitions), which the next sync makes durable with
    /// everything before it.
    pub fn append(&mut self, events: &[Event]) -> std::io::Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::new();
        for e in events {
            serde_json::to_writer(&mut buf, e)?;
            buf.push(b'\n');
        }
        self.file.write_all(&buf)?;
        let progress_only = events.iter().all(|e| {
            matches!(
                e,
                Event::Completed { .. }
                    | Event::Split { .. }
                    | Event::Invalidated { .. }
                    | Event::Coalesced { .. }
            )
        });
        if progress_only { Ok(()) } else { self.sync() }
    }

    /// Makes everything appended so far durable.
    pub fn sync(&mut self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_whole_events_and_drops_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut w, old) = Wal::open(dir.path()).unwrap();
            assert!(old.is_empty());
            w.append(&[Event::Started { epoch: 1 }, Event::Invalidated { item: 3 }])
                .unwrap();
        }
        // A crash in the middle of the next line.
        let path = dir.path().join("coordinator.wal");
        let mut text = std::fs::read(&path).unwrap();
        text.extend_from_slice(b"{\"Invalidated\":{\"ite");
        std::fs::write(&path, text).unwrap();
        let (mut w, events) = Wal::open(dir.path()).unwrap();
        assert_eq!(
            events,
            vec![Event::Started { epoch: 1 }, Event::Invalidated { item: 3 }]
        );
        w.append(&[Event::Cancelled]).unwrap();
        let (_, events) = Wal::open(dir.path()).unwrap();
        assert_eq!(events.len(), 3);
        assert_eq!(events[2], Event::Cancelled);
    }
}
