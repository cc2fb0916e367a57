//! What a process tells the outside: Prometheus metrics (prometheus-client's text encoding of
//! a registry built at scrape time from the live counters) and its own CPU and memory use.
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

/// One sample to export.
pub struct Sample {
    pub name: &'static str,
    pub help: &'static str,
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

impl Sample {
    pub fn new(name: &'static str, help: &'static str, value: f64) -> Self {
        Sample {
            name,
            help,
            labels: vec![],
            value,
        }
    }
    pub fn label(mut self, k: &'static str, v: impl Into<String>) -> Self {
        self.labels.push((k, v.into()));
        self
    }
}

type GaugeFamily = Family<Vec<(String, String)>, Gauge<f64, AtomicU64>>;
type Labelled = Vec<(Vec<(String, String)>, f64)>;

/// Encodes samples in the Prometheus text format, families grouped by name (in first-seen
/// order); a name with one unlabelled sample is a plain gauge.
pub fn encode_samples(samples: Vec<Sample>) -> String {
    let mut groups: Vec<(&'static str, &'static str, Labelled)> = vec![];
    for s in samples {
        let labels = s
            .labels
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        match groups.iter_mut().find(|(n, ..)| *n == s.name) {
            Some(g) => g.2.push((labels, s.value)),
            None => groups.push((s.name, s.help, vec![(labels, s.value)])),
        }
    }
    let mut registry = Registry::with_prefix("riverbank");
    for (name, help, values) in groups {
        // prometheus-client ends help texts with a period itself.
        let help = help.trim_end_matches('.');
        if let [(labels, v)] = values.as_slice()
            && labels.is_empty()
        {
            let g: Gauge<f64, AtomicU64> = Gauge::default();
            g.set(*v);
            registry.register(name, help, g);
        } else {
            let fam = GaugeFamily::default();
            for (labels, v) in values {
                fam.get_or_create(&labels).set(v);
            }
            registry.register(name, help, fam);
        }
    }
    let mut out = String::new();
    let _ = encode(&mut out, &registry);
    out
}

/// CPU use of this process between calls, as a fraction of `cores`.
pub struct CpuMeter {
    last: Option<(Instant, f64)>,
    cores: f64,
}

impl CpuMeter {
    pub fn new(cores: usize) -> Self {
        CpuMeter {
            last: None,
            cores: cores.max(1) as f64,
        }
    }

    pub fn sample(&mut self) -> f64 {
        let now = Instant::now();
        let Some(cpu) = process_cpu_seconds() else {
            return 0.0;
        };
        let frac = match self.last {
            Some((t, c)) if now > t => (cpu - c) / now.duration_since(t).as_secs_f64() / self.cores,
            _ => 0.0,
        };
        self.last = Some((now, cpu));
        frac.clamp(0.0, 1.0)
    }
}

/// User + system CPU seconds of this process (Linux /proc; None elsewhere).
pub fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks / if hz > 0 { hz as f64 } else { 100.0 })
}

/// Resident memory of this process in bytes (Linux /proc; 0 elsewhere).
pub fn rss_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse::<u64>().ok())
        .map(|p| p * page)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_families_with_labels() {
        let text = encode_samples(vec![
            Sample::new("work_items_done", "Work items finished.", 3.0),
            Sample::new("stage_elements_out", "Elements out of a stage.", 10.0)
                .label("stage", "S01"),
            Sample::new("stage_elements_out", "Elements out of a stage.", 5.0)
                .label("stage", "S02"),
        ]);
        assert!(
            text.contains("# HELP riverbank_work_items_done Work items finished."),
            "{text}"
        );
        assert!(text.contains("riverbank_work_items_done 3.0\n"), "{text}");
        assert!(
            text.contains("riverbank_stage_elements_out{stage=\"S01\"} 10"),
            "{text}"
        );
        assert!(
            text.contains("riverbank_stage_elements_out{stage=\"S02\"} 5"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn reads_its_own_cpu_and_memory() {
        // A 4 MiB buffer touched page by page is resident.
        let before = rss_bytes();
        let buf = std::hint::black_box(vec![1u8; 4 << 20]);
        assert!(
            rss_bytes() >= before + (3 << 20),
            "{before} -> {}",
            rss_bytes()
        );
        drop(buf);
        // Busy until this process has used 100 ms of CPU (however loaded the machine is):
        // the meter reads a share of a core above nothing. (The clock ticks at 100 Hz.)
        let mut m = CpuMeter::new(1);
        assert_eq!(m.sample(), 0.0, "no interval yet");
        let used = process_cpu_seconds().unwrap();
        let start = Instant::now();
        let mut x = 0u64;
        while process_cpu_seconds().unwrap() < used + 0.1
            && start.elapsed() < std::time::Duration::from_secs(20)
        {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
            }
        }
        let busy = m.sample();
        assert!(busy > 0.0, "a busy core read as {busy}");
        // Asleep: nearly nothing.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let idle = m.sample();
        assert!(idle < busy, "asleep {idle}, busy {busy}");
    }
}
