//! Reading a config mapping field by field, with errors that name the field.

use serde_json::{Map, Value};

use super::{AggregateConfig, Expr, Language, UdfForm, generic};

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
                "javascript" => Ok(Language::Javascript),
                "python" => Ok(Language::Python),
                "java" => Err(self.err("language", &format!("language java is not supported in transform {ty}: Riverbank runs no Java UDFs (supported: generic, sql, python, javascript)"))),
                other => Err(self.err("language", &format!("language {other} is not supported in transform {ty} (supported: generic, sql, python, javascript)"))),
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
        if lang.is_udf() {
            return self.udf(field, v, lang);
        }
        let text = match v {
            Value::String(s) => s.clone(),
            Value::Object(m) => {
                if m.contains_key("callable") || m.contains_key("path") {
                    return Err(self.err(field, "callables need a UDF language (language: python or javascript); 'generic' and 'sql' take expressions only"));
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
        Ok(Expr::new(lang, text))
    }
    /// A UDF as Beam YAML takes it: an expression string, or `{expression}`, `{callable}` or
    /// `{path, name}`, each with an optional `output_type` (checked as Beam checks them).
    fn udf(&self, field: &str, v: &Value, lang: Language) -> Result<Expr, FieldErr> {
        let m = match v {
            Value::String(s) if s.trim().is_empty() => {
                return Err(self.err(field, "expression must not be empty"));
            }
            Value::String(s) => return Ok(Expr::new(lang, s.clone())),
            Value::Object(m) => m,
            _ => {
                return Err(self.err(
                    field,
                    "must be an expression string, or a mapping with 'expression', 'callable', or 'path' and 'name'",
                ));
            }
        };
        const KEYS: &[&str] = &["expression", "callable", "path", "name", "output_type"];
        if let Some(k) = m.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(self.err(
                field,
                &format!("unknown key '{k}' (allowed: {})", KEYS.join(", ")),
            ));
        }
        let get = |k: &str| -> Result<Option<String>, FieldErr> {
            match m.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if s.trim().is_empty() => {
                    Err(self.err(field, &format!("'{k}' must not be empty")))
                }
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(self.err(field, &format!("'{k}' must be a string"))),
            }
        };
        let (expression, callable) = (get("expression")?, get("callable")?);
        let (path, name) = (get("path")?, get("name")?);
        let output_type = match m.get("output_type") {
            None | Some(Value::Null) => None,
            Some(t @ (Value::String(_) | Value::Object(_))) => Some(t.clone()),
            Some(_) => {
                return Err(self.err(
                    field,
                    "'output_type' must be a type name or a JSON schema mapping",
                ));
            }
        };
        let (text, form) = match (expression, callable, path, name) {
            (None, None, None, None) => {
                return Err(self.err(
                    field,
                    "must give 'expression', 'callable', or both 'path' and 'name'",
                ));
            }
            (Some(_), Some(_), _, _) => {
                return Err(self.err(field, "cannot give both 'expression' and 'callable'"));
            }
            (Some(_), _, Some(_), _)
            | (Some(_), _, _, Some(_))
            | (_, Some(_), Some(_), _)
            | (_, Some(_), _, Some(_)) => {
                return Err(self.err(
                    field,
                    "cannot give 'expression' or 'callable' with 'path' or 'name'",
                ));
            }
            (Some(e), None, None, None) => (e, UdfForm::Expression),
            (None, Some(c), None, None) => (c, UdfForm::Callable),
            (None, None, Some(_), None) => {
                return Err(self.err(field, "'path' needs 'name': the function to call"));
            }
            (None, None, None, Some(_)) => {
                return Err(self.err(field, "'name' needs 'path': the file that defines it"));
            }
            (None, None, Some(path), Some(name)) => {
                let ext = if lang == Language::Python {
                    ".py"
                } else {
                    ".js"
                };
                if !path.ends_with(ext) {
                    return Err(self.err(field, &format!("'{path}' is not a {ext} file")));
                }
                if !is_identifier(&name) {
                    return Err(self.err(
                        field,
                        &format!("'name' must be a function's name, not '{name}'"),
                    ));
                }
                (name, UdfForm::File { path, source: None })
            }
        };
        Ok(Expr {
            language: lang,
            text,
            form,
            output_type,
        })
    }
    pub fn aggregate(
        &self,
        out: &str,
        spec: &Value,
        lang: Language,
    ) -> Result<AggregateConfig, FieldErr> {
        let field = format!("combine.{out}");
        let (func, fn_config, value) = match spec {
            Value::String(f) => (f.clone(), None, Some(Value::String(out.to_string()))),
            Value::Object(m) => {
                if let Some(k) = m.keys().find(|k| *k != "fn" && *k != "value") {
                    return Err(self.err(
                        &field,
                        &format!("unknown key '{k}' (expected fn and value)"),
                    ));
                }
                let (func, fn_config) = match m.get("fn") {
                    Some(Value::String(f)) => (f.clone(), None),
                    Some(Value::Object(o)) => {
                        if let Some(k) = o.keys().find(|k| *k != "type" && *k != "config") {
                            return Err(self.err(
                                &format!("{field}.fn"),
                                &format!("unknown key '{k}' (expected type and config)"),
                            ));
                        }
                        let func = match o.get("type") {
                            Some(Value::String(f)) => f.clone(),
                            _ => return Err(self.err(&field, "fn needs a 'type'")),
                        };
                        match o.get("config") {
                            None => (func, None),
                            Some(Value::Object(c)) => (func, Some(c.clone())),
                            Some(_) => {
                                return Err(self.err(
                                    &format!("{field}.fn.config"),
                                    "must be a mapping of the fn's keyword arguments",
                                ));
                            }
                        }
                    }
                    _ => return Err(self.err(&field, "needs 'fn'")),
                };
                (func, fn_config, m.get("value").cloned())
            }
            _ => return Err(self.err(&field, "must be a combine fn name or {fn, value}")),
        };
        const FNS: &[&str] = &[
            "sum", "max", "min", "all", "any", "mean", "count", "group", "concat",
        ];
        let builtin = FNS.contains(&func.as_str());
        if !builtin && lang != Language::Python {
            return Err(self.err(
                &field,
                &format!(
                    "unknown combine fn '{func}' (built-ins: {}; a custom CombineFn needs language: python)",
                    FNS.join(", ")
                ),
            ));
        }
        if builtin && fn_config.is_some() {
            return Err(self.err(
                &format!("{field}.fn.config"),
                &format!("the built-in '{func}' takes no config"),
            ));
        }
        let value = match value {
            None if func == "count" => None,
            // As Beam: a custom fn without a value combines the field named like its output.
            None if !builtin => Some(self.expr(
                &format!("{field}.value"),
                &Value::String(out.to_string()),
                lang,
            )?),
            None => return Err(self.err(&field, &format!("'{func}' needs a 'value'"))),
            Some(v) => Some(self.expr(&format!("{field}.value"), &v, lang)?),
        };
        Ok(AggregateConfig {
            output: out.to_string(),
            func,
            fn_config,
            value,
        })
    }
}

/// A JavaScript identifier (ASCII letters, digits, `_` and `$`, not starting with a digit).
fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
}
