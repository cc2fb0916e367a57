//! Beam YAML's `generic` language: what every language can evaluate alike. An expression is a
//! field (`a`, and here also a nested `a.b`), a literal — an integer within ±2³¹, a float
//! `1.9`, a double-quoted string `"text"` (a single-quoted `'text'` too) — or, in MapToFields
//! `fields` and Filter `keep`, one comparison of two of those (`==`, `!=`, `<`, `<=`, `>`,
//! `>=`), meaning what it means in Python. Anything else needs a language.

use super::is_field_path;

/// A field or a literal.
#[derive(Debug, Clone, PartialEq)]
pub enum Atom {
    /// A field path, `a` or `a.b`.
    Field(String),
    Int(i64),
    /// A float literal as written (`1.9`, `-2.`).
    Float(String),
    Str(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    /// Whether this orders its operands (Python refuses to order a string and a number).
    pub fn orders(self) -> bool {
        !matches!(self, CmpOp::Eq | CmpOp::Ne)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Generic {
    Atom(Atom),
    Compare(Atom, CmpOp, Atom),
}

/// Parses a generic expression; `allow_cmp` where Beam accepts a comparison (MapToFields
/// fields and Filter keep).
pub fn parse(text: &str, allow_cmp: bool) -> Result<Generic, String> {
    const HINT: &str = "the generic language takes a field name, a literal (389, 1.9, \"text\") or one comparison of two of those (set a language, e.g. sql, for other expressions)";
    let text = text.trim();
    let ops = operator_runs(text);
    match ops.as_slice() {
        [] => atom(text)
            .map(Generic::Atom)
            .ok_or_else(|| format!("'{text}' is not a field name or a literal; {HINT}")),
        [(start, end)] => {
            if !allow_cmp {
                return Err(format!(
                    "'{text}': the generic language takes a comparison only in MapToFields fields and Filter keep (set a language, e.g. sql, for other expressions)"
                ));
            }
            let op = match &text[*start..*end] {
                "==" => CmpOp::Eq,
                "!=" => CmpOp::Ne,
                "<" => CmpOp::Lt,
                "<=" => CmpOp::Le,
                ">" => CmpOp::Gt,
                ">=" => CmpOp::Ge,
                other => {
                    return Err(format!(
                        "'{text}': '{other}' is not a comparison (==, !=, <, <=, >, >=)"
                    ));
                }
            };
            let (l, r) = (text[..*start].trim(), text[*end..].trim());
            match (atom(l), atom(r)) {
                (Some(l), Some(r)) => Ok(Generic::Compare(l, op, r)),
                _ => Err(format!(
                    "'{text}' does not compare two fields or literals; {HINT}"
                )),
            }
        }
        _ => Err(format!(
            "'{text}' has more than one comparison; the generic language takes one comparison of two fields or literals (set a language, e.g. sql, for other expressions)"
        )),
    }
}

/// Byte ranges of the runs of `<>=!` outside quoted strings.
fn operator_runs(text: &str) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = vec![];
    let mut quote: Option<char> = None;
    for (i, c) in text.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None if "<>=!".contains(c) => match runs.last_mut() {
                Some((_, end)) if *end == i => *end = i + 1,
                _ => runs.push((i, i + 1)),
            },
            None => {}
        }
    }
    runs
}

fn atom(s: &str) -> Option<Atom> {
    let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    let unsigned = s.strip_prefix('-').unwrap_or(s);
    if digits(unsigned) {
        // As Beam: some languages have 32-bit integer literals.
        return s
            .parse::<i64>()
            .ok()
            .filter(|v| v.abs() < 1 << 31)
            .map(Atom::Int);
    }
    if let Some((int, frac)) = unsigned.split_once('.')
        && digits(int)
        && (frac.is_empty() || digits(frac))
    {
        return Some(Atom::Float(s.to_string()));
    }
    for q in ['"', '\''] {
        if let Some(inner) = s.strip_prefix(q).and_then(|r| r.strip_suffix(q)) {
            // As Beam: no escapes, no quote inside.
            return (s.len() >= 2 && !inner.contains(q) && !inner.contains('\\'))
                .then(|| Atom::Str(inner.to_string()));
        }
    }
    is_field_path(s).then(|| Atom::Field(s.to_string()))
}

impl Atom {
    /// The SQL (DataFusion) form: fields quoted (nested ones by key), literals typed as
    /// Python types them (int → Int64, float → Float64, str → Utf8).
    pub fn to_sql(&self) -> String {
        match self {
            Atom::Field(path) => {
                let mut parts = path.split('.');
                let mut s = format!("\"{}\"", parts.next().unwrap_or_default());
                for p in parts {
                    s.push_str(&format!("['{p}']"));
                }
                s
            }
            Atom::Int(v) => format!("CAST({v} AS BIGINT)"),
            Atom::Float(t) => format!("CAST({} AS DOUBLE)", t.trim_end_matches('.')),
            Atom::Str(s) => format!("'{}'", s.replace('\'', "''")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atoms_and_comparisons_parse_as_beam_reads_them() {
        use Atom::*;
        assert_eq!(parse("389", false), Ok(Generic::Atom(Int(389))));
        assert_eq!(parse("-7", false), Ok(Generic::Atom(Int(-7))));
        assert_eq!(parse("1.9", false), Ok(Generic::Atom(Float("1.9".into()))));
        assert_eq!(parse("2.", false), Ok(Generic::Atom(Float("2.".into()))));
        assert_eq!(
            parse("\"text\"", false),
            Ok(Generic::Atom(Str("text".into())))
        );
        assert_eq!(parse("a.b", false), Ok(Generic::Atom(Field("a.b".into()))));
        assert_eq!(
            parse("col2 > 0", true),
            Ok(Generic::Compare(Field("col2".into()), CmpOp::Gt, Int(0)))
        );
        assert_eq!(
            parse("a >= 'x=y'", true),
            Ok(Generic::Compare(
                Field("a".into()),
                CmpOp::Ge,
                Str("x=y".into())
            ))
        );
        assert_eq!(
            parse("\"a\" != b", true),
            Ok(Generic::Compare(
                Str("a".into()),
                CmpOp::Ne,
                Field("b".into())
            ))
        );
    }

    #[test]
    fn everything_else_is_refused_with_the_reason() {
        let e = parse("2147483648", false).unwrap_err();
        assert!(
            e.contains("'2147483648' is not a field name or a literal"),
            "{e}"
        );
        let e = parse("x + 1", true).unwrap_err();
        assert!(e.contains("'x + 1' is not a field name"), "{e}");
        let e = parse("x > 1", false).unwrap_err();
        assert!(
            e.contains("only in MapToFields fields and Filter keep"),
            "{e}"
        );
        let e = parse("x => 1", true).unwrap_err();
        assert!(e.contains("'=>' is not a comparison"), "{e}");
        let e = parse("0 < x < 2", true).unwrap_err();
        assert!(e.contains("more than one comparison"), "{e}");
        let e = parse("x > y + 1", true).unwrap_err();
        assert!(e.contains("does not compare two fields or literals"), "{e}");
        let e = parse("\"a\\\"b\"", false).unwrap_err();
        assert!(e.contains("is not a field name or a literal"), "{e}");
    }

    #[test]
    fn literals_become_typed_sql() {
        assert_eq!(Atom::Int(389).to_sql(), "CAST(389 AS BIGINT)");
        assert_eq!(Atom::Float("2.".into()).to_sql(), "CAST(2 AS DOUBLE)");
        assert_eq!(Atom::Str("it's".into()).to_sql(), "'it''s'");
        assert_eq!(Atom::Field("a.b".into()).to_sql(), "\"a\"['b']");
    }
}
