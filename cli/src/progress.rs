//! Live progress on a terminal, and the end-of-run summary.
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use riverbank_engine::{Metrics, RunSummary};
use std::sync::Arc;
use std::time::Duration;

pub struct Live {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Live {
    pub fn start(metrics: Arc<Metrics>, stages: Vec<String>) -> Live {
        let (stop, mut rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mp = MultiProgress::new();
            let read = mp.add(ProgressBar::new(0));
            read.set_style(
                ProgressStyle::with_template("{spinner} read {bar:30} {pos}/{len} splits  {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            let stage_line = mp.add(ProgressBar::new_spinner());
            loop {
                let m = &metrics;
                read.set_length(Metrics::get(&m.splits_total));
                read.set_position(Metrics::get(&m.splits_done));
                read.set_message(format!(
                    "{} rows, {}",
                    Metrics::get(&m.rows_read),
                    human_bytes(Metrics::get(&m.bytes_read))
                ));
                let parts: Vec<String> = stages
                    .iter()
                    .zip(&m.stages)
                    .map(|(id, s)| {
                        let state = match Metrics::get(&s.state) {
                            0 => "pending",
                            1 => "running",
                            _ => "done",
                        };
                        format!("{id} {state} {}b", Metrics::get(&s.bundles))
                    })
                    .collect();
                stage_line.set_message(parts.join("  "));
                stage_line.tick();
                tokio::select! {
                    _ = &mut rx => break,
                    _ = tokio::time::sleep(Duration::from_millis(150)) => {}
                }
            }
            read.finish_and_clear();
            stage_line.finish_and_clear();
        });
        Live { stop, task }
    }

    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

pub fn print_summary(s: &RunSummary, m: &Metrics) {
    let width = s
        .elements_out
        .iter()
        .map(|(n, _)| n.len())
        .max()
        .unwrap_or(10)
        .max(9);
    eprintln!("{:<width$}  {:>12}", "transform", "elements");
    for (name, n) in &s.elements_out {
        eprintln!("{name:<width$}  {n:>12}");
    }
    for (sink, files) in &s.files {
        eprintln!("{sink}: committed {}", files.join(", "));
    }
    let rows = Metrics::get(&m.rows_read);
    let secs = s.wall.as_secs_f64();
    eprintln!(
        "done in {:.3}s: read {} rows ({}), {:.0} rows/s{}",
        secs,
        rows,
        human_bytes(Metrics::get(&m.bytes_read)),
        if secs > 0.0 { rows as f64 / secs } else { 0.0 },
        match Metrics::get(&m.spills) {
            0 => String::new(),
            n => format!(", {n} combine spills"),
        }
    );
}
