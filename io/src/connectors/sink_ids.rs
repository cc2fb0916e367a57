//! The ids a sink stamps on every record it writes (job, epoch, index of the record within the
//! epoch's records for its partition), so that a retried epoch can tell which of its records
//! are already in the log: the exactly-once key of both sinks.

use super::LogRecord;

pub const JOB: &str = "riverbank-job";
pub const EPOCH: &str = "riverbank-epoch";
pub const INDEX: &str = "riverbank-index";

/// The headers of record `index` of `epoch`.
pub fn headers(job_id: &str, epoch: u64, index: u64) -> [(&'static str, String); 3] {
    [
        (JOB, job_id.to_string()),
        (EPOCH, epoch.to_string()),
        (INDEX, index.to_string()),
    ]
}

/// `(epoch, index)` of a record this job wrote; `None` for anyone else's record.
pub fn written_by(r: &LogRecord, job_id: &str) -> Option<(u64, u64)> {
    let get = |name: &str| {
        r.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    };
    if get(JOB)? != job_id.as_bytes() {
        return None;
    }
    let num = |v: &[u8]| std::str::from_utf8(v).ok()?.parse::<u64>().ok();
    Some((num(get(EPOCH)?)?, num(get(INDEX)?)?))
}

/// What a backward scan of a log's tail learnt about epoch `epoch`.
#[derive(Debug, Default)]
pub struct TailScan {
    /// Indices of this epoch already in the log.
    pub present: std::collections::BTreeSet<u64>,
    /// Whether the scan reached a record of an earlier epoch of this job (or the log's start):
    /// nothing of this epoch can be further back.
    pub done: bool,
}

impl TailScan {
    /// Takes in a chunk of the log read backwards (the chunk itself in offset order).
    pub fn scan(&mut self, chunk: &[LogRecord], job_id: &str, epoch: u64) {
        for r in chunk {
            match written_by(r, job_id) {
                Some((e, i)) if e == epoch => {
                    self.present.insert(i);
                }
                // Epochs are committed in order: an earlier one marks where this one began.
                Some((e, _)) if e < epoch => self.done = true,
                _ => {}
            }
        }
    }
}
