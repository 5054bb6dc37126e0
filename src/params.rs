//! `--param NAME=VALUE`: the installation's settings rules read as
//! `params.<name>` (see [`crate::api::Param`]), shared by every command that
//! evaluates rules.

use std::collections::BTreeMap;

/// The `--param` flags of a command.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ParamArgs {
    /// A setting rules read as `params.NAME`, overriding the default each
    /// declaring rule gives (repeatable; the environment variable takes
    /// a comma-separated list). Example: `--param appNamespace=tools`.
    #[arg(
        long = "param",
        value_name = "NAME=VALUE",
        env = "RBAC_RULES_PARAMS",
        value_delimiter = ',',
        value_parser = parse_param
    )]
    pub params: Vec<(String, String)>,
}

impl ParamArgs {
    /// The settings by name (a later flag wins).
    pub fn map(&self) -> BTreeMap<String, String> {
        self.params.iter().cloned().collect()
    }
}

/// Parses `NAME=VALUE`.
pub fn parse_param(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not NAME=VALUE")),
    }
}

/// The names given that no rule declares: most likely typos.
pub fn undeclared<'a>(
    given: &'a BTreeMap<String, String>,
    rules: &[crate::engine::RuleSource],
) -> Vec<&'a str> {
    given
        .keys()
        .filter(|k| {
            !rules
                .iter()
                .any(|r| r.spec.params.iter().any(|p| &p.name == *k))
        })
        .map(String::as_str)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_name_and_value() {
        assert_eq!(parse_param("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert_eq!(parse_param("ns="), Ok(("ns".into(), String::new())));
        assert!(parse_param("novalue").is_err());
        assert!(parse_param("=x").is_err());
    }
}
