//! Beam's `generic` language (`riverbank_pipeline::config::generic`) as a SQL expression over a
//! schema, with Python's meaning: `==`/`!=` treat null as a value (`None == None`), and a
//! string is never equal to a number; ordering a string and a number is refused here, where
//! Beam's Python would raise for every element.
use arrow::datatypes::{DataType, Schema};
use riverbank_pipeline::config::generic::{self, Atom, CmpOp, Generic};

/// The SQL form of a generic expression over `schema` (already validated by the planner).
pub fn to_sql(text: &str, schema: &Schema) -> Result<String, String> {
    let g = generic::parse(text, true).map_err(|e| format!("cannot compile '{text}': {e}"))?;
    let (l, op, r) = match g {
        Generic::Atom(a) => return Ok(a.to_sql()),
        Generic::Compare(l, op, r) => (l, op, r),
    };
    let (lk, rk) = (kind(&l, schema), kind(&r, schema));
    if let (Some(a), Some(b)) = (lk, rk)
        && a != b
    {
        if op.orders() {
            return Err(format!(
                "cannot compile '{text}': it orders a string and a number, which Python refuses"
            ));
        }
        // Python: a string never equals a number.
        return Ok(if op == CmpOp::Eq { "false" } else { "true" }.into());
    }
    let sql_op = match op {
        CmpOp::Eq => "IS NOT DISTINCT FROM",
        CmpOp::Ne => "IS DISTINCT FROM",
        CmpOp::Lt => "<",
        CmpOp::Le => "<=",
        CmpOp::Gt => ">",
        CmpOp::Ge => ">=",
    };
    Ok(format!("({}) {sql_op} ({})", l.to_sql(), r.to_sql()))
}

/// Whether an operand is a string or a number (`None` for other types and unknown fields,
/// which the SQL compiler then reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    Num,
}

fn kind(a: &Atom, schema: &Schema) -> Option<Kind> {
    match a {
        Atom::Int(_) | Atom::Float(_) => Some(Kind::Num),
        Atom::Str(_) => Some(Kind::Str),
        Atom::Field(path) => {
            let mut parts = path.split('.');
            let mut t = schema
                .field_with_name(parts.next()?)
                .ok()?
                .data_type()
                .clone();
            for p in parts {
                t = match &t {
                    DataType::Struct(fs) => fs.find(p)?.1.data_type().clone(),
                    _ => return None,
                };
            }
            match t {
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Some(Kind::Str),
                t if t.is_numeric() => Some(Kind::Num),
                _ => None,
            }
        }
    }
}
