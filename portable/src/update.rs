//! Dataflow's `--update`: whether a replacement pipeline can take over a running streaming
//! job's state, and under which transform ids. State is kept by stage and by transform id, so
//! the replacement must have the same stages and transforms, save for the renames
//! `--transform_name_mapping` gives (old name → new name; a composite's rename renames the
//! transforms inside it). Its DoFns' code may differ.
use std::collections::{BTreeSet, HashMap};

use prost_types::value::Kind;

use crate::execute::checkpoint::{fingerprint, fingerprint_as};
use crate::options;
use crate::plan::Plan;

/// The ids of `old`'s plan as `new`'s plan has them.
pub(crate) struct Ids {
    transforms: HashMap<String, String>,
    pcollections: HashMap<String, String>,
}

impl Ids {
    #[cfg(test)]
    pub(crate) fn of(
        transforms: HashMap<String, String>,
        pcollections: HashMap<String, String>,
    ) -> Ids {
        Ids {
            transforms,
            pcollections,
        }
    }

    pub(crate) fn transform(&self, id: &str) -> String {
        self.transforms
            .get(id)
            .cloned()
            .unwrap_or_else(|| id.to_string())
    }

    pub(crate) fn pcollection(&self, id: &str) -> String {
        self.pcollections
            .get(id)
            .cloned()
            .unwrap_or_else(|| id.to_string())
    }
}

/// Whether `new` (submitted with `options`: its `--transform_name_mapping`) can take over the
/// state of a streaming job running `old`, and if not, why.
pub fn check(old: &Plan, new: &Plan, options: &prost_types::Struct) -> Result<(), String> {
    ids(old, new, options).map(|_| ())
}

/// Each transform and stage PCollection id of `old`'s plan and its id in `new`'s, or why
/// `new` cannot take over (both must be streaming jobs).
pub(crate) fn ids(old: &Plan, new: &Plan, options: &prost_types::Struct) -> Result<Ids, String> {
    if !old.streaming || !new.streaming {
        return Err("the running job and its replacement must both be streaming jobs".into());
    }
    let renames = renames(options)?;
    let by_name: HashMap<&str, &str> = new
        .components
        .transforms
        .iter()
        .map(|(id, t)| (t.unique_name.as_str(), id.as_str()))
        .collect();
    let old_names: BTreeSet<&str> = old
        .components
        .transforms
        .values()
        .map(|t| t.unique_name.as_str())
        .collect();
    if let Some(unknown) = renames.keys().find(|k| !old_names.contains(k.as_str())) {
        return Err(format!(
            "--transform_name_mapping renames '{unknown}', which the running job does not have"
        ));
    }
    let mut ids = HashMap::new();
    let mut gone = Vec::new();
    for (id, t) in &old.components.transforms {
        let name = renamed(&t.unique_name, &renames);
        match by_name.get(name.as_str()) {
            Some(new_id) => {
                ids.insert(id.clone(), new_id.to_string());
            }
            None => gone.push(name),
        }
    }
    let mapped: BTreeSet<&str> = ids.values().map(String::as_str).collect();
    let added: Vec<&str> = by_name
        .iter()
        .filter(|(_, id)| !mapped.contains(**id))
        .map(|(name, _)| *name)
        .collect();
    if !gone.is_empty() || !added.is_empty() {
        gone.sort();
        gone.truncate(3);
        let mut added = added;
        added.sort();
        added.truncate(3);
        return Err(format!(
            "its transforms differ (not in the replacement: {gone:?}; new in it: {added:?}; a renamed transform needs --transform_name_mapping)"
        ));
    }
    let fused_otherwise = || "its transforms are the same but fused into other stages".to_string();
    if old.stages.len() != new.stages.len() {
        return Err(fused_otherwise());
    }
    // The PCollections between stages, by position (the runner names those it makes after
    // the transforms that make them).
    let mut pcollections = HashMap::new();
    for (was, is) in old.stages.iter().zip(&new.stages) {
        let (was_p, is_p) = (stage_pcollections(was), stage_pcollections(is));
        if was_p.len() != is_p.len() {
            return Err(fused_otherwise());
        }
        for (a, b) in was_p.into_iter().zip(is_p) {
            pcollections.insert(a.clone(), b.clone());
        }
    }
    let ids = Ids {
        transforms: ids,
        pcollections,
    };
    if fingerprint_as(old, &|t| ids.transform(t), &|p| ids.pcollection(p)) != fingerprint(new) {
        return Err(fused_otherwise());
    }
    Ok(ids)
}

/// A stage's PCollections in order: main inputs, outputs, side inputs.
fn stage_pcollections(stage: &crate::plan::Stage) -> Vec<&String> {
    let mut all = stage.kind.inputs();
    all.extend(stage.kind.outputs());
    if let crate::plan::StageKind::Sdk(s) = &stage.kind {
        all.extend(s.side_inputs.iter().map(|x| &x.pcollection));
    }
    all
}

/// `name` under the longest rename that applies to it (itself, or a composite holding it).
fn renamed(name: &str, renames: &HashMap<String, String>) -> String {
    renames
        .iter()
        .filter(|(old, _)| {
            name == old.as_str()
                || name
                    .strip_prefix(old.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
        })
        .max_by_key(|(old, _)| old.len())
        .map_or_else(
            || name.to_string(),
            |(old, new)| format!("{new}{}", &name[old.len()..]),
        )
}

/// `--transform_name_mapping` (Python sends the JSON mapping as a struct; other SDKs as text).
fn renames(options: &prost_types::Struct) -> Result<HashMap<String, String>, String> {
    let bad = |what: &str| {
        format!("--transform_name_mapping: {what}: a mapping of old transform names to new ones")
    };
    let fields = match options::value(options, "transform_name_mapping") {
        None | Some(Kind::NullValue(_)) => return Ok(HashMap::new()),
        Some(Kind::StructValue(s)) => s
            .fields
            .iter()
            .map(|(k, v)| match &v.kind {
                Some(Kind::StringValue(n)) => Ok((k.clone(), n.clone())),
                _ => Err(bad(&format!("'{k}' is not renamed to a name"))),
            })
            .collect::<Result<_, _>>()?,
        Some(Kind::StringValue(s)) if s.trim().is_empty() => HashMap::new(),
        Some(Kind::StringValue(s)) => {
            serde_json::from_str::<HashMap<String, String>>(s).map_err(|e| bad(&e.to_string()))?
        }
        Some(_) => return Err(bad("not a mapping")),
    };
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_composites_rename_renames_what_it_holds() {
        let renames: HashMap<String, String> = [
            ("Count".to_string(), "Tally".to_string()),
            ("Count/Inner".to_string(), "Tally/Core".to_string()),
        ]
        .into();
        assert_eq!(renamed("Count", &renames), "Tally");
        assert_eq!(renamed("Count/Group", &renames), "Tally/Group");
        assert_eq!(renamed("Count/Inner/Map", &renames), "Tally/Core/Map");
        assert_eq!(
            renamed("Counter", &renames),
            "Counter",
            "a name, not a prefix"
        );
    }

    #[test]
    fn the_mapping_reads_as_json_text_or_a_struct() {
        let text = |s: &str| prost_types::Struct {
            fields: [(
                "beam:option:transform_name_mapping:v1".to_string(),
                prost_types::Value {
                    kind: Some(Kind::StringValue(s.into())),
                },
            )]
            .into(),
        };
        assert_eq!(renames(&text(r#"{"A": "B"}"#)).unwrap()["A"], "B");
        assert!(renames(&text("")).unwrap().is_empty());
        assert!(
            renames(&text("[1]"))
                .unwrap_err()
                .contains("transform_name_mapping")
        );
    }
}
