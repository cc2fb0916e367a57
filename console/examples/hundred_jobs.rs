//! How fast the console answers with 100 jobs whose charts are full (900 samples each, 8
//! workers, 3 stages): fills a `Console`, serves it on loopback, and times GETs of the job list
//! and of a job page over real HTTP.
//!
//!     cargo run --release -p riverbank-console --example hundred_jobs
use riverbank_console::{Console, Observation, serve};
use riverbank_pipeline::{JobPhase, JobProgress, StageProgress, WorkerProgress};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Instant;

fn progress(i: u64) -> JobProgress {
    JobProgress {
        job_name: "j".into(),
        phase: JobPhase::Running,
        message: "running".into(),
        failure: None,
        started_at: None,
        finished_at: None,
        work_items_total: 100,
        work_items_done: i % 100,
        work_items_running: 8,
        fraction_consumed: 0.5,
        remaining_bytes: 1 << 30,
        throughput_bytes_per_sec: 1e8,
        throughput_elements_per_sec: 1e6,
        backlog_seconds: Some(10.0),
        active_keys: None,
        runnable_items: 4,
        splittable_items: 0,
        workers: (0..8)
            .map(|w| WorkerProgress {
                name: format!("worker-{w}"),
                alive: true,
                cpu: 0.8,
                rss_bytes: 1 << 30,
                ..Default::default()
            })
            .collect(),
        stages: (0..3)
            .map(|s| StageProgress {
                index: s,
                name: format!("S{s:02}"),
                state: "Running".into(),
                bytes_in: i * 1000,
                elements_in: i * 10,
                ..Default::default()
            })
            .collect(),
        work_items: vec![],
        streaming: None,
    }
}

fn get(addr: std::net::SocketAddr, path: &str) -> usize {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    out.len()
}

fn main() {
    let console = Arc::new(Console::new());
    let fill = Instant::now();
    for j in 0..100 {
        for i in 0..900u64 {
            let o = Observation {
                state: "Running".into(),
                current_workers: 8,
                target_workers: 8,
                progress: Some(progress(i)),
                ..Default::default()
            };
            console.observe_at("ns", &format!("job-{j:03}"), o, i as f64);
        }
    }
    println!("90 000 observations stored in {:?}", fill.elapsed());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (addr, server) = rt
        .block_on(serve("127.0.0.1:0".parse().unwrap(), console))
        .unwrap();
    rt.spawn(server);
    for (what, path) in [
        ("job list", "/api/jobs"),
        ("job page", "/api/jobs/ns/job-042"),
    ] {
        let n = 50;
        let t = Instant::now();
        let mut bytes = 0;
        for _ in 0..n {
            bytes = get(addr, path);
        }
        println!(
            "{what}: {:.2} ms per GET, {} KiB",
            t.elapsed().as_secs_f64() * 1000.0 / n as f64,
            bytes / 1024
        );
    }
}
