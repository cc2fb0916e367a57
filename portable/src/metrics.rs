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
    /// Per PCollection id, the elements the harnesses sampled for their size and those
    /// elements' bytes.
    sampled: BTreeMap<String, (u64, u64)>,
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
        for info in infos.iter().filter(|i| i.urn == urns::SAMPLED_BYTE_SIZE) {
            if let (Some(pcollection), Some(d)) =
                (info.labels.get("PCOLLECTION"), varints(&info.payload, 2))
            {
                let s = self.sampled.entry(pcollection.clone()).or_default();
                s.0 += d[0].max(0) as u64;
                s.1 += d[1].max(0) as u64;
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

    /// Bytes of the elements counted in `pcollections`, together: each one's count at the mean
    /// size of its sampled elements (none sampled: no bytes).
    pub fn bytes_of<'a>(&self, pcollections: impl IntoIterator<Item = &'a String>) -> u64 {
        pcollections
            .into_iter()
            .filter_map(|p| {
                let (n, bytes) = self.sampled.get(p).filter(|(n, _)| *n > 0)?;
                let count = self.elements.get(p).copied().unwrap_or(*n);
                Some((count as f64 * *bytes as f64 / *n as f64) as u64)
            })
            .sum()
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
        urns::USER_SET_STRING => {
            let mut all = strings(a)?;
            all.extend(strings(b)?);
            all.sort();
            all.dedup();
            // Beam's IterableCoder(StrUtf8Coder): a 4-byte count, then each string nested.
            out.extend_from_slice(&(all.len() as i32).to_be_bytes());
            for s in all {
                write_varint(&mut out, s.len() as u64);
                out.extend_from_slice(&s);
            }
        }
        _ => return None,
    }
    Some(out)
}

/// The strings of a string-set payload.
fn strings(payload: &[u8]) -> Option<Vec<Vec<u8>>> {
    let count = i32::from_be_bytes(payload.get(..4)?.try_into().ok()?);
    let mut pos = 4;
    let mut out = Vec::with_capacity(count.max(0) as usize);
    for _ in 0..count {
        let (len, at) = read_varint(payload, pos).ok()?;
        let end = at.checked_add(len as usize)?;
        out.push(payload.get(at..end)?.to_vec());
        pos = end;
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
    fn a_pcollections_bytes_are_its_count_at_the_sampled_mean_size() {
        let sampled = |n: u64, bytes: u64| {
            let mut payload = Vec::new();
            for v in [n, bytes, 8, 12] {
                write_varint(&mut payload, v);
            }
            MonitoringInfo {
                urn: urns::SAMPLED_BYTE_SIZE.into(),
                r#type: "beam:metrics:distribution_int64:v1".into(),
                payload,
                ..elements("ticks", 0)
            }
        };
        let mut m = JobMetrics::default();
        // Two bundles: 100 and 300 elements, 10 and 20 of them sampled at 10 bytes each.
        m.add(&[elements("ticks", 100), sampled(10, 100)]);
        m.add(&[elements("ticks", 300), sampled(20, 200)]);
        let ticks = ["ticks".to_string()];
        assert_eq!(m.bytes_of(&ticks), 4_000);
        assert_eq!(m.bytes_of(&["other".to_string()]), 0);
    }

    #[test]
    fn string_sets_are_the_union_over_bundles() {
        let set = |items: &[&str]| {
            let mut payload = (items.len() as i32).to_be_bytes().to_vec();
            for s in items {
                write_varint(&mut payload, s.len() as u64);
                payload.extend_from_slice(s.as_bytes());
            }
            MonitoringInfo {
                urn: urns::USER_SET_STRING.into(),
                payload,
                ..counter(0)
            }
        };
        let mut m = JobMetrics::default();
        m.add(&[set(&["a", "zzz"])]);
        m.add(&[set(&["b", "a"])]);
        let union: Vec<Vec<u8>> = strings(&m.infos()[0].payload).unwrap();
        assert_eq!(union, [b"a".to_vec(), b"b".to_vec(), b"zzz".to_vec()]);
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
