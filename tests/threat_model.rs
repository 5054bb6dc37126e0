//! The threat model of docs/security.md, its writers together: a legitimate
//! Crossplane platform (XRDs, a provider, team Namespaces) and, at once,
//! every actor of the table writing what Kubernetes and Crossplane let it
//! write — a package author's revision and its MRD taking over another
//! tool's CRD (controller and non-controller references), an XRD author
//! naming that CRD, a Namespace labeller accepting real, made-up and
//! hostile XRD names, and whoever may label ClusterRoles labelling a
//! third party's roles into the copies and aggregates. The property ranges
//! over those writes, with the built-in rules and the shipped allow-list:
//! the foreign type is never granted, no third party's rules are copied,
//! and every innocent team still gets its roles, nothing refused for size.

use std::collections::BTreeSet;

use proptest::prelude::*;
use rbac_rules::api::OutputKind;
use rbac_rules::engine::{Engine, ErrorKind, Evaluation, Options};
use serde_json::{Value, json};

mod support;
use support::engine::{
    builtin, granted, namespace, provider, provider_ref, revision, revision_crds,
    shipped_allow_list, store, xrd, xrd_crds,
};

/// Another tool's CRD, installed (by Helm, without ownerReferences) long
/// before Crossplane.
const FOREIGN: &str = "clusterpolicies.kyverno.io";
const FOREIGN_GROUP: &str = "kyverno.io";
const FOREIGN_CREATED: &str = "2025-06-01T00:00:00Z";

/// The innocent XRDs (all with claims; XRD 3's claim is hostile in the
/// shared fixtures, so it is left out).
const XRDS: [usize; 3] = [0, 1, 2];

/// What the package author gets Crossplane to write on the foreign CRD.
#[derive(Clone, Debug)]
struct PackageAuthor {
    /// An inactive revision naming it: non-controller references to the
    /// revision and its Provider (establisher.go `update`, `!control`).
    inactive_refs: bool,
    /// An active revision or an MRD force-applied over it: the revision as
    /// controller (establisher.go `AddControllerReference`; managed/crd.go).
    takeover: bool,
}

/// What the XRD author writes: an XRD named like the foreign CRD, and
/// Crossplane's XRD controller taking the CRD over (no controller yet).
#[derive(Clone, Debug)]
struct XrdAuthor {
    named_like_foreign: bool,
    /// Seconds after the foreign CRD the XRD is created.
    created_after: u32,
}

/// Which names a Namespace labeller accepts claims of, per team.
#[derive(Clone, Debug)]
struct Labeller {
    teams: Vec<(Vec<usize>, bool, bool)>,
}

/// A third party's role labelled for the namespace copies and the
/// Crossplane aggregates.
#[derive(Clone, Debug)]
struct RoleLabeller {
    into_copies: bool,
    into_aggregates: bool,
    everything: bool,
}

fn package_author() -> impl Strategy<Value = PackageAuthor> {
    (any::<bool>(), any::<bool>()).prop_map(|(inactive_refs, takeover)| PackageAuthor {
        inactive_refs,
        takeover,
    })
}

fn xrd_author() -> impl Strategy<Value = XrdAuthor> {
    (any::<bool>(), 0u32..100_000_000).prop_map(|(named_like_foreign, created_after)| XrdAuthor {
        named_like_foreign,
        created_after,
    })
}

fn labeller() -> impl Strategy<Value = Labeller> {
    proptest::collection::vec(
        (
            proptest::sample::subsequence(XRDS.to_vec(), 0..=XRDS.len()),
            any::<bool>(),
            any::<bool>(),
        ),
        1..4,
    )
    .prop_map(|teams| Labeller { teams })
}

fn role_labeller() -> impl Strategy<Value = RoleLabeller> {
    (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
        |(into_copies, into_aggregates, everything)| RoleLabeller {
            into_copies,
            into_aggregates,
            everything,
        },
    )
}

/// RFC 3339 of `secs` after the foreign CRD's creation.
fn after_foreign(secs: u32) -> String {
    let base = 1_748_736_000u64; // 2025-06-01T00:00:00Z
    let t = base + u64::from(secs);
    let days = t / 86_400;
    let rem = t % 86_400;
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn world(p: &PackageAuthor, x: &XrdAuthor, l: &Labeller, r: &RoleLabeller) -> Vec<Value> {
    let mut objects = Vec::new();
    // The legitimate platform.
    for i in XRDS {
        objects.push(xrd(i, true, false));
        objects.extend(xrd_crds(i, true));
    }
    objects.push(provider(0));
    objects.push(revision(0, 0, "org", 2));
    objects.extend(revision_crds(0, 2));
    // The foreign CRD and what Crossplane writes on it for the actors.
    let mut refs = Vec::new();
    if p.inactive_refs {
        refs.push(
            json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
                         "name": "provider-0", "uid": "pr-0", "controller": false}),
        );
        refs.push(provider_ref(0, false));
    }
    if p.takeover {
        refs.retain(|r| r["kind"] != "ProviderRevision");
        refs.push(
            json!({"apiVersion": "pkg.crossplane.io/v1", "kind": "ProviderRevision",
                         "name": "provider-0", "uid": "pr-0", "controller": true}),
        );
    }
    if x.named_like_foreign {
        objects.push(json!({"apiVersion": "apiextensions.crossplane.io/v1",
            "kind": "CompositeResourceDefinition",
            "metadata": {"name": FOREIGN, "uid": "xrd-foreign",
                         "creationTimestamp": after_foreign(x.created_after)},
            "spec": {"group": FOREIGN_GROUP,
                     "names": {"kind": "ClusterPolicy", "plural": "clusterpolicies"}}}));
        // MustBeControllableBy passes on a CRD with no controller.
        if !p.takeover {
            refs.push(json!({"apiVersion": "apiextensions.crossplane.io/v1",
                             "kind": "CompositeResourceDefinition", "name": FOREIGN,
                             "uid": "xrd-foreign", "controller": true}));
        }
    }
    objects.push(
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": FOREIGN, "uid": "crd-foreign", "creationTimestamp": FOREIGN_CREATED,
                     "ownerReferences": refs},
        "spec": {"group": FOREIGN_GROUP, "names": {"plural": "clusterpolicies"}}}),
    );
    // The Namespace labeller.
    for (n, (accepted, made_up, foreign)) in l.teams.iter().enumerate() {
        let mut ns = namespace(n, accepted);
        let ann = ns["metadata"]["annotations"]
            .as_object_mut()
            .expect("annotations");
        if *made_up {
            ann.insert(
                "rbac.crossplane.io/nothings.example.org".into(),
                json!("xrd-claim-accepted"),
            );
        }
        if *foreign {
            ann.insert(
                format!("rbac.crossplane.io/{FOREIGN}"),
                json!("xrd-claim-accepted"),
            );
        }
        objects.push(ns);
    }
    // Whoever may label ClusterRoles: a third party's role.
    let mut labels = serde_json::Map::new();
    labels.insert("app.kubernetes.io/part-of".into(), json!("argocd"));
    if r.into_copies {
        for k in ["admin", "edit", "view"] {
            labels.insert(
                format!("rbac.crossplane.io/aggregate-to-ns-{k}"),
                json!("true"),
            );
            labels.insert(format!("rbac.crossplane.io/base-of-ns-{k}"), json!("true"));
        }
    }
    if r.into_aggregates {
        labels.insert("rbac.crossplane.io/aggregate-to-edit".into(), json!("true"));
    }
    let rules = if r.everything {
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}])
    } else {
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}])
    };
    objects.push(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "argocd-application-controller", "labels": labels},
        "rules": rules}),
    );
    objects
}

fn evaluate(objects: &[Value]) -> Evaluation {
    let options = Options {
        allow: Some(shipped_allow_list()),
        ..Options::default()
    };
    Engine::new(&builtin(), options).evaluate(&store(objects))
}

/// Every (group, resource) the desired roles grant.
fn grants(eval: &Evaluation) -> BTreeSet<(String, String)> {
    eval.desired
        .iter()
        .filter(|d| d.kind.is_role())
        .flat_map(|d| granted(d.object.to_value()))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_writer_at_once_gets_nothing_it_does_not_own(
        p in package_author(),
        x in xrd_author(),
        l in labeller(),
        r in role_labeller(),
    ) {
        let objects = world(&p, &x, &l, &r);
        let eval = evaluate(&objects);
        let granted = grants(&eval);

        // Package and XRD authors: the foreign type is never granted.
        prop_assert!(
            !granted.iter().any(|(g, _)| g == FOREIGN_GROUP),
            "the foreign type is granted: {:?}",
            granted.iter().filter(|(g, _)| g == FOREIGN_GROUP).collect::<Vec<_>>()
        );
        // The ClusterRole labeller: no Namespace's Role copies the third
        // party's rules.
        for d in eval.desired.iter().filter(|d| d.kind == OutputKind::Role) {
            let g = granted_of(d.object.to_value());
            prop_assert!(
                !g.contains(&(String::new(), "pods".to_string()))
                    && !g.contains(&("*".to_string(), "*".to_string())),
                "{}/{} copies the third party's rules: {g:?}",
                d.namespace,
                d.name
            );
        }
        // Nobody's load refuses anyone: no limit was hit.
        for (rule, report) in eval.reports.iter() {
            prop_assert!(
                !report.errors.iter().any(|e| e.kind == ErrorKind::LimitExceeded),
                "{rule}: {:?}", report.errors
            );
        }
        // The innocent teams keep their roles: each accepted XRD's claim
        // type is in its Namespace's crossplane-edit Role.
        for (n, (accepted, made_up, foreign)) in l.teams.iter().enumerate() {
            if accepted.is_empty() && !made_up && !foreign {
                continue; // not a trigger: no roles asked for
            }
            let ns = format!("team-{n}");
            let edit = eval
                .desired
                .iter()
                .find(|d| d.kind == OutputKind::Role
                    && d.name == "crossplane-edit"
                    && d.namespace == ns)
                .map(|d| granted_of(d.object.to_value()));
            prop_assert!(edit.is_some(), "{ns} has no crossplane-edit Role");
            let edit = edit.unwrap_or_default();
            for i in accepted {
                prop_assert!(
                    edit.contains(&("example.org".to_string(), format!("things{i}"))),
                    "{ns} lost the claims of XRD {i}: {edit:?}"
                );
            }
            // The base role (secrets, events) is still copied.
            prop_assert!(
                edit.contains(&(String::new(), "secrets".to_string())),
                "{ns} lost the base rules: {edit:?}"
            );
        }
    }
}

fn granted_of(v: Value) -> BTreeSet<(String, String)> {
    granted(v)
}

#[test]
fn the_timestamps_of_the_writers_are_rfc3339() {
    assert_eq!(after_foreign(0), FOREIGN_CREATED);
    assert_eq!(after_foreign(86_400 * 31 + 3_661), "2025-07-02T01:01:01Z");
}
