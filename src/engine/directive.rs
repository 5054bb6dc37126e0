//! List directives: an entry of a template list that is a map of
//! `forEach`, `as`, `when` and `item` or `items` expands to zero or more
//! entries. Parsed alike by the checks, both evaluators and the cache keys.

use serde_json::Value;

/// The body of a list directive.
pub enum Body<'a> {
    /// One item per iteration.
    Item(&'a Value),
    /// A list of items spliced in per iteration.
    Items(&'a Value),
}

/// A parsed list directive.
pub struct Directive<'a> {
    pub for_each: Option<&'a str>,
    pub as_name: Option<&'a str>,
    pub when: Option<&'a str>,
    pub body: Body<'a>,
}

const DIRECTIVE_KEYS: &[&str] = &["forEach", "as", "when", "item", "items"];

/// Whether a list entry is a directive (a map whose keys are all directive
/// keys, with `item` or `items`), and its parts.
pub fn directive(v: &Value) -> Result<Option<Directive<'_>>, String> {
    let Value::Object(m) = v else { return Ok(None) };
    if m.is_empty() || !m.keys().all(|k| DIRECTIVE_KEYS.contains(&k.as_str())) {
        return Ok(None);
    }
    let text = |k: &str| -> Result<Option<&str>, String> {
        match m.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(format!("{k} must be a string")),
        }
    };
    let body = match (m.get("item"), m.get("items")) {
        (Some(i), None) => Body::Item(i),
        (None, Some(Value::Array(_))) => Body::Items(&m["items"]),
        (None, Some(_)) => return Err("items must be a list".to_string()),
        _ => return Err("a directive takes exactly one of item and items".to_string()),
    };
    let d = Directive {
        for_each: text("forEach")?,
        as_name: text("as")?,
        when: text("when")?,
        body,
    };
    if d.as_name.is_some() && d.for_each.is_none() {
        return Err("as needs forEach".to_string());
    }
    Ok(Some(d))
}
