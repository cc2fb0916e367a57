//! `resource_hints` on transforms, composites and the pipeline, as Beam 2.77 takes them
//! (`apache_beam/transforms/resources.py`): `min_ram` (`minRam`; bytes, or a size like `16GB`,
//! `4GiB`), `cpu_count` (`cpuCount`), `accelerator` (Dataflow's `type:…;count:…;…` string) and
//! `max_active_bundles_per_worker` (and Beam's aliases for it). A composite's hints apply to
//! every transform inside it, merged as Beam merges them: the larger `min_ram` and `cpu_count`,
//! the inner `accelerator`, the sum of `max_active_bundles_per_worker`.
//!
//! They travel in the plan on each transform (`Transform::resource_hints`);
//! `Plan::worker_resource_hints` is what a worker running every stage needs, which is where
//! pod requests can come from (as `options.minRam`/`options.cpuCount` do for the pipeline).
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceHints {
    /// The least memory a worker running the transform should have, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ram_bytes: Option<u64>,
    /// The least number of CPUs a worker running the transform should have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_count: Option<u64>,
    /// Dataflow's accelerator string (`type:nvidia-l4;count:1;install-nvidia-driver`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_active_bundles_per_worker: Option<u64>,
}

impl ResourceHints {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Parses a `resource_hints:` mapping; the error names the hint.
    pub fn parse(v: &Value) -> Result<Self, String> {
        let Value::Object(m) = v else {
            return Err("must be a mapping of hint name to value".into());
        };
        let mut h = Self::default();
        for (name, value) in m {
            let bad = || format!("resource hint {name} has invalid value {value}");
            match name.as_str() {
                "min_ram" | "minRam" => {
                    h.min_ram_bytes = Some(storage_size(value).ok_or_else(bad)?);
                }
                "cpu_count" | "cpuCount" => h.cpu_count = Some(int(value).ok_or_else(bad)?),
                "accelerator" => {
                    h.accelerator = Some(value.as_str().ok_or_else(bad)?.to_string());
                }
                "max_active_bundles_per_worker"
                | "MaxActiveBundlesPerWorker"
                | "max_active_bundle_per_worker"
                | "MaxActiveBundlePerWorker" => {
                    h.max_active_bundles_per_worker = Some(int(value).ok_or_else(bad)?);
                }
                _ => {
                    return Err(format!(
                        "unknown resource hint: {name} (Beam's are min_ram, cpu_count, \
                         accelerator, max_active_bundles_per_worker)"
                    ));
                }
            }
        }
        Ok(h)
    }

    /// `inner` (a transform's own hints) inside a composite with `outer`'s, as Beam merges.
    pub fn merged(outer: &Self, inner: &Self) -> Self {
        fn max(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            a.max(b)
        }
        Self {
            min_ram_bytes: max(outer.min_ram_bytes, inner.min_ram_bytes),
            cpu_count: max(outer.cpu_count, inner.cpu_count),
            accelerator: inner.accelerator.clone().or(outer.accelerator.clone()),
            max_active_bundles_per_worker: match (
                outer.max_active_bundles_per_worker,
                inner.max_active_bundles_per_worker,
            ) {
                (Some(a), Some(b)) => Some(a.saturating_add(b)),
                (a, b) => a.or(b),
            },
        }
    }
}

/// Beam's `_parse_int`: an int, or a string of one.
fn int(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Beam's `_parse_storage_size_str`: bytes as an int, or a number and a unit (`16GB`, `4 GiB`,
/// `0.5TB`).
fn storage_size(v: &Value) -> Option<u64> {
    let s = match v {
        Value::Number(n) => return n.as_u64(),
        Value::String(s) => s.trim().replace(' ', ""),
        _ => return None,
    };
    let split = s.rfind(|c: char| c.is_ascii_digit())? + 1;
    let (number, unit) = s.split_at(split);
    let multiplier: u64 = match unit {
        "PiB" => 1 << 50,
        "TiB" => 1 << 40,
        "GiB" => 1 << 30,
        "MiB" => 1 << 20,
        "KiB" => 1 << 10,
        "PB" => 1_000_000_000_000_000,
        "TB" => 1_000_000_000_000,
        "GB" => 1_000_000_000,
        "MB" => 1_000_000,
        "KB" => 1_000,
        "B" => 1,
        _ => return None,
    };
    let n: f64 = number.parse().ok()?;
    (n >= 0.0).then(|| (n * multiplier as f64).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_beams_hints() {
        let h = ResourceHints::parse(&json!({
            "min_ram": "16GB", "cpuCount": 4, "accelerator": "type:nvidia-l4;count:1",
            "MaxActiveBundlesPerWorker": "2"
        }))
        .unwrap();
        assert_eq!(h.min_ram_bytes, Some(16_000_000_000));
        assert_eq!(h.cpu_count, Some(4));
        assert_eq!(h.accelerator.as_deref(), Some("type:nvidia-l4;count:1"));
        assert_eq!(h.max_active_bundles_per_worker, Some(2));
        let g = |v| ResourceHints::parse(&json!({ "minRam": v })).map(|h| h.min_ram_bytes);
        assert_eq!(g(json!("4 GiB")), Ok(Some(4 << 30)));
        assert_eq!(g(json!("0.5KB")), Ok(Some(500)));
        assert_eq!(g(json!(1024)), Ok(Some(1024)));
        assert!(g(json!("16")).is_err());
        assert!(g(json!("16Gi")).is_err());
        let e = ResourceHints::parse(&json!({"memory": "1GB"})).unwrap_err();
        assert!(e.contains("unknown resource hint: memory"), "{e}");
        assert!(ResourceHints::parse(&json!({"cpu_count": "many"})).is_err());
        assert!(ResourceHints::parse(&json!(["min_ram"])).is_err());
    }

    #[test]
    fn merges_as_beam() {
        let outer = ResourceHints::parse(
            &json!({"min_ram": "8GB", "cpu_count": 8, "accelerator": "a", "max_active_bundles_per_worker": 1}),
        )
        .unwrap();
        let inner = ResourceHints::parse(
            &json!({"min_ram": "16GB", "cpu_count": 2, "accelerator": "b", "max_active_bundles_per_worker": 2}),
        )
        .unwrap();
        let m = ResourceHints::merged(&outer, &inner);
        assert_eq!(m.min_ram_bytes, Some(16_000_000_000));
        assert_eq!(m.cpu_count, Some(8));
        assert_eq!(m.accelerator.as_deref(), Some("b"));
        assert_eq!(m.max_active_bundles_per_worker, Some(3));
        assert_eq!(
            ResourceHints::merged(&outer, &ResourceHints::default()),
            outer
        );
    }
}
