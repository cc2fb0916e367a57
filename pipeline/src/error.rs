//! Errors of the pipeline model. Every error names where it happened: the transform, the
//! field, or the line of the file, because users read these in `kubectl describe` and CI logs.
use std::fmt;

/// One problem found in a pipeline definition.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Issue {
    /// The transform the problem is in, when there is one.
    pub transform: Option<String>,
    /// The config field (dotted path) the problem is in, when there is one.
    pub field: Option<String>,
    pub message: String,
}

impl Issue {
    pub fn new(message: impl Into<String>) -> Self {
        Issue {
            transform: None,
            field: None,
            message: message.into(),
        }
    }
    pub fn at(transform: &str, message: impl Into<String>) -> Self {
        Issue {
            transform: Some(transform.to_string()),
            field: None,
            message: message.into(),
        }
    }
    pub fn field(transform: &str, field: &str, message: impl Into<String>) -> Self {
        Issue {
            transform: Some(transform.to_string()),
            field: Some(field.to_string()),
            message: message.into(),
        }
    }
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.transform, &self.field) {
            (Some(t), Some(fl)) => write!(f, "transform '{t}', field '{fl}': {}", self.message),
            (Some(t), None) => write!(f, "transform '{t}': {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("template error: {0}")]
    Template(String),
    #[error("YAML error: {0}")]
    Yaml(String),
    #[error("{}", format_issues(.0))]
    Invalid(Vec<Issue>),
}

impl PipelineError {
    /// All issues carried by this error (a single one for template and YAML errors).
    pub fn issues(&self) -> Vec<Issue> {
        match self {
            PipelineError::Invalid(v) => v.clone(),
            other => vec![Issue::new(other.to_string())],
        }
    }
}

fn format_issues(issues: &[Issue]) -> String {
    let mut s = format!(
        "pipeline is invalid ({} error{}):",
        issues.len(),
        if issues.len() == 1 { "" } else { "s" }
    );
    for i in issues {
        s.push_str("\n  - ");
        s.push_str(&i.to_string());
    }
    s
}
