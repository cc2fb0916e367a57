//! A checkpoint's sink commit: connector sinks write the checkpoint's staged rows as one
//! epoch (`commit_connector`); file sinks move their temp parts into final names, one set of
//! shards per checkpoint for the global window (`{prefix}-cNNNNNNNN-SSSSS-of-NNNNN`) and one
//! per window and pane for windowed rows (`window_files`). Names depend only on the
//! checkpoint's plan and the record before it, so a replay overwrites what an interrupted
//! attempt moved instead of adding to it. Each set has as many files as its size calls for
//! (`runner_shards`), not one per shuffle partition.
use super::window_files::WindowPanes;
use riverbank_engine::compile::{CompiledPlan, CompiledTransform};
use riverbank_engine::error::RunError;
use riverbank_engine::work::SourceWatermarks;
use riverbank_io as io;
use riverbank_pipeline::config::TransformConfig;
use std::collections::BTreeMap;

/// What a checkpoint committed.
#[derive(Debug, Default)]
pub struct Committed {
    /// (sink transform, files or records written).
    pub files: Vec<(String, Vec<String>)>,
    /// Rows of windows already closed, dropped as late.
    pub late_rows: u64,
}

/// Commits checkpoint `id`'s sink parts. `watermarks` are the source partitions' watermarks
/// after the checkpoint and their minimum (`None`: the drain's, past every window); a sink's
/// windows are judged by the watermark of its own upstream sources.
pub async fn commit(
    plan: &CompiledPlan,
    mut parts: BTreeMap<usize, Vec<io::TempPart>>,
    job_token: &str,
    id: u64,
    panes: &mut WindowPanes,
    watermarks: Option<(&SourceWatermarks, i64)>,
) -> Result<Committed, RunError> {
    let lateness = allowed_lateness(plan);
    let upstream = plan.plan.graph.upstream_sources();
    let mut out = Committed::default();
    for (t, ct) in plan.transforms.iter().enumerate() {
        let CompiledTransform::Write { options, schema } = ct else {
            continue;
        };
        let watermark = watermarks.map(|(m, job)| {
            (m.iter())
                .filter(|((s, _), _)| upstream[t].contains(s))
                .map(|(_, w)| *w)
                .min()
                .unwrap_or(job)
        });
        let mine = parts.remove(&t).unwrap_or_default();
        let transform = &plan.plan.graph.transforms[t];
        if let TransformConfig::WriteConnector(cfg) = &transform.config {
            let written = super::commit_connector::commit(
                &transform.name,
                cfg,
                options,
                &plan.plan.job_name,
                id,
                mine,
            )
            .await?;
            out.files.push((transform.name.clone(), written));
            continue;
        }
        let template = options
            .shard_name_template
            .as_deref()
            .unwrap_or(io::DEFAULT_SHARD_TEMPLATE);
        let sink = panes.plan(&transform.name, mine, watermark, lateness, template);
        let mut written = vec![];
        if !sink.global.is_empty() {
            let named = io::WriteOptions {
                shard_name_template: Some(format!("-c{id:08}{template}")),
                num_shards: runner_shards(&sink.global, options.num_shards, template),
                ..options.clone()
            };
            written.extend(io::commit_sink_set(&named, Some(schema.clone()), sink.global).await?);
        }
        for w in sink.windows {
            let named = io::WriteOptions {
                num_shards: runner_shards(&w.parts, options.num_shards, template),
                shard_name_template: Some(w.template),
                ..options.clone()
            };
            written.extend(io::commit_sink_set(&named, Some(schema.clone()), w.parts).await?);
        }
        if !sink.late.is_empty() {
            let rows: u64 = sink.late.iter().map(|p| p.rows).sum();
            tracing::warn!(sink = %transform.name, rows, "rows of closed windows dropped as late");
            out.late_rows += rows;
            io::abort_sink(options, sink.late).await;
        }
        if !written.is_empty() {
            out.files.push((transform.name.clone(), written));
        }
        io::cleanup_temp(options, job_token).await;
        panes.close_sink(&transform.name, watermark, lateness);
    }
    Ok(out)
}

/// Data per file of a streaming sink's set of shards. Small enough that a busy checkpoint's
/// parts, a few MiB each, are each a file (renamed into place) rather than copied into fewer
/// files: a copy writes every byte of the output a second time.
const SHARD_BYTES: u64 = 8 << 20;

/// How many files one set of shards (a checkpoint's global-window rows, or a window's pane)
/// is committed as: as many as its size calls for, one per [`SHARD_BYTES`] (Beam's
/// runner-determined sharding), never more than its temp parts (one per shuffle partition
/// that had rows) nor than the sink's `num_shards`. A few rows make one file. A template
/// without a shard placeholder names one file, whatever the size.
fn runner_shards(
    parts: &[io::TempPart],
    num_shards: Option<usize>,
    template: &str,
) -> Option<usize> {
    if !io::has_shard_placeholder(template) {
        return num_shards;
    }
    let bytes: u64 = parts.iter().map(|p| p.bytes).sum();
    let by_size = usize::try_from(bytes.div_ceil(SHARD_BYTES)).unwrap_or(usize::MAX);
    let n = by_size.clamp(1, parts.len().max(1));
    Some(num_shards.filter(|&k| k > 0).map_or(n, |k| n.min(k)))
}

/// The pipeline's allowed lateness: the largest of its windowings'.
fn allowed_lateness(plan: &CompiledPlan) -> i64 {
    plan.plan
        .graph
        .transforms
        .iter()
        .filter_map(|t| match &t.config {
            TransformConfig::WindowInto { triggering, .. } => Some(triggering.allowed_lateness_us),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(part: usize, bytes: u64) -> io::TempPart {
        io::TempPart {
            location: format!("tmp/p{part}"),
            part,
            rows: 1,
            bytes,
            header_bytes: 0,
            window: None,
        }
    }

    #[test]
    fn a_set_of_shards_has_as_many_files_as_its_size_calls_for() {
        const T: &str = "-SSSSS-of-NNNNN";
        let small: Vec<_> = (0..8).map(|i| part(i, 1_000)).collect();
        assert_eq!(
            runner_shards(&small, None, T),
            Some(1),
            "a few rows: one file"
        );
        let big: Vec<_> = (0..8).map(|i| part(i, 5 << 20)).collect();
        assert_eq!(
            runner_shards(&big, None, T),
            Some(5),
            "40 MiB: five of 8 MiB"
        );
        let busy: Vec<_> = (0..4).map(|i| part(i, 12 << 20)).collect();
        assert_eq!(
            runner_shards(&busy, None, T),
            Some(4),
            "parts of 12 MiB: each a file, none copied"
        );
        let huge: Vec<_> = (0..3).map(|i| part(i, 1 << 30)).collect();
        assert_eq!(
            runner_shards(&huge, None, T),
            Some(3),
            "never more than the parts"
        );
        assert_eq!(
            runner_shards(&big, Some(2), T),
            Some(2),
            "at most num_shards"
        );
        assert_eq!(runner_shards(&small, Some(4), T), Some(1));
        assert_eq!(
            runner_shards(&big, None, ""),
            None,
            "no placeholder: one file"
        );
    }
}
