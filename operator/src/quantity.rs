//! Kubernetes quantities: memory sizes in bytes and back, Beam's memory hints, CPU counts.
//! A leaf: the children, vertical autoscaling and the reconciler all size pods with these.
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A Kubernetes memory quantity (`2Gi`, `1.5G`, `512Mi`, `1e9`, `2048`) in bytes.
pub fn parse_bytes(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let n: f64 = number.parse().ok()?;
    let factor: f64 = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        _ => return None,
    };
    let bytes = n * factor;
    (bytes.is_finite() && bytes >= 0.0).then(|| bytes.ceil() as u64)
}

/// Bytes as a quantity: `3Gi` when whole gibibytes, else mebibytes (`4608Mi`), else bytes.
pub fn quantity(bytes: u64) -> Quantity {
    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;
    Quantity(if bytes.is_multiple_of(GI) {
        format!("{}Gi", bytes / GI)
    } else if bytes.is_multiple_of(MI) {
        format!("{}Mi", bytes / MI)
    } else {
        bytes.to_string()
    })
}

/// Beam's resource hint sizes (`16GB`, `16GiB`, bytes) as a Kubernetes quantity (`16G`,
/// `16Gi`). Kubernetes spells the decimal kilo `k`.
pub fn memory_quantity(hint: &str) -> Option<Quantity> {
    let s = hint.trim();
    let digits_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(digits_end);
    if number.is_empty()
        || number.starts_with('.')
        || number.ends_with('.')
        || number.matches('.').count() > 1
    {
        return None;
    }
    let unit = unit.strip_suffix('B').unwrap_or(unit);
    let unit = match unit {
        "" => "",
        "k" | "K" => "k",
        "Ki" | "KI" | "ki" => "Ki",
        "M" | "G" | "T" | "P" | "E" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => unit,
        _ => return None,
    };
    Some(Quantity(format!("{number}{unit}")))
}

/// A CPU quantity (`2`, `1.5`, `500m`) in whole cores, rounded up.
pub fn cpu_cores(quantity: &str) -> Option<u32> {
    let q = quantity.trim();
    let cores = match q.strip_suffix('m') {
        Some(milli) => milli.parse::<f64>().ok()? / 1000.0,
        None => q.parse::<f64>().ok()?,
    };
    (cores.is_finite() && cores > 0.0).then(|| (cores.ceil() as u32).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_hints_become_quantities() {
        let q = |s: &str| memory_quantity(s).map(|q| q.0);
        assert_eq!(q("16GB").as_deref(), Some("16G"));
        assert_eq!(q("16GiB").as_deref(), Some("16Gi"));
        assert_eq!(q("16Gi").as_deref(), Some("16Gi"));
        assert_eq!(q("512MiB").as_deref(), Some("512Mi"));
        assert_eq!(q("1.5GB").as_deref(), Some("1.5G"));
        assert_eq!(q("640KB").as_deref(), Some("640k"));
        assert_eq!(q("1073741824").as_deref(), Some("1073741824"));
        assert_eq!(q("16 apples"), None);
        assert_eq!(q("GB"), None);
        assert_eq!(q("1..5G"), None);
    }
}
