//! A deterministic generator of synthetic control planes: the objects the
//! built-in rules (`rules/`) read, at three sizes. The kinds, groups, label
//! and annotation keys come from `bench/control-plane.yaml` ([`Names`]).
//!
//! No randomness: object `i` of a scenario is always the same object, so
//! two runs (or two processes of one run) see byte-identical input.
//!
//! - package revisions in families (the family label, one image org per
//!   family), whose `status.objectRefs` list the scenario's CRDs, spread
//!   evenly;
//! - one package per revision, controlling it and created before it;
//! - the CRDs themselves, as a real cluster holds them: each revision's
//!   controlled by it (its package an owner too), each XRD's (its types and
//!   claims) controlled by it, all created after their package or XRD (the
//!   proof of lineage the built-in rules require);
//! - one Deployment per revision in the system namespace, controlled by its
//!   revision (ownerReference with `controller: true`);
//! - XRDs, every even-numbered one with claimNames;
//! - Namespaces, each accepting claims of some claim-bearing XRDs (the
//!   acceptance annotation).

use std::sync::OnceLock;

use serde_json::{Value, json};

/// The names of the generated kinds, from `bench/control-plane.yaml`.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Names {
    /// The package revisions.
    pub revision: RevisionNames,
    /// Namespace of the revisions' Deployments.
    pub system_namespace: String,
    /// The packages that control the revisions.
    pub package: PackageNames,
    /// The XRDs.
    pub definition: DefinitionNames,
    /// How a Namespace accepts claims.
    pub namespace: NamespaceNames,
}

/// Names of the package revision kind.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RevisionNames {
    /// apiVersion.
    pub api_version: String,
    /// kind.
    pub kind: String,
    /// Plural, as in API paths.
    pub plural: String,
    /// Label naming a revision's family.
    pub family_label: String,
    /// A revision's name: prefix, number, suffix.
    pub name_prefix: String,
    /// See `name_prefix`.
    pub name_suffix: String,
}

/// Names of the package kind.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PackageNames {
    /// apiVersion.
    pub api_version: String,
    /// kind.
    pub kind: String,
    /// Plural, as in API paths.
    pub plural: String,
}

/// Names of the XRD kind.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DefinitionNames {
    /// apiVersion.
    pub api_version: String,
    /// kind.
    pub kind: String,
    /// Plural, as in API paths.
    pub plural: String,
    /// API group of the types XRDs define.
    pub type_group: String,
}

/// How a Namespace accepts claims of an XRD.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespaceNames {
    /// Annotation key prefix, followed by the XRD's name.
    pub annotation_prefix: String,
    /// Annotation value.
    pub accepted_value: String,
}

/// The text of `bench/control-plane.yaml`, built in.
const NAMES_YAML: &str = include_str!("../control-plane.yaml");

impl Names {
    /// The built-in names (parsed once).
    pub fn builtin() -> Result<&'static Names, String> {
        static NAMES: OnceLock<Result<Names, String>> = OnceLock::new();
        NAMES
            .get_or_init(|| {
                serde_saphyr::from_str(NAMES_YAML)
                    .map_err(|e| format!("bench/control-plane.yaml: {e}"))
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// A named size of control plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// CI-cheap: 7 revisions, 100 CRDs, 50 XRDs, 100 namespaces.
    Small,
    /// 70 revisions, 1,000 CRDs, 500 XRDs, 2,000 namespaces, and the CRDs
    /// a real cluster holds for their types (4,460 objects in).
    Large,
    /// 70 revisions, 1,000 CRDs, 5,000 XRDs, 20,000 namespaces, and their
    /// types' CRDs (33,710 in).
    Xl,
    /// The Upbound AWS provider family on Crossplane v2: 151 revisions of
    /// one family, 2,108 CRDs, each member lending its family's types (so
    /// every member's roles list all 2,108), 50 XRDs, 100 namespaces.
    Aws,
    /// `xl`'s 20,000 namespaces accepting 10 claims each and 5,000 XRDs,
    /// with the whole AWS family of `aws` (34,910 objects in).
    Crossplane,
}

impl Scenario {
    /// Its sizes.
    pub fn sizes(self) -> Sizes {
        match self {
            Scenario::Small => Sizes {
                revisions: 7,
                family_size: 7,
                crds: 100,
                xrds: 50,
                namespaces: 100,
                accepted_per_namespace: 10,
            },
            Scenario::Large => Sizes {
                revisions: 70,
                family_size: 7,
                crds: 1_000,
                xrds: 500,
                namespaces: 2_000,
                accepted_per_namespace: 10,
            },
            Scenario::Xl => Sizes {
                revisions: 70,
                family_size: 7,
                crds: 1_000,
                xrds: 5_000,
                namespaces: 20_000,
                accepted_per_namespace: 10,
            },
            Scenario::Aws => Sizes {
                revisions: 151,
                family_size: 151,
                crds: 2_108,
                xrds: 50,
                namespaces: 100,
                accepted_per_namespace: 10,
            },
            Scenario::Crossplane => Sizes {
                revisions: 151,
                family_size: 151,
                crds: 2_108,
                xrds: 5_000,
                namespaces: 20_000,
                accepted_per_namespace: 10,
            },
        }
    }

    /// Its name, as `--scenario` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Small => "small",
            Scenario::Large => "large",
            Scenario::Xl => "xl",
            Scenario::Aws => "aws",
            Scenario::Crossplane => "crossplane",
        }
    }
}

/// The sizes of a synthetic control plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Sizes {
    /// ProviderRevisions (and as many provider Deployments).
    pub revisions: usize,
    /// Revisions per provider family.
    pub family_size: usize,
    /// CRDs named in all revisions' `status.objectRefs` together.
    pub crds: usize,
    /// CompositeResourceDefinitions; half (the even-numbered) have claimNames.
    pub xrds: usize,
    /// Namespaces.
    pub namespaces: usize,
    /// Claim-bearing XRDs each namespace accepts claims of.
    pub accepted_per_namespace: usize,
}

impl Sizes {
    /// Objects in: packages, revisions, Deployments, CRDs (the revisions', each
    /// XRD's and each claim's), XRDs and Namespaces.
    pub fn objects_in(&self) -> usize {
        3 * self.revisions + self.crds + 2 * self.xrds + self.claim_xrds() + self.namespaces
    }

    /// XRDs with claimNames (the even-numbered ones).
    pub fn claim_xrds(&self) -> usize {
        self.xrds.div_ceil(2)
    }

    /// The most outputs one change of a revision's objectRefs may touch:
    /// a revision's three ClusterRoles (edit, system, view) list the types
    /// of its whole family (`of: [trigger, family]` in
    /// the provider rules in rules/), so every member's three change.
    pub fn max_touched_per_revision_change(&self) -> usize {
        3 * self.family_size
    }
}

/// A deterministic resourceVersion source, as a live cluster numbers its
/// writes.
#[derive(Clone, Debug)]
pub struct Versions(u64);

impl Default for Versions {
    fn default() -> Self {
        Versions(1)
    }
}

impl Versions {
    /// The next resourceVersion.
    pub fn bump(&mut self) -> String {
        self.0 += 1;
        self.0.to_string()
    }
}

/// A control plane to generate: its names and sizes.
#[derive(Clone, Copy, Debug)]
pub struct Plane<'a> {
    /// Kinds, groups, label and annotation keys.
    pub names: &'a Names,
    /// How many of each.
    pub sizes: Sizes,
}

impl Plane<'_> {
    /// Family of revision `p`.
    fn family(&self, p: usize) -> usize {
        p / self.sizes.family_size.max(1)
    }

    /// metadata.name of revision `p`.
    pub fn revision_name(&self, p: usize) -> String {
        let r = &self.names.revision;
        format!("{}{p}{}", r.name_prefix, r.name_suffix)
    }

    /// The API group of revision `p`'s types.
    fn revision_group(&self, p: usize) -> String {
        format!("p{p}.family{}.example.org", self.family(p))
    }

    /// The CRDs revision `p` lists: `crds` spread evenly, the first
    /// revisions taking one more when they do not divide.
    fn revision_refs(&self, p: usize) -> Vec<Value> {
        let r = self.sizes.revisions.max(1);
        let count = self.sizes.crds / r + usize::from(p < self.sizes.crds % r);
        let group = self.revision_group(p);
        (0..count)
            .map(|t| crd_ref(&format!("kind{t}s.{group}")))
            .collect()
    }

    /// Revision `p` with the given objectRefs.
    fn revision(&self, p: usize, refs: Vec<Value>, rv: String) -> Value {
        let f = self.family(p);
        let r = &self.names.revision;
        let mut labels = serde_json::Map::new();
        labels.insert(r.family_label.clone(), json!(format!("family-{f}")));
        json!({
            "apiVersion": r.api_version,
            "kind": r.kind,
            "metadata": {
                "name": self.revision_name(p),
                "uid": revision_uid(p),
                "resourceVersion": rv,
                "creationTimestamp": REVISION_CREATED,
                "labels": labels,
                "ownerReferences": [self.package_ref(p, true)],
            },
            "spec": {"image": format!("xpkg.example.org/org{f}/package-p{p}:v1.0.0"), "desiredState": "Active"},
            "status": {"objectRefs": refs},
        })
    }

    /// The package of revision `p`: it controls the revision.
    fn package(&self, p: usize, rv: String) -> Value {
        let k = &self.names.package;
        json!({
            "apiVersion": k.api_version,
            "kind": k.kind,
            "metadata": {
                "name": format!("{}{p}", self.names.revision.name_prefix),
                "uid": package_uid(p),
                "resourceVersion": rv,
                "creationTimestamp": OWNER_CREATED,
            },
            "spec": {"package": format!("xpkg.example.org/org{}/package-p{p}:v1.0.0", self.family(p))},
        })
    }

    /// An ownerReference to the package of revision `p`.
    fn package_ref(&self, p: usize, controller: bool) -> Value {
        let k = &self.names.package;
        json!({
            "apiVersion": k.api_version, "kind": k.kind,
            "name": format!("{}{p}", self.names.revision.name_prefix), "uid": package_uid(p),
            "controller": controller, "blockOwnerDeletion": true,
        })
    }

    /// The Deployment of revision `p`.
    fn deployment(&self, p: usize, rv: String) -> Value {
        let r = &self.names.revision;
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": format!("package-p{p}"),
                "namespace": self.names.system_namespace,
                "uid": format!("00000000-0000-4000-9000-{p:012}"),
                "resourceVersion": rv,
                "ownerReferences": [{
                    "apiVersion": r.api_version, "kind": r.kind,
                    "name": self.revision_name(p), "uid": revision_uid(p),
                    "controller": true, "blockOwnerDeletion": true,
                }],
            },
            "spec": {"template": {"spec": {"serviceAccountName": format!("package-p{p}")}}},
        })
    }

    /// metadata.name of XRD `i` (`<plural>.<group>`).
    pub fn xrd_name(&self, i: usize) -> String {
        format!("xthing{i}s.{}", self.names.definition.type_group)
    }

    /// The CRDs of an XRD of types `x<stem>s` (and claims `<stem>s`),
    /// controlled by it.
    fn xrd_crds(&self, stem: &str, claims: bool, uid: &str, versions: &mut Versions) -> Vec<Value> {
        let d = &self.names.definition;
        let owner = json!({
            "apiVersion": d.api_version, "kind": d.kind,
            "name": format!("x{stem}s.{}", d.type_group), "uid": uid,
            "controller": true, "blockOwnerDeletion": true,
        });
        let mut out = vec![crd(
            &format!("x{stem}s"),
            &d.type_group,
            &owner,
            versions.bump(),
        )];
        if claims {
            out.push(crd(
                &format!("{stem}s"),
                &d.type_group,
                &owner,
                versions.bump(),
            ));
        }
        out
    }

    /// The CRDs revision `p` controls (its package an owner too): one per
    /// name in `refs`.
    fn revision_crds(&self, p: usize, refs: &[Value], versions: &mut Versions) -> Vec<Value> {
        let r = &self.names.revision;
        let owner = json!({
            "apiVersion": r.api_version, "kind": r.kind,
            "name": self.revision_name(p), "uid": revision_uid(p),
            "controller": true, "blockOwnerDeletion": true,
        });
        let package = self.package_ref(p, false);
        refs.iter()
            .filter_map(|r| r["name"].as_str()?.split_once('.'))
            .map(|(plural, group)| {
                let mut c = crd(plural, group, &owner, versions.bump());
                if let Some(refs) = c["metadata"]["ownerReferences"].as_array_mut() {
                    refs.push(package.clone());
                }
                c
            })
            .collect()
    }

    /// An XRD of types `x<stem>s` (and claims `<stem>s` when `claims`).
    fn xrd(&self, stem: &str, claims: bool, uid: String, rv: String) -> Value {
        let d = &self.names.definition;
        let mut spec = json!({
            "group": d.type_group,
            "names": {"kind": format!("X{stem}"), "plural": format!("x{stem}s")},
            // As every XRD carries one (the built-in rules read none).
            "versions": [{"name": "v1alpha1", "served": true, "referenceable": true,
                "schema": schema(&format!("x{stem}s"))}],
        });
        if claims {
            spec["claimNames"] = json!({"kind": stem, "plural": format!("{stem}s")});
        }
        json!({
            "apiVersion": d.api_version,
            "kind": d.kind,
            "metadata": {"name": format!("x{stem}s.{}", d.type_group), "uid": uid, "resourceVersion": rv,
                         "creationTimestamp": OWNER_CREATED},
            "spec": spec,
        })
    }

    /// The claim-bearing XRDs namespace `n` accepts, shifted by `shift`:
    /// spread over all of them, never twice the same.
    fn accepted(&self, n: usize, shift: usize) -> Vec<usize> {
        let c = self.sizes.claim_xrds();
        if c == 0 {
            return Vec::new();
        }
        let k = self.sizes.accepted_per_namespace.min(c);
        let step = (c / k.max(1)).max(1);
        (0..k).map(|j| 2 * ((n + shift + j * step) % c)).collect()
    }

    /// Namespace `n`, accepting the XRDs `xrds` names.
    fn namespace(&self, n: usize, xrds: &[usize], rv: String) -> Value {
        let a = &self.names.namespace;
        let annotations: serde_json::Map<String, Value> = xrds
            .iter()
            .map(|&i| {
                (
                    format!("{}{}", a.annotation_prefix, self.xrd_name(i)),
                    json!(a.accepted_value),
                )
            })
            .collect();
        json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": namespace_name(n),
                "uid": format!("00000000-0000-4000-a000-{n:012}"),
                "resourceVersion": rv,
                "annotations": annotations,
            },
        })
    }

    /// Every object, in a fixed order: packages, revisions, Deployments, the
    /// revisions' CRDs, XRDs and their CRDs, Namespaces.
    pub fn objects(&self, versions: &mut Versions) -> Vec<Value> {
        let s = &self.sizes;
        let mut out = Vec::with_capacity(s.objects_in());
        for p in 0..s.revisions {
            out.push(self.package(p, versions.bump()));
        }
        for p in 0..s.revisions {
            out.push(self.revision(p, self.revision_refs(p), versions.bump()));
        }
        for p in 0..s.revisions {
            out.push(self.deployment(p, versions.bump()));
        }
        for p in 0..s.revisions {
            let crds = self.revision_crds(p, &self.revision_refs(p), versions);
            out.extend(crds);
        }
        for i in 0..s.xrds {
            let (stem, uid) = (
                format!("thing{i}"),
                format!("00000000-0000-4000-b000-{i:012}"),
            );
            out.push(self.xrd(&stem, i % 2 == 0, uid.clone(), versions.bump()));
            let crds = self.xrd_crds(&stem, i % 2 == 0, &uid, versions);
            out.extend(crds);
        }
        for n in 0..s.namespaces {
            out.push(self.namespace(n, &self.accepted(n, 0), versions.bump()));
        }
        out
    }

    /// The `i`-th change of a kind: the objects as they are after the
    /// change (new or replacing objects). Changes of one kind apply in
    /// order `0, 1, …`: namespaces are each changed once while `i` <
    /// namespaces (a stride prime to common sizes); revision changes
    /// accumulate refs. An added XRD comes with its CRDs, a revision's new
    /// ref with the CRD it owns, as the package manager makes them.
    pub fn change(&self, kind: ChangeKind, i: usize, versions: &mut Versions) -> Vec<Value> {
        match kind {
            ChangeKind::NamespaceAnnotation => {
                let count = self.sizes.namespaces.max(1);
                let n = (i * 7919) % count;
                vec![self.namespace(n, &self.accepted(n, 1 + i / count), versions.bump())]
            }
            ChangeKind::XrdAdded => {
                let (stem, uid) = (
                    format!("added{i}"),
                    format!("00000000-0000-4000-c000-{i:012}"),
                );
                let mut out = self.xrd_crds(&stem, true, &uid, versions);
                out.push(self.xrd(&stem, true, uid, versions.bump()));
                out
            }
            ChangeKind::RevisionObjectRefs => {
                let r = self.sizes.revisions.max(1);
                let p = i % r;
                let mut refs = self.revision_refs(p);
                let group = self.revision_group(p);
                // Every earlier change of this revision, and this one.
                for k in (p..=i).step_by(r) {
                    refs.push(crd_ref(&format!("added{k}s.{group}")));
                }
                let mut out = self.revision_crds(p, &refs[refs.len() - 1..], versions);
                out.push(self.revision(p, refs, versions.bump()));
                out
            }
            ChangeKind::CrdAdded => {
                // A CRD its revision controls, not (yet) in its objectRefs:
                // the provider rules believe a CRD by its controller.
                let r = self.sizes.revisions.max(1);
                let p = (i * 7) % r;
                let group = self.revision_group(p);
                let added = [crd_ref(&format!("new{i}s.{group}"))];
                self.revision_crds(p, &added, versions)
            }
            // The rules change, not the objects (see the incremental phase).
            ChangeKind::RuleChanged => Vec::new(),
        }
    }
}

/// When the packages and XRDs were created: before the revisions and
/// CRDs, as a real cluster holds them.
const OWNER_CREATED: &str = "2026-01-01T00:00:00Z";
/// When the revisions were created.
const REVISION_CREATED: &str = "2026-01-01T00:00:10Z";
/// When the CRDs were created (by their revision or XRD).
const CRD_CREATED: &str = "2026-01-01T00:01:00Z";

fn package_uid(p: usize) -> String {
    format!("00000000-0000-4000-7000-{p:012}")
}

fn revision_uid(p: usize) -> String {
    format!("00000000-0000-4000-8000-{p:012}")
}

/// A CRD's schema as providers generate them: a spec with `forProvider`
/// and `initProvider` of some twenty typed, described fields each, and a
/// status with `atProvider` and conditions (about 5 KB of JSON).
fn schema(plural: &str) -> Value {
    let fields: serde_json::Map<String, Value> = (0..20)
        .map(|i| {
            let kind = ["string", "integer", "boolean", "number"][i % 4];
            (
                format!("field{i}"),
                json!({"type": kind, "description": format!("Field {i} of a {plural} resource, as the provider's API documents it.")}),
            )
        })
        .collect();
    let params = json!({"type": "object", "properties": fields});
    json!({"openAPIV3Schema": {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {"type": "object", "properties": {
                "forProvider": params.clone(),
                "initProvider": params.clone(),
                "deletionPolicy": {"type": "string", "enum": ["Orphan", "Delete"]},
                "providerConfigRef": {"type": "object", "properties": {"name": {"type": "string"}}},
            }},
            "status": {"type": "object", "properties": {
                "atProvider": params,
                "conditions": {"type": "array", "items": {"type": "object", "properties": {
                    "type": {"type": "string"}, "status": {"type": "string"},
                    "reason": {"type": "string"}, "message": {"type": "string"},
                    "lastTransitionTime": {"type": "string", "format": "date-time"},
                }}},
            }},
        },
    }})
}

/// A CRD `<plural>.<group>` owned by `owner`, as a cluster holds it, with
/// a realistic schema (the built-in rules read only its metadata).
fn crd(plural: &str, group: &str, owner: &Value, rv: String) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{plural}.{group}"),
            "uid": format!("crd-{plural}.{group}"),
            "resourceVersion": rv,
            "creationTimestamp": CRD_CREATED,
            "ownerReferences": [owner],
        },
        "spec": {
            "group": group,
            "names": {"plural": plural, "kind": plural},
            "scope": "Cluster",
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": schema(plural)}],
        },
    })
}

/// An objectRef of a CRD.
fn crd_ref(name: &str) -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "name": name})
}

/// metadata.name of namespace `n`.
pub fn namespace_name(n: usize) -> String {
    format!("team-{n:05}")
}

/// The kinds of change the incremental benchmark makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum ChangeKind {
    /// A Namespace accepts claims of a different set of XRDs.
    NamespaceAnnotation,
    /// A new XRD (with claimNames) appears.
    XrdAdded,
    /// A revision lists one more CRD in its objectRefs.
    RevisionObjectRefs,
    /// A CRD controlled by a revision appears.
    CrdAdded,
    /// One rule (a static one) changes: the engine is built again and the
    /// memo carried over, as the controller does when an RbacRule changes.
    RuleChanged,
}

impl ChangeKind {
    /// Every kind, in report order.
    pub const ALL: [ChangeKind; 5] = [
        ChangeKind::NamespaceAnnotation,
        ChangeKind::XrdAdded,
        ChangeKind::RevisionObjectRefs,
        ChangeKind::CrdAdded,
        ChangeKind::RuleChanged,
    ];

    /// Its key in the report.
    pub fn key(self) -> &'static str {
        match self {
            ChangeKind::NamespaceAnnotation => "namespace_annotation",
            ChangeKind::XrdAdded => "xrd_added",
            ChangeKind::RevisionObjectRefs => "revision_object_refs",
            ChangeKind::CrdAdded => "crd_added",
            ChangeKind::RuleChanged => "rule_changed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plane(s: Scenario) -> Plane<'static> {
        Plane {
            names: Names::builtin().expect("bench/control-plane.yaml"),
            sizes: s.sizes(),
        }
    }

    #[test]
    fn large_has_the_issue_sizes() {
        let pl = plane(Scenario::Large);
        let objs = pl.objects(&mut Versions::default());
        // 2,710 objects (70 of them the revisions' packages) and the 1,750
        // CRDs a real cluster holds for them.
        assert_eq!(objs.len(), 4_460);
        assert_eq!(pl.sizes.objects_in(), 4_460);
        assert_eq!(Scenario::Xl.sizes().objects_in(), 33_710);
        let kind = |o: &Value, k: &str| o["kind"] == k;
        let refs: usize = objs
            .iter()
            .filter(|o| kind(o, &pl.names.revision.kind))
            .map(|o| o["status"]["objectRefs"].as_array().map_or(0, Vec::len))
            .sum();
        assert_eq!(refs, 1_000);
        let claims = objs
            .iter()
            .filter(|o| kind(o, &pl.names.definition.kind))
            .filter(|o| o["spec"].get("claimNames").is_some())
            .count();
        assert_eq!(claims, 250);
    }

    #[test]
    fn namespaces_accept_distinct_claim_xrds() {
        for sc in [Scenario::Small, Scenario::Large] {
            let pl = plane(sc);
            for n in [0, 1, pl.sizes.namespaces - 1] {
                let mut a = pl.accepted(n, 0);
                assert_eq!(a.len(), 10);
                assert!(a.iter().all(|i| i % 2 == 0 && *i < pl.sizes.xrds));
                a.sort();
                a.dedup();
                assert_eq!(a.len(), 10, "{sc:?} namespace {n}");
                assert_ne!(pl.accepted(n, 0), pl.accepted(n, 1));
            }
        }
    }

    #[test]
    fn generation_is_deterministic() {
        let pl = plane(Scenario::Small);
        let a = pl.objects(&mut Versions::default());
        let b = pl.objects(&mut Versions::default());
        assert_eq!(a, b);
        let change = |i| {
            let mut objs = pl.change(ChangeKind::RevisionObjectRefs, i, &mut Versions::default());
            objs.pop().unwrap_or_default()
        };
        assert_eq!(change(9), change(9));
        // Revision 2's second change keeps its first added ref.
        assert_eq!(change(9)["metadata"]["name"], pl.revision_name(2));
        let refs = change(9)["status"]["objectRefs"]
            .as_array()
            .map_or(0, Vec::len);
        assert_eq!(refs, pl.revision_refs(2).len() + 2);
    }
}
