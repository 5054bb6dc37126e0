//! `--param NAME=VALUE`: the installation's settings rules read as
//! `params.<name>` (see [`crate::api::Param`]), shared by every command that
//! evaluates rules.
//!
//! Settings are data: each is given whole, one per flag or one per
//! environment variable (`RBAC_RULES_PARAM_<name>`), and nothing in a value
//! (a `,`, a `=`, a newline) is ever read as the start of another setting.
//! The old `RBAC_RULES_PARAMS`, one variable split at every `,`, let a value
//! such as `devs,appNamespace=team-a` set a second param; it is
//! refused with a message naming its replacement, never read.

use std::collections::BTreeMap;

/// The prefix of the environment variables that each give one param:
/// `RBAC_RULES_PARAM_appNamespace=xp-system`. The name after it is
/// the param's name as rules spell it (camelCase included).
pub const ENV_PREFIX: &str = "RBAC_RULES_PARAM_";

/// The variable that once held every param, split at `,`; refused.
pub const OLD_ENV: &str = "RBAC_RULES_PARAMS";

/// Why the params given to a command cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    /// `--param` without `NAME=`, or a name that is not a param name.
    #[error(
        "--param {given:?}: expected NAME=VALUE with NAME a param name (letters, digits, _; not starting with a digit)"
    )]
    BadFlag {
        /// The flag's value as given.
        given: String,
    },
    /// A `RBAC_RULES_PARAM_*` variable whose suffix is not a param name.
    #[error(
        "environment variable {var}: {name:?} is not a param name (letters, digits, _; not starting with a digit)"
    )]
    BadEnvName {
        /// The variable.
        var: String,
        /// What follows the prefix.
        name: String,
    },
    /// A `RBAC_RULES_PARAM_*` variable whose value is not Unicode.
    #[error("environment variable {var}: the value is not valid UTF-8")]
    NotUnicode {
        /// The variable.
        var: String,
    },
    /// The same param given by two flags: neither silently wins.
    #[error("--param {name}: given twice ({first:?} and {second:?}); give each param once")]
    Twice {
        /// The param.
        name: String,
        /// The first value.
        first: String,
        /// The second value.
        second: String,
    },
    /// `RBAC_RULES_PARAMS` is set.
    #[error(
        "environment variable RBAC_RULES_PARAMS is no longer read (it split its value at every ',', so a value could set another param): give each param its own variable, {example}, or flag, --param NAME=VALUE; the Helm value `params` does this"
    )]
    OldVariable {
        /// The replacement for what it holds, e.g.
        /// `RBAC_RULES_PARAM_appNamespace=xp-system`.
        example: String,
    },
}

/// Where a param's value was given, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A `--param` flag.
    Flag,
    /// An environment variable `RBAC_RULES_PARAM_<name>`.
    Env,
}

impl Origin {
    /// The origin as a message names it: `--param NAME` or
    /// `environment variable RBAC_RULES_PARAM_NAME`.
    pub fn describe(&self, name: &str) -> String {
        match self {
            Origin::Flag => format!("--param {name}"),
            Origin::Env => format!("environment variable {ENV_PREFIX}{name}"),
        }
    }
}

/// The `--param` flags of a command, and, once
/// [`ParamArgs::read_environment`] ran, the `RBAC_RULES_PARAM_*`
/// environment variables.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ParamArgs {
    /// A setting rules read as `params.NAME`, overriding the default each
    /// declaring rule gives; one param per flag, the value taken whole
    /// (`,` and `=` in it are part of it). Repeat for more params. Each
    /// param may also be given by its own environment variable
    /// `RBAC_RULES_PARAM_<NAME>` (e.g. RBAC_RULES_PARAM_appNamespace=tools); a
    /// flag wins over the variable. Example: `--param appNamespace=tools`.
    #[arg(long = "param", value_name = "NAME=VALUE", value_parser = parse_param)]
    pub params: Vec<(String, String)>,
    /// The params of `RBAC_RULES_PARAM_*` variables (filled by
    /// [`ParamArgs::read_environment`]).
    #[arg(skip)]
    pub env: Vec<(String, String)>,
}

impl ParamArgs {
    /// Reads the environment: one param per `RBAC_RULES_PARAM_<name>`
    /// variable; `RBAC_RULES_PARAMS` is an error. Also checks the flags: a
    /// param given twice is an error.
    pub fn read_environment(&mut self) -> Result<(), ParamError> {
        self.read_from(std::env::vars_os())
    }

    /// [`ParamArgs::read_environment`] over the given variables.
    pub fn read_from(
        &mut self,
        vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    ) -> Result<(), ParamError> {
        let mut env = Vec::new();
        for (k, v) in vars {
            // A variable whose name is not Unicode cannot start with our
            // prefix (which is ASCII), so it is not ours.
            let Some(k) = k.to_str() else { continue };
            if k == OLD_ENV {
                return Err(ParamError::OldVariable {
                    example: old_example(&v.to_string_lossy()),
                });
            }
            let Some(name) = k.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            if !is_name(name) {
                return Err(ParamError::BadEnvName {
                    var: k.to_string(),
                    name: name.to_string(),
                });
            }
            let Some(v) = v.to_str() else {
                return Err(ParamError::NotUnicode { var: k.to_string() });
            };
            env.push((name.to_string(), v.to_string()));
        }
        env.sort();
        self.env = env;
        let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
        for (k, v) in &self.params {
            if let Some(first) = seen.insert(k, v) {
                return Err(ParamError::Twice {
                    name: k.clone(),
                    first: first.to_string(),
                    second: v.clone(),
                });
            }
        }
        Ok(())
    }

    /// The settings by name: the environment's, then the flags' (a flag
    /// wins over the variable of the same param).
    pub fn map(&self) -> BTreeMap<String, String> {
        self.env.iter().chain(&self.params).cloned().collect()
    }

    /// Where each setting of [`ParamArgs::map`] was given.
    pub fn origins(&self) -> BTreeMap<String, Origin> {
        let env = self.env.iter().map(|(k, _)| (k.clone(), Origin::Env));
        let flags = self.params.iter().map(|(k, _)| (k.clone(), Origin::Flag));
        env.chain(flags).collect()
    }
}

/// What to set instead of `RBAC_RULES_PARAMS=<old>`: its first entry as a
/// variable of its own, or a placeholder.
fn old_example(old: &str) -> String {
    match old.split(',').next().and_then(|e| e.split_once('=')) {
        Some((k, v)) if is_name(k.trim()) => format!("{ENV_PREFIX}{}={v}", k.trim()),
        _ => format!("{ENV_PREFIX}<NAME>=<VALUE>"),
    }
}

/// Whether `s` can name a param: what rules accept as `spec.params[].name`
/// (letters, digits and `_`, not starting with a digit).
pub fn is_name(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Parses `NAME=VALUE`: the name up to the first `=`, the value the whole
/// rest (a `,` or `=` in it is part of it).
pub fn parse_param(s: &str) -> Result<(String, String), ParamError> {
    match s.split_once('=') {
        Some((k, v)) if is_name(k) => Ok((k.to_string(), v.to_string())),
        _ => Err(ParamError::BadFlag { given: s.into() }),
    }
}

/// The names given that no rule (by its spec) declares: most likely typos.
pub fn undeclared<'a, 'r>(
    given: &'a BTreeMap<String, String>,
    specs: impl IntoIterator<Item = &'r crate::api::RbacRuleSpec>,
) -> Vec<&'a str> {
    let declared: std::collections::BTreeSet<&str> = specs
        .into_iter()
        .flat_map(|s| s.params.iter().map(|p| p.name.as_str()))
        .collect();
    given
        .keys()
        .filter(|k| !declared.contains(k.as_str()))
        .map(String::as_str)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(v: &[(&str, &str)]) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
        v.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
    }

    #[test]
    fn parses_name_and_value() {
        assert_eq!(parse_param("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert_eq!(parse_param("ns="), Ok(("ns".into(), String::new())));
        assert_eq!(
            parse_param("ns=devs,ns=team-a"),
            Ok(("ns".into(), "devs,ns=team-a".into()))
        );
        assert!(parse_param("novalue").is_err());
        assert!(parse_param("=x").is_err());
        assert!(parse_param(" ns=x").is_err());
        assert!(parse_param("1ns=x").is_err());
        assert!(parse_param("a.b=x").is_err());
    }

    #[test]
    fn one_variable_one_param() {
        let mut p = ParamArgs::default();
        p.read_from(vars(&[
            ("RBAC_RULES_PARAM_appNamespace", "devs,appNamespace=team-a"),
            ("RBAC_RULES_PARAMETERS", "x=y"),
            ("HOME", "/root"),
        ]))
        .expect("read");
        assert_eq!(
            p.map(),
            BTreeMap::from([(
                "appNamespace".to_string(),
                "devs,appNamespace=team-a".to_string()
            )])
        );
        assert_eq!(p.origins()["appNamespace"], Origin::Env);
    }

    #[test]
    fn a_flag_wins_over_the_variable() {
        let mut p = ParamArgs {
            params: vec![("ns".into(), "flag".into())],
            ..ParamArgs::default()
        };
        p.read_from(vars(&[("RBAC_RULES_PARAM_ns", "env")]))
            .expect("read");
        assert_eq!(p.map()["ns"], "flag");
        assert_eq!(p.origins()["ns"], Origin::Flag);
    }

    #[test]
    fn the_old_variable_and_bad_names_are_refused() {
        let e = ParamArgs::default()
            .read_from(vars(&[("RBAC_RULES_PARAMS", "appNamespace=xp")]))
            .expect_err("old");
        assert!(
            e.to_string().contains("RBAC_RULES_PARAM_appNamespace=xp"),
            "{e}"
        );
        let e = ParamArgs::default()
            .read_from(vars(&[("RBAC_RULES_PARAM_a-b", "x")]))
            .expect_err("bad name");
        assert!(e.to_string().contains("RBAC_RULES_PARAM_a-b"), "{e}");
        let e = ParamArgs {
            params: vec![("a".into(), "1".into()), ("a".into(), "2".into())],
            ..ParamArgs::default()
        }
        .read_from(vars(&[]))
        .expect_err("twice");
        assert!(e.to_string().contains("given twice"), "{e}");
    }
}
