//! The package-isolation example (rules/examples/package-isolation): a
//! tenant, who may write PackageInstalls (spec, status, annotations) in
//! their own namespace, cannot touch another tenant's package roles. The
//! property ranges over what foreign tenants write: installs in namespaces
//! sorting before and after the victim's, naming the victim's package (or
//! not), listing the victim's types, paused or not, in managed namespaces
//! or not.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

mod support;
use support::engine::store;

use proptest::prelude::*;
use rbac_rules::engine::{Engine, Evaluation, Options, RuleSource};
use serde_json::{Value, json};

const VICTIM: &str = "team-a";
const VICTIM_TYPE: &str = "wordpressinstances.wordpress.samples.example.org";
const PACKAGE: &str = "wordpressinc/wordpress:1.1";
/// A type the package manager installed for every foreign namespace.
const FOREIGN_TYPE: &str = "gadgets.mallory.example.org";
const FOREIGN_NAMESPACES: &[&str] = &["a-mallory", "team-0", "team-b", "team-a-x", "zz-eve"];

fn rules() -> Vec<RuleSource> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules/examples/package-isolation");
    rbac_rules::rules::load(&[dir]).expect("rules load")
}

fn crd(name: &str, namespaces: &[&str]) -> Value {
    let (plural, group) = name.split_once('.').expect("plural.group");
    let mut labels = serde_json::Map::new();
    labels.insert("crossplane.io/scope".into(), json!("namespace"));
    for ns in namespaces {
        labels.insert(format!("namespace.crossplane.io/{ns}"), json!("true"));
    }
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": name, "labels": labels},
           "spec": {"group": group, "names": {"plural": plural, "kind": "Thing"}, "scope": "Namespaced",
                    "versions": [{"name": "v1", "served": true, "storage": true}]}})
}

fn namespace(name: &str, managed: bool) -> Value {
    let labels = if managed {
        json!({"rbac.crossplane.io/managed-roles": "true"})
    } else {
        json!({})
    };
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": name, "uid": format!("u-{name}"), "labels": labels}})
}

fn install(ns: &str, name: &str, package: &str, owned: &[&str], paused: bool) -> Value {
    let annotations = if paused {
        json!({"crossplane.io/paused": "true"})
    } else {
        json!({})
    };
    json!({"apiVersion": "packages.crossplane.io/v1alpha1", "kind": "PackageInstall",
           "metadata": {"name": name, "namespace": ns, "uid": format!("u-{ns}-{name}"),
                        "annotations": annotations},
           "spec": {"package": package},
           "status": {"ownedCRDs": owned.iter().map(|n| json!({"name": n})).collect::<Vec<_>>()}})
}

/// The victim's world: its managed namespace, its install, the CRD the
/// package manager installed for it, and the foreign tenants' own CRD.
fn victim() -> Vec<Value> {
    vec![
        namespace(VICTIM, true),
        install(VICTIM, "wordpress", PACKAGE, &[VICTIM_TYPE], false),
        crd(VICTIM_TYPE, &[VICTIM]),
        crd(FOREIGN_TYPE, FOREIGN_NAMESPACES),
    ]
}

/// What a foreign tenant writes.
#[derive(Clone, Debug)]
struct Foreign {
    ns: &'static str,
    managed: bool,
    name: &'static str,
    package: &'static str,
    owned: Vec<&'static str>,
    paused: bool,
}

fn foreign() -> impl Strategy<Value = Foreign> {
    (
        prop::sample::select(FOREIGN_NAMESPACES),
        any::<bool>(),
        prop::sample::select(&["wordpress", "a", "zz"][..]),
        prop::sample::select(&[PACKAGE, "wordpressinc/wordpress:1.2", "evil/pkg:1"][..]),
        prop::sample::subsequence(&[VICTIM_TYPE, FOREIGN_TYPE, "*.*"][..], 0..=3),
        any::<bool>(),
    )
        .prop_map(|(ns, managed, name, package, owned, paused)| Foreign {
            ns,
            managed,
            name,
            package,
            owned,
            paused,
        })
}

fn evaluate(objects: &[Value]) -> Evaluation {
    Engine::new(&rules(), Options::default()).evaluate(&store(objects))
}

/// What the victim's access is made of: its namespace's objects whole, and
/// the rules of every ClusterRole that aggregates into its namespace's
/// roles (labelled for it) or that one of its bindings references. (The
/// label sets of roles shared by every managed namespace, like the
/// namespace defaults, grow with other namespaces; their rules must not.)
fn victims(eval: &Evaluation) -> BTreeMap<String, Value> {
    let label = format!("namespace.crossplane.io/{VICTIM}");
    let mut out = BTreeMap::new();
    let mut referenced = BTreeSet::new();
    for d in eval.desired.iter().filter(|d| d.namespace == VICTIM) {
        let o = d.object.to_value();
        if let Some(r) = o["roleRef"]["name"].as_str() {
            referenced.insert(r.to_string());
        }
        out.insert(format!("{} {}/{}", d.kind.as_str(), d.namespace, d.name), o);
    }
    for d in eval
        .desired
        .iter()
        .filter(|d| d.kind.as_str() == "ClusterRole")
    {
        let o = d.object.to_value();
        if o["metadata"]["labels"].get(&label).is_some() || referenced.contains(&*d.name) {
            out.insert(format!("ClusterRole {} rules", d.name), o["rules"].clone());
        }
    }
    out
}

/// Whether a ClusterRole grants anything on the victim's type.
fn grants_victim_type(role: &Value) -> bool {
    let (plural, group) = VICTIM_TYPE.split_once('.').expect("plural.group");
    role["rules"].as_array().into_iter().flatten().any(|r| {
        r["apiGroups"]
            .as_array()
            .is_some_and(|g| g.iter().any(|g| g == group || g == "*"))
            && r["resources"]
                .as_array()
                .is_some_and(|rs| rs.iter().any(|x| x == plural || x == "*"))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Whatever foreign tenants write, the victim's outputs are those it
    /// has alone, and nothing that serves a foreign namespace grants the
    /// victim's type (the package manager installed it for the victim only).
    #[test]
    fn foreign_installs_never_touch_a_tenants_package_roles(
        foreigners in prop::collection::vec(foreign(), 1..5)
    ) {
        let alone = victims(&evaluate(&victim()));
        prop_assert!(alone.values().any(|v| v.to_string().contains("wordpressinstances")));
        let mut objects = victim();
        let mut namespaces: BTreeMap<&str, bool> = BTreeMap::new();
        let mut installs: BTreeSet<(&str, &str)> = BTreeSet::new();
        for f in &foreigners {
            *namespaces.entry(f.ns).or_default() |= f.managed;
            if installs.insert((f.ns, f.name)) {
                objects.push(install(f.ns, f.name, f.package, &f.owned, f.paused));
            }
        }
        for (ns, managed) in &namespaces {
            objects.push(namespace(ns, *managed));
        }
        let eval = evaluate(&objects);
        prop_assert_eq!(victims(&eval), alone);
        for d in eval.desired.iter().filter(|d| d.kind.as_str() == "ClusterRole") {
            let role = d.object.to_value();
            let labels = role["metadata"]["labels"].as_object().cloned().unwrap_or_default();
            let serves_foreign = FOREIGN_NAMESPACES
                .iter()
                .any(|ns| labels.contains_key(&format!("namespace.crossplane.io/{ns}")))
                || FOREIGN_NAMESPACES.iter().any(|ns| d.name.contains(&format!(":{ns}:")));
            prop_assert!(
                !(serves_foreign && grants_victim_type(&role)),
                "{} serves a foreign namespace and grants {VICTIM_TYPE}", d.name
            );
        }
        // Every foreign install's system binding names its own namespace's role.
        for d in eval.desired.iter().filter(|d| d.kind.as_str() == "RoleBinding") {
            let role_ref = d.object.to_value()["roleRef"]["name"].as_str().unwrap_or_default().to_string();
            prop_assert!(
                role_ref.starts_with(&format!("package:{}:", d.namespace)),
                "{}/{} binds {role_ref}", d.namespace, d.name
            );
        }
    }
}
