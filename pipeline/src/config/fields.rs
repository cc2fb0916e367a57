//! Reading a config mapping field by field, with errors that name the field.

use serde_json::{Map, Value};

use super::{AggregateConfig, Expr, Language, generic};

pub(super) type FieldErr = (Option<String>, String);

/// Small helpers to read a config mapping with errors that name the field.
pub(super) struct Fields<'a> {
    pub cfg: &'a Map<String, Value>,
}

impl Fields<'_> {
    pub fn err(&self, field: &str, msg: &str) -> FieldErr {
        (Some(field.to_string()), msg.to_string())
    }
    pub fn only(&self, allowed: &[&str]) -> Result<(), FieldErr> {
        for k in self.cfg.keys() {
            if !allowed.contains(&k.as_str()) {
                let hint = if allowed.is_empty() {
                    "this transform takes no config".to_string()
                } else {
                    format!("allowed: {}", allowed.join(", "))
                };
                return Err((Some(k.clone()), format!("unknown config field ({hint})")));
            }
        }
        Ok(())
    }
    pub fn req(&self, f: &str) -> Result<&Value, FieldErr> {
        self.cfg
            .get(f)
            .filter(|v| !v.is_null())
            .ok_or_else(|| self.err(f, "is required"))
    }
    pub fn req_list(&self, f: &str) -> Result<Vec<Value>, FieldErr> {
        Ok(self
            .req(f)?
            .as_array()
            .ok_or(self.err(f, "must be a list"))?
            .clone())
    }
    pub fn req_str(&self, f: &str) -> Result<String, FieldErr> {
        match self.req(f)? {
            Value::String(s) if !s.trim().is_empty() => Ok(s.clone()),
            Value::String(_) => Err(self.err(f, "must not be empty")),
            _ => Err(self.err(f, "must be a string")),
        }
    }
    pub fn opt_str(&self, f: &str) -> Result<Option<String>, FieldErr> {
        match self.cfg.get(f) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.err(f, "must be a string")),
        }
    }
    pub fn opt_bool(&self, f: &str) -> Result<Option<bool>, FieldErr> {
        match self.cfg.get(f) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.err(f, "must be true or false")),
        }
    }
    pub fn opt_str_list(&self, f: &str) -> Result<Option<Vec<String>>, FieldErr> {
        match self.cfg.get(f) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => self.str_or_list(f).map(Some),
        }
    }
    pub fn str_or_list(&self, f: &str) -> Result<Vec<String>, FieldErr> {
        match self.cfg.get(f) {
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(String::from)
                        .ok_or_else(|| self.err(f, "must be a list of field names"))
                })
                .collect(),
            _ => Err(self.err(f, "must be a field name or a list of field names")),
        }
    }
    pub fn language(&self, ty: &str) -> Result<Language, FieldErr> {
        match self.cfg.get("language") {
            None | Some(Value::Null) => Ok(Language::Generic),
            Some(Value::String(s)) => match s.as_str() {
                "generic" => Ok(Language::Generic),
                "sql" | "calcite" => Ok(Language::Sql),
                other => Err(self.err("language", &format!("language {other} is not supported yet in transform {ty} (supported: generic, sql)"))),
            },
            Some(_) => Err(self.err("language", "must be a string")),
        }
    }
    /// A required expression.
    pub fn req_expr(&self, f: &str, lang: Language) -> Result<Expr, FieldErr> {
        self.expr(f, self.req(f)?, lang)
    }
    /// An expression: `"text"`, `{expression: "text"}`, or a literal scalar (SQL literal).
    pub fn expr(&self, field: &str, v: &Value, lang: Language) -> Result<Expr, FieldErr> {
        let text = match v {
            Value::String(s) => s.clone(),
            Value::Object(m) => {
                if m.contains_key("callable") || m.contains_key("path") {
                    return Err(self.err(field, "callables need a python or javascript UDF; only expressions in 'generic' or 'sql' are supported yet"));
                }
                match m.get("expression") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Number(n)) => n.to_string(),
                    _ => {
                        return Err(
                            self.err(field, "must be an expression string or {expression: ...}")
                        );
                    }
                }
            }
            // A number is a literal (Beam's generic language takes 389 and 1.9 too).
            Value::Number(n) => n.to_string(),
            Value::Bool(b) if lang == Language::Sql => b.to_string(),
            _ => return Err(self.err(field, "must be an expression string")),
        };
        if text.trim().is_empty() {
            return Err(self.err(field, "expression must not be empty"));
        }
        if lang == Language::Generic {
            // As Beam: a comparison only where a boolean or a new field is expected.
            let allow_cmp = field == "keep" || field.starts_with("fields.");
            generic::parse(&text, allow_cmp).map_err(|m| self.err(field, &m))?;
        }
        Ok(Expr {
            language: lang,
            text,
        })
    }
    pub fn aggregate(
        &self,
        out: &str,
        spec: &Value,
        lang: Language,
    ) -> Result<AggregateConfig, FieldErr> {
        let field = format!("combine.{out}");
        let (func, value) = match spec {
            Value::String(f) => (f.clone(), Some(Value::String(out.to_string()))),
            Value::Object(m) => {
                if let Some(k) = m.keys().find(|k| *k != "fn" && *k != "value") {
                    return Err(self.err(
                        &field,
                        &format!("unknown key '{k}' (expected fn and value)"),
                    ));
                }
                let func = match m.get("fn") {
                    Some(Value::String(f)) => f.clone(),
                    Some(Value::Object(o)) => match o.get("type") {
                        Some(Value::String(f)) => f.clone(),
                        _ => return Err(self.err(&field, "fn needs a 'type'")),
                    },
                    _ => return Err(self.err(&field, "needs 'fn'")),
                };
                (func, m.get("value").cloned())
            }
            _ => return Err(self.err(&field, "must be a combine fn name or {fn, value}")),
        };
        const FNS: &[&str] = &[
            "sum", "max", "min", "all", "any", "mean", "count", "group", "concat",
        ];
        if !FNS.contains(&func.as_str()) {
            return Err(self.err(
                &field,
                &format!(
                    "unknown combine fn '{func}' (built-ins: {})",
                    FNS.join(", ")
                ),
            ));
        }
        let value = match value {
            None if func == "count" => None,
            None => return Err(self.err(&field, &format!("'{func}' needs a 'value'"))),
            Some(v) => Some(self.expr(&format!("{field}.value"), &v, lang)?),
        };
        Ok(AggregateConfig {
            output: out.to_string(),
            func,
            value,
        })
    }
}
