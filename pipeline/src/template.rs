//! Jinja templating of pipeline files, as Beam YAML does before parsing (`--jinja_variables`).
use crate::error::PipelineError;
use minijinja::{Environment, UndefinedBehavior};

/// Renders `text` with `vars`. An undefined variable is an error naming it, unless the template
/// gives a default (`{{ x | default('y') }}`), so a forgotten `--jinja-variables` is caught early.
pub fn render(
    text: &str,
    vars: &serde_json::Map<String, serde_json::Value>,
) -> Result<String, PipelineError> {
    if !text.contains("{{") && !text.contains("{%") {
        return Ok(text.to_string());
    }
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.render_str(text, minijinja::value::Serde(vars))
        .map_err(|e| {
            let mut msg = e.to_string();
            if let Some(line) = e.line() {
                msg = format!("line {line}: {msg}");
            }
            PipelineError::Template(msg)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_variables_filters_and_defaults() {
        let vars = json!({"input": "a.csv", "n": 3})
            .as_object()
            .unwrap()
            .clone();
        assert_eq!(render("p: {{ input }}", &vars).unwrap(), "p: a.csv");
        assert_eq!(
            render("p: {{ out | default('x') }}", &vars).unwrap(),
            "p: x"
        );
        assert_eq!(render("p: {{ input | upper }}", &vars).unwrap(), "p: A.CSV");
        let e = render("p: {{ output }}", &vars).unwrap_err().to_string();
        assert!(e.contains("undefined"), "{e}");
    }
}
