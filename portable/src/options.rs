//! Pipeline options as Beam's SDKs send them with a job: a `Struct` keyed `beam:option:NAME:v1`.
use prost_types::Struct;
use prost_types::value::Kind;

/// The value of `--NAME`, if given.
pub fn value<'a>(options: &'a Struct, name: &str) -> Option<&'a Kind> {
    options
        .fields
        .get(&format!("beam:option:{name}:v1"))?
        .kind
        .as_ref()
}

/// A text option (`--temp_location`, `--job_name`), if given and not empty.
pub fn text(options: &Struct, name: &str) -> Option<String> {
    match value(options, name)? {
        Kind::StringValue(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

/// A flag (`--streaming`, `--update`): true when given as true.
pub fn flag(options: &Struct, name: &str) -> bool {
    match value(options, name) {
        Some(Kind::BoolValue(b)) => *b,
        Some(Kind::StringValue(s)) => s == "true",
        _ => false,
    }
}

/// The value of `--experiments=NAME=VALUE`, if given.
pub fn experiment(options: &Struct, name: &str) -> Option<String> {
    let Some(Kind::ListValue(list)) = value(options, "experiments") else {
        return None;
    };
    list.values.iter().find_map(|v| match &v.kind {
        Some(Kind::StringValue(s)) => s.strip_prefix(name)?.strip_prefix('=').map(String::from),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_types::{ListValue, Value};

    fn options(fields: Vec<(&str, Kind)>) -> Struct {
        Struct {
            fields: fields
                .into_iter()
                .map(|(k, v)| (format!("beam:option:{k}:v1"), Value { kind: Some(v) }))
                .collect(),
        }
    }

    #[test]
    fn options_read_as_the_sdk_sends_them() {
        let experiments = Kind::ListValue(ListValue {
            values: ["use_runner_v2", "checkpointing_interval=250"]
                .iter()
                .map(|s| Value {
                    kind: Some(Kind::StringValue(s.to_string())),
                })
                .collect(),
        });
        let o = options(vec![
            ("experiments", experiments),
            ("streaming", Kind::BoolValue(true)),
            ("update", Kind::StringValue("true".into())),
            ("job_name", Kind::StringValue(String::new())),
            ("temp_location", Kind::StringValue("/tmp/x".into())),
        ]);
        assert_eq!(
            experiment(&o, "checkpointing_interval").as_deref(),
            Some("250")
        );
        assert_eq!(experiment(&o, "use_runner"), None);
        assert!(flag(&o, "streaming") && flag(&o, "update") && !flag(&o, "drain"));
        assert_eq!(text(&o, "job_name"), None, "empty is not given");
        assert_eq!(text(&o, "temp_location").as_deref(), Some("/tmp/x"));
    }
}
