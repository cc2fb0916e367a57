//! Beam user metrics, summed over bundles: what `result.metrics()` of an SDK pipeline reads back
//! through the Job API; and the SDK's element counts per PCollection, for the job's progress.
use std::collections::BTreeMap;

use crate::coders::{read_varint, write_varint};
use crate::runner_api::MonitoringInfo;
use crate::urns;

#[derive(Debug, Default, Clone)]
pub struct JobMetrics {
    by_key: BTreeMap<(String, Vec<(String, String)>), MonitoringInfo>,
    /// Elements per PCollection id, as the harnesses counted them.
    elements: BTreeMap<String, u64>,
}

impl JobMetrics {
    /// Folds one bundle's monitoring infos in; user metrics and element counts are kept.
    pub fn add(&mut self, infos: &[MonitoringInfo]) {
        for info in infos.iter().filter(|i| i.urn == urns::ELEMENT_COUNT) {
            if let (Some(pcollection), Ok((n, _))) = (
                info.labels.get("PCOLLECTION"),
                read_varint(&info.payload, 0),
            ) {
                *self.elements.entry(pcollection.clone()).or_default() += n;
            }
        }
        for info in infos
            .iter()
            .filter(|i| i.urn.starts_with("beam:metric:user:"))
        {
            let mut labels: Vec<(String, String)> = info
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            labels.sort();
            match self.by_key.get_mut(&(info.urn.clone(), labels.clone())) {
                Some(known) => {
                    known.payload = merge(&info.urn, &known.payload, &info.payload)
                        .unwrap_or_else(|| info.payload.clone())
                }
                None => {
                    self.by_key.insert((info.urn.clone(), labels), info.clone());
                }
            }
        }
    }

    /// The user metrics.
    pub fn infos(&self) -> Vec<MonitoringInfo> {
        self.by_key.values().cloned().collect()
    }

    /// Elements counted in `pcollections`, together.
    pub fn elements_of<'a>(&self, pcollections: impl IntoIterator<Item = &'a String>) -> u64 {
        pcollections
            .into_iter()
            .filter_map(|p| self.elements.get(p))
            .sum()
    }
}

fn varints(payload: &[u8], n: usize) -> Option<Vec<i64>> {
    let mut out = Vec::with_capacity(n);
    let mut pos = 0;
    for _ in 0..n {
        let (v, next) = read_varint(payload, pos).ok()?;
        out.push(v as i64);
        pos = next;
    }
    Some(out)
}

fn double(payload: &[u8], at: usize) -> Option<f64> {
    Some(f64::from_be_bytes(
        payload.get(at..at + 8)?.try_into().ok()?,
    ))
}

/// Merges two payloads of one metric; `None` when the payload is not understood (the newer
/// one then wins, as for gauges and string sets).
fn merge(urn: &str, a: &[u8], b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match urn {
        urns::USER_SUM_INT64 => {
            let (x, y) = (varints(a, 1)?[0], varints(b, 1)?[0]);
            write_varint(&mut out, x.wrapping_add(y) as u64);
        }
        urns::USER_SUM_DOUBLE => {
            out.extend_from_slice(&(double(a, 0)? + double(b, 0)?).to_be_bytes())
        }
        urns::USER_DISTRIBUTION_INT64 => {
            let (x, y) = (varints(a, 4)?, varints(b, 4)?);
            for v in [
                x[0] + y[0],
                x[1].wrapping_add(y[1]),
                x[2].min(y[2]),
                x[3].max(y[3]),
            ] {
                write_varint(&mut out, v as u64);
            }
        }
        urns::USER_DISTRIBUTION_DOUBLE => {
            let (ca, at) = read_varint(a, 0).ok()?;
            let (cb, bt) = read_varint(b, 0).ok()?;
            write_varint(&mut out, ca + cb);
            out.extend_from_slice(&(double(a, at)? + double(b, bt)?).to_be_bytes());
            out.extend_from_slice(&double(a, at + 8)?.min(double(b, bt + 8)?).to_be_bytes());
            out.extend_from_slice(&double(a, at + 16)?.max(double(b, bt + 16)?).to_be_bytes());
        }
        _ => return None,
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(n: u64) -> MonitoringInfo {
        let mut payload = Vec::new();
        write_varint(&mut payload, n);
        MonitoringInfo {
            urn: urns::USER_SUM_INT64.into(),
            r#type: "beam:metrics:sum_int64:v1".into(),
            payload,
            labels: [("NAME".to_string(), "seen".to_string())].into(),
            start_time: None,
        }
    }

    fn elements(pcollection: &str, n: u64) -> MonitoringInfo {
        MonitoringInfo {
            urn: urns::ELEMENT_COUNT.into(),
            labels: [("PCOLLECTION".to_string(), pcollection.to_string())].into(),
            ..counter(n)
        }
    }

    #[test]
    fn counters_sum_over_bundles_and_system_metrics_are_left_out() {
        let mut m = JobMetrics::default();
        m.add(&[counter(3), elements("p1", 1)]);
        m.add(&[counter(4), elements("p1", 5), elements("p2", 2)]);
        let infos = m.infos();
        assert_eq!(infos.len(), 1);
        assert_eq!(read_varint(&infos[0].payload, 0).unwrap().0, 7);
        let p1 = "p1".to_string();
        assert_eq!(m.elements_of([&p1]), 6);
        assert_eq!(m.elements_of(&["p1".to_string(), "p2".to_string()]), 8);
    }
}
