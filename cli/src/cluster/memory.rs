//! `run --workers N --memory-mb M`: each worker process has M MiB, enforced as a pod's memory
//! limit is: a worker whose resident memory goes over it is killed (SIGKILL, as the kernel's OOM
//! killer does). Then, as the operator's vertical autoscaling does (`operator/src/memory.rs`,
//! with the same steps), the workers' memory grows a step, up to `--max-memory-mb`; the killed
//! worker starts again at the new size and its work items run again.
use riverbank_autoscale::memory::step_up;

const MIB: u64 = 1 << 20;

/// The workers' memory limit and how far it may grow.
pub struct MemoryLimit {
    current: u64,
    max: u64,
}

/// What was done about a worker over its limit.
pub struct MemoryDecision {
    pub worker: String,
    pub rss: u64,
    pub from: u64,
    pub to: u64,
    pub max: u64,
}

impl MemoryDecision {
    /// The line `riverbank run` prints, and the console's Event message.
    pub fn describe(&self) -> String {
        let mb = |b: u64| b.div_ceil(MIB);
        let killed = format!(
            "{} was killed at {} MiB, over its {} MiB memory limit (OOMKilled)",
            self.worker,
            mb(self.rss),
            mb(self.from)
        );
        if self.to > self.from {
            format!(
                "{killed}; workers' memory {} -> {} MiB (maximum {} MiB); its work items run again on the bigger worker",
                mb(self.from),
                mb(self.to),
                mb(self.max)
            )
        } else {
            format!(
                "{killed}; workers' memory is at its maximum ({} MiB): restarted at the same size",
                mb(self.max)
            )
        }
    }
}

impl MemoryLimit {
    /// `memory_mb` per worker, growing up to `max_memory_mb` (default: no growth).
    pub fn new(memory_mb: usize, max_memory_mb: Option<usize>) -> MemoryLimit {
        let current = memory_mb.max(1) as u64 * MIB;
        MemoryLimit {
            current,
            max: max_memory_mb.map_or(current, |m| (m as u64 * MIB).max(current)),
        }
    }

    /// A worker whose resident memory is over the limit: its resident bytes.
    pub fn over(&self, pid: u32) -> Option<u64> {
        rss_of(pid).filter(|rss| *rss > self.current)
    }

    /// After `worker` was killed at `rss`: a step up, within the maximum.
    pub fn killed(&mut self, worker: &str, rss: u64) -> MemoryDecision {
        let from = self.current;
        self.current = step_up(from).min(self.max).max(from);
        MemoryDecision {
            worker: worker.into(),
            rss,
            from,
            to: self.current,
            max: self.max,
        }
    }
}

/// Resident memory of a process in bytes (Linux /proc; None when it is gone or elsewhere).
pub fn rss_of(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    statm
        .split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|p| p * page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_by_the_operators_step_up_to_the_maximum() {
        let mut m = MemoryLimit::new(100, Some(300));
        let d = m.killed("worker-0", 150 * MIB);
        assert_eq!((d.from, d.to), (100 * MIB, 256 * MIB));
        assert!(d.describe().contains("100 -> 256 MiB"), "{}", d.describe());
        let d = m.killed("worker-0", 260 * MIB);
        assert_eq!((d.from, d.to), (256 * MIB, 300 * MIB));
        let d = m.killed("worker-1", 310 * MIB);
        assert_eq!(d.to, 300 * MIB);
        assert!(d.describe().contains("at its maximum"), "{}", d.describe());
        assert_eq!(MemoryLimit::new(64, None).killed("w", 0).to, 64 * MIB);
    }

    #[test]
    fn reads_a_real_process_resident_memory() {
        let rss = rss_of(std::process::id()).unwrap();
        assert!(rss > MIB, "{rss}");
        let pid = std::process::id();
        assert!(MemoryLimit::new(1, None).over(pid).is_some());
        assert!(MemoryLimit::new(1 << 20, None).over(pid).is_none());
        assert!(rss_of(u32::MAX).is_none());
    }
}
