//! A checkpoint's commit to a Kafka or NATS sink: the checkpoint's staged rows (Parquet parts,
//! in part order, so a replay sends the same records in the same order) are encoded and written
//! as the checkpoint's epoch, exactly once (`connectors::Sink::write_epoch`), then the parts go.
use object_store::ObjectStoreExt;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use riverbank_engine::error::RunError;
use riverbank_io::connectors::{Encoder, Sink};
use riverbank_io::{self as io, TempPart, WriteOptions};
use riverbank_pipeline::config::ConnectorSinkConfig;

/// Writes checkpoint `id`'s parts of sink `name`; returns what it says it wrote.
pub async fn commit(
    name: &str,
    cfg: &ConnectorSinkConfig,
    staged: &WriteOptions,
    job: &str,
    id: u64,
    mut parts: Vec<TempPart>,
) -> Result<Vec<String>, RunError> {
    let err = |e: &dyn std::fmt::Display| RunError::transform(name, e.to_string());
    parts.sort_by(|a, b| (a.part, &a.location).cmp(&(b.part, &b.location)));
    let encoder = Encoder::new(name, cfg).map_err(|e| err(&e))?;
    let mut records = vec![];
    for p in &parts {
        let r = io::location::resolve(&p.location).map_err(|e| err(&e))?;
        let bytes = r
            .store
            .get(&r.path().map_err(|e| err(&e))?)
            .await
            .map_err(|e| err(&e))?
            .bytes()
            .await
            .map_err(|e| err(&e))?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .and_then(|b| b.build())
            .map_err(|e| err(&e))?;
        for b in reader {
            records.extend(
                encoder
                    .encode(&b.map_err(|e| err(&e))?)
                    .map_err(|e| err(&e))?,
            );
        }
    }
    let written = if records.is_empty() {
        0
    } else {
        let sink = Sink::open(cfg).await.map_err(|e| err(&e))?;
        sink.write_epoch(job, id, &records)
            .await
            .map_err(|e| err(&e))?
    };
    io::abort_sink(staged, parts).await;
    Ok(vec![format!(
        "{} records of checkpoint {id} ({written} written now)",
        records.len()
    )])
}
