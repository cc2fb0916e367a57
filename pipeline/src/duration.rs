//! Durations as pipelines write them: a number of seconds, or a string such as `60s`, `500ms`,
//! `5m`, `1h`, `1d`; read into microseconds. Windows, triggers and allowed lateness use it.

/// A duration in microseconds.
pub fn parse_duration(v: &serde_json::Value) -> Result<i64, String> {
    const S: f64 = 1_000_000.0;
    if let Some(n) = v.as_f64() {
        return Ok((n * S).round() as i64);
    }
    let s = v
        .as_str()
        .ok_or("a duration is a number of seconds or a string like '60s'")?
        .trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("cannot read duration '{s}'"))?;
    let mult = match unit.trim() {
        "" | "s" | "sec" | "secs" | "seconds" => S,
        "ms" => S / 1000.0,
        "us" => 1.0,
        "m" | "min" | "mins" | "minutes" => 60.0 * S,
        "h" | "hr" | "hours" => 3600.0 * S,
        "d" | "days" => 86400.0 * S,
        u => {
            return Err(format!(
                "unknown duration unit '{u}' in '{s}' (use ms, s, m, h or d)"
            ));
        }
    };
    Ok((n * mult).round() as i64)
}
